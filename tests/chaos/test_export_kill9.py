"""A model export killed half-way (kill -9 of the writer process) leaves the previous version
intact, pointed to, and served by a real `streamrec serve` process, which answers throughout.

The writer is a separate process publishing through ``model.artifact.registry.Registry`` (stage ->
write -> verify -> rename -> CURRENT). It is killed once at a known point (files half
written in the staging dir), then several times at arbitrary moments of a large export, so
some kills land in the write, some in the verification, some around the rename.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
import redis

from model.artifact.files import load_artifact, write_artifact
from model.artifact.registry import STAGING, Registry
from streamrec.ids import item_keys, user_key
from streamrec.settings import Settings, to_env
from tests.support import free_port, repo_root, stop_process, wait_until

pytestmark = pytest.mark.chaos

WRITER = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    import numpy as np
    import redis
    from streamrec.ids import item_keys, user_key
    from model.artifact.files import write_artifact
    from model.artifact.registry import Registry

    root, name, prefix, port, version, mode, sentinel = sys.argv[1:8]
    reg = Registry(Path(root), name, redis_client=redis.Redis(port=int(port)), key_prefix=prefix)
    n = 200_000 if mode == "big" else 500
    rng = np.random.default_rng(7)
    items = [f"m{i}" for i in range(n)]

    def write(d: Path) -> None:
        write_artifact(d, version=version, item_ids=items,
                       item_vectors=rng.normal(size=(n, 64)),
                       item_hist_keys=item_keys(items), item_hist_rows=rng.normal(size=(n, 32)),
                       user_keys=np.array([user_key("alice")]), user_rows=rng.normal(size=(1, 32)),
                       default_user_row=np.zeros(32))
        if mode == "hang":  # half-way: delete a file, say so, wait to be killed
            (d / "item_vectors.npy").unlink()
            Path(sentinel).write_text("written")
            time.sleep(3600)

    Path(sentinel + ".start").write_text("started")
    reg.publish(version, write)
    Path(sentinel).write_text("published")
""")


def registry(s: Settings, client: redis.Redis) -> Registry:
    return Registry(s.trainer.registry_dir, s.trainer.model_name, redis_client=client,
                    key_prefix=s.redis.key_prefix)


def publish_small(reg: Registry, version: str) -> None:
    rng = np.random.default_rng(1)
    items = [f"m{i}" for i in range(200)]
    reg.publish(version, lambda d: write_artifact(
        d, version=version, item_ids=items, item_vectors=rng.normal(size=(200, 16)),
        item_hist_keys=item_keys(items), item_hist_rows=rng.normal(size=(200, 8)),
        user_keys=np.array([user_key("alice")]), user_rows=rng.normal(size=(1, 8)),
        default_user_row=np.zeros(8)))


