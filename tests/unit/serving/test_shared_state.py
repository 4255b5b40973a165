"""One composer per host (``serving.shared_state``, ``model.delta.shared``): a state written
to a file and mapped back is the same state and artifact bit for bit; a damaged file is
refused; a worker's follower serves exactly what the composer published, of ``CURRENT``
only; a slot in use is never rewritten; a killed composer is started again."""

from __future__ import annotations

import json
import os
import signal
from dataclasses import replace
from pathlib import Path
from typing import BinaryIO

import numpy as np
import pytest

from model.artifact.registry import Registry
from model.delta import Composer, DeltaError, apply, decode, encode, from_snapshot, state_checksum
from model.delta.shared import map_slot, mark_writing, read_shared, set_generation, write_shared
from serving.loader import ModelLoader
from serving.metrics import ServingMetrics
from serving.shared_state import (
    HELD,
    POINTER,
    ComposingFollower,
    Publisher,
    SharedFollower,
    held_slots,
)
from serving.workers import ComposerProcess
from streamrec.settings import load_settings
from tests.support import free_port, wait_until
from tests.unit.model.delta.test_delta import CREATED, shared_lineage
from tests.unit.model.delta.test_delta_compose import _assert_same
from tests.unit.model.delta.test_delta_groups import GROUPS
from tests.unit.model.delta.test_delta_rarity import ITEMS
from tests.unit.serving.test_serving_deltas import Seeks, _publish


@pytest.fixture(scope="module")
def records() -> list[bytes]:
    return shared_lineage()[1]


def _slot(path: Path) -> BinaryIO:
    path.touch()
    return path.open("r+b")


def test_a_shared_state_maps_back_bit_for_bit(records: list[bytes], tmp_path: Path) -> None:
    state = from_snapshot(decode(records[0]))
    composer = Composer()
    artifact, previous = composer.compose(state), None
    f = _slot(tmp_path / "slot-0.bin")
    seen = set()
    for n, record in enumerate([None, *records[1:]]):
        if record is not None:  # each cold start in turn: "popular" shares its scores too
            delta = replace(decode(record), cold_start=("mix", "prior", "popular")[n % 3],
                            history_groups=GROUPS if n % 2 else None,
                            item_groups=ITEMS if n % 2 == 0 else None)
            state = apply(state, delta)
            artifact = composer.compose(state, delta)
        mark_writing(f)
        size = write_shared(f, state, artifact, {"applied": n}, 100 + n)
        assert (tmp_path / "slot-0.bin").stat().st_size >= size
        mapped, served, status = read_shared(map_slot(f), 100 + n, previous)
        assert status == {"applied": n}
        assert state_checksum(mapped) == state_checksum(state)
        assert mapped.seq == state.seq and mapped.offsets == state.offsets
        _assert_same(served, artifact)
        assert served.cold_start == state.cold_start
        assert served.manifest.get("history_groups") == state.history_groups
        assert mapped.item_groups == state.item_groups
        assert (served.item_popularity is not None) == (state.cold_start == "popular")
        assert not served.user_rows.flags.writeable
        previous = served
        seen.add(state.cold_start)
    assert seen == {"mix", "prior", "popular"}


def test_a_slot_of_another_generation_or_damaged_is_refused(
    records: list[bytes], tmp_path: Path
) -> None:
    state = from_snapshot(decode(records[0]))
    f = _slot(tmp_path / "slot-0.bin")
    size = write_shared(f, state, Composer().compose(state), None, 7)
    with pytest.raises(DeltaError, match="generation 7, not 8"):
        read_shared(map_slot(f), 8)  # rewritten since the pointer named it
    mark_writing(f)
    with pytest.raises(DeltaError, match="generation 0, not 7"):
        read_shared(map_slot(f), 7)  # being written
    set_generation(f, 7)
    read_shared(map_slot(f), 7)
    data = (tmp_path / "slot-0.bin").read_bytes()
    short = tmp_path / "short.bin"
    assert len(data) > size  # a slot grows with room to spare
    short.write_bytes(data[: size - 100])
    with short.open("rb") as g, pytest.raises(DeltaError, match="its header says"):
        read_shared(map_slot(g), 7)
    short.write_bytes(b"XXXX" + data[4:])
    with short.open("rb") as g, pytest.raises(DeltaError, match="generation -1"):
        read_shared(map_slot(g), 7)
    with pytest.raises(DeltaError, match="positive"):
        write_shared(f, state, Composer().compose(state), None, 0)


