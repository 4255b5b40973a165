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

from bench.harness import TEST_RUN_DIR, test_stack_settings  # noqa: F401
from streamrec.settings import Settings
from tests.support import isolated_settings


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
