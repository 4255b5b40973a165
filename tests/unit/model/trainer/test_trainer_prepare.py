"""Chunks prepared ahead train exactly as chunks prepared in turn (``model.trainer.prepare``,
``Trainer.prepare``, ``LoopOptions.prepare_ahead``)."""

from __future__ import annotations

import json
import time
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import pytest

from model.evaluation.synthetic import SyntheticConfig, SyntheticStream
from model.towers.two_tower import DEFAULT_KEY, ModelConfig
from model.trainer.dedupe import id_hashes
from model.trainer.fetch_thread import ChunkFetcher, KafkaPythonSource
from model.trainer.loop_options import LoopOptions
from model.trainer.prepare import Preparer
from model.trainer.samples import KeyCache, encode_sample, to_batch
from model.trainer.service import TrainerService
from model.trainer.trainer import Batch, Trainer, TrainOptions

HIST = 5
CFG = ModelConfig(embedding_dim=8, user_layers=(16, 8), history_len=HIST)
#: Fewer negatives than items, so that every draw uses the sampler's random generator;
#: partial batches (48 < 64) get three passes, each with its own draw.
OPTS = TrainOptions(batch_size=64, eval_rows=16, eval_every=1, eval_refresh_steps=2,
                    learning_rate=0.3, sampled_negatives=8, spare_epochs=3)


def _batches(sizes: list[int], seed: int = 5) -> list[Batch]:
    stream = SyntheticStream(SyntheticConfig(users=60, items=40, clusters=4, history_len=HIST, seed=seed))
    keys = KeyCache()
    return [to_batch(stream.take(n), HIST, keys) for n in sizes]


def _state(trainer: Trainer) -> dict[str, Any]:
    """Everything the trainers learn, comparable with ``==`` after ``_same``."""
    out: dict[str, Any] = {}
    for name, table in (("user", trainer.model.users), ("item", trainer.model.items)):
        keys, rows = table.params.export()
        order = np.argsort(keys.numpy())
        out[name] = (keys.numpy()[order], rows.numpy()[order])
    out["dense"] = [v.numpy() for v in trainer.model.dense_variables]
    out["step"] = int(trainer.step.numpy())
    out["quality"] = trainer.quality()
    out["mix"] = trainer.mixer.as_dict()
    out["negatives"] = trainer.negatives.keys.copy()
    return out


def _same(a: dict[str, Any], b: dict[str, Any]) -> None:
    for name in ("user", "item"):
        np.testing.assert_array_equal(a[name][0], b[name][0])
        np.testing.assert_array_equal(a[name][1], b[name][1])  # float equality, bit for bit
    for va, vb in zip(a["dense"], b["dense"], strict=True):
        np.testing.assert_array_equal(va, vb)
    np.testing.assert_array_equal(a["negatives"], b["negatives"])
    assert (a["step"], a["quality"], a["mix"]) == (b["step"], b["quality"], b["mix"])


@pytest.mark.parametrize("evict", [0, 3])
def test_batches_prepared_one_ahead_train_as_in_turn(evict: int) -> None:
    """Each batch prepared while the one before it has not trained yet (as the preparing
    thread does) trains the same rows, weights, figures and sampler state, bit for bit, as
    batches trained in turn: the negatives of each pass are drawn in training order (with
    eviction on they are drawn at the step, after the eviction that may reset the sampler)."""
    batches = _batches([64, 48, 64, 64, 20, 64])
    opts = replace(OPTS, evict_every_steps=evict, max_item_rows=30)
    turn = Trainer(CFG, opts, tag=f"turn{evict}")
    ahead = Trainer(CFG, opts, tag=f"ahead{evict}")
    for b in batches:
        turn.fit_batch(b)
    nxt = ahead.prepare(batches[0])
    for i, b in enumerate(batches):
        now = nxt
        if i + 1 < len(batches):
            nxt = ahead.prepare(batches[i + 1])
        assert now is not None and (now.negatives is None) == bool(evict)
        ahead.fit_batch(b, now)
    a, b_ = _state(turn), _state(ahead)
    _same(a, b_)
    assert a["step"] == 4 * 1 + 2 * 3  # the partial batches had three passes each
    assert a["quality"]["evaluated_samples"] == 6 * 16
    with pytest.raises(ValueError, match="another batch"):
        ahead.fit_batch(batches[0], ahead.prepare(batches[1]))


# -- the service: a whole run with the preparing thread against one without -----------------


class _TP(NamedTuple):
    topic: str
    partition: int


class _Record(NamedTuple):
    topic: str
    partition: int
    offset: int
    key: bytes
    value: bytes


