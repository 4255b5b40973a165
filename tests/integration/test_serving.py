"""`streamrec serve` as a real process on real Redis: hot swap under load, refused versions,
Redis outage (a throwaway redis-server of this test), unknown users."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import httpx
import numpy as np
import orjson
import pytest
import redis

from bench.workers import connections
from feature_store.store import HistoryEntry, Trending, UserFeatures, open_store
from model.artifact.files import write_artifact
from model.artifact.registry import Registry, published_channel
from streamrec.ids import item_keys, user_key
from streamrec.settings import Settings
from tests.support import free_port, repo_root, stop_process, wait_until

pytestmark = pytest.mark.integration

USERS = ["alice", "bob", "carol"]
ITEMS = [f"m{i}" for i in range(2000)]


def write_random(directory: Path, version: str, seed: int) -> None:
    rng = np.random.default_rng(seed)
    write_artifact(
        directory, version=version, item_ids=ITEMS,
        item_vectors=rng.normal(size=(len(ITEMS), 16)),
        item_hist_keys=item_keys(ITEMS), item_hist_rows=rng.normal(size=(len(ITEMS), 8)),
        user_keys=np.array([user_key(u) for u in USERS]), user_rows=rng.normal(size=(3, 8)),
        default_user_row=np.zeros(8), layers=[(rng.normal(size=(16, 16)), np.zeros(16), "relu")],
        normalize=True, manifest_extra={"trained_through_ms": 1_772_000_000_000 + seed},
    )


def seed_store(settings: Settings) -> None:
    store = open_store(settings)
    hist = tuple(HistoryEntry(f"m{i}", "click", 5000 - i) for i in range(5))
    store.write_batch(
        users=[UserFeatures(u, hist, {}, 5000, 5000) for u in USERS],
        trending=Trending(tuple((f"m{i}", 100.0 - i) for i in range(100, 160)), 5000),
    )
    store.close()


def make_registry(settings: Settings) -> Registry:
    client = redis.Redis(host=settings.redis.host, port=settings.redis.port)
    return Registry(settings.trainer.registry_dir, settings.trainer.model_name,
                    redis_client=client, key_prefix=settings.redis.key_prefix)


@dataclass
class Server:
    url: str
    proc: subprocess.Popen

    def get(self, path: str, **params: object) -> httpx.Response:
        return httpx.get(self.url + path, params=params, timeout=5.0)

    def model_version(self) -> str | None:
        return self.get("/model").json()["version"]


@pytest.fixture
def serve(tmp_path: Path) -> Iterator:
    procs: list[subprocess.Popen] = []

    def start(settings: Settings, workers: int = 1) -> Server:
        port = free_port()
        env = dict(os.environ)
        env.update({
            "STREAMREC_STACK__RUN_DIR": str(tmp_path / "run"),
            "STREAMREC_REDIS__PORT": str(settings.redis.port),
            "STREAMREC_REDIS__KEY_PREFIX": settings.redis.key_prefix,
            "STREAMREC_TRAINER__REGISTRY_DIR": str(settings.trainer.registry_dir),
            "STREAMREC_TRAINER__MODEL_NAME": settings.trainer.model_name,
            "STREAMREC_SERVING__POLL_INTERVAL_S": "60",  # swaps must come by pub/sub
            "STREAMREC_KAFKA__PORT": str(settings.kafka.port),
            "STREAMREC_KAFKA__UPDATES_TOPIC": settings.kafka.updates_topic,
        })
        log = (tmp_path / f"serve-{port}.log").open("w")
        proc = subprocess.Popen(
            [sys.executable, "-m", "deploy.cli", "serve", "--port", str(port),
             "--workers", str(workers)],
            cwd=repo_root(), env=env, stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True,  # its workers are in its process group: none is left over
        )
        procs.append(proc)
        server = Server(f"http://127.0.0.1:{port}", proc)
        wait_until(lambda: proc.poll() is None and server.get("/health").status_code == 200,
                   60, "serving /health")
        return server

    yield start
    for proc in procs:
        stop_process(proc)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)


class Client(threading.Thread):
    """Requests one known user's recommendations back to back until stopped."""

    def __init__(self, url: str) -> None:
        super().__init__(daemon=True)
        self.url = url
        self.stop = threading.Event()
        self.results: list[tuple[float, int, str | None, str | None]] = []

    def run(self) -> None:
        with httpx.Client(base_url=self.url, timeout=5.0) as http:
            while not self.stop.is_set():
                started = time.monotonic()
                try:
                    resp = http.get("/recommend", params={"user_id": "alice", "k": 20})
                    body = resp.json() if resp.status_code == 200 else {}
                    self.results.append(
                        (started, resp.status_code, body.get("model_version"), body.get("source")))
                except httpx.HTTPError as exc:
                    self.results.append((started, -1, repr(exc), None))


