"""Session-wide fixtures: the real local stack on test ports, and per-test isolation.

The stack (Kafka, Redis, Flink) is started once per pytest session in ``.streamrec-test/``
on ports that do not collide with a developer's `streamrec up` (Kafka 19092, Redis 16379,
Flink REST 18081; ``STREAMREC_TEST_PORT_OFFSET=N`` adds N to each, so two checkouts can run
their suites at once). If it is already running it is reused. What this session started is
stopped at the end when STREAMREC_TEST_STOP_STACK=1 (as `make test` and CI set it); otherwise
it is left running so the next run starts fast (`make test-stack-down` stops it).
Each test that takes ``settings`` gets its own topics, Redis key prefix, consumer group and
model registry folder.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from feature_store.settings import Settings, load_settings
from tests.support import REPO_ROOT, isolated_settings

TEST_RUN_DIR = REPO_ROOT / ".streamrec-test"


def test_stack_settings() -> Settings:
    base = load_settings()
    off = int(os.environ.get("STREAMREC_TEST_PORT_OFFSET", "0"))
    return base.model_copy(update={
        "stack": base.stack.model_copy(update={"run_dir": TEST_RUN_DIR, "ready_timeout_s": 120.0}),
        "kafka": base.kafka.model_copy(update={"port": 19092 + off,
                                               "controller_port": 19093 + off}),
        "redis": base.redis.model_copy(update={"port": 16379 + off}),
        "flink": base.flink.model_copy(update={"rest_port": 18081 + off, "rpc_port": 16123 + off}),
        "ingest": base.ingest.model_copy(update={"port": 18001 + off}),
        "serving": base.serving.model_copy(update={"port": 18000 + off}),
        "trainer": base.trainer.model_copy(update={"metrics_port": 18002 + off}),
        "prometheus": base.prometheus.model_copy(update={
            "port": 19090 + off, "exporter_port": 18003 + off,
            "flink_reporter_port": 19249 + off}),
    })


@pytest.fixture(scope="session")
def stack() -> Iterator[Settings]:
    """The real infrastructure, up for the whole session."""
    from deploy.stack import INFRA, Stack

    settings = test_stack_settings()
    runner = Stack(settings)
    started = runner.up(list(INFRA))
    try:
        yield settings
    finally:
        if started and os.environ.get("STREAMREC_TEST_STOP_STACK") == "1":
            runner.down(started)


@pytest.fixture
def settings(stack: Settings, tmp_path: Path) -> Settings:
    """Settings of one test: its own topics, key prefix, group and registry."""
    return isolated_settings(stack, tmp_path)