@pytest.fixture
def serve(settings: Settings, tmp_path: Path) -> Iterator[str]:
    port = free_port()
    env = dict(os.environ) | to_env(settings) | {"STREAMREC_SERVING__POLL_INTERVAL_S": "0.5"}
    with (tmp_path / "serve.log").open("wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "deploy.cli", "serve", "--port", str(port)],
                                cwd=repo_root(), env=env, stdout=out, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until(lambda: proc.poll() is None and httpx.get(url + "/health").status_code == 200,
                   90, "serve /health")
        yield url
    finally:
        stop_process(proc)


class Watch(threading.Thread):
    """Requests recommendations back to back; remembers every status and version."""

    def __init__(self, url: str) -> None:
        super().__init__(daemon=True)
        self.url = url
        self.stop = threading.Event()
        self.seen: list[tuple[int, str | None]] = []

    def run(self) -> None:
        with httpx.Client(base_url=self.url, timeout=10.0) as http:
            while not self.stop.is_set():
                try:
                    resp = http.get("/recommend", params={"user_id": "alice", "k": 5})
                    self.seen.append((resp.status_code, resp.json().get("model_version")))
                except httpx.HTTPError as exc:
                    self.seen.append((-1, repr(exc)))
                time.sleep(0.02)  # pacing of the load generator


def run_writer(s: Settings, version: str, mode: str, sentinel: Path) -> subprocess.Popen[bytes]:
    args = [str(s.trainer.registry_dir), s.trainer.model_name, s.redis.key_prefix,
            str(s.redis.port), version, mode, str(sentinel)]
    return subprocess.Popen([sys.executable, "-c", WRITER, *args], cwd=repo_root(),
                            start_new_session=True, stdout=subprocess.DEVNULL)


def kill9(proc: subprocess.Popen[bytes]) -> None:
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(10)


def assert_registry_consistent(reg: Registry, served: str) -> None:
    current = reg.current()
    assert current is not None
    load_artifact(reg.path(current))  # checksums of the pointed-to version hold
    for version in reg.versions():  # no half-written version was ever renamed into place
        load_artifact(reg.path(version))
    assert served in reg.versions()


def test_killed_export_leaves_previous_version_served(
    settings: Settings, serve: str, tmp_path: Path
) -> None:
    client = redis.Redis(host=settings.redis.host, port=settings.redis.port)
    reg = registry(settings, client)
    publish_small(reg, "v1")
    wait_until(lambda: httpx.get(serve + "/model").json()["version"] == "v1", 30, "v1 served")
    watch = Watch(serve)
    watch.start()
    published: set[str] = {"v1"}
    try:
        # 1. Killed with the files half written in the staging dir.
        sentinel = tmp_path / "hang"
        writer = run_writer(settings, "v2", "hang", sentinel)
        wait_until(sentinel.exists, 120, "the writer to be half-way")
        kill9(writer)
        assert reg.current() == "v1" and reg.versions() == ["v1"]
        assert list((reg.model_dir / STAGING).iterdir()), "the half-written export is staged"
        assert_registry_consistent(reg, "v1")

        # 2. A large export, timed; then the same export killed at fractions of that time
        #    (in the write, the verification, around the rename).
        sentinel = tmp_path / "big"
        writer = run_writer(settings, "v3", "big", sentinel)
        wait_until(Path(str(sentinel) + ".start").exists, 60, "writer start")
        started = time.monotonic()
        wait_until(sentinel.exists, 120, "the timed export", interval_s=0.01)
        duration = time.monotonic() - started
        writer.wait(30)
        published.add("v3")
        killed_midway = 0
        for attempt, fraction in enumerate((0.1, 0.4, 0.7, 0.95)):
            version = f"v{4 + attempt}"
            sentinel = tmp_path / f"big{attempt}"
            writer = run_writer(settings, version, "big", sentinel)
            wait_until(Path(str(sentinel) + ".start").exists, 60, "writer start", interval_s=0.01)
            time.sleep(fraction * duration)  # the kill lands at this point of the export
            if writer.poll() is None:
                kill9(writer)
            if sentinel.exists() or version in reg.versions():  # renamed = complete
                published.add(version)
            else:
                killed_midway += 1
            assert reg.current() in published
            assert_registry_consistent(reg, reg.current() or "")
        assert killed_midway >= 2, f"only {killed_midway} kills landed inside an export"
        served_before = reg.current()
        wait_until(lambda: httpx.get(serve + "/model").json()["version"] == served_before, 30,
                   "serving to point at CURRENT")

        # 3. The next export goes through and is served.
        publish_small(reg, "v9")
        wait_until(lambda: httpx.get(serve + "/model").json()["version"] == "v9", 30, "v9 served")
    finally:
        watch.stop.set()
        watch.join(15)
        client.close()
    statuses = {status for status, _ in watch.seen}
    versions = {v for _, v in watch.seen}
    print(f"\nchaos export: answers={len(watch.seen)} statuses={statuses} versions={versions}")
    assert statuses == {200}, [s for s in watch.seen if s[0] != 200][:10]
    assert None not in versions, "serving fell back to no model during a killed export"
    assert versions <= published | {"v9"}
