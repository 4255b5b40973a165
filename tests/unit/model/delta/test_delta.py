"""Deltas: codecs, the record's checksum, apply's sequence rules, and a lineage of deltas
from a real trainer equal to a full export of it (rows bit for bit)."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta
from functools import cache

import numpy as np
import pytest

from model.delta import (
    CODECS,
    DeltaError,
    DeltaGap,
    UnknownBase,
    apply,
    compose,
    decode,
    decode_rows,
    encode,
    encode_rows,
    from_snapshot,
    state_checksum,
)
from model.delta.wire import pack, unpack
from model.evaluation.synthetic import SyntheticConfig, SyntheticStream
from model.towers.two_tower import ModelConfig
from model.trainer.deltas import DeltaBuilder
from model.trainer.export import artifact_arrays
from model.trainer.samples import KeyCache, to_batch
from model.trainer.trainer import Trainer, TrainOptions

HISTORY = 20
BATCH = 128


# -- codecs and records ------------------------------------------------------------------------
@pytest.mark.parametrize("codec", CODECS)
def test_row_codecs_round_trip_within_their_precision(codec: str) -> None:
    rows = np.random.default_rng(0).normal(size=(50, 32)).astype(np.float32)
    rows[3] = 0.0
    back = decode_rows(encode_rows(rows, codec), codec)
    assert back.dtype == np.float32 and back.shape == rows.shape
    tol = {"float32": 0.0, "float16": 1e-3, "bfloat16": 8e-3, "int8": 8e-3}[codec]
    peak = np.abs(rows).max(axis=1, keepdims=True)
    assert np.all(np.abs(back - rows) <= tol * np.maximum(peak, 1e-12) + 1e-12)
    assert not np.any(back[3])


def test_bfloat16_rounds_to_nearest_even() -> None:
    x = np.array([[1.0 + 2**-8, 1.0 + 3 * 2**-8, -2.5]], np.float32)  # ties at bfloat16
    back = decode_rows(encode_rows(x, "bfloat16"), "bfloat16")
    assert back.tolist() == [[1.0, 1.0 + 4 * 2**-8, -2.5]]


@pytest.mark.parametrize("compress", [False, True])
def test_record_round_trip_and_every_flipped_byte_is_caught(compress: bool) -> None:
    arrays = {"a": np.arange(10, dtype=np.int64), "ids": np.array(["x", "yz"], np.str_)}
    record = pack({"seq": 3}, arrays, compress=compress)
    meta, back = unpack(record)
    assert meta == {"seq": 3}
    assert back["a"].tolist() == list(range(10)) and back["ids"].tolist() == ["x", "yz"]
    for at in range(0, len(record), max(1, len(record) // 40)):
        bad = bytearray(record)
        bad[at] ^= 0x10
        with pytest.raises(DeltaError):
            unpack(bytes(bad))


# -- a lineage from a real trainer ---------------------------------------------------------------
class Run:
    """A small trainer with eviction on (of rows, and of the session-kNN index's histories:
    400 users, 150 kept), trained batch by batch like the service does."""

    def __init__(self) -> None:
        stream = SyntheticStream(SyntheticConfig(users=400, items=300, clusters=8, history_len=HISTORY))
        self.samples = iter(stream.take(40 * BATCH))
        self.keys = KeyCache()
        self.trainer = Trainer(
            ModelConfig(history_len=HISTORY, sknn_weight=1.0, sknn_max_sessions=150,
                        rare_select=True),
            TrainOptions(batch_size=BATCH, eval_rows=32, eval_refresh_steps=3,
                         evict_every_steps=4, max_user_rows=250, max_item_rows=200),
            tag="delta",
        )
        self.item_ids: dict[int, str] = {}
        self.builder = DeltaBuilder(self.trainer, lambda: self.item_ids, checksums=True)

    def train(self, batches: int) -> None:
        for _ in range(batches):
            samples = [next(self.samples) for _ in range(BATCH)]
            batch = to_batch(samples, HISTORY, self.keys)
            self.trainer.fit_batch(batch)
            self.item_ids.update(zip(batch.item_keys.tolist(), [s.item_id for s in samples],
                                     strict=True))


#: Creation time of the lineage's snapshot.
CREATED = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)


@cache
def shared_lineage() -> tuple[Run, list[bytes]]:
    """One trainer's snapshot and three deltas (one trainer per session: TFRA table names)."""
    run = Run()
    run.train(6)
    meta = {"samples_trained": 6 * BATCH, "created_at": CREATED.isoformat()}
    records = [encode(run.builder.snapshot("v1", meta), compress=True)]
    for n in range(3):
        run.train(3 + n)
        at = (CREATED + timedelta(seconds=n + 1)).isoformat()
        records.append(encode(run.builder.delta({"offsets": {"samples:0": n}, "created_at": at})))
    return run, records