def _composer(records: list[bytes], tmp_path: Path
              ) -> tuple[Registry, Path, ComposingFollower]:
    """A registry with version v1 (the lineage's snapshot) and a host composer of it."""
    registry = Registry(tmp_path / "models", "m")
    _publish(registry, "v1", records[0])
    shared = tmp_path / "shared"
    shared.mkdir()
    composer = ComposingFollower(Publisher(shared), registry, load_settings().kafka,
                                 lambda: CREATED)
    return registry, shared, composer


def _worker(registry: Registry, directory: Path) -> tuple[SharedFollower, ModelLoader]:
    loader = ModelLoader(registry, ServingMetrics(clock=lambda: CREATED), lambda: CREATED)
    return SharedFollower(loader, registry, directory, lambda: CREATED), loader


def test_workers_serve_what_the_composer_published(records: list[bytes], tmp_path: Path) -> None:
    registry, shared, composer = _composer(records, tmp_path)
    workers = [_worker(registry, shared) for _ in range(2)]
    assert not workers[0][0].check()  # nothing published yet: the registry's version serves
    composer.follow_pointer()  # the lineage's snapshot
    for offset, record in enumerate(records[1:], start=10):
        composer.handle(Seeks(), offset, record)
        for follower, loader in workers:
            assert follower.check() and not follower.check()  # once per new state
            assert loader.current is not None
            assert loader.current.artifact.manifest["delta_seq"] == composer.state.seq
            # the id -> row map grown from the last one (one catalog: not compared)
            assert dict(loader.current.artifact.item_index) == dict(
                composer.composer._artifact.item_index)  # type: ignore[union-attr]
    assert workers[0][0].composer["catalog"] and workers[0][0]._catalog == workers[0][0].composer["catalog"]
    want = decode(records[-1]).state_checksum
    for follower, _ in workers:
        status = follower.status(checksum=True)
        assert status["state_checksum"] == want and status["seq"] == len(records) - 1
        assert status["applied"] == len(records) - 1 and status["errors"] == 0
        assert status["composer"]["mapped"] == len(records) - 1  # the snapshot unseen
        assert status["last_apply_cpu_ms"] is not None
    # served, retired (held until the next swap) and one free: three slots, rewritten in turn
    assert len(list(shared.glob("slot-*.bin"))) == 3

    # a state of another version than CURRENT is not served (a pin moved the pointer)
    snap2 = decode(records[0])
    _publish(registry, "v2", encode(replace(snap2, base_version="v2")))
    registry.pin("v2")
    follower, loader = workers[0]
    before = loader.current
    assert before is not None and composer.state is not None
    composer.publisher.publish(composer.state, before.artifact, {"seq": 3})
    assert not follower.check() and loader.current is before
    composer.follow_pointer()  # the composer follows the pin: v2's snapshot
    assert follower.check() and loader.current.version == "v2"  # type: ignore[union-attr]
    assert follower.status()["base_version"] == "v2" and follower.status()["seq"] == 0


def test_a_slot_in_use_is_never_rewritten(records: list[bytes], tmp_path: Path) -> None:
    """A request still on an old state keeps it: the composer writes other slots."""
    registry, shared, composer = _composer(records, tmp_path)
    follower, loader = _worker(registry, shared)
    composer.follow_pointer()
    assert follower.check()
    in_flight = loader.current  # a request that started on the snapshot's state
    assert in_flight is not None
    vectors = np.array(in_flight.artifact.item_vectors)
    snapshot = decode(records[0])
    for round_ in range(3):  # the lineage replayed: many writes while the request runs
        composer.follow_pointer()  # a pin back and forth restarts the lineage each time
        registry.pin("v1")
        composer.state = None
        composer.follow_pointer()
        for offset, record in enumerate(records[1:], start=10 * round_):
            composer.handle(Seeks(), offset, record)
            follower.check()
    assert follower.state is not None and follower.state.seq == len(records) - 1
    assert np.array_equal(in_flight.artifact.item_vectors, vectors)
    assert in_flight.artifact.manifest["delta_seq"] == snapshot.seq
    assert len(held_slots(shared)) == 3  # the request's, the retired and the served one
    # besides those three: the one being written, and the snapshot the pointer named
    # before the worker looked (a restarted lineage publishes twice between two looks)
    slots = len(list(shared.glob("slot-*.bin")))
    assert slots == 5
    del in_flight
    follower.check()  # the freed state's slot is let go
    assert len(held_slots(shared)) == 2
    for offset, record in enumerate(records[1:], start=100):
        composer.state = None
        composer.follow_pointer()
        composer.handle(Seeks(), offset, record)
        follower.check()
    assert len(list(shared.glob("slot-*.bin"))) == slots  # reused, none added


