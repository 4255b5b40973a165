"""Helpers shared by the test suites and the benchmarks (``bench/`` imports them): bounded
waits, free ports, HTTP probes, child processes and their environment, Kafka reads, paths."""

from __future__ import annotations

import contextlib
import os
import socket
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")

REPO_ROOT = Path(__file__).resolve().parent.parent


def repo_root() -> Path:
    return REPO_ROOT


def shared_data() -> Path:
    """The shared data folder that sits beside the clone (``../shared/data``)."""
    return REPO_ROOT.parent / "shared" / "data"


def wait_until(
    predicate: Callable[[], T],
    timeout_s: float,
    what: str,
    interval_s: float = 0.1,
    *,
    process: Any = None,
) -> T:
    """Poll ``predicate`` until it returns a truthy value; fail with ``what`` at the deadline.
    An exception of ``predicate`` counts as "not yet" (the last one is reported). With
    ``process`` (anything with ``poll()`` and ``returncode``, e.g. a ``Popen``), fail at once
    if it exits meanwhile."""
    deadline = time.monotonic() + timeout_s
    last_exc: BaseException | None = None
    while True:
        if process is not None and process.poll() is not None:
            raise AssertionError(
                f"the process exited ({process.returncode}) while waiting for {what}")
        try:
            value = predicate()
            if value:
                return value
        except Exception as exc:  # noqa: BLE001 - remembered and reported at the deadline
            last_exc = exc
        if time.monotonic() > deadline:
            detail = f" (last error: {last_exc!r})" if last_exc else ""
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}{detail}")
        time.sleep(interval_s)


def consume(bootstrap: str, topic: str, n: int, timeout_s: float = 30.0) -> list[Any]:
    """Read ``topic`` from the beginning until ``n`` records arrived or the deadline passes.

    Returns what it read (possibly more than ``n`` if more were there); the caller asserts.
    """
    from kafka import KafkaConsumer

    consumer = KafkaConsumer(
        topic,
        bootstrap_servers=bootstrap,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        group_id=None,
        consumer_timeout_ms=1000,
    )
    records: list[Any] = []
    deadline = time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline and len(records) < n:
            batch = consumer.poll(timeout_ms=500, max_records=10_000)
            for part in batch.values():
                records.extend(part)
        # One more short poll so that "more than expected" can be seen by the caller.
        for part in consumer.poll(timeout_ms=300).values():
            records.extend(part)
    finally:
        consumer.close()
    return records


def produce(settings: Any, topic: str, records: Iterable[tuple[str, bytes]]) -> None:
    """Send (key, value) records to ``topic`` and wait until Kafka acknowledged them all."""
    from stream.kafka_client import make_producer

    producer = make_producer(settings.kafka, linger_ms=20, batch_size=256 * 1024)
    try:
        for key, value in records:
            producer.send(topic, key=key.encode(), value=value)
        producer.flush(timeout=60)
    finally:
        producer.close()


def produce_samples(settings: Any, samples: Iterable[Any]) -> None:
    """Training samples (``model.trainer.samples.Sample``) onto the samples topic, keyed by user."""
    from model.trainer.samples import encode_sample

    produce(settings, settings.kafka.samples_topic,
            ((s.user_id, encode_sample(s)) for s in samples))


def isolated_settings(stack: Any, root: Path, prefix: str = "t") -> Any:
    """Settings derived from the test stack's with their own topics (created here), Redis key
    prefix, trainer consumer group, model registry and checkpoints under ``root``."""
    import uuid

    from stream.kafka_client import ensure_topics

    uid = f"{prefix}{uuid.uuid4().hex[:10]}"
    s = stack.model_copy(update={
        "kafka": stack.kafka.model_copy(update={
            "events_topic": f"{uid}.events",
            "dlq_topic": f"{uid}.events.dlq",
            "samples_topic": f"{uid}.samples",
            "updates_topic": f"{uid}.updates",
        }),
        "redis": stack.redis.model_copy(update={"key_prefix": f"{uid}:"}),
        "trainer": stack.trainer.model_copy(update={
            "group_id": f"{uid}-trainer",
            "registry_dir": root / "models",
            "checkpoint_dir": root / "trainer",
        }),
    })
    ensure_topics(s.kafka, [s.kafka.events_topic, s.kafka.dlq_topic, s.kafka.samples_topic])
    return s


def stop_process(proc: Any, grace_s: float = 10.0) -> None:
    """SIGTERM a ``subprocess.Popen``, then SIGKILL if it has not exited after ``grace_s``."""
    import subprocess

    proc.terminate()
    try:
        proc.wait(grace_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(5)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def http_ok(url: str, timeout_s: float = 1.0) -> bool:
    """Whether ``GET url`` answers 200 (a connection error or timeout is ``False``)."""
    import httpx

    try:
        return httpx.get(url, timeout=timeout_s).status_code == 200
    except httpx.HTTPError:
        return False


@contextlib.contextmanager
def service_env(settings: Any) -> Iterator[None]:
    """The ``STREAMREC_*`` environment of ``settings`` for the processes started meanwhile: no
    other setting leaks in from the caller's (the harness's own ``STREAMREC_TEST_*`` stay);
    the previous environment is restored after."""
    from feature_store.settings import to_env

    saved = dict(os.environ)
    for key in [k for k in os.environ
                if k.startswith("STREAMREC_") and not k.startswith("STREAMREC_TEST_")]:
        del os.environ[key]
    os.environ.update(to_env(settings))
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)