@pytest.fixture(scope="module")
def lineage() -> tuple[Run, list[bytes]]:
    return shared_lineage()


def _by_key(keys: np.ndarray, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    order = np.argsort(keys)
    return keys[order], rows[order]


def test_applied_deltas_equal_a_full_export(lineage: tuple[Run, list[bytes]]) -> None:
    run, records = lineage
    deltas = [decode(r) for r in records]
    assert sum(d.removed_users.size + d.removed_hist.size for d in deltas[1:]), "no eviction ran"
    assert any(d.new_item_keys.size for d in deltas[1:]), "no item joined after the snapshot"
    state = from_snapshot(deltas[0])
    for d in deltas[1:]:
        state = apply(state, d)
    # the state is as old as its newest delta (serving's lag), not as its snapshot
    assert state.created_at == (CREATED + timedelta(seconds=3)).isoformat()
    full = artifact_arrays(run.trainer, run.item_ids)
    mine = state.artifact_arrays()
    for name in ("user", "item_hist"):
        fk, fr = _by_key(full[f"{name}_keys"], full[f"{name}_rows"])
        mk, mr = _by_key(mine[f"{name}_keys"], mine[f"{name}_rows"])
        np.testing.assert_array_equal(mk, fk)
        np.testing.assert_array_equal(mr, fr)  # bit for bit
    np.testing.assert_array_equal(mine["default_user_row"], full["default_user_row"])
    for (w, b, act), (fw, fb, fact) in zip(mine["layers"], full["layers"], strict=True):
        np.testing.assert_array_equal(w, fw)
        np.testing.assert_array_equal(b, fb)
        assert act == fact
    f_order, m_order = np.argsort(full["item_ids"]), np.argsort(mine["item_ids"])
    assert list(np.asarray(full["item_ids"])[f_order]) == list(mine["item_ids"][m_order])
    # the towers' part is the same arithmetic; the prior's log q is float64 here, float32 in TF
    np.testing.assert_allclose(mine["item_vectors"][m_order], full["item_vectors"][f_order],
                               rtol=1e-5, atol=1e-5)
    assert full["covisit_params"]["weight"] == state.weights[2]

    def triples(csr: tuple[np.ndarray, np.ndarray, np.ndarray], ids: np.ndarray) -> dict:
        indptr, nb, w = csr
        out = {}
        for r in range(len(ids)):
            for j in range(indptr[r], indptr[r + 1]):
                out[(str(ids[r]), str(ids[nb[j]]))] = float(w[j])
        return out

    ft, mt = triples(full["covisit"], np.asarray(full["item_ids"])), triples(mine["covisit"], mine["item_ids"])
    assert ft.keys() == mt.keys() and ft
    np.testing.assert_allclose([mt[k] for k in ft], list(ft.values()), rtol=1e-6)
    assert state_checksum(state) == deltas[-1].state_checksum
    assert mine["cold_start"] == full["cold_start"] == state.cold_start


def test_cold_start_travels_with_the_deltas_to_the_served_score(
    lineage: tuple[Run, list[bytes]],
) -> None:
    """A trainer whose prior alone hits more at rows with no history publishes that choice;
    serving's state, its checksum, its shared slot and its artifact carry it."""
    run, records = lineage
    state = from_snapshot(decode(records[0]))
    mix_sum = state_checksum(state)
    assert state.cold_start == "mix" and compose(state).cold_start == "mix"
    cold = replace(decode(records[0]), cold_start="prior")
    again = decode(encode(cold))
    assert again.cold_start == "prior"
    state = from_snapshot(again)
    assert state.cold_start == "prior" and state_checksum(state) != mix_sum
    art = compose(state)
    assert art.cold_start == "prior" and art.manifest["cold_start"] == "prior"
    scores = art.scores(["u-nobody", "u-nobody"], [[], list(art.item_ids[:2])])
    np.testing.assert_array_equal(scores[:, 0], art.item_vectors[:, -1])
    assert not np.array_equal(scores[:, 1], art.item_vectors[:, -1])
    nxt = apply(state, replace(decode(records[1]), cold_start="mix"))
    assert nxt.cold_start == "mix" and compose(nxt).cold_start == "mix"
    with pytest.raises(DeltaError, match="cold_start"):
        decode(encode(replace(cold, cold_start="trending")))
    # all-time popularity: the counts travel with the prior's buckets
    popular = from_snapshot(decode(encode(replace(decode(records[0]), cold_start="popular"))))
    for record in records[1:]:
        popular = apply(popular, replace(decode(record), cold_start="popular"))
    art = compose(popular)
    assert art.cold_start == "popular" and state_checksum(popular) != state_checksum(
        replace(popular, cold_start="mix"))
    counts = run.trainer.cold.counts
    np.testing.assert_array_equal(popular.prior_count_of(popular.item_keys),
                                  counts.of_buckets(counts.bucket(popular.item_keys)))
    assert popular.prior_count.max() > 1
    scores = art.scores(["u-nobody"], [[]])
    np.testing.assert_array_equal(scores[:, 0], art.item_popularity)
    # a record written before the counts travelled decodes with zeros; a garbled one fails
    meta, arrays = unpack(records[1])
    older = decode(pack(meta, {k: v for k, v in arrays.items() if k != "prior_count"}))
    assert older.prior_count.shape == older.prior_buckets.shape and not older.prior_count.any()
    with pytest.raises(DeltaError, match="prior_count"):
        decode(pack(meta, {**arrays, "prior_count": arrays["prior_count"][:-1]}))
    # the live head counted its rows with no history (a new user's first event)
    assert run.trainer.cold.rows > 0
    # the trainer's own choice reaches its deltas and its versions
    hits = run.trainer.cold.hits.copy()
    try:
        run.trainer.cold.hits[:] = (0, 1, 0)
        assert run.builder._common()["cold_start"] == "prior"
        assert artifact_arrays(run.trainer, run.item_ids)["cold_start"] == "prior"
        run.trainer.cold.hits[:] = (0, 1, 2)
        assert run.builder._common()["cold_start"] == "popular"
        full = artifact_arrays(run.trainer, run.item_ids)
        assert full["cold_start"] == "popular"
        by_id = dict(zip(art.item_ids.tolist(), art.item_popularity.tolist(), strict=True))
        np.testing.assert_array_equal(  # the version's scores are the lineage's
            full["item_popularity"], [by_id[str(i)] for i in full["item_ids"]])
    finally:
        run.trainer.cold.hits[:] = hits


def test_composed_artifact_scores_like_its_state(lineage: tuple[Run, list[bytes]]) -> None:
    run, records = lineage
    state = from_snapshot(decode(records[0]))
    art = compose(state)
    users = ["u-nobody", *[str(i) for i in art.item_ids[:3]]]
    vecs = art.user_vectors(users, [list(art.item_ids[:5])] * len(users))
    scores = vecs @ art.item_vectors.T
    assert scores.shape == (len(users), len(art.item_ids)) and np.isfinite(scores).all()
    assert art.covisit_scores([list(art.item_ids[:5])])[0][0].size > 0
    assert art.manifest["delta_seq"] == 0 and art.version == "v1"
    assert not art.item_vectors.flags.writeable


def test_apply_is_idempotent_by_sequence_and_detects_gaps(lineage: tuple[Run, list[bytes]]) -> None:
    _, records = lineage
    snap, d1, d2, _ = (decode(r) for r in records)
    s0 = from_snapshot(snap)
    s1 = apply(s0, d1)
    assert apply(s1, d1) is s1 and apply(s1, snap) is s1
    with pytest.raises(DeltaGap):
        apply(s0, d2)
    with pytest.raises(UnknownBase):
        apply(s1, replace(d2, base_version="v0"))
    before = s0.user_rows.copy()
    apply(s0, d1)
    np.testing.assert_array_equal(s0.user_rows, before)  # copy on write: s0 is untouched
    assert state_checksum(apply(s1, d2)) == d2.state_checksum


def test_compressed_rows_apply_with_bounded_error(lineage: tuple[Run, list[bytes]]) -> None:
    _, records = lineage
    delta = decode(records[0])
    exact = from_snapshot(delta)
    raw = len(encode(delta))
    n_rows = delta.user_rows.shape[0] + delta.hist_rows.shape[0]
    row_bytes = 4 * (delta.user_rows.size + delta.hist_rows.size)
    for codec, width in (("float16", 2), ("bfloat16", 2), ("int8", 1)):
        record = encode(delta, codec)
        scales = 4 * n_rows if codec == "int8" else 0
        # the rows shrink to ``width`` bytes a value; the header grows by its array specs
        assert len(record) <= raw - row_bytes * (4 - width) // 4 + scales + 400, codec
        approx = from_snapshot(decode(record))
        peak = np.abs(exact.user_rows).max()
        np.testing.assert_allclose(approx.user_rows, exact.user_rows, atol=0.01 * peak)
        assert approx.user_keys.tolist() == exact.user_keys.tolist()


def test_compose_reuses_the_catalog_index_only_when_it_is_still_right(
    lineage: tuple[Run, list[bytes]],
) -> None:
    _, records = lineage
    s0 = from_snapshot(decode(records[0]))
    a0 = compose(s0)
    same = compose(replace(s0, seq=5), a0)
    assert same.item_index is a0.item_index
    grown = replace(s0, item_keys=s0.item_keys[:-2], item_ids=s0.item_ids[:-2])
    a_small = compose(grown)
    a_big = compose(s0, a_small)
    assert dict(a_big.item_index) == dict(a0.item_index)
    shuffled = replace(s0, item_ids=s0.item_ids[::-1].copy(), item_keys=s0.item_keys[::-1].copy())
    assert dict(compose(shuffled, a0).item_index) == {
        str(i): r for r, i in enumerate(shuffled.item_ids.tolist())}


class _Builder:
    """A stand-in DeltaBuilder replaying a recorded lineage (its mirror as the real one's)."""

    def __init__(self, deltas: list) -> None:
        self.mirror = from_snapshot(deltas[0])
        self.rest = list(deltas[1:])

    @property
    def pending(self) -> bool:
        return bool(self.rest)

    def delta(self, meta: dict) -> object:
        d = self.rest.pop(0)
        self.mirror = apply(self.mirror, d)
        return d


class _Producer:
    def __init__(self) -> None:
        self.sent: list[bytes] = []

    def send(self, topic: str, key: bytes, value: bytes) -> None:
        self.sent.append(value)


@pytest.mark.parametrize("codec", CODECS)
def test_the_published_checksum_is_the_state_serving_receives_in_any_codec(
    lineage: tuple[Run, list[bytes]], codec: str,
) -> None:
    from model.trainer.deltas import DeltaPublisher

    _, records = lineage
    deltas = [decode(r) for r in records]
    raw = from_snapshot(deltas[0])
    for d in deltas[1:]:
        raw = apply(raw, d)
    producer = _Producer()
    publisher = DeltaPublisher(_Builder(deltas), producer, "t", "m", codec)  # type: ignore[arg-type]
    while publisher.publish({}) is not None:
        pass
    served = from_snapshot(deltas[0])  # serving: the snapshot, then the records as sent
    for record in producer.sent:
        served = apply(served, decode(record))
    assert len(producer.sent) == len(deltas) - 1
    assert publisher.status(checksum=True)["state_checksum"] == state_checksum(served)
    # float32 is the trainer's state itself; a lossy codec's is not
    assert (state_checksum(served) == state_checksum(raw)) == (codec == "float32")


def test_pairs_gone_and_moved_by_their_definition() -> None:
    """``_diff_pairs`` against its definition with sets: a pair is new or moved if its code
    is new or its value moved beyond the tolerance; gone if its code is no longer there."""
    from model.trainer.deltas import PAIR_RTOL, _diff_pairs

    rng = np.random.default_rng(7)
    for trial in range(30):
        old = np.unique(rng.integers(0, 400, rng.integers(0, 60)))
        now = np.unique(np.concatenate([rng.choice(old, old.size // 2, replace=False)
                                        if old.size else old.astype(np.int64),
                                        rng.integers(0, 400, rng.integers(0, 60))]))
        old_v = rng.random(old.size) + 0.5
        now_v = rng.random(now.size) + 0.5
        for i, c in enumerate(now):  # about half of the kept pairs keep their value
            j = np.searchsorted(old, c)
            if j < old.size and old[j] == c and rng.random() < 0.5:
                now_v[i] = old_v[j] * (1 + PAIR_RTOL / 10)
        changed, gone = _diff_pairs(old, old_v, now, now_v)
        was = dict(zip(old.tolist(), old_v.tolist(), strict=True))
        want = [c not in was or abs(v - was[c]) > PAIR_RTOL * abs(was[c])
                for c, v in zip(now.tolist(), now_v.tolist(), strict=True)]
        assert changed.tolist() == want, trial
        assert gone.tolist() == sorted(set(old.tolist()) - set(now.tolist())), trial


@pytest.mark.parametrize("n, m", [(0, 3), (5, 0), (40, 1), (40, 7), (40, 60), (41, 9)])
def test_insert_sorted_is_np_insert(n: int, m: int) -> None:
    from model.delta.apply import insert_sorted

    rng = np.random.default_rng(n * 100 + m)
    keys = np.sort(rng.choice(10_000, n, replace=False)).astype(np.int64)
    values = rng.standard_normal((n, 3) if n % 2 == 0 else n).astype(np.float32)
    new = np.sort(rng.choice(10_000, m)).astype(np.int64)  # repeats: equal positions
    at = np.searchsorted(keys, new)
    at[:1] = 0  # the front and the back too
    at[-1:] = n
    at = np.sort(at)
    new_values = rng.standard_normal((m, *values.shape[1:])).astype(np.float32)
    k, v = insert_sorted(keys, values, at, new, new_values)
    np.testing.assert_array_equal(k, np.insert(keys, at, new))
    np.testing.assert_array_equal(v, np.insert(values, at, new_values, axis=0))
