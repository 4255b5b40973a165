"""Hostile requests against real `streamrec ingest-api` and `streamrec serve` processes.

Oversize bodies (declared and streamed), deeply nested JSON, 10 MB ids, invalid UTF-8, huge
headers and wrong content types all get a 4xx (or, for a request line/header the HTTP parser
refuses, a closed connection); the process stays up and answers a normal request afterwards;
its resident memory does not grow with repetition. Access: the API key and the admin token
are enforced, both services listen on 127.0.0.1 only, and their logs (at debug level) hold no
secret and no event payload; in process, every record our own loggers emit at DEBUG for
requests carrying a secret and ids (accepted, refused, Kafka down) is checked the same way.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from streamrec.settings import Settings, to_env
from tests.support import free_port, repo_root, stop_process, wait_until

pytestmark = pytest.mark.integration

API_KEY = f"ingest-key-{uuid.uuid4().hex}"
ADMIN_TOKEN = f"admin-token-{uuid.uuid4().hex}"
MB = 1_000_000
#: Allowed RSS growth between the first and the last round of hostile requests.
RSS_GROWTH_LIMIT_KB = 60_000
ROUNDS = 4


@dataclass
class Service:
    url: str
    proc: subprocess.Popen[bytes]
    port: int
    log_path: Path

    def alive(self) -> bool:
        return self.proc.poll() is None

    def rss_kb(self) -> int:
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
        raise AssertionError("no VmRSS")

    def listen_addresses(self) -> set[str]:
        """Local addresses of the sockets listening on this service's port (/proc/net/tcp*)."""
        found: set[str] = set()
        for table in ("/proc/net/tcp", "/proc/net/tcp6"):
            for line in Path(table).read_text().splitlines()[1:]:
                fields = line.split()
                address, port_hex = fields[1].rsplit(":", 1)
                if int(port_hex, 16) == self.port and fields[3] == "0A":  # 0A = LISTEN
                    found.add(_decode_address(address))
        return found


def _decode_address(hex_address: str) -> str:
    raw = bytes.fromhex(hex_address)
    if len(raw) == 4:
        return ".".join(str(b) for b in reversed(raw))
    return raw.hex()


@pytest.fixture
def start(tmp_path: Path) -> Iterator[Callable[[str, dict[str, str]], Service]]:
    procs: list[subprocess.Popen[bytes]] = []

    def run(command: str, env_extra: dict[str, str]) -> Service:
        port = free_port()
        env = {k: v for k, v in os.environ.items() if not k.startswith("STREAMREC_")}
        env.update(env_extra)
        log_path = tmp_path / f"{command}.log"
        with log_path.open("wb") as out:
            proc = subprocess.Popen(
                # Production logging (INFO; uvicorn at debug). Not `streamrec -v`: that sets
                # kafka-python to DEBUG, which logs every produced record (see docs/FAULTS.md).
                [sys.executable, "-m", "deploy.cli", command, "--port", str(port),
                 "--log-level", "debug"],
                cwd=repo_root(), env=env, stdout=out, stderr=subprocess.STDOUT,
            )
        procs.append(proc)
        service = Service(f"http://127.0.0.1:{port}", proc, port, log_path)

        def healthy() -> bool:
            assert proc.poll() is None, log_path.read_text()[-2000:]
            return httpx.get(service.url + "/health", timeout=2.0).status_code == 200

        wait_until(healthy, 90, f"{command} /health")
        return service

    yield run
    for proc in procs:
        stop_process(proc)


def send(method: str, url: str, **kwargs: object) -> int:
    """Status code, or -1 when the server closed the connection (a refusal by the parser)."""
    try:
        return httpx.request(method, url, timeout=30.0, **kwargs).status_code  # type: ignore[arg-type]
    except (httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError):
        return -1


