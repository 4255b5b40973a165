"""``streamrec evaluate --row-codec``: the served rows follow a real trainer through the delta
stream in each codec (float32 bit for bit, a lossy codec exactly as decoded), and the served
learner ranks as serving does."""

from __future__ import annotations

import numpy as np
import pytest

from model.delta import decode_rows, encode_rows
from model.evaluation.replay import Positive
from model.evaluation.served import ServedLearner, ServedRows
from model.evaluation.synthetic import SyntheticConfig, SyntheticStream
from model.towers.two_tower import ModelConfig
from model.trainer.samples import KeyCache, to_batch
from model.trainer.trainer import Trainer, TrainOptions
from serving.retrieval import rank_with_model

HISTORY = 10
BATCH = 64


def _by_key(keys: np.ndarray, rows: np.ndarray) -> dict[int, np.ndarray]:
    return dict(zip(keys.tolist(), rows, strict=True))


def test_served_rows_pass_through_the_codec_and_rank_as_serving_does() -> None:
    stream = SyntheticStream(SyntheticConfig(users=150, items=120, clusters=6,
                                             history_len=HISTORY, seed=2))
    samples = iter(stream.take(30 * BATCH))
    trainer = Trainer(ModelConfig(history_len=HISTORY), TrainOptions(batch_size=BATCH, eval_rows=0),
                      tag="served")
    keys = KeyCache()
    item_ids = [stream.item_id(j) for j in range(120)]
    rows = ServedRows(trainer, item_ids, ["float32", "int8"])

    def train(batches: int) -> list[object]:
        last: list[object] = []
        for _ in range(batches):
            last = [next(samples) for _ in range(BATCH)]
            trainer.fit_batch(to_batch(last, HISTORY, keys))
        return last

    train(6)
    first = [object()]
    rows.artifact("float32", first)  # the lineage's snapshot
    assert rows.deltas == 0 and rows.artifact("int8", first) is not None
    batch = train(4)
    f32, i8 = rows.artifact("float32", batch), rows.artifact("int8", batch)
    assert rows.deltas == 1 and rows.bytes["int8"] < rows.bytes["float32"]

    model = trainer.model
    for table, name in ((model.users, "user"), (model.items, "item_hist")):
        tkeys, trows = model.known_rows(table)
        exact = _by_key(tkeys, trows)
        served = _by_key(getattr(f32, f"{name}_keys"), getattr(f32, f"{name}_rows"))
        assert served.keys() == exact.keys()
        for k, row in exact.items():  # float32: the trainer's rows bit for bit
            np.testing.assert_array_equal(served[k], row)
        lossy = _by_key(getattr(i8, f"{name}_keys"), getattr(i8, f"{name}_rows"))
        moved = [k for k in exact if not np.array_equal(lossy[k], exact[k])]
        assert moved, "no row went through the int8 codec"
        want = decode_rows(encode_rows(np.stack([exact[k] for k in moved]), "int8"), "int8")
        np.testing.assert_array_equal(np.stack([lossy[k] for k in moved]), want)

    index = {item: j for j, item in enumerate(item_ids)}
    positives = [Positive(sample=s, user=0, item=index[s.item_id], seen=0, n_items=len(item_ids))
                 for s in batch[:8]]
    learner = ServedLearner(rows, "float32", index)
    scores = learner.scores(positives, len(item_ids))
    assert scores.shape == (8, len(item_ids))
    in_catalog = np.isin(item_ids, f32.item_ids.astype(str))
    assert np.isfinite(scores[:, in_catalog]).all() and np.isneginf(scores[:, ~in_catalog]).all()
    ranked = rank_with_model(f32, [p.sample.user_id for p in positives],
                             [list(p.sample.history) for p in positives], [10] * 8, [False] * 8)
    for row, answer in zip(scores, ranked, strict=True):
        top = np.argsort(-row, kind="stable")[:10]
        assert [item_ids[j] for j in top] == [s.item_id for s in answer]
        np.testing.assert_allclose(row[top], [s.score for s in answer], rtol=0, atol=0)
    with pytest.raises(ValueError, match="unknown row codec"):
        ServedRows(trainer, item_ids, ["float8"])
