"""Serving's delta follower on a real registry and a stand-in consumer: lineage start from
the snapshot, idempotence, a gap's resync and replay, damaged records, and pins."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from model.artifact.files import write_artifact
from model.artifact.registry import Registry
from model.delta import SNAPSHOT_FILE, ModelState, decode, encode, from_snapshot, state_checksum
from serving.deltas import DeltaFollower, Pacer
from serving.loader import ModelLoader
from serving.metrics import ServingMetrics
from streamrec.settings import load_settings
from tests.unit.model.delta.test_delta import CREATED, shared_lineage

NOW = CREATED


class Seeks:
    """The consumer calls a resync makes (no records: the test hands them over)."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []

    def offsets_for_times(self, query: dict[Any, int]) -> dict[Any, Any]:
        self.calls.append(("times", next(iter(query.values()))))
        return {tp: None for tp in query}

    def seek_to_end(self, tp: Any) -> None:
        self.calls.append(("end", tp.topic))

    def seek(self, tp: Any, offset: int) -> None:
        self.calls.append(("seek", offset))


@pytest.fixture(scope="module")
def records() -> list[bytes]:
    return shared_lineage()[1]


def _publish(registry: Registry, version: str, snapshot: bytes) -> None:
    state: ModelState = from_snapshot(decode(snapshot))
    c = state.constants
    arrays = state.artifact_arrays()
    covisit = arrays.pop("covisit")

    def write(path: Path) -> None:
        write_artifact(path, version=version, normalize=c.normalize, score_bias=c.score_bias,
                       history_len=c.history_len, history_decay=c.history_decay,
                       covisit=covisit, covisit_params={
                           "weight": state.weights[2], "last_weight": state.weights[3],
                           "window": c.covisit_window, "decay": c.covisit_decay},
                       **arrays)
        (path / SNAPSHOT_FILE).write_bytes(snapshot)

    registry.publish(version, write)


def _follower(tmp_path: Path) -> tuple[DeltaFollower, ModelLoader, Registry]:
    registry = Registry(tmp_path, "m")
    loader = ModelLoader(registry, ServingMetrics(clock=lambda: NOW), lambda: NOW)
    return DeltaFollower(loader, registry, load_settings().kafka, lambda: NOW), loader, registry


def test_follows_a_lineage_in_order_and_replays_after_a_gap(
    records: list[bytes], tmp_path: Path
) -> None:
    follower, loader, registry = _follower(tmp_path)
    _publish(registry, "v1", records[0])
    seeks = Seeks()
    follower.handle(seeks, 10, records[1])
    assert follower.state is not None and follower.state.seq == 1
    served = loader.current
    assert served is not None and served.artifact.manifest["delta_seq"] == 1
    follower.handle(seeks, 10, records[1])  # again: nothing happens
    assert loader.current is served and follower.applied == 1

    follower.handle(seeks, 12, records[3])  # seq 3 after 1: resync from the snapshot
    assert follower.state.seq == 0 and follower.resyncs == 1
    assert seeks.calls[0] == ("times", int(NOW.timestamp() * 1000) - 5_000)
    for offset, record in enumerate(records[1:], start=10):  # the replay from the topic
        follower.handle(seeks, offset, record)
    assert follower.state.seq == 3
    assert state_checksum(follower.state) == decode(records[3]).state_checksum
    assert follower.status(checksum=True)["state_checksum"] == decode(records[3]).state_checksum

    bad = bytearray(records[3])
    bad[-1] ^= 1
    follower.handle(seeks, 13, bytes(bad))
    assert follower.errors == 1 and follower.state.seq == 3


def test_a_pacer_sleeps_in_proportion_to_the_work_between_calls() -> None:
    now, slept = [0.0], []
    pacer = Pacer(0.25, sleep=slept.append, cpu=lambda: now[0])
    pacer.start()
    now[0] += 0.004
    pacer()
    now[0] += 0.002
    pacer()
    pacer()  # no work since the last call: no sleep
    assert slept == pytest.approx([0.012, 0.006]) and pacer.slept == pytest.approx(0.018)
    assert pacer.start().slept == 0.0
    whole = Pacer(1.0, sleep=slept.append, cpu=lambda: now[0])
    now[0] += 1.0
    whole()
    assert len(slept) == 2  # a share of 1 never sleeps
    for bad in (0.0, -1.0, 1.5):
        with pytest.raises(ValueError, match="share"):
            Pacer(bad)


