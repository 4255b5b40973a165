"""The served state's side of the quality guard's ``paired`` signal (``model.trainer.guard_rule``).

The delta publisher keeps the state serving converges to (``DeltaBuilder.mirror``, its rows as
the codec delivers them). :class:`ServedView` composes it as a serving worker does (a
``model.delta.served.Composer``: patched per delta, from scratch after a gap) and scores the
guard's rows with it through the artifact's own scoring (``ServingArtifact.scores_of_keys``):
the served and the trained state judged on the same rows, on every :data:`EVERY`-th head
only. Numpy only; called on the evaluation thread, one caller.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np

from model.artifact.files import ServingArtifact
from model.delta import ModelState
from model.delta.served import Composer
from model.delta.wire import Delta
from model.trainer.rolling import ScoredRows

#: The served side scores every this-many-th head (the others: no ``paired`` evidence). Scoring
#: every head (and composing the mirror for each delta) cost the trainer ~7% of its CPU, over
#: the guard's 5% (docs/decisions.md#quality-guard); ``paired`` is a slow signal (a state made
#: worse by what it trained on), the bursts are caught by the data signals on every row.
EVERY = 3


class _Builder(Protocol):
    @property
    def mirror(self) -> ModelState | None: ...


class _Publisher(Protocol):
    @property
    def builder(self) -> _Builder: ...

    @property
    def applied(self) -> Delta | None: ...


class ServedView:
    """Recall@K hits of scored rows by the state the publisher last published (module doc)."""

    def __init__(self, publisher: _Publisher, k: int = 10, every: int = EVERY) -> None:
        if every < 1:
            raise ValueError("every must be >= 1")
        self.publisher = publisher
        self.k = k
        self.every = every
        self._heads = 0
        self._composer = Composer()
        self._state: ModelState | None = None
        self._artifact: ServingArtifact | None = None

    def artifact(self) -> tuple[ModelState, ServingArtifact] | None:
        """The published state and its artifact (None: nothing published in this lineage)."""
        state = self.publisher.builder.mirror
        if state is None:
            return None
        if state is not self._state or self._artifact is None:
            delta = self.publisher.applied
            if delta is not None and (delta.seq != state.seq
                                      or delta.base_version != state.base_version):
                delta = None
            self._artifact = self._composer.compose(state, delta)
            self._state = state
        return state, self._artifact

    def ranks(self, rows: ScoredRows) -> np.ndarray | None:
        """Per row: how many items the published state scores above the target (-1: the
        target is not in it; None: no state, or a head this view does not score)."""
        self._heads += 1
        if (self._heads - 1) % self.every:
            return None
        found = self.artifact()
        if found is None:
            return None
        state, art = found
        target = state.catalog_rows(np.asarray(rows.item_keys, np.int64))
        if not art.item_ids.size:
            return np.full(target.size, -1, np.int64)
        history = np.asarray(rows.history, np.int64)
        keys = [h[h != 0] for h in history]
        scores = art.scores_of_keys(np.asarray(rows.user_keys, np.int64), keys,
                                    [state.catalog_rows(h) for h in keys])
        cols = np.arange(target.size)
        at = scores[np.maximum(target, 0), cols]
        rank = (scores > at[None, :]).sum(axis=0)
        return np.where(target >= 0, rank, -1)

    def hits(self, rows: ScoredRows) -> np.ndarray | None:
        """1/0 per row: the target in the published state's top ``k`` (None: no state, or a
        head not scored)."""
        rank = self.ranks(rows)
        return None if rank is None else ((rank >= 0) & (rank < self.k)).astype(np.float64)