def chunks(total: int, size: int = 256 * 1024) -> Iterator[bytes]:
    """A streamed body with no Content-Length."""
    block = b"[" + b" " * (size - 1)
    for _ in range(total // size):
        yield block


def check_rounds(service: Service, hostile: Callable[[], None], normal: Callable[[], None]) -> None:
    """Run the hostile set ROUNDS times; the process must live and its RSS stay flat."""
    hostile()  # warm-up: first-use allocations are not growth
    normal()
    before = service.rss_kb()
    for _ in range(ROUNDS):
        hostile()
        assert service.alive(), service.log_path.read_text()[-3000:]
        normal()
    after = service.rss_kb()
    assert after - before < RSS_GROWTH_LIMIT_KB, (before, after)


def assert_log_clean(service: Service, secrets: list[str]) -> None:
    text = service.log_path.read_text(errors="replace")
    assert text.strip(), "the service logged nothing: the check would prove nothing"
    for secret in secrets:
        assert secret not in text, f"{secret[:40]!r} appears in {service.log_path}"


# --------------------------------------------------------------------------- ingest


def test_ingest_api_survives_hostile_requests(settings: Settings, start) -> None:
    env = to_env(settings) | {"STREAMREC_INGEST__API_KEY": API_KEY}
    svc = start("ingest-api", env)
    assert svc.listen_addresses() == {"127.0.0.1"}
    url = svc.url + "/events"
    key = {"x-api-key": API_KEY}
    json_ct = key | {"content-type": "application/json"}
    marker = f"payload-{uuid.uuid4().hex}"
    big_id = "u" * (10 * MB)
    limit = settings.ingest.max_body_bytes

    def hostile() -> None:
        event = {"user_id": "u", "item_id": marker, "event_type": "click"}
        assert send("POST", url, json=event) == 401
        assert send("POST", url, json=event, headers={"x-api-key": "wrong" + API_KEY}) == 401
        assert send("POST", url, headers={"x-api-key": "x" * (10 * MB)}) in (-1, 401, 431)
        assert send("POST", url, content=b"[" * (limit + 1), headers=json_ct) in (-1, 413)
        assert send("POST", url, content=chunks(limit + MB), headers=json_ct) in (-1, 413)
        assert send("POST", url, content=b"[" * 500_000 + b"]" * 500_000, headers=json_ct) == 422
        body = json.dumps({"user_id": big_id, "item_id": marker, "event_type": "click"})
        resp = httpx.post(url, content=body.encode(), headers=json_ct, timeout=30.0)
        assert resp.status_code == 422 and len(resp.content) < 10_000
        assert resp.json()["errors"][0]["field"] == "user_id"
        assert send("POST", url, content=b'{"user_id": "\xff\xfe", "item_id": "m"}',
                    headers=json_ct) == 422
        for ctype in ("text/plain", "application/xml", "multipart/form-data; boundary=x",
                      "application/x-www-form-urlencoded"):
            assert send("POST", url, content=b"user_id=u", headers=key | {"content-type": ctype}) == 415

    def normal() -> None:
        ok = httpx.post(url, json={"user_id": "ok", "item_id": marker, "event_type": "click",
                                   "context": {"note": marker}}, headers=key, timeout=30.0)
        assert ok.status_code == 202, ok.text

    check_rounds(svc, hostile, normal)
    assert_log_clean(svc, [API_KEY, marker, big_id[:64]])


# --------------------------------------------------------------------------- serving


def test_serving_survives_hostile_requests(settings: Settings, start) -> None:
    env = to_env(settings) | {"STREAMREC_SERVING__ADMIN_TOKEN": ADMIN_TOKEN,
                              "STREAMREC_SERVING__POLL_INTERVAL_S": "60"}
    svc = start("serve", env)
    assert svc.listen_addresses() == {"127.0.0.1"}
    marker = f"user-{uuid.uuid4().hex}"
    admin = {"x-admin-token": ADMIN_TOKEN}

    def hostile() -> None:
        pin = svc.url + "/model/pin"
        assert send("POST", pin, json={"version": "v1"}) == 401
        assert send("POST", pin, json={"version": "v1"}, headers={"x-admin-token": "no"}) == 403
        assert send("POST", pin, json={"version": "v1"},
                    headers={"authorization": "Bearer " + ADMIN_TOKEN[:-1]}) == 403
        assert send("POST", pin, content=b"{" * (10 * MB),
                    headers={"content-type": "application/json"}) in (-1, 413)
        assert send("POST", pin, content=chunks(10 * MB),
                    headers={"content-type": "application/json"}) in (-1, 413)
        assert send("POST", pin, content=b"[" * 30_000 + b"]" * 30_000,
                    headers=admin | {"content-type": "application/json"}) in (400, 422)
        assert send("POST", pin, content=b'{"version": "\xff"}',
                    headers=admin | {"content-type": "application/json"}) in (400, 422)
        assert send("POST", pin, content=b"version=v1",
                    headers=admin | {"content-type": "application/x-www-form-urlencoded"}) == 422
        assert send("POST", svc.url + "/model/rollback", content=b"\x00" * 1000,
                    headers=admin | {"content-type": "application/json"}) in (400, 422)
        assert send("GET", svc.url + "/recommend", params={"user_id": "u" * 60_000}) in (-1, 414, 422)
        assert send("GET", svc.url + "/recommend", params={"user_id": marker, "k": 10**12}) == 422
        assert send("GET", svc.url + "/recommend?user_id=%ff%fe%00") == 200
        assert send("GET", svc.url + "/users/" + "x" * 8000 + "/features") == 404
        # httptools (serve --http default) has no header-size cap: answered, memory checked below.
        assert send("GET", svc.url + "/model", headers={"x-big": "h" * (10 * MB)}) in (-1, 200, 431)

    def normal() -> None:
        resp = httpx.get(svc.url + "/recommend", params={"user_id": marker, "k": 5}, timeout=10.0)
        assert resp.status_code == 200, resp.text

    check_rounds(svc, hostile, normal)
    assert_log_clean(svc, [ADMIN_TOKEN, "u" * 1000])


# --------------------------------------------------------------------------- logs in process


def test_own_loggers_never_log_secrets_or_payloads(
    settings: Settings, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from fastapi.testclient import TestClient
    from pydantic import SecretStr

    from serving.app import create_app as create_serving
    from serving.deps import ServingDeps
    from stream.ingest.api import create_app as create_ingest

    marker = f"secret-item-{uuid.uuid4().hex}"
    user = f"user-{uuid.uuid4().hex}"
    event = {"user_id": user, "item_id": marker, "event_type": "click",
             "context": {"note": marker}, "event_id": f"ev-{marker}"}
    with_key = settings.model_copy(update={
        "ingest": settings.ingest.model_copy(update={"api_key": SecretStr(API_KEY),
                                                     "produce_timeout_s": 1.0}),
        "serving": settings.serving.model_copy(update={"admin_token": SecretStr(ADMIN_TOKEN)}),
    })
    nowhere = with_key.model_copy(update={
        "kafka": with_key.kafka.model_copy(update={"port": free_port()})})
    caplog.set_level(logging.DEBUG)
    for name in ("stream", "serving", "feature_store", "model", "uvicorn", "fastapi"):
        caplog.set_level(logging.DEBUG, logger=name)
    with TestClient(create_ingest(with_key)) as client:
        assert client.post("/events", json=event, headers={"x-api-key": API_KEY}).status_code == 202
        assert client.post("/events", json=event, headers={"x-api-key": API_KEY[::-1]}).status_code == 401
        bad = dict(event, ts="yesterday")
        assert client.post("/events", json=[event, bad], headers={"x-api-key": API_KEY}).status_code == 422
    with TestClient(create_ingest(nowhere)) as client:
        assert client.post("/events", json=event, headers={"x-api-key": API_KEY}).status_code == 503
    serving = create_serving(ServingDeps(with_key, watch=False))
    with TestClient(serving) as client:
        assert client.get("/recommend", params={"user_id": user}).status_code == 200
        assert client.post("/model/pin", json={"version": marker},
                           headers={"x-admin-token": ADMIN_TOKEN}).status_code == 404
        assert client.post("/model/pin", json={"version": "v1"},
                           headers={"authorization": "Bearer " + ADMIN_TOKEN + "x"}).status_code == 403
    ours = [r for r in caplog.records
            if r.name.split(".")[0] in ("stream", "serving", "feature_store", "model")]
    assert ours, "no record from our loggers: the check would prove nothing"
    text = "\n".join(f"{r.name} {r.getMessage()} {r.exc_text or ''}" for r in ours)
    for secret in (API_KEY, API_KEY[::-1], ADMIN_TOKEN, marker, user):
        assert secret not in text, secret


def test_local_services_bind_loopback_by_default(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from deploy.components import redis_component
    from streamrec.settings import load_settings

    for name in [k for k in os.environ if k.startswith("STREAMREC_")]:
        monkeypatch.delenv(name)
    s = load_settings()
    assert {s.stack.bind_host, s.ingest.host, s.serving.host, s.kafka.host} == {"127.0.0.1"}
    assert s.ingest.api_key is None and s.serving.admin_token is None  # off unless configured
    argv = redis_component(s, tmp_path).argv()
    assert argv[argv.index("--bind") + 1] == "127.0.0.1"
    assert argv[argv.index("--protected-mode") + 1] == "yes"
