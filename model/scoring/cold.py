"""What a user's first event is ranked by: the learnt mix, the popularity prior alone, or
all-time popularity.

A row with no history (a new user's, a session's first click) has nothing for the towers'
user side or the co-visitation term to go on but the user's own row (often the default
row); the learnt mix ranks it by the towers' cold vector plus ``prior_weight * log q``. On
some logs that cold vector wins (a rating log whose new users rate the same signup items),
on others the prior alone does (a shop whose first clicks follow what is popular now), on
others again all-time popularity does (a shop whose first clicks go to its long-standing
best sellers), and the mix, learnt over all rows, cannot tell
(``docs/decisions.md#cold-start``). :class:`ColdStart` counts, on rows with no history, how
often each of the three has the target in its top ``k`` (test-then-train: scored before the
model learns the row) and serves the one that has hit most so far (ties: the earlier of
:data:`CHOICES`, so the mix until another is strictly ahead). :class:`ItemCounts` holds the
all-time counts, by the prior's hash buckets. Numpy only: the trainer's live scoring,
``streamrec evaluate`` and the artifact (``cold_start``) apply the same rule.
"""

from __future__ import annotations

import numpy as np

#: Served rankings of a row with no history (the artifact's ``cold_start``), in the order
#: ties are broken.
MIX, PRIOR, POPULAR = "mix", "prior", "popular"
CHOICES = (MIX, PRIOR, POPULAR)


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


def popularity_scores(counts: np.ndarray) -> np.ndarray:
    """The all-time popularity ranking's scores (float32) of items counted ``counts`` times:
    ``log1p`` (finite for never-counted items; only the order matters)."""
    return np.log1p(np.asarray(counts, np.float64)).astype(np.float32)


class ItemCounts:
    """All-time positives per item, by the prior's hash bucket (``key mod buckets``: the
    buckets the delta stream already sends for the prior, ``model/delta/FORMAT.md``)."""

    def __init__(self, buckets: int) -> None:
        if buckets < 1:
            raise ValueError("buckets must be >= 1")
        self.buckets = int(buckets)
        self.counts = np.zeros(self.buckets, np.float64)

    def bucket(self, keys: np.ndarray) -> np.ndarray:
        return np.mod(np.asarray(keys, np.int64), np.int64(self.buckets))

    def observe(self, keys: np.ndarray) -> None:
        """Count one positive of each of ``keys`` (a batch's targets)."""
        np.add.at(self.counts, self.bucket(np.asarray(keys).reshape(-1)), 1.0)

    def of_buckets(self, buckets: np.ndarray) -> np.ndarray:
        """Counts (float64) of ``buckets``."""
        return self.counts[np.asarray(buckets, np.int64)]

    def scores(self, keys: np.ndarray) -> np.ndarray:
        """:func:`popularity_scores` of item ``keys``."""
        return popularity_scores(self.counts[self.bucket(keys)])

    def state(self) -> dict[str, np.ndarray]:
        """The counted buckets and their counts (restored by :meth:`load_state`)."""
        nz = np.flatnonzero(self.counts)
        return {"buckets": nz.astype(np.int64), "counts": self.counts[nz]}

    def load_state(self, state: dict[str, np.ndarray]) -> None:
        buckets = np.asarray(state["buckets"], np.int64)
        counts = np.asarray(state["counts"], np.float64)
        if buckets.shape != counts.shape or (buckets.size and not
                                             (0 <= buckets.min() and buckets.max() < self.buckets)):
            raise ValueError(f"item counts of {buckets.size} buckets do not fit {self.buckets}")
        self.counts = np.zeros(self.buckets, np.float64)
        self.counts[buckets] = counts


class ColdStart:
    """The served ranking of rows with no history (module doc)."""

    def __init__(self, k: int = 10, buckets: int = 1 << 20) -> None:
        self.k = k
        #: Top-``k`` hits so far on rows with no history, one count per ranking of
        #: :data:`CHOICES`.
        self.hits = np.zeros(len(CHOICES), np.int64)
        #: Rows with no history observed (with a target among the candidates).
        self.rows = 0
        #: All-time counts of the popularity ranking.
        self.counts = ItemCounts(buckets)

    @property
    def choice(self) -> str:
        return CHOICES[int(np.argmax(self.hits))]

    def observe(self, scores: dict[str, np.ndarray], target: np.ndarray) -> None:
        """Scores ``[B, N]`` of rows with no history by each ranking of :data:`CHOICES`
        (all of them), and each row's target column (-1: not a candidate, skipped)."""
        target = np.asarray(target, np.int64)
        if not target.size:
            return
        for i, name in enumerate(CHOICES):
            self.hits[i] += int(hits_at(scores[name], target, self.k).sum())
        self.rows += int((target >= 0).sum())

    def rank(self, scores: np.ndarray, rows: np.ndarray, alone: dict[str, np.ndarray],
             target: np.ndarray, kept: np.ndarray | None = None) -> None:
        """Test-then-train on the ``rows`` of ``scores`` (``[B, N]``, the mix's, changed in
        place) that have no history: they get the ranking :attr:`choice` names (``alone``:
        each other ranking's ``[len(rows), N]`` scores), then every ranking's hits on their
        ``target`` columns are counted (``kept``: ``[len(rows), N]``, False where the
        ranking leaves an item out; those count as ``-inf``)."""
        if not rows.size:
            return
        rankings = {MIX: scores[rows], **alone}  # fancy indexing: a copy of the mix's rows
        choice = self.choice
        if choice != MIX:
            scores[rows] = alone[choice]
        if kept is not None:
            rankings = {name: np.where(kept, r, -np.inf) for name, r in rankings.items()}
        self.observe(rankings, target)

    def state(self) -> dict[str, np.ndarray]:
        """Arrays to checkpoint (restored by :meth:`load_state`)."""
        counts = self.counts.state()
        return {"hits": self.hits.copy(), "rows": np.asarray(self.rows, np.int64),
                "count_buckets": counts["buckets"], "count_values": counts["counts"]}

    def load_state(self, state: dict[str, np.ndarray]) -> None:
        """Restore :meth:`state`; a checkpoint from before all-time popularity (two hit
        counts, no counts) restores with that ranking's hits and counts at 0."""
        hits = np.asarray(state["hits"], np.int64)
        if hits.shape not in ((2,), (len(CHOICES),)):
            raise ValueError(f"cold-start state has {hits.size} counts, expected {len(CHOICES)}")
        self.hits = np.zeros(len(CHOICES), np.int64)
        self.hits[: hits.size] = hits
        self.rows = int(state["rows"])
        if "count_buckets" in state:
            self.counts.load_state({"buckets": state["count_buckets"],
                                    "counts": state["count_values"]})
