"""Test-then-train bookkeeping and baselines on tiny hand-made streams (no TensorFlow)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest

from feature_store.features import FeatureParams
from model.evaluation.baselines import PopularityBaseline
from model.evaluation.learners import BaselineLearner
from model.evaluation.replay import (
    EvalOptions,
    Positive,
    build_stream,
    evaluate,
    evaluation_weights,
    load_stream,
    recommend,
)
from streamrec.settings import FeatureSettings

PARAMS = FeatureParams(event_weights={"impression": 0.0, "click": 1.0}, history_len=5)


def _ev(eid: str, user: str, item: str, ts: int, etype: str = "click") -> dict[str, object]:
    return {"event_id": eid, "user_id": user, "item_id": item, "event_type": etype, "ts": ts}


#: Items get indices A=0 (e1), B=1 (e3), C=2 (e5). Positives: e1 e2 e3 e4 e6 e7 e8.
EVENTS = [
    _ev("e1", "u1", "A", 1),
    _ev("e2", "u2", "A", 2),
    _ev("e3", "u3", "B", 3),
    _ev("e4", "u1", "B", 4),
    _ev("e5", "u2", "C", 5, "impression"),
    _ev("e6", "u2", "B", 6),
    _ev("e7", "u3", "A", 7),
    _ev("e8", "u4", "C", 8),
]
#: warm-up floor(0.3 * 7) = 2 positives; then batches [e3 e4] [e6 e7] [e8].
OPTIONS = EvalOptions(batch_size=2, warmup_fraction=0.3, ks=(1, 3), chunks=2)


def test_build_stream_positives_exclusions_and_point_in_time_history() -> None:
    stream = build_stream(EVENTS + [_ev("e1", "u1", "A", 1)], PARAMS)  # a duplicate at the end
    assert stream.events == 9 and stream.duplicates == 1
    assert stream.item_ids == ["A", "B", "C"]
    assert [p.sample.sample_id for p in stream.positives] == [
        "e1",
        "e2",
        "e3",
        "e4",
        "e6",
        "e7",
        "e8",
    ]
    by_id = {p.sample.sample_id: p for p in stream.positives}
    e6 = by_id["e6"]
    # u2 interacted with A (click) and C (impression) before e6; C is no positive.
    assert (e6.user, e6.item, e6.seen, e6.n_items) == (1, 1, 2, 3)
    assert list(stream.user_items[e6.user]) == [0, 2, 1]
    assert e6.sample.history == ("A",)
    assert by_id["e3"].n_items == 1  # B is new: not yet a candidate
    assert by_id["e4"].sample.history == ("A",)


def test_popularity_on_hand_made_stream() -> None:
    stream = build_stream(EVENTS, PARAMS)
    result = evaluate(stream, [BaselineLearner(PopularityBaseline())], OPTIONS)
    # [e3 e4]: only A is a candidate -> both miss; [e6 e7]: A=2,B=2,C=0 -> order A,B,C;
    # e6 (u2 excludes A,C) -> B at 0; e7 (u3 excludes B) -> A at 0; [e8]: A=3,B=3 -> C at 2.
    assert result.warmup == 2 and result.scored == 5
    values = result.values["popularity"]
    assert list(values["recall@1"]) == [0, 0, 1, 1, 0]
    assert list(values["recall@3"]) == [0, 0, 1, 1, 1]
    assert list(values["ndcg@3"]) == pytest.approx([0, 0, 1, 1, 0.5])
    assert list(result.ts_ms) == [3, 4, 6, 7, 8]
    figs = result.overall("popularity")
    assert figs["recall@1"] == pytest.approx(2 / 5)
    assert figs["recall@3"] == pytest.approx(3 / 5)
    assert figs["ndcg@3"] == pytest.approx((1 + 1 + 0.5) / 5)


class _Recorder:
    """Scores the target of each row highest (an oracle) and logs every call in order."""

    name = "oracle"

    def __init__(self) -> None:
        self.calls: list[tuple[str, list[str]]] = []

    def scores(self, batch: Sequence[Positive], n_candidates: int) -> np.ndarray:
        self.calls.append(("score", [p.sample.sample_id for p in batch]))
        out = np.zeros((len(batch), n_candidates))
        for row, p in enumerate(batch):
            if p.item < n_candidates:
                out[row, p.item] = 1.0
        return out

    def tiebreak(self, n_candidates: int) -> np.ndarray | None:
        return None

    def learn(self, batch: Sequence[Positive]) -> None:
        self.calls.append(("learn", [p.sample.sample_id for p in batch]))


def test_each_batch_is_scored_before_it_is_learned_and_warmup_is_not_scored() -> None:
    stream = build_stream(EVENTS, PARAMS)
    oracle = _Recorder()
    result = evaluate(stream, [oracle], OPTIONS)
    assert oracle.calls == [
        ("learn", ["e1", "e2"]),
        ("score", ["e3", "e4"]),
        ("learn", ["e3", "e4"]),
        ("score", ["e6", "e7"]),
        ("learn", ["e6", "e7"]),
        ("score", ["e8"]),
        ("learn", ["e8"]),
    ]
    # New items (not yet candidates) cannot be hit, even by an oracle.
    assert list(result.values["oracle"]["recall@1"]) == [0, 0, 1, 1, 1]


def test_report_layout_and_chunks() -> None:
    stream = build_stream(EVENTS, PARAMS)
    learners = [_Recorder(), BaselineLearner(PopularityBaseline())]
    doc = evaluate(stream, learners, OPTIONS).report("oracle", chunks=2)
    assert doc["events"] == 8 and doc["scored"] == 5
    assert doc["recall@1"] == pytest.approx(3 / 5)
    assert doc["baselines"]["popularity"]["recall@1"] == pytest.approx(2 / 5)
    assert doc["baselines"]["popularity"]["scored"] == 5
    assert "oracle" not in doc["baselines"]
    chunks = doc["over_time"]["popularity"]
    assert [c["scored"] for c in chunks] == [3, 2]
    assert [(c["first_ts"], c["last_ts"]) for c in chunks] == [(3, 6), (7, 8)]
    assert chunks[0]["recall@1"] == pytest.approx(1 / 3)
    assert chunks[1]["recall@3"] == pytest.approx(1.0)


def test_recommend_excludes_breaks_ties_by_index_and_skips_minus_inf() -> None:
    user_items = [np.array([0, 3]), np.array([], np.int64)]
    batch = [
        Positive(sample=None, user=0, item=2, seen=2, n_items=5),  # type: ignore[arg-type]
        Positive(sample=None, user=0, item=2, seen=0, n_items=5),  # type: ignore[arg-type]
        Positive(sample=None, user=1, item=4, seen=0, n_items=5),  # type: ignore[arg-type]
    ]
    excluded = [user_items[p.user][: p.seen] for p in batch]
    shared = np.array([5.0, 1.0, 1.0, 9.0, -np.inf])
    # order: 3, 0, 1, 2 (1 and 2 tie: lower index first), 4 never.
    assert recommend(shared, excluded, k=3).tolist() == [
        [1, 2, -1],  # 0 and 3 excluded (seen before), 4 is -inf
        [3, 0, 1],
        [3, 0, 1],
    ]
    per_row = np.array(
        [
            [5.0, 1.0, 2.0, 9.0, 0.0],
            [0.0, 0.5, 3.0, 0.0, 1.0],
            [-np.inf, 0.0, -np.inf, 2.0, -np.inf],
        ]
    )
    assert recommend(per_row, excluded, k=3).tolist() == [
        [2, 1, 4],
        [2, 4, 1],
        [3, 1, -1],
    ]
    # Per-row ties with a tiebreak key: larger key first, then lower index.
    tied = np.array([[1.0, 2.0, 2.0, 2.0, 0.0], [0.0] * 5, [-np.inf, 0.0, -np.inf, 0.0, 0.0]])
    key = np.array([0, 1, 3, 1, 0])
    assert recommend(tied, excluded, k=3, tiebreak=key).tolist() == [
        [2, 1, 4],  # 0 and 3 excluded
        [2, 1, 3],
        [1, 3, 4],
    ]


def test_report_figures_from_per_event_values() -> None:
    stream = build_stream(EVENTS, PARAMS)
    result = evaluate(stream, [BaselineLearner(PopularityBaseline())], OPTIONS)
    # Per event (popularity): ranks -1, -1, 0, 0, 2 -> NDCG@3 gains 0, 0, 1, 1, 1/log2(4).
    assert result.overall("popularity")["ndcg@1"] == pytest.approx(2 / 5)
    assert result.chunks("popularity", 2)[1]["ndcg@3"] == pytest.approx((1 + 1 / np.log2(4)) / 2)


def test_popularity_counts() -> None:
    pop = PopularityBaseline()
    pop.learn([0, 2, 2], [5, 6, 7])
    pop.learn([2000], [8])  # grows past the initial capacity
    scores = pop.scores(3)
    assert list(scores) == [1.0, 0.0, 2.0]
    assert pop.scores(2001)[2000] == 1.0


def test_movielens_low_ratings_are_interactions_not_positives(tmp_path: Path) -> None:
    path = tmp_path / "ratings.csv"
    path.write_text(
        "userId,movieId,rating,timestamp\n"
        "1,10,5.0,964982100\n"
        "1,11,2.0,964982050\n"  # earlier event time: ordered first
        "2,10,4.0,964982100\n"
        "2,12,3.5,964982300\n"
        "2,11,4.5,964982200\n"
    )
    features = FeatureSettings()
    stream, report = load_stream([path], "movielens", features, now_ms=1_700_000_000_000)
    assert report["rejected"] == 0 and stream.events == 5
    assert [(p.sample.user_id, p.sample.item_id) for p in stream.positives] == [
        ("1", "10"),
        ("2", "10"),
        ("2", "11"),
    ]
    first = stream.positives[0]
    # movie 11 was rated 2.0 before: seen (excluded), in the history, never a target
    assert first.seen == 1 and first.sample.history == ("11",)
    assert [p.sample.history for p in stream.positives[1:]] == [(), ("10",)]
    assert evaluation_weights({"rating": 1.0, "like": 2.0}, "ndjson") == {
        "rating": 1.0,
        "like": 2.0,
    }
    assert evaluation_weights({"rating": 1.0, "like": 2.0}, "movielens")["rating"] == 0.0


def test_exclude_positives_keeps_items_merely_shown_as_candidates() -> None:
    stream = build_stream(EVENTS, PARAMS)
    e6 = next(p for p in stream.positives if p.sample.sample_id == "e6")
    # u2 before e6: clicked A (positive), was shown C (impression).
    assert stream.excluded(e6, "rated").tolist() == [0, 2]
    assert stream.excluded(e6, "positives").tolist() == [0]
    assert list(stream.user_positives[e6.user]) == [0, 1]
    options = EvalOptions(
        batch_size=2, warmup_fraction=0.3, ks=(1, 3), chunks=2, exclude="positives"
    )
    result = evaluate(stream, [BaselineLearner(PopularityBaseline())], options)
    # [e8]: A=3, B=3, C=0 and u4 has nothing earlier -> C at 2 either way; e6: C stays a
    # candidate but ranks after B.
    assert list(result.values["popularity"]["recall@1"]) == [0, 0, 1, 1, 0]
    with pytest.raises(ValueError):
        EvalOptions(exclude="everything")


def test_report_names_the_best_baseline_and_the_ratios() -> None:
    stream = build_stream(EVENTS, PARAMS)
    learners = [_Recorder(), BaselineLearner(PopularityBaseline())]
    doc = evaluate(stream, learners, OPTIONS).report("oracle", chunks=2)
    assert doc["best_baseline"] == "popularity"
    assert doc["ratio_to_best"] == pytest.approx((3 / 5) / (2 / 5))
    assert doc["ratio_to_popularity"] == doc["ratio_to_best"]


def test_report_splits_scored_events_by_the_users_earlier_items() -> None:
    """Cold and sparse users apart: e3 and e8 have no earlier item, e4 e6 e7 have 1-2."""
    stream = build_stream(EVENTS, PARAMS)
    learners = [_Recorder(), BaselineLearner(PopularityBaseline())]
    result = evaluate(stream, learners, OPTIONS)
    assert list(result.seen) == [0, 1, 2, 1, 0]
    groups = result.report("oracle", chunks=1)["by_history"]
    assert list(groups) == ["0", "1-4", "5+"]
    assert [g["scored"] for g in groups.values()] == [2, 3, 0]
    # popularity recall@1 per scored event: [0, 0, 1, 1, 0]
    assert groups["0"]["popularity"]["recall@1"] == 0.0
    assert groups["1-4"]["popularity"]["recall@1"] == pytest.approx(2 / 3)
    assert groups["0"]["oracle"]["recall@1"] == pytest.approx(1 / 2)  # e3's B is new
    assert groups["5+"]["oracle"] == {k: 0.0 for k in result.values["oracle"]}


def test_catalogue_items_are_candidates_from_the_start_and_item_history_is_counted() -> None:
    stream = build_stream(EVENTS, PARAMS, catalogue=[("Z", 0), ("B", 0), ("A", 0)])
    assert stream.item_ids[:3] == ["Z", "B", "A"] and stream.item_ids[3] == "C"
    by_id = {p.sample.sample_id: p for p in stream.positives}
    assert by_id["e1"].n_items == 3  # the whole catalogue is there before any event
    # earlier positives of the target item: A (e1, e2, e7), B (e3, e4, e6), C (e8)
    assert [by_id[e].item_positives for e in ("e1", "e2", "e7")] == [0, 1, 2]
    assert [by_id[e].item_positives for e in ("e3", "e4", "e6")] == [0, 1, 2]
    assert by_id["e8"].item_positives == 0  # C's impression (e5) is no positive
    result = evaluate(stream, [BaselineLearner(PopularityBaseline())], OPTIONS)
    assert result.item_seen.tolist() == [0, 1, 2, 2, 0]  # e3 e4 e6 e7 e8
    groups = result.by_item()
    assert groups["0"]["scored"] == 2 and groups["1-4"]["scored"] == 3
    assert groups["5+"]["scored"] == 0
    doc = result.report("popularity", 2)
    assert doc["by_item"]["1-4"]["popularity"]["recall@1"] == pytest.approx(
        result.values["popularity"]["recall@1"][1:4].mean())


def test_a_catalogue_item_is_a_candidate_from_its_ts_on() -> None:
    stream = build_stream(EVENTS, PARAMS, catalogue=[("late", 6), ("B", 0), ("early", 2)])
    by_id = {p.sample.sample_id: p for p in stream.positives}
    assert stream.item_ids[:2] == ["B", "A"]  # A: named by e1 before "early" is listed
    assert stream.item_ids.index("early") == 2 and by_id["e2"].n_items == 3
    assert by_id["e4"].n_items == 3 and by_id["e6"].n_items == 5  # C (e5), then "late" at 6
    assert stream.item_ids[3:] == ["C", "late"]


def test_the_exact_side_reads_the_rows_the_model_scored_last() -> None:
    """``model-exact`` (``--retrieval ann``): the scores over every candidate of the batch the
    model scored just before, never another batch's."""
    from model.evaluation.learners import ExactLearner, TwoTowerLearner

    model = TwoTowerLearner(trainer=None, history_len=3)
    side = ExactLearner(model)
    batch: list[object] = [object(), object()]
    with pytest.raises(RuntimeError):
        side.scores(batch, 4)  # type: ignore[arg-type]
    exact = np.arange(8, dtype=np.float32).reshape(2, 4)
    model._exact = (batch, exact)  # type: ignore[assignment]
    assert side.scores(batch, 4) is exact  # type: ignore[arg-type]
    with pytest.raises(RuntimeError):
        side.scores([object()], 4)  # type: ignore[arg-type]
    assert side.name == "model-exact" and side.tiebreak(4) is None


def test_each_evaluation_of_a_process_trains_its_own_tables() -> None:
    """TFRA tables of one name share their rows within a process: a second ``evaluate`` in
    the same process (the tests run several) must not start from the first one's rows."""
    from model.cli.evaluate import _eval_tag
    from model.towers.tables import EmbeddingTable
    from model.towers.tf_env import tf

    tags = [_eval_tag(), _eval_tag(), _eval_tag()]
    assert len(set(tags)) == 3
    first, second = (EmbeddingTable(f"item_{t}", 4, 0.1, 1, 16) for t in tags[1:])
    first.params.upsert(tf.constant([5], tf.int64), tf.ones([1, 4]))
    assert first.size() == 1 and second.size() == 0
