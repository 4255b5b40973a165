"""The session-kNN index on the delta stream: the snapshot carries it whole, each delta the
positives it learnt, and a state that applied them holds the trainer's index array for array
and serves the trainer's session-kNN scores; a lineage without the part is as before.

The lineage is ``test_delta``'s (one traced trainer per session), whose index evicts."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from model.delta import (
    DeltaError,
    ModelState,
    apply,
    compose,
    decode,
    encode,
    from_snapshot,
    state_checksum,
)
from model.delta.wire import POSITIVES, pack, unpack
from model.evaluation.synthetic import SyntheticConfig, SyntheticStream
from model.trainer.export import artifact_arrays
from model.trainer.samples import KeyCache, to_batch
from tests.unit.model.delta.test_delta import HISTORY, Run, shared_lineage

SESSION_META = ("sessions_weight",)


@pytest.fixture(scope="module")
def lineage() -> tuple[Run, list[bytes]]:
    return shared_lineage()


def _served(records: list[bytes]) -> ModelState:
    """The state serving holds after the lineage's records."""
    state = from_snapshot(decode(records[0]))
    for record in records[1:]:
        state = apply(state, decode(record))
    return state


def _assert_same_index(mine: dict[str, np.ndarray], theirs: dict[str, np.ndarray]) -> None:
    assert mine.keys() == theirs.keys()
    for name in theirs:
        assert mine[name].dtype == theirs[name].dtype, name
        np.testing.assert_array_equal(mine[name], theirs[name], err_msg=name)


def test_the_records_carry_the_index_then_its_positives(lineage: tuple[Run, list[bytes]]) -> None:
    run, records = lineage
    snap, *deltas = (decode(r) for r in records)
    index = run.trainer.sessions
    assert index is not None
    assert snap.constants is not None and snap.constants.sknn == {
        "sample_size": 300, "window": run.trainer.config.sknn_window, "k": 75,
        "max_sessions": 150}
    assert snap.sessions is not None and snap.sessions_positives is None
    assert snap.sessions["sessions_codes"].size > 0
    for d in deltas:
        assert d.sessions is None and d.sessions_positives is not None and d.sessions_weight > 0
        users, items, calls = d.sessions_positives
        assert users.size == items.size == calls.sum() and calls.size >= 1  # calls made
    # the wire keeps every array and the weight as they were
    for record in records:
        d = decode(record)
        again = decode(encode(d, "int8", compress=True))
        assert again.constants == d.constants and again.sessions_weight == d.sessions_weight
        if d.sessions is not None:
            assert again.sessions is not None
            _assert_same_index(dict(again.sessions), dict(d.sessions))
        if d.sessions_positives is not None:
            assert again.sessions_positives is not None
            for x, y in zip(again.sessions_positives, d.sessions_positives, strict=True):
                assert x.dtype == np.int64 and np.array_equal(x, y)


def test_the_applied_index_is_the_trainers_and_scores_as_it_does(
    lineage: tuple[Run, list[bytes]],
) -> None:
    run, records = lineage
    trainer = run.trainer
    index = trainer.sessions
    assert index is not None
    # the histories beyond max_sessions went in the trainer, and so in the replay
    assert index.sessions <= index.EVICT_SLACK * 150 and len(index.users.keys) < 400
    state = _served(records)
    mirror = run.builder.mirror
    assert mirror is not None and state.sessions is not None and mirror.sessions is not None
    _assert_same_index(state.sessions.to_arrays(), index.to_arrays())
    _assert_same_index(mirror.sessions.to_arrays(), index.to_arrays())
    assert state.sessions_weight == trainer.sknn_weight() > 0
    assert state_checksum(state) == state_checksum(mirror) == decode(records[-1]).state_checksum
    # the full version at this point holds the same index, its items at the same item ids
    full = artifact_arrays(trainer, run.item_ids)
    mine = state.artifact_arrays()
    assert mine["sessions_params"] == full["sessions_params"]
    _assert_same_index(mine["sessions"][0], full["sessions"][0])

    def ids_of(rows: np.ndarray, ids: np.ndarray) -> list[str | None]:
        return [None if r < 0 else str(ids[r]) for r in rows.tolist()]

    assert (ids_of(mine["sessions"][1], mine["item_ids"])
            == ids_of(full["sessions"][1], np.asarray(full["item_ids"])))
    # the session part served from the state is the trainer's
    stream = SyntheticStream(SyntheticConfig(users=400, items=300, clusters=8,
                                             history_len=HISTORY, seed=5))
    batch = to_batch(stream.take(3000)[-64:], HISTORY, KeyCache())  # rows with histories
    art = compose(state)
    assert art.manifest["sessions"]["weight"] == trainer.sknn_weight()
    expected = trainer.session_scores(batch.user_keys, batch.history, state.item_keys)
    served = np.zeros_like(expected)
    histories = [h[h != 0] for h in batch.history]
    for r, (rows, added) in enumerate(art.session_scores_of_keys(batch.user_keys, histories)):
        served[r, rows] = added
    assert np.count_nonzero(expected) > 100
    np.testing.assert_array_equal(served, expected)


