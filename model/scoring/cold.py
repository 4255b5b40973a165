"""What a user's first event is ranked by: the learnt mix, or the popularity prior alone.

A row with no history (a new user's, a session's first click) has nothing for the towers'
user side or the co-visitation term to go on but the user's own row (often the default
row); the learnt mix ranks it by the towers' cold vector plus ``prior_weight * log q``. On
some logs that cold vector wins (a rating log whose new users rate the same signup items),
on others the prior alone does (a shop whose first clicks follow what is popular now), and
the mix, learnt over all rows, cannot tell (``docs/decisions.md#cold-start``).
:class:`ColdStart` counts, on rows with no history, how often each of the two has the target
in its top ``k`` (test-then-train: scored before the model learns the row) and serves the one
that has hit more so far (the mix until the prior is strictly ahead). Numpy only: the
trainer's live scoring, ``streamrec evaluate`` and the artifact (``cold_start``) apply the
same rule.
"""

from __future__ import annotations

import numpy as np

#: Served rankings of a row with no history (the artifact's ``cold_start``).
MIX, PRIOR = "mix", "prior"
CHOICES = (MIX, PRIOR)


def no_history(history: np.ndarray) -> np.ndarray:
    """Rows of a padded history matrix (item keys, 0 = padding) with no item."""
    history = np.asarray(history)
    if history.ndim != 2 or history.shape[1] == 0:
        return np.ones(history.shape[0], bool)
    return ~(history != 0).any(axis=1)


def hits_at(scores: np.ndarray, target: np.ndarray, k: int) -> np.ndarray:
    """Per row of ``scores`` ``[B, N]``: whether the target column ``target[b]`` (-1: none,
    never a hit) is in the top ``k`` (fewer than ``k`` candidates score strictly above it;
    ``-inf`` targets never hit)."""
    target = np.asarray(target, np.int64)
    out = np.zeros(target.size, bool)
    rows = np.flatnonzero(target >= 0)
    if rows.size:
        at = scores[rows, target[rows]]
        above = (scores[rows] > at[:, None]).sum(axis=1)
        out[rows] = np.isfinite(at) & (above < k)
    return out


class ColdStart:
    """The served ranking of rows with no history (module doc)."""

    def __init__(self, k: int = 10) -> None:
        self.k = k
        #: Top-``k`` hits so far on rows with no history: the learnt mix, the prior alone.
        self.hits = np.zeros(2, np.int64)
        #: Rows with no history observed (with a target among the candidates).
        self.rows = 0

    @property
    def choice(self) -> str:
        return PRIOR if self.hits[1] > self.hits[0] else MIX

    def observe(self, mix: np.ndarray, prior: np.ndarray, target: np.ndarray) -> None:
        """Scores ``[B, N]`` of rows with no history by the mix and by the prior alone,
        and each row's target column (-1: not a candidate, skipped)."""
        target = np.asarray(target, np.int64)
        if not target.size:
            return
        self.hits[0] += int(hits_at(mix, target, self.k).sum())
        self.hits[1] += int(hits_at(prior, target, self.k).sum())
        self.rows += int((target >= 0).sum())

    def state(self) -> dict[str, np.ndarray]:
        """Arrays to checkpoint (restored by :meth:`load_state`)."""
        return {"hits": self.hits.copy(), "rows": np.asarray(self.rows, np.int64)}

    def load_state(self, state: dict[str, np.ndarray]) -> None:
        hits = np.asarray(state["hits"], np.int64)
        if hits.shape != (2,):
            raise ValueError(f"cold-start state has {hits.size} counts, expected 2")
        self.hits = hits.copy()
        self.rows = int(state["rows"])
