"""The delta stream on the real stack: a trainer process publishes deltas, a serving process
applies them; the state serving converges to equals the trainer's (checksum), across a
kill -9 of serving, of its workers' delta composer or of the trainer, and equals the full
version the trainer exports at the same point."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from model.artifact.registry import Registry
from model.evaluation.synthetic import SyntheticConfig, SyntheticStream
from model.scoring.rarity import check_item_groups
from streamrec.settings import Settings
from tests.support import free_port, produce_samples, repo_root, stop_process, wait_until

pytestmark = pytest.mark.integration


def _env(settings: Settings, trainer_port: int) -> dict[str, str]:
    env = dict(os.environ)
    k, r, t = settings.kafka, settings.redis, settings.trainer
    env.update({
        "STREAMREC_KAFKA__PORT": str(k.port),
        "STREAMREC_KAFKA__SAMPLES_TOPIC": k.samples_topic,
        "STREAMREC_KAFKA__DLQ_TOPIC": k.dlq_topic,
        "STREAMREC_KAFKA__UPDATES_TOPIC": k.updates_topic,
        "STREAMREC_REDIS__PORT": str(r.port),
        "STREAMREC_REDIS__KEY_PREFIX": r.key_prefix,
        "STREAMREC_TRAINER__REGISTRY_DIR": str(t.registry_dir),
        "STREAMREC_TRAINER__CHECKPOINT_DIR": str(t.checkpoint_dir),
        "STREAMREC_TRAINER__GROUP_ID": t.group_id,
        "STREAMREC_TRAINER__METRICS_PORT": str(trainer_port),
        "STREAMREC_TRAINER__DELTA_EVERY_S": "0.5",
        # a delta every 0.5 s throughout: these tests start the trainer behind a backlog of
        # synthetic samples whose event times are months old (both slow the cadence down)
        "STREAMREC_TRAINER__DELTA_CATCHUP_EVERY_S": "0",
        "STREAMREC_FEATURES__HISTORY_LEN": "20",
        "STREAMREC_SERVING__POLL_INTERVAL_S": "2",
    })
    return env




@pytest.fixture
def procs(settings: Settings, tmp_path: Path) -> Iterator[dict[str, Any]]:
    started: list[subprocess.Popen[bytes]] = []
    trainer_port = free_port()
    env = _env(settings, trainer_port)

    def launch(name: str, args: list[str], **extra: str) -> subprocess.Popen[bytes]:
        log = (tmp_path / f"{name}-{len(started)}.log").open("wb")
        proc = subprocess.Popen([sys.executable, "-m", "deploy.cli", *args], cwd=repo_root(),
                                env={**env, **extra}, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
        started.append(proc)
        return proc

    yield {"launch": launch, "trainer_port": trainer_port}
    for proc in started:
        if proc.poll() is None:
            stop_process(proc)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)


def _get(url: str) -> dict[str, Any]:
    return httpx.get(url, timeout=5.0).json()


def test_serving_converges_to_the_trainer_through_deltas_and_a_kill_9(
    settings: Settings, procs: dict[str, Any]
) -> None:
    stream = SyntheticStream(SyntheticConfig(users=300, items=200, history_len=20, seed=9))
    first, second = stream.take(4_000), stream.take(6_000)
    total = len(first) + len(second)
    trainer_url = f"http://127.0.0.1:{procs['trainer_port']}/health"
    delta_url = f"http://127.0.0.1:{procs['trainer_port']}/delta"
    produce_samples(settings, first)
    # float32 rows: the state serving converges to is the trainer's own, so the next full
    # version's snapshot hashes the same (a lossy codec converges to what it delivered:
    # the test below runs with the default codec)
    trainer = procs["launch"]("trainer", [
        "train", "--batch-size", "128", "--export-every-s", "3600", "--eval-rows", "32"],
        STREAMREC_TRAINER__DELTA_CODEC="float32")
    serve_port = free_port()
    model_url = f"http://127.0.0.1:{serve_port}/model"

    def start_serving() -> subprocess.Popen[bytes]:
        proc = procs["launch"]("serve", ["serve", "--port", str(serve_port), "--workers", "1"])
        wait_until(lambda: httpx.get(model_url, timeout=2.0).status_code == 200, 90,
                   "serving up", process=proc)
        return proc

    def served() -> dict[str, Any]:
        return _get(model_url + "?checksum=true")["delta"]

    serving = start_serving()
    wait_until(lambda: (served().get("seq") or 0) >= 2, 180, "serving applies deltas",
               process=trainer)
    base = served()["base_version"]
    produce_samples(settings, second)
    # kill -9 serving while the trainer is still training and publishing
    wait_until(lambda: _get(trainer_url)["samples_trained"] > len(first), 60,
               "training on part 2", process=trainer)
    os.killpg(serving.pid, signal.SIGKILL)
    serving.wait(timeout=30)
    serving = start_serving()

    wait_until(lambda: _get(trainer_url)["samples_trained"] == total, 180, "all samples trained",
               process=trainer)

    def converged() -> bool:
        t = _get(trainer_url)["delta"]
        s = served()
        return bool(t["seq"]) and s["seq"] == t["seq"] and s["base_version"] == t["base_version"]

    wait_until(converged, 60, "serving at the trainer's last delta", process=serving)
    t, s = _get(delta_url), served()
    assert s["base_version"] == base  # one lineage: no full version in between
    assert s["resyncs"] >= 1 and s["errors"] == 0
    assert s["state_checksum"] == t["state_checksum"]
    info = _get(model_url)
    assert info["version"] == base and info["trained_through_ms"] == max(
        x.ts_ms for x in first + second)

    # the trainer's full version of this very state (its stop exports one) starts a new
    # lineage; serving resyncs to its snapshot, whose checksum is the deltas' one
    registry = Registry(settings.trainer.registry_dir, settings.trainer.model_name)
    trainer.send_signal(signal.SIGTERM)
    assert trainer.wait(timeout=60) == 0
    final = registry.current()
    assert final is not None and final != base
    assert registry.show(final)["samples_trained"] == total
    wait_until(lambda: served()["base_version"] == final, 30, "serving on the final version",
               process=serving)
    assert served()["state_checksum"] == t["state_checksum"]


def test_a_trainer_and_a_composer_killed_mid_stream_leave_every_worker_exactly_once(
    settings: Settings, procs: dict[str, Any]
) -> None:
    from model.trainer.samples import sample_digest

    stream = SyntheticStream(SyntheticConfig(users=300, items=200, history_len=20, seed=13))
    first, second = stream.take(3_000), stream.take(5_000)
    every = first + second
    trainer_url = f"http://127.0.0.1:{procs['trainer_port']}/health"
    delta_url = f"http://127.0.0.1:{procs['trainer_port']}/delta"
    args = ["train", "--batch-size", "128", "--export-every-s", "3600", "--eval-rows", "32"]
    produce_samples(settings, first)
    trainer = procs["launch"]("trainer", args)
    serve_port = free_port()
    model_url = f"http://127.0.0.1:{serve_port}/model?checksum=true"
    serving = procs["launch"]("serve", ["serve", "--port", str(serve_port), "--workers", "2"])
    wait_until(lambda: (_get(model_url)["delta"].get("seq") or 0) >= 2, 180,
               "serving applies deltas", process=trainer)
    first_base = _get(trainer_url)["delta"]["base_version"]
    # one composer applies the deltas for both workers (serving.shared_state): killed -9
    # here, it is restarted and resyncs while the workers serve its last state
    composer = _get(model_url)["delta"]["composer"]["pid"]
    assert composer is not None and composer != _get(model_url)["worker_pid"]
    os.kill(composer, signal.SIGKILL)
    produce_samples(settings, second)
    wait_until(lambda: _get(trainer_url)["samples_trained"] > len(first), 60,
               "training on part 2", process=trainer)
    # the deltas past the lineage's snapshot are provisional: nothing checkpointed them
    os.killpg(trainer.pid, signal.SIGKILL)
    trainer.wait(timeout=30)
    trainer = procs["launch"]("trainer", args)
    wait_until(lambda: _get(trainer_url)["samples_trained"] == len(every), 240,
               "all samples trained after the restart", process=trainer)
    health = _get(trainer_url)
    assert health["digest"] == str(sample_digest([s.sample_id for s in every]))
    assert health["delta"]["base_version"] != first_base  # a new full version came first

    want: dict[int, str] = {}

    def both_workers_converged() -> bool:
        t = _get(delta_url)
        for _ in range(8):  # the kernel spreads the connections over both workers
            info = _get(model_url)
            d = info["delta"]
            if d["seq"] == t["seq"] and d["base_version"] == t["base_version"]:
                want[info["worker_pid"]] = d["state_checksum"]
            else:
                want.pop(info["worker_pid"], None)
        return len(want) == 2 and set(want.values()) == {t["state_checksum"]}

    wait_until(both_workers_converged, 120, "both workers at the trainer's last delta",
               process=serving)
    assert _get(model_url)["delta"]["composer"]["pid"] not in (None, composer)


def test_a_catalogued_item_reaches_serving_before_its_first_click(
    settings: Settings, procs: dict[str, Any]
) -> None:
    """With attribute slots the trainer reads the items topic: an item posted there is in
    serving's catalog with the next delta, never clicked; a deleted one leaves it; serving's
    state is the trainer's (checksum) with the attribute parts in it."""
    from stream.items import item_record
    from tests.support import produce

    stream = SyntheticStream(SyntheticConfig(users=300, items=200, history_len=20, seed=5))
    samples = stream.take(3_000)
    catalogue = [{"item_id": i, "attributes": {"category": f"c{n % 5}", "tags": [f"t{n % 7}"]},
                  "ts": 1, "deleted": False}
                 for n, i in enumerate(sorted({s.item_id for s in samples}))]
    def post(items: list[dict[str, Any]]) -> None:
        produce(settings, settings.kafka.items_topic,
                ((it["item_id"], item_record(it)[1]) for it in items))

    post(catalogue)
    produce_samples(settings, samples)
    trainer = procs["launch"]("trainer", [
        "train", "--batch-size", "128", "--export-every-s", "3600", "--eval-rows", "32"],
        STREAMREC_TRAINER__DELTA_CODEC="float32", STREAMREC_TRAINER__ATTR_TOKENS="8",
        STREAMREC_KAFKA__ITEMS_TOPIC=settings.kafka.items_topic)
    serve_port = free_port()
    base_url = f"http://127.0.0.1:{serve_port}"
    serving = procs["launch"]("serve", ["serve", "--port", str(serve_port), "--workers", "1"])
    wait_until(lambda: httpx.get(base_url + "/model", timeout=2.0).status_code == 200, 90,
               "serving up", process=serving)
    trainer_url = f"http://127.0.0.1:{procs['trainer_port']}"
    wait_until(lambda: _get(trainer_url + "/health")["samples_trained"] == len(samples), 180,
               "all samples trained", process=trainer)
    wait_until(lambda: (_get(base_url + "/model")["delta"].get("seq") or 0) >= 1, 60,
               "serving applies deltas", process=serving)

    def in_catalog(item: str) -> bool:
        return bool(_get(f"{base_url}/model/items/{item}").get("in_catalog"))

    assert not in_catalog("brand-new")
    post([{"item_id": "brand-new", "attributes": {"category": "c1", "tags": ["t3"]}, "ts": 2,
           "deleted": False}])
    wait_until(lambda: in_catalog("brand-new"), 30, "the new item in serving's catalog",
               process=trainer)
    post([{"item_id": "brand-new", "attributes": {}, "ts": 3, "deleted": True}])
    wait_until(lambda: not in_catalog("brand-new"), 30, "the deleted item out of the catalog",
               process=trainer)

    def converged() -> bool:
        t = _get(trainer_url + "/delta")
        s = _get(base_url + "/model?checksum=true")["delta"]
        return s["seq"] == t["seq"] and s["state_checksum"] == t["state_checksum"]

    wait_until(converged, 60, "serving holds the trainer's state", process=serving)
    # the version names the towers' scales baked into its rare items (model.scoring.rarity:
    # on with attribute slots; None while scale 1 leads)
    registry = Registry(settings.trainer.registry_dir, settings.trainer.model_name)
    groups = registry.show(registry.current())["model"]["item_groups"]
    if groups is not None:
        check_item_groups(groups)
