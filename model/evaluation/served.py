"""The model as serving holds it, scored in the evaluation: ``streamrec evaluate --row-codec``.

Serving does not score with the trainer's rows but with what reached it over the delta
stream, whose rows went through a row codec. :class:`ServedRows` plays that stream inside the
evaluation (the trainer's snapshot at the first scored micro-batch, then before each later one
the delta of what changed, encoded and decoded in each codec, applied and composed as serving
does); :class:`ServedLearner` scores a micro-batch with one codec's artifact exactly as serving
ranks and learns nothing itself, so the codecs are compared on one training run.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from model.artifact.files import ServingArtifact
from model.delta import CODECS, Composer, ModelState, apply, decode, encode, from_snapshot
from model.evaluation.replay import Positive
from streamrec.ids import item_keys


class ServedRows:
    """One delta lineage of a trainer, received in each of ``codecs`` (module doc)."""

    def __init__(self, trainer: Any, item_ids: Sequence[str], codecs: Sequence[str]) -> None:
        from model.trainer.deltas import DeltaBuilder

        unknown = [c for c in codecs if c not in CODECS]
        if unknown:
            raise ValueError(f"unknown row codec(s) {unknown}: one of {', '.join(CODECS)}")
        self.codecs = tuple(codecs)
        ids = list(item_ids)
        #: Key -> id of the stream's items (the trainer's catalog names those it has rows for).
        self.names: dict[int, str] = dict(zip(item_keys(ids).tolist(), ids, strict=True))
        self.builder = DeltaBuilder(trainer, lambda: self.names)
        self._states: dict[str, ModelState] = {}
        self._composers = {c: Composer() for c in self.codecs}
        self._artifacts: dict[str, ServingArtifact] = {}
        self._batch: Sequence[Positive] | None = None
        #: Bytes of the records received, per codec (snapshot excluded).
        self.bytes = dict.fromkeys(self.codecs, 0)
        self.deltas = 0

    def artifact(self, codec: str, batch: Sequence[Positive]) -> ServingArtifact:
        """``codec``'s served artifact for scoring ``batch`` (the stream advanced once per batch)."""
        if self._batch is not batch:
            self._advance()
            self._batch = batch
        return self._artifacts[codec]

    def _advance(self) -> None:
        if not self._states:
            snapshot = encode(self.builder.snapshot("evaluate", {}), "float32")
            for codec in self.codecs:
                self._serve(codec, from_snapshot(decode(snapshot)))
            return
        if not self.builder.pending:
            return
        delta = self.builder.delta({})
        self.deltas += 1
        for codec in self.codecs:
            record = encode(delta, codec)
            self.bytes[codec] += len(record)
            received = decode(record)
            self._serve(codec, apply(self._states[codec], received), received)

    def _serve(self, codec: str, state: ModelState, delta: Any = None) -> None:
        self._states[codec] = state
        self._artifacts[codec] = self._composers[codec].compose(state, delta)


class ServedLearner:
    """Scores with one codec's served artifact (module doc); items the artifact does not
    hold score ``-inf``, as the model's learner does."""

    def __init__(self, rows: ServedRows, codec: str, item_index: Mapping[str, int]) -> None:
        self.rows, self.codec, self.item_index = rows, codec, item_index
        self.name = f"served-{codec}"
        self._cols = np.zeros(0, np.int64)  # candidate index of each artifact row

    def _columns(self, artifact: ServingArtifact) -> np.ndarray:
        """Candidate index of each artifact row; the catalog only grows here (the
        evaluation's trainer evicts nothing), so the rows seen before are kept."""
        ids = artifact.item_ids
        if self._cols.size > ids.size:
            self._cols = np.zeros(0, np.int64)
        if self._cols.size < ids.size:
            index = self.item_index
            more = np.fromiter((index.get(str(i), -1) for i in ids[self._cols.size:].tolist()),
                               np.int64)
            self._cols = np.concatenate([self._cols, more])
        return self._cols

    def scores(self, batch: Sequence[Positive], n_candidates: int) -> np.ndarray:
        artifact = self.rows.artifact(self.codec, batch)
        out = np.full((len(batch), n_candidates), -np.inf, np.float32)
        if not artifact.item_ids.size:
            return out
        served = artifact.scores([p.sample.user_id for p in batch],
                                 [list(p.sample.history) for p in batch])
        cols = self._columns(artifact)
        keep = (cols >= 0) & (cols < n_candidates)
        out[:, cols[keep]] = served[keep].T
        return out

    def tiebreak(self, n_candidates: int) -> np.ndarray | None:
        return None

    def learn(self, batch: Sequence[Positive]) -> None:
        return None
