"""The paired signal's served side (model.trainer.guard_served): the delta publisher's state,
composed as a serving worker composes it, scores the guard's rows (keys only) exactly as
serving's artifact scores the same users and histories by their ids."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from model.delta import compose, decode
from model.evaluation.synthetic import SyntheticConfig, SyntheticStream
from model.trainer.guard_served import ServedView
from model.trainer.rolling import ScoredRows
from model.trainer.samples import KeyCache, to_batch
from tests.unit.model.delta.test_delta import HISTORY, shared_lineage


def _rows(n: int) -> tuple[ScoredRows, list]:
    stream = SyntheticStream(SyntheticConfig(users=400, items=300, clusters=8,
                                             history_len=HISTORY, seed=5))
    samples = stream.take(n)
    batch = to_batch(samples, HISTORY, KeyCache())
    rows = ScoredRows(np.zeros(n), np.zeros(n, np.int64), 300, batch.user_keys,
                      batch.item_keys, batch.history)
    return rows, samples


def test_served_ranks_are_serving_own_ranking_of_the_same_rows() -> None:
    run, records = shared_lineage()
    state = run.builder.mirror
    assert state is not None
    publisher = SimpleNamespace(builder=run.builder, applied=decode(records[-1]))
    view = ServedView(publisher, k=10, every=1)
    rows, samples = _rows(256)
    ranks, hits = view.ranks(rows), view.hits(rows)
    assert ranks is not None and hits is not None and hits.shape == (256,)
    art = compose(state)  # what a serving worker holds after the same deltas
    scores = art.scores([s.user_id for s in samples], [list(s.history) for s in samples])
    expected = []
    for col, s in enumerate(samples):
        row = art.item_index.get(s.item_id)
        expected.append(-1 if row is None else int((scores[:, col] > scores[row, col]).sum()))
    assert ranks.tolist() == expected
    assert hits.tolist() == [float(0 <= e < 10) for e in expected]
    assert 0 < hits.sum() < 256  # a ranking, not a constant
    # composed once per published state: the same state again reuses its artifact
    first = view.artifact()
    assert first is not None and view.artifact() is not None
    assert view.artifact()[1] is first[1]  # type: ignore[index]


def test_nothing_published_no_served_hits() -> None:
    publisher = SimpleNamespace(builder=SimpleNamespace(mirror=None), applied=None)
    rows, _ = _rows(8)
    assert ServedView(publisher).hits(rows) is None
    assert ServedView(publisher).ranks(rows) is None


def test_every_nth_head_scored() -> None:
    run, records = shared_lineage()
    publisher = SimpleNamespace(builder=run.builder, applied=decode(records[-1]))
    view = ServedView(publisher, every=3)
    rows, _ = _rows(16)
    scored = [view.ranks(rows) is not None for _ in range(7)]
    assert scored == [True, False, False, True, False, False, True]
    full = ServedView(publisher, every=1).ranks(rows)
    again = view.ranks(rows), view.ranks(rows), view.ranks(rows)
    assert again[0] is None and again[1] is None and again[2] is not None
    assert again[2].tolist() == full.tolist()  # type: ignore[union-attr]
