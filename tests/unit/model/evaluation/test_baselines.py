"""The evaluation's baselines against plain, slow re-implementations of their docstring rules.

Small random streams go through ``build_stream`` and the protocol's micro-batches; each
baseline's scores must equal the slow version's exactly, and so must the rankings of
``recommend`` (with its exclusions and tie-breaks).
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Sequence
from fractions import Fraction

import numpy as np
import pytest

from feature_store.features import FeatureParams
from model.evaluation import neighbours
from model.evaluation.baselines import (
    CooccurrenceBaseline,
    ItemKNNBaseline,
    PopularityBaseline,
    RecentPopularityBaseline,
    SequentialRulesBaseline,
    SessionKNNBaseline,
)
from model.evaluation.learners import BaselineLearner, HistoryLearner
from model.evaluation.replay import EvalStream, Positive, build_stream, recommend
from model.scoring import sessions

PARAMS = FeatureParams(
    event_weights={"impression": 0.0, "click": 1.0, "rating": 0.0},
    history_len=30,
    history_types=frozenset({"rating"}),
)


def _random_stream(seed: int, events: int = 700, users: int = 25, items: int = 60) -> EvalStream:
    rng = np.random.default_rng(seed)
    popular = rng.dirichlet(np.full(items, 0.3))
    wire = []
    for n in range(events):
        wire.append(
            {
                "event_id": f"e{n}",
                "user_id": f"u{rng.integers(users)}",
                "item_id": f"i{rng.choice(items, p=popular)}",
                "event_type": str(rng.choice(["click", "click", "rating", "impression"])),
                "ts": 1_700_000_000_000 + n * 1000 + int(rng.integers(0, 3000)),  # some disorder
            }
        )
    wire.sort(key=lambda e: e["ts"])
    return build_stream(wire, PARAMS)


def _distinct(history: Sequence[int], window: int) -> list[int]:
    out: list[int] = []
    for item in history[:window]:
        if item not in out:
            out.append(item)
    return out


class _Slow:
    """Shared state of the slow versions: learned positives in order, item ids -> index."""

    def __init__(self, stream: EvalStream, window: int) -> None:
        self.index = stream.item_index
        self.window = window
        self.popularity: Counter[int] = Counter()

    def query(self, p: Positive) -> list[int]:
        return _distinct([self.index[i] for i in p.sample.history], self.window)

    def tiebreak(self, n: int) -> np.ndarray:
        return np.array([self.popularity[i] for i in range(n)], np.int64)


class SlowCooccurrence(_Slow):
    def __init__(self, stream: EvalStream, window: int) -> None:
        super().__init__(stream, window)
        self.pairs: Counter[tuple[int, int]] = Counter()

    def learn(self, batch: Sequence[Positive]) -> None:
        for p in batch:
            self.popularity[p.item] += 1
            for j in self.query(p):
                self.pairs[(p.item, j)] += 1
                self.pairs[(j, p.item)] += 1

    def scores(self, batch: Sequence[Positive], n: int) -> np.ndarray:
        out = np.zeros((len(batch), n))
        for row, p in enumerate(batch):
            window = self.query(p)
            for i in range(n):
                out[row, i] = sum(self.pairs[(j, i)] for j in window)
        return out


class SlowItemKNN(SlowCooccurrence):
    def __init__(self, stream: EvalStream, window: int, alpha: float, decay: float) -> None:
        super().__init__(stream, window)
        self.alpha, self.decay = alpha, decay

    def scores(self, batch: Sequence[Positive], n: int) -> np.ndarray:
        out = np.zeros((len(batch), n))
        for row, p in enumerate(batch):
            window = self.query(p)
            for i in range(n):
                total = 0.0
                for pos, j in enumerate(window):
                    total += self.decay**pos * self.pairs[(j, i)]
                out[row, i] = total / (self.popularity[i] + 1) ** self.alpha
        return out


class SlowSequentialRules(_Slow):
    """Exact rational weights; the fast version's scores are these times its scale."""

    def __init__(self, stream: EvalStream, steps: int, query_items: int) -> None:
        super().__init__(stream, steps)
        self.steps, self.query_items = steps, query_items
        self.rules: defaultdict[tuple[int, int], Fraction] = defaultdict(Fraction)

    def learn(self, batch: Sequence[Positive]) -> None:
        for p in batch:
            self.popularity[p.item] += 1
            history = [self.index[i] for i in p.sample.history]
            for pos, j in enumerate(_distinct(history, self.steps)):
                self.rules[(j, p.item)] += Fraction(1, pos + 1)

    def scores(self, batch: Sequence[Positive], n: int) -> np.ndarray:
        scale = math.lcm(*range(1, self.steps + 1)) * math.lcm(*range(1, self.query_items + 1))
        out = np.zeros((len(batch), n))
        for row, p in enumerate(batch):
            history = [self.index[i] for i in p.sample.history]
            query = _distinct(history, self.query_items)
            for i in range(n):
                total = sum(
                    (self.rules[(j, i)] / (m + 1) for m, j in enumerate(query)), Fraction(0)
                )
                assert (total * scale).denominator == 1
                out[row, i] = float(total * scale)
        return out