def test_hot_swap_under_load_and_refused_version(settings: Settings, serve) -> None:
    seed_store(settings)
    reg = make_registry(settings)
    reg.publish("A", lambda d: write_random(d, "A", 1))
    server = serve(settings)
    assert server.model_version() == "A"
    stranger = server.get("/recommend", user_id="stranger", k=5).json()
    # no row, no history: the model's cold answer (model.scoring.cold), not trending
    assert stranger["source"] == "model" and stranger["model_version"] == "A"
    assert len(stranger["items"]) == 5

    client = Client(server.url)
    client.start()
    try:
        wait_until(lambda: len(client.results) >= 50, 30, "requests on A")
        reg.publish("B", lambda d: write_random(d, "B", 2))
        wait_until(lambda: server.model_version() == "B", 10, "swap to B")
        swapped_at = time.monotonic()
        wait_until(lambda: sum(r[0] > swapped_at for r in client.results) >= 50, 30,
                   "requests after the swap")
    finally:
        client.stop.set()
        client.join(10)

    results = list(client.results)
    errors = [r for r in results if r[1] != 200]
    assert not errors, errors[:5]
    assert {r[2] for r in results} == {"A", "B"}
    assert {r[3] for r in results} == {"model"}
    assert all(r[2] == "B" for r in results if r[0] > swapped_at)
    first_b = next(i for i, r in enumerate(results) if r[2] == "B")
    assert all(r[2] == "B" for r in results[first_b:]), "went back to A after serving B"

    # A half-written version announced by a broken writer is refused; B keeps serving.
    broken = settings.trainer.registry_dir / settings.trainer.model_name / "C"
    write_random(broken, "C", 3)
    vec = broken / "item_vectors.npy"
    vec.write_bytes(vec.read_bytes()[: vec.stat().st_size // 2])
    (broken.parent / "CURRENT").write_text("C\n")
    reg.redis.publish(published_channel(settings.redis.key_prefix, reg.model_name), "C")
    wait_until(lambda: "C" in server.get("/model").json()["refused"], 10, "C refused")
    body = server.get("/recommend", user_id="alice").json()
    assert body["model_version"] == "B" and body["source"] == "model"
    metrics = server.get("/metrics").text
    assert 'streamrec_serving_model_refused_total{reason="artifact"} 1.0' in metrics
    assert "streamrec_serving_model_swaps_total 2.0" in metrics


def start_redis(directory: Path, port: int) -> subprocess.Popen:
    directory.mkdir(parents=True, exist_ok=True)
    proc = subprocess.Popen(
        [shutil.which("redis-server") or "redis-server", "--port", str(port), "--bind",
         "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", str(directory)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    client = redis.Redis(port=port)
    wait_until(lambda: client.ping(), 20, f"redis-server on {port}")
    return proc


def test_redis_outage_is_degraded_never_5xx(tmp_path: Path, serve) -> None:
    from streamrec.settings import load_settings

    port = free_port()
    settings = load_settings(
        redis={"port": port, "key_prefix": "outage:"},
        trainer={"registry_dir": tmp_path / "models", "model_name": "tt"},
    )
    redis_proc = start_redis(tmp_path / "redis", port)
    try:
        seed_store(settings)
        make_registry(settings).publish("A", lambda d: write_random(d, "A", 1))
        server = serve(settings)
        assert server.get("/recommend", user_id="alice").json()["source"] == "model"

        redis_proc.terminate()
        redis_proc.wait(10)
        known = wait_until(
            lambda: (b := server.get("/recommend", user_id="alice").json())["source"] == "degraded"
            and b, 10, "degraded answers")
        assert known["model_version"] == "A" and len(known["items"]) == 20
        for user in ("alice", "stranger", "bob"):
            resp = server.get("/recommend", user_id=user, k=10)
            assert resp.status_code == 200
            body = resp.json()
            assert body["source"] == "degraded" and len(body["items"]) == 10
        stranger = server.get("/recommend", user_id="stranger", k=3).json()
        assert [i["item_id"] for i in stranger["items"]] == ["m100", "m101", "m102"]
        assert server.get("/health").status_code == 200

        redis_proc = start_redis(tmp_path / "redis", port)
        wait_until(lambda: server.get("/recommend", user_id="alice").json()["source"] == "model",
                   15, "recovery after Redis is back")
    finally:
        redis_proc.terminate()
        redis_proc.wait(10)


def _requests_by_worker(metrics_dir: Path) -> dict[int, float]:
    """GET /recommend answers each worker counted in its own multiprocess file."""
    from prometheus_client.mmap_dict import MmapedDict

    from serving.metrics import REQUEST_SECONDS

    out: dict[int, float] = {}
    for path in metrics_dir.glob("histogram_*.db"):
        pid = int(path.stem.rsplit("_", 1)[1])
        out[pid] = sum(
            value for key, value, *_ in MmapedDict.read_all_values_from_file(str(path))
            if orjson.loads(key)[1] == f"{REQUEST_SECONDS}_bucket")
    return out


def _served_total(server: Server) -> float:
    from serving.metrics import REQUEST_SECONDS
    from serving.stats import parse_metrics

    samples = parse_metrics(server.get("/metrics").text)
    return sum(v for (name, _), v in samples.items() if name == f"{REQUEST_SECONDS}_count")


def test_two_workers_one_metrics_truth(settings: Settings, serve, tmp_path: Path) -> None:
    """Requests spread over two workers: /metrics (answered by either) counts every one of
    them, also after a worker was killed and replaced."""
    seed_store(settings)
    reg = make_registry(settings)
    reg.publish("A", lambda d: write_random(d, "A", 1))
    server = serve(settings, workers=2)
    port = server.url.rsplit(":", 1)[1]
    metrics_dir = tmp_path / "run" / "metrics" / f"serving-{port}"
    sent = 0

    def burst(n: int) -> None:
        nonlocal sent
        def one(_: int) -> int:  # a new connection each: the kernel spreads them over workers
            return httpx.get(server.url + "/recommend", params={"user_id": "alice"},
                             timeout=10.0).status_code
        with ThreadPoolExecutor(8) as pool:
            codes = list(pool.map(one, range(n)))
        assert codes == [200] * n
        sent += n

    def both_served() -> bool:
        burst(40)
        return len([c for c in _requests_by_worker(metrics_dir).values() if c > 0]) >= 2

    wait_until(both_served, 60, "requests answered by both workers", interval_s=0)
    by_worker = _requests_by_worker(metrics_dir)
    assert sum(by_worker.values()) == sent
    for _ in range(4):  # any worker may answer the scrape; each must give the whole count
        assert _served_total(server) == sent
    text = server.get("/metrics").text
    assert text.count("\nstreamrec_serving_model_created_timestamp_seconds ") == 1
    age = [line for line in text.splitlines()
           if line.startswith("streamrec_serving_model_version_age_seconds ")]
    assert len(age) == 1 and float(age[0].split()[1]) >= 0.0

    victim = max(by_worker, key=lambda pid: by_worker[pid])
    os.kill(victim, signal.SIGKILL)
    # a scrape drops the dead worker's live gauges (serving.metrics); workers scrape nothing
    # themselves, so the scrape comes first
    wait_until(lambda: server.get("/metrics").status_code == 200
               and not list(metrics_dir.glob(f"gauge_live*_{victim}.db")), 30,
               "the dead worker's gauges gone")
    wait_until(lambda: len({p.stem.rsplit("_", 1)[1]
                            for p in metrics_dir.glob("gauge_livemin_*.db")}) == 2,
               60, "a replacement worker")
    burst(40)
    assert _served_total(server) == sent


def _split(server: Server) -> list[int]:
    """The established connections to ``server``'s port per worker process, sorted."""
    split = connections(int(server.url.rsplit(":", 1)[1]), server.proc.pid)
    return sorted(c for c in split.values() if c)


def test_keep_alive_connections_even_out_over_two_workers(settings: Settings, serve) -> None:
    """16 clients on keep-alive connections: whatever the kernel's split, the workers close
    their excess after an answer until it is 8/8 (serving.balance), and every request of
    the clients is answered (a closed connection is reopened by the client, not an error)."""
    seed_store(settings)
    reg = make_registry(settings)
    reg.publish("A", lambda d: write_random(d, "A", 1))
    server = serve(settings, workers=2)
    clients = [Client(server.url) for _ in range(16)]
    for client in clients:
        client.start()
    try:
        wait_until(lambda: _split(server) == [8, 8], 60, "16 connections split 8/8",
                   interval_s=0.5)
    finally:
        for client in clients:
            client.stop.set()
        for client in clients:
            client.join(10)
    results = [r for client in clients for r in client.results]
    assert len(results) > 16 and all(code == 200 for _, code, _, _ in results), [
        r for r in results if r[1] != 200][:3]
