"""The trainer on the real stack: samples in Kafka -> versions, exactly once across kill -9."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest

from model.artifact.files import load_artifact
from model.artifact.registry import Registry
from model.evaluation.synthetic import SyntheticConfig, SyntheticStream
from model.trainer.samples import Sample, encode_sample, sample_digest
from streamrec.settings import Settings, with_trainer
from tests.support import (
    consume,
    free_port,
    isolated_settings,
    produce,
    repo_root,
    wait_until,
)

pytestmark = pytest.mark.integration

POISON = [b"{not json", json.dumps({"sample_id": "x", "user_id": "u", "item_id": "i"}).encode()]




def _encoded(samples: list[Sample]) -> list[tuple[str, bytes]]:
    return [(s.user_id, encode_sample(s)) for s in samples]


@dataclass
class InProcessRun:
    settings: Settings
    samples: list[Sample]
    state: Any
    registry: Registry


@pytest.fixture(scope="module")
def in_process_run(stack: Settings, tmp_path_factory: pytest.TempPathFactory) -> InProcessRun:
    """One trainer run in this process over a planted-preference stream with poison records."""
    from model.towers.two_tower import ModelConfig
    from model.trainer.build import build_service
    from model.trainer.loop_options import LoopOptions
    from model.trainer.trainer import TrainOptions

    settings = isolated_settings(stack, tmp_path_factory.mktemp("trainer"))
    cfg = SyntheticConfig(users=1000, items=500, clusters=20, history_len=20, seed=11)
    samples = SyntheticStream(cfg).take(40_000)
    values = _encoded(samples)
    values[5_000:5_000] = [("poison", p) for p in POISON]  # mid-stream
    produce(settings, settings.kafka.samples_topic, values)
    service = build_service(
        settings,
        ModelConfig(history_len=20),
        TrainOptions(batch_size=256, eval_rows=128, eval_every=1, eval_refresh_steps=10,
                     eval_window=5_000, evict_every_steps=0, spare_epochs=1),
        LoopOptions.from_settings(
            with_trainer(settings, export_every_s=3600, export_every_samples=15_000,
                         delta_every_s=0.0, delta_catchup_every_s=0.0, delta_history_lag_s=0.0),
            max_samples=len(samples)),
        clock=lambda: datetime.now(UTC),
    )
    state = service.run()
    return InProcessRun(settings, samples, state, service.registry)


def test_samples_in_versions_out_with_valid_manifest(in_process_run: InProcessRun) -> None:
    run = in_process_run
    versions = run.registry.versions()
    assert len(versions) == 3  # 15k, 30k and the final 40k
    assert run.registry.current() == versions[-1]
    art = load_artifact(run.registry.path(versions[-1]))  # verifies checksums
    m = art.manifest
    assert m["samples_trained"] == len(run.samples)
    assert m["sample_digest"] == str(sample_digest([s.sample_id for s in run.samples]))
    assert m["trained_through_ms"] == max(s.ts_ms for s in run.samples)
    assert sum(m["kafka_offsets"].values()) == len(run.samples) + len(POISON)
    assert {"recall@10", "ndcg@10", "popularity_recall@10"} <= m["metrics"].keys()
    assert art.item_vectors.shape[0] == len({s.item_id for s in run.samples})


def test_a_fetch_process_asked_to_stop_ends_without_an_error(
    stack: Settings, tmp_path: Path
) -> None:
    """After ``request_stop`` the child closes its consumer and exits, and ``get`` then
    answers None instead of reporting a lost child."""
    from model.trainer.fetch_process import ProcessFetcher

    settings = isolated_settings(stack, tmp_path)
    samples = SyntheticStream(SyntheticConfig(users=50, items=40, seed=5)).take(300)
    produce(settings, settings.kafka.samples_topic, _encoded(samples))
    fetcher = ProcessFetcher(settings.kafka, settings.trainer.group_id, {}, "auto", 1000,
                             100, 10, 0.2, 100)
    fetcher.start()
    try:
        first = wait_until(lambda: fetcher.get(0.2), 60.0, "a first chunk")
        assert len(first.sample_ids) == 100
        fetcher.request_stop()
        process = fetcher._process  # the child itself
        wait_until(lambda: process.exitcode is not None, 30.0, "the child's exit")
        assert process.exitcode == 0
        left = [fetcher.get(0.1) for _ in range(4)]  # what the queue still held, then None
        assert left[-1] is None and all(len(c.sample_ids) == 100 for c in left if c)
    finally:
        fetcher.stop()


def test_poison_samples_go_to_the_dlq_with_a_reason(in_process_run: InProcessRun) -> None:
    run = in_process_run
    assert run.state.dlq_records == len(POISON)
    records = consume(run.settings.kafka.bootstrap, run.settings.kafka.dlq_topic, len(POISON))
    assert len(records) == len(POISON)
    bodies = [json.loads(r.value) for r in records]
    assert {b["stage"] for b in bodies} == {"trainer"}
    assert sorted(b["raw"].encode() for b in bodies) == sorted(POISON)
    assert all(b["reason"] for b in bodies)


def test_learning_beats_popularity_on_planted_preferences(in_process_run: InProcessRun) -> None:
    metrics = in_process_run.registry.show(in_process_run.registry.versions()[-1])["metrics"]
    # Rolling test-then-train over the last 5000 evaluated samples, same rows for both.
    assert metrics["recall@10"] >= metrics["popularity_recall@10"] + 0.15, metrics
    assert metrics["ndcg@10"] > metrics["popularity_ndcg@10"], metrics


# -- kill -9 ---------------------------------------------------------------------------------


def _env(settings: Settings, port: int) -> dict[str, str]:
    env = dict(os.environ)
    k, r, t = settings.kafka, settings.redis, settings.trainer
    env.update({
        "STREAMREC_KAFKA__PORT": str(k.port),
        "STREAMREC_KAFKA__SAMPLES_TOPIC": k.samples_topic,
        "STREAMREC_KAFKA__UPDATES_TOPIC": k.updates_topic,
        "STREAMREC_KAFKA__DLQ_TOPIC": k.dlq_topic,
        "STREAMREC_KAFKA__EVENTS_TOPIC": k.events_topic,
        "STREAMREC_REDIS__PORT": str(r.port),
        "STREAMREC_REDIS__KEY_PREFIX": r.key_prefix,
        "STREAMREC_TRAINER__REGISTRY_DIR": str(t.registry_dir),
        "STREAMREC_TRAINER__CHECKPOINT_DIR": str(t.checkpoint_dir),
        "STREAMREC_TRAINER__GROUP_ID": t.group_id,
        "STREAMREC_TRAINER__METRICS_PORT": str(port),
        "STREAMREC_FEATURES__HISTORY_LEN": "20",
    })
    return env


@pytest.fixture
def trainer_proc(settings: Settings, tmp_path: Path) -> Iterator[dict[str, Any]]:
    port = free_port()
    procs: list[subprocess.Popen[bytes]] = []
    logs: list[Path] = []

    def start() -> subprocess.Popen[bytes]:
        logs.append(tmp_path / f"trainer-{len(procs)}.log")
        # its own process group, which `streamrec down` signals as a whole
        proc = subprocess.Popen(
            [sys.executable, "-m", "deploy.cli", "train", "--batch-size", "256",
             "--export-every-s", "1", "--eval-rows", "64"],
            cwd=repo_root(), env=_env(settings, port), stdout=logs[-1].open("wb"),
            stderr=subprocess.STDOUT, start_new_session=True,
        )
        procs.append(proc)
        return proc

    yield {"start": start, "port": port, "logs": logs}
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)


def _health(port: int) -> dict[str, Any]:
    return httpx.get(f"http://127.0.0.1:{port}/health", timeout=2.0).json()


def test_kill_9_mid_stream_trains_every_sample_exactly_once(
    settings: Settings, trainer_proc: dict[str, Any]
) -> None:
    stream = SyntheticStream(SyntheticConfig(users=300, items=200, history_len=20, seed=5))
    first, second = stream.take(8_000), stream.take(12_000)
    port = trainer_proc["port"]
    registry = Registry(settings.trainer.registry_dir, settings.trainer.model_name)
    produce(settings, settings.kafka.samples_topic, _encoded(first))

    proc = trainer_proc["start"]()
    wait_until(lambda: _health(port).get("samples_trained", 0) >= 2_000
               and registry.current() is not None, 180, "a first checkpointed version")
    produce(settings, settings.kafka.samples_topic, _encoded(second))
    wait_until(lambda: _health(port)["samples_trained"] > len(first), 120, "training on part 2")
    # Kill while the live state is ahead of the newest checkpoint: those samples must be
    # trained again from the restored state, and only once in the surviving model.
    wait_until(
        lambda: _health(port)["samples_trained"]
        > registry.show(registry.current())["samples_trained"],
        60, "uncheckpointed progress",
    )
    before_kill = _health(port)["samples_trained"]
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    checkpointed = registry.show(registry.current())["samples_trained"]
    assert checkpointed <= before_kill

    proc = trainer_proc["start"]()
    total = len(first) + len(second)
    wait_until(lambda: _health(port).get("samples_trained") == total, 240, "all samples trained")
    wait_until(lambda: registry.show(registry.current())["samples_trained"] == total, 60,
               "a version covering every sample")
    manifest = registry.show(registry.current())
    health = _health(port)
    expected = str(sample_digest([s.sample_id for s in first + second]))
    assert health["digest"] == expected
    assert manifest["sample_digest"] == expected
    assert sum(manifest["kafka_offsets"].values()) == total
    metrics = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=2.0).text
    assert f"streamrec_trainer_samples_trained_lifetime {float(total)}" in metrics
    assert 'streamrec_trainer_quality_rolling{metric="recall@10"}' in metrics
    os.killpg(proc.pid, signal.SIGTERM)  # the whole group, as `streamrec down` stops it
    assert proc.wait(timeout=60) == 0
    # an orderly stop: the fetch child ignored the signal and was stopped by its parent
    log = trainer_proc["logs"][-1].read_text()
    assert "Traceback" not in log and "sample fetch" not in log, log[-3000:]
    # Stopping gracefully trained nothing more (the topic is drained).
    final = registry.show(registry.current())
    assert final["samples_trained"] == total

    # The same checkpoint against its samples topic deleted and created again (empty): the
    # trainer refuses to resume rather than silently reading the new topic from its start.
    from kafka.admin import KafkaAdminClient

    topic = settings.kafka.samples_topic
    admin = KafkaAdminClient(bootstrap_servers=settings.kafka.bootstrap)
    try:
        admin.delete_topics([topic])
        wait_until(lambda: topic not in admin.list_topics(), 60, f"{topic} to be deleted")
    finally:
        admin.close()
    again = subprocess.run(
        [sys.executable, "-m", "deploy.cli", "train"], cwd=repo_root(),
        env=_env(settings, free_port()), capture_output=True, text=True, timeout=180,
    )
    assert again.returncode == 2, again.stderr[-2000:]
    assert "beyond its end" in again.stderr