class SlowSessionKNN(_Slow):
    def __init__(
        self,
        stream: EvalStream,
        sample: int,
        window: int,
        k: int | None = None,
        recency: bool = True,
    ) -> None:
        super().__init__(stream, window)
        self.sample, self.k, self.recency = sample, k, recency
        self.held: defaultdict[int, set[int]] = defaultdict(set)
        self.last: dict[int, int] = {}
        self.learned = 0

    def learn(self, batch: Sequence[Positive]) -> None:
        for p in batch:
            self.popularity[p.item] += 1
            self.held[p.user].add(p.item)
            self.last[p.user] = self.learned
            self.learned += 1

    def scores(self, batch: Sequence[Positive], n: int) -> np.ndarray:
        out = np.zeros((len(batch), n))
        for row, p in enumerate(batch):
            window = self.query(p)
            length = len(window)
            weight_of = {j: (length - pos) / length for pos, j in enumerate(window)}
            sharing = [u for u, h in self.held.items() if u != p.user and h & set(window)]
            sharing.sort(key=lambda u: -self.last[u])
            found = []  # (rank, user, sim)
            for rank, u in enumerate(sharing[: self.sample]):
                num = 0.0
                for j in window:
                    if j in self.held[u]:
                        num += weight_of[j]
                sim = num / (math.sqrt(length) * math.sqrt(len(self.held[u])))
                found.append((rank, u, sim))
            if self.k is not None:
                nearest = sorted(found, key=lambda f: (-f[2], f[0]))[: self.k]
                found = sorted(nearest)  # back to rank order
            for rank, u, sim in found:
                weight = sim * (1.0 - rank / self.sample) if self.recency else sim
                for i in sorted(self.held[u]):
                    if i < n:
                        out[row, i] += weight
        return out


def _slow_ranking(
    scores: np.ndarray, tiebreak: np.ndarray, excluded: np.ndarray, k: int
) -> list[int]:
    gone = set(excluded.tolist())
    keep = [i for i in range(scores.size) if i not in gone]
    keep.sort(key=lambda i: (-scores[i], -tiebreak[i], i))
    return keep[:k]


def _batches(stream: EvalStream, size: int) -> list[list[Positive]]:
    return [stream.positives[s : s + size] for s in range(0, len(stream.positives), size)]


@pytest.mark.parametrize("seed", [1, 2, 3])
@pytest.mark.parametrize("exclude", ["rated", "positives"])
@pytest.mark.parametrize("dense", [0, 1])  # sorted pairs / dense arrays (cooc: from item 30)
def test_per_user_baselines_equal_their_slow_versions(
    seed: int, exclude: str, dense: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sessions, "DENSE_RATIO", 10**9 if dense else 0)
    monkeypatch.setattr(neighbours, "DENSE_ITEMS", 30 if dense else 0)
    stream = _random_stream(seed)
    assert len(stream.positives) > 200
    pairs = [
        (
            HistoryLearner(CooccurrenceBaseline(window=4), stream.item_index),
            SlowCooccurrence(stream, window=4),
        ),
        (
            HistoryLearner(SessionKNNBaseline(sample_size=5, window=6, k=None), stream.item_index),
            SlowSessionKNN(stream, sample=5, window=6),
        ),
        (  # the defaults
            HistoryLearner(SessionKNNBaseline(), stream.item_index),
            SlowSessionKNN(stream, sample=300, window=20, k=75),
        ),
        (
            HistoryLearner(ItemKNNBaseline(), stream.item_index),
            SlowItemKNN(stream, window=20, alpha=0.3, decay=0.7),
        ),
        (
            HistoryLearner(SequentialRulesBaseline(), stream.item_index),
            SlowSequentialRules(stream, steps=10, query_items=12),
        ),
        (
            HistoryLearner(SessionKNNBaseline(sample_size=8, window=6, k=3), stream.item_index),
            SlowSessionKNN(stream, sample=8, window=6, k=3),
        ),
        (
            HistoryLearner(
                SessionKNNBaseline(sample_size=6, window=5, k=2, recency=False),
                stream.item_index,
            ),
            SlowSessionKNN(stream, sample=6, window=5, k=2, recency=False),
        ),
        (
            HistoryLearner(ItemKNNBaseline(window=5, alpha=0.5, decay=1.0), stream.item_index),
            SlowItemKNN(stream, window=5, alpha=0.5, decay=1.0),
        ),
        (
            HistoryLearner(ItemKNNBaseline(window=6, alpha=0.75, decay=0.8), stream.item_index),
            SlowItemKNN(stream, window=6, alpha=0.75, decay=0.8),
        ),
        (
            HistoryLearner(SequentialRulesBaseline(steps=5, query_items=1), stream.item_index),
            SlowSequentialRules(stream, steps=5, query_items=1),
        ),
        (
            HistoryLearner(SequentialRulesBaseline(steps=4, query_items=3), stream.item_index),
            SlowSequentialRules(stream, steps=4, query_items=3),
        ),
    ]
    nonzero: Counter[str] = Counter()
    for batch in _batches(stream, 16):
        n = batch[0].n_items
        excluded = [stream.excluded(p, exclude) for p in batch]
        for fast, slow in pairs:
            got, want = fast.scores(batch, n), slow.scores(batch, n)
            assert np.array_equal(got, want), fast.name
            nonzero[fast.name] += int((got > 0).sum())
            tiebreak = fast.tiebreak(n)
            assert tiebreak is not None
            assert np.array_equal(tiebreak, slow.tiebreak(n))
            ranked = recommend(got, excluded, 7, tiebreak)
            for row in range(len(batch)):
                expected = _slow_ranking(want[row], tiebreak, excluded[row], 7)
                assert [i for i in ranked[row] if i >= 0] == expected, fast.name
            fast.learn(batch)
            slow.learn(batch)
    assert min(nonzero.values()) > 1000  # the comparison is not vacuous