def test_apply_learns_on_a_copy(lineage: tuple[Run, list[bytes]]) -> None:
    _, records = lineage
    s0 = from_snapshot(decode(records[0]))
    assert s0.sessions is not None
    before = {k: v.copy() for k, v in s0.sessions.to_arrays().items()}
    s1 = apply(s0, decode(records[1]))
    assert s1.sessions is not None and s1.sessions is not s0.sessions
    _assert_same_index(s0.sessions.to_arrays(), before)
    assert int(s1.sessions.to_arrays()["sessions_learned"][0]) > int(before["sessions_learned"][0])
    # a delta without positives keeps the index it has (shared: never written)
    empty = tuple(np.zeros(0, np.int64) for _ in range(3))
    s2 = apply(s1, replace(decode(records[2]), sessions_positives=empty))
    assert s2.sessions is s1.sessions


def test_a_served_weight_of_zero_keeps_the_index_but_not_the_part(
    lineage: tuple[Run, list[bytes]],
) -> None:
    _, records = lineage
    state = from_snapshot(decode(records[0]))
    off = replace(state, sessions_weight=0.0)
    art = compose(off)
    assert art.sessions is None and art.sessions_rows is None and "sessions" not in art.manifest
    assert "sessions" not in off.artifact_arrays()
    assert state_checksum(off) != state_checksum(state)
    on = compose(state)
    assert on.sessions is state.sessions and on.sessions_rows is not None
    assert not on.sessions_rows.flags.writeable
    # the manifest entry is the one a full version holds (model.artifact.sessions)
    assert on.manifest["sessions"]["max_sessions"] == 150
    assert on.manifest["sessions"]["weight"] == state.sessions_weight


def _without_sessions(record: bytes) -> bytes:
    """``record`` as a writer without the session-kNN part writes it."""
    meta, arrays = unpack(record)
    for name in SESSION_META:
        meta.pop(name, None)
    if meta.get("constants"):
        meta["constants"] = {k: v for k, v in meta["constants"].items() if k != "sknn"}
    return pack(meta, {k: v for k, v in arrays.items() if not k.startswith("sessions_")})


def test_a_lineage_without_the_part_is_as_before(lineage: tuple[Run, list[bytes]]) -> None:
    _, records = lineage
    plain = [_without_sessions(r) for r in records]
    snap = decode(plain[0])
    assert snap.constants is not None and snap.constants.sknn is None
    assert not snap.carries_sessions and snap.sessions_weight == 0.0
    assert "sknn" not in snap.constants.to_json()
    again, _ = unpack(encode(snap))  # written as before the part: no new keys
    assert "sknn" not in again["constants"] and "sessions_weight" not in again
    state = _served(plain)
    assert state.sessions is None and state.sessions_weight == 0.0
    art = compose(state)
    assert art.sessions is None and "sessions" not in art.manifest
    assert "sessions" not in state.artifact_arrays()
    # the checksum reads no part of what the lineage lacks
    full = _served(records)
    assert state_checksum(state) == state_checksum(replace(full, sessions=None,
                                                           sessions_weight=0.0))
    with pytest.raises(DeltaError, match="without the index"):
        apply(from_snapshot(snap), decode(records[1]))
    with pytest.raises(DeltaError, match="without one"):
        from_snapshot(replace(decode(records[0]), constants=snap.constants))


def test_garbled_session_records_are_refused(lineage: tuple[Run, list[bytes]]) -> None:
    _, records = lineage
    meta, arrays = unpack(records[0])
    with pytest.raises(DeltaError, match="every one"):
        decode(pack(meta, {k: v for k, v in arrays.items() if k != "sessions_codes"}))
    bad = {**meta, "constants": {**meta["constants"], "sknn": {"window": 3}}}
    with pytest.raises(DeltaError, match="sknn"):
        decode(pack(bad, arrays))
    meta, arrays = unpack(records[1])
    users, items, calls = (arrays[n] for n in POSITIVES)
    with pytest.raises(DeltaError, match="add up"):
        decode(pack(meta, {**arrays, POSITIVES[2]: calls + 1}))
    with pytest.raises(DeltaError, match="add up"):
        decode(pack(meta, {**arrays, POSITIVES[1]: items[:-1]}))
    with pytest.raises(DeltaError, match="index or positives"):
        decode(pack(meta, {k: v for k, v in arrays.items() if k not in POSITIVES}))