class _OnePoll:
    """A consumer whose first poll returns every record (so the chunks are cut the same way
    in every run), then nothing."""

    def __init__(self, records: list[_Record]) -> None:
        self.polls = [{_TP("t.samples", 0): [r for r in records if r.partition == 0],
                       _TP("t.samples", 1): [r for r in records if r.partition == 1]}]

    def poll(self, timeout_ms: int) -> dict[_TP, list[_Record]]:
        return self.polls.pop() if self.polls else {}


def _records() -> tuple[list[_Record], int]:
    """Samples over two partitions with repeats of earlier sample ids (dropped by the
    dedupe), and the number of distinct samples."""
    stream = SyntheticStream(SyntheticConfig(users=60, items=40, clusters=4, history_len=HIST, seed=9))
    fresh = stream.take(700)
    # at least once: repeats, far and near (the stream ends with a fresh sample)
    samples = fresh[:400] + fresh[100:130] + fresh[400:690] + fresh[650:660] + fresh[690:]
    offsets = [0, 0]
    out = []
    for i, s in enumerate(samples):
        p = i % 2
        out.append(_Record("t.samples", p, offsets[p], s.user_id.encode(), encode_sample(s)))
        offsets[p] += 1
    return out, 700


def _run(tmp_path: Path, prepare_ahead: bool, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    from streamrec.settings import load_settings

    base = load_settings()
    root = tmp_path / ("ahead" if prepare_ahead else "turn")
    settings = base.model_copy(update={
        "kafka": base.kafka.model_copy(update={"samples_topic": "t.samples"}),
        "trainer": base.trainer.model_copy(update={
            "registry_dir": root / "models", "checkpoint_dir": root / "ckpt"}),
    })
    records, distinct = _records()
    loop = LoopOptions(export_every_s=1e9, export_every_samples=150, max_samples=distinct,
                       delta_every_s=0.0, fetch_process=False, prepare_ahead=prepare_ahead)
    trainer = Trainer(CFG, replace(OPTS, batch_size=32), tag=f"svc{int(prepare_ahead)}")
    at = datetime(2026, 1, 2, tzinfo=UTC)
    service = TrainerService(settings, trainer, loop, clock=lambda: at)
    fetcher = ChunkFetcher(KafkaPythonSource(_OnePoll(records)), 32, HIST, 0.05, 1, time.monotonic)
    monkeypatch.setattr(service, "_fetcher", lambda: fetcher)
    saved: list[tuple[dict[str, Any], np.ndarray]] = []
    save = service.checkpoints.save

    def recording(state: dict[str, Any], arrays: dict[str, np.ndarray]) -> Path:
        saved.append((json.loads(json.dumps(state)), arrays["trained_sample_ids"]))
        return save(state, arrays)

    monkeypatch.setattr(service.checkpoints, "save", recording)
    final = service.run()
    # each checkpoint holds the ids of exactly the samples its offsets cover
    by_offset = {(r.partition, r.offset): json.loads(r.value)["sample_id"] for r in records}
    for state, ids in saved:
        covered = {sid for (p, o), sid in by_offset.items() if o < state["offsets"].get(f"t.samples:{p}", 0)}
        np.testing.assert_array_equal(ids, np.sort(id_hashes(sorted(covered))))
        assert state["samples_trained"] == len(covered)
    return {"state": final.to_json(), "checkpoints": saved, "model": _state(trainer),
            "trained": service.trained_ids.to_array()}


def test_the_service_trains_the_same_with_chunks_prepared_ahead(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run with the preparing thread trains the same samples into the same model as one
    without (digest, offsets, rows and weights bit for bit, figures), its duplicates are
    dropped the same, and every checkpoint, including those taken while chunks were admitted
    ahead of the training, holds the ids of exactly the samples its offsets cover."""
    ahead_counts: list[int] = []
    trained_ids = Preparer.trained_ids

    def counting(self: Preparer) -> np.ndarray:
        ahead_counts.append(len(self._ahead))
        return trained_ids(self)

    monkeypatch.setattr(Preparer, "trained_ids", counting)
    turn = _run(tmp_path, False, monkeypatch)
    ahead = _run(tmp_path, True, monkeypatch)
    assert ahead["state"] == turn["state"]
    state = turn["state"]
    assert state["samples_trained"] == 700 and state["duplicates_dropped"] == 40
    assert len(turn["checkpoints"]) == len(ahead["checkpoints"]) >= 4
    for (sa, ia), (sb, ib) in zip(turn["checkpoints"], ahead["checkpoints"], strict=True):
        assert sa == sb
        np.testing.assert_array_equal(ia, ib)
    _same(turn["model"], ahead["model"])
    np.testing.assert_array_equal(turn["trained"], ahead["trained"])
    assert any(ahead_counts), "no checkpoint was taken with chunks admitted ahead"
    assert DEFAULT_KEY not in ahead["model"]["negatives"]