def test_recent_popularity_is_a_count_over_the_last_window_positives() -> None:
    rng = np.random.default_rng(4)
    recent = RecentPopularityBaseline(window=50)
    learned: list[int] = []
    for size in [3, 40, 1, 77, 120, 5, 0, 60]:  # batches larger and smaller than the window
        items = rng.integers(0, 30, size)
        recent.learn(items, np.zeros(size, np.int64))
        learned.extend(items.tolist())
        want = Counter(learned[-50:])
        assert recent.scores(30).tolist() == [float(want[i]) for i in range(30)]
    with pytest.raises(ValueError):
        RecentPopularityBaseline(window=0)


def test_popularity_learner_ranks_like_counts_with_exclusions() -> None:
    stream = _random_stream(5)
    learner = BaselineLearner(PopularityBaseline())
    counts: Counter[int] = Counter()
    for batch in _batches(stream, 32):
        n = batch[0].n_items
        excluded = [stream.excluded(p, "positives") for p in batch]
        ranked = recommend(learner.scores(batch, n), excluded, 5)
        zeros = np.zeros(n, np.int64)
        for row, gone in enumerate(excluded):
            scores = np.array([counts[i] for i in range(n)], np.float64)
            expected = _slow_ranking(scores, zeros, gone, 5)
            assert [i for i in ranked[row] if i >= 0] == expected
        learner.learn(batch)
        counts.update(p.item for p in batch)


def test_empty_window_falls_back_to_popularity_and_self_is_no_neighbour() -> None:
    knn = SessionKNNBaseline(sample_size=3, window=5)
    knn.learn([0, 0, 1, 2], [4, 5, 4, 6])
    empty = np.zeros(0, np.int64)
    assert knn.scores([3], [empty], 7).tolist() == [[0.0] * 7]
    assert knn.tiebreak(7).tolist() == [0, 0, 0, 0, 2, 1, 1]
    # User 0 asks with item 4: neighbours are 1 (holds 4) only, not user 0 itself.
    scores = knn.scores([0], [np.array([4])], 7)[0]
    assert scores[4] == pytest.approx(1.0) and scores[5] == 0.0 and scores[6] == 0.0
    cooc = CooccurrenceBaseline(window=2)
    cooc.learn([3, 4], [np.array([1, 2, 9]), np.array([3, 3])])  # 9 is outside the window
    assert cooc.scores([np.array([3])], 10)[0].tolist() == [0, 1, 1, 0, 1, 0, 0, 0, 0, 0]


def test_sequential_rules_are_directional_and_weighted_by_distance() -> None:
    sr = SequentialRulesBaseline(steps=3, query_items=2)  # scale lcm(1..3) * lcm(1..2) = 12
    sr.learn([5], [np.array([3, 4, 3, 2, 1])])  # window 3, 4 (the second 3 is a repeat)
    assert sr.scores([np.array([3])], 6)[0].tolist() == [0, 0, 0, 0, 0, 12]
    assert sr.scores([np.array([4])], 6)[0].tolist() == [0, 0, 0, 0, 0, 6]
    assert sr.scores([np.array([4, 3])], 6)[0].tolist() == [0, 0, 0, 0, 0, 6 + 6]
    assert sr.scores([np.array([5, 3, 4])], 6)[0].tolist() == [0, 0, 0, 0, 0, 6]  # 4: 3rd entry
    with pytest.raises(ValueError):
        SequentialRulesBaseline(steps=13)