def test_a_worker_starting_late_maps_the_current_state_at_once(
    records: list[bytes], tmp_path: Path
) -> None:
    registry, shared, composer = _composer(records, tmp_path)
    composer.follow_pointer()
    for offset, record in enumerate(records[1:], start=10):
        composer.handle(Seeks(), offset, record)
    follower, loader = _worker(registry, shared)
    assert follower.check()
    assert follower.state is not None and follower.state.seq == len(records) - 1
    slot, gen = json.loads((shared / POINTER).read_text())["slot"], follower.composer
    # a pointer naming a generation its slot no longer holds (rewritten since): not served,
    # and the slot is not held for it
    (shared / POINTER).write_text(json.dumps({"slot": slot, "generation": 5, "status": {}}))
    assert not follower.check() and follower.errors == 0
    assert (slot, 5) not in held_slots(shared)
    assert np.array_equal(loader.current.artifact.item_vectors,  # type: ignore[union-attr]
                          composer.composer._artifact.item_vectors)  # type: ignore[union-attr]
    assert gen["seq"] == len(records) - 1
    follower.stop()
    assert not held_slots(shared)  # a stopped worker holds nothing


def test_the_composer_is_restarted_when_killed_not_when_stopped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The supervisor's side (``serving.workers.ComposerProcess``), on real processes: a
    composer killed with SIGKILL is started again; one that exits cleanly (a SIGTERM to
    the server's process group) is not."""
    monkeypatch.setenv("STREAMREC_KAFKA__PORT", str(free_port()))  # no broker: it retries
    monkeypatch.setenv("STREAMREC_TRAINER__REGISTRY_DIR", str(tmp_path / "models"))
    composer = ComposerProcess(tmp_path / "shared", "error", restart_after_s=0.1)
    composer.start()
    try:
        wait_until(lambda: composer.proc is not None and composer.proc.poll() is None, 30,
                   "the composer started")
        first = composer.proc
        os.kill(first.pid, signal.SIGKILL)
        wait_until(lambda: composer.starts == 2 and composer.proc is not first
                   and composer.proc.poll() is None, 30, "the composer restarted")
        second = composer.proc
        second.terminate()  # as a stop of the server's process group does
        assert second.wait(30) in (0, -signal.SIGTERM)
        assert composer._thread is not None
        composer._thread.join(10)
        assert not composer._thread.is_alive() and composer.starts == 2
    finally:
        composer.stop()
    assert not (tmp_path / "shared").exists()


def test_a_garbled_held_list_or_slot_is_an_error_not_a_skip(
    records: list[bytes], tmp_path: Path
) -> None:
    """What cannot be read is never taken as "nothing held" or "rewritten since"."""
    registry, shared, composer = _composer(records, tmp_path)
    composer.follow_pointer()
    follower, _ = _worker(registry, shared)
    assert follower.check()
    slot, gen = follower._serving  # type: ignore[misc]
    # a slot of the pointer's generation whose header does not read
    with (shared / slot).open("r+b") as f:
        f.seek(16)
        f.write(b"\xff" * 8)
    (shared / POINTER).touch()  # the pointer looks new: read again
    follower._serving = None
    with pytest.raises(DeltaError, match="garbles"):
        follower.check()
    (shared / f"{HELD}{os.getpid()}-x.json").write_text("{not json")
    with pytest.raises(DeltaError, match="not a list of held slots"):
        held_slots(shared)