def test_a_paced_follower_applies_the_same_state(records: list[bytes], tmp_path: Path) -> None:
    follower, loader, registry = _follower(tmp_path)
    slept: list[float] = []
    follower.pacer = Pacer(0.5, sleep=slept.append)
    _publish(registry, "v1", records[0])
    for offset, record in enumerate(records[1:4], start=10):
        follower.handle(Seeks(), offset, record)
    assert follower.state is not None and follower.state.seq == 3
    assert state_checksum(follower.state) == decode(records[3]).state_checksum
    assert len(slept) >= 3 * 5 and all(s >= 0.0 for s in slept)  # decode, apply, compose
    assert sum(slept) > 0.0


def test_only_the_current_version_is_followed(records: list[bytes], tmp_path: Path) -> None:
    follower, loader, registry = _follower(tmp_path)
    _publish(registry, "v1", records[0])
    snap2 = decode(records[0])
    _publish(registry, "v2", encode(replace(snap2, base_version="v2")))
    seeks = Seeks()
    follower.handle(seeks, 1, records[1])  # v1's delta while v2 is current: skipped
    assert follower.state is None and loader.current is None
    follower.follow_pointer()
    assert follower.state is not None and follower.state.base_version == "v2"
    registry.pin("v1")
    follower.follow_pointer()
    assert follower.state.base_version == "v1" and follower.state.seq == 0
    follower.handle(seeks, 1, records[1])
    assert follower.state.seq == 1
    assert loader.current is not None and loader.current.version == "v1"


def test_a_resync_tells_the_poll_loop_to_drop_the_rest_of_its_records(
    records: list[bytes], tmp_path: Path
) -> None:
    follower, _, registry = _follower(tmp_path)
    _publish(registry, "v1", records[0])
    seeks = Seeks()
    assert follower.handle(seeks, 10, records[1]) is False
    assert follower.handle(seeks, 12, records[3]) is True  # gap: sought back
    assert follower.handle(seeks, 12, records[3]) is False  # the same gap again: no loop
    assert follower.state is not None and follower.state.seq == 0


def test_deltas_follow_the_versions_ann_index_and_rank_as_exact_search(
    records: list[bytes], tmp_path: Path
) -> None:
    from model.scoring.ann import AnnParams
    from serving.retrieval import rank_with_model

    registry = Registry(tmp_path, "m")
    metrics = ServingMetrics(clock=lambda: NOW)
    # every item is a candidate (all lists probed): the two stages must rank as exact search
    loader = ModelLoader(registry, metrics, lambda: NOW, ann_min_items=1,
                         ann=AnnParams(nprobe=10_000, candidates=10_000, rebuild_share=1.0))
    follower = DeltaFollower(loader, registry, load_settings().kafka, lambda: NOW)
    _publish(registry, "v1", records[0])
    for offset, record in enumerate(records[1:4], start=10):
        follower.handle(Seeks(), offset, record)
        served = loader.current
        assert served is not None and served.ann is not None
        art = served.artifact
        ids = art.item_ids.tolist()
        users = ["u0", "u1", "stranger"]
        histories = [ids[:3], ids[-2:], []]
        exact = rank_with_model(art, users, histories, [10, 10, 10], [True, False, True])
        two_stage = rank_with_model(art, users, histories, [10, 10, 10], [True, False, True],
                                    served.ann)
        assert [[s.item_id for s in r] for r in two_stage] == [[s.item_id for s in r]
                                                               for r in exact]
    assert follower.state is not None and follower.state.seq == 3
    # one index for the version (its first delta's state), followed by the next deltas
    builds = metrics.ann_builds._value.get()
    assert builds == 1, builds
    assert loader.current is not None and loader.current.ann is not None
    assert loader.current.ann.stale > 0  # the deltas trained items: scored exactly
