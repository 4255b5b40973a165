"""The README's streamrec.client examples, run against a real ingest API and serving API
(their own processes, on this test's topics and key prefix; the addresses swapped in)."""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from streamrec.settings import Settings, to_env
from tests.support import REPO_ROOT, consume, free_port, http_ok, stop_process, wait_until

pytestmark = pytest.mark.integration

SECTION = "### From Python: `streamrec.client`"


def readme_examples() -> list[str]:
    text = (REPO_ROOT / "README.md").read_text()
    section = text[text.index(SECTION):]
    section = section[:section.index("\n### ", len(SECTION))]
    blocks = re.findall(r"```python\n(.*?)```", section, re.S)
    assert len(blocks) == 2, "the README's client section should hold two python examples"
    return blocks


@pytest.fixture
def services(settings: Settings, tmp_path: Path) -> Iterator[tuple[str, str]]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("STREAMREC_")
           or k.startswith("STREAMREC_TEST_")}
    env.update(to_env(settings))
    env["STREAMREC_STACK__RUN_DIR"] = str(tmp_path / "run")
    procs = []
    urls = []
    for command in (["ingest-api"], ["serve", "--workers", "1"]):
        port = free_port()
        log = (tmp_path / f"{command[0]}.log").open("w")
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "deploy.cli", *command, "--port", str(port)],
            cwd=REPO_ROOT, env=env, stdout=log, stderr=subprocess.STDOUT))
        urls.append(f"http://127.0.0.1:{port}")
    try:
        for url, proc in zip(urls, procs, strict=True):
            wait_until(lambda u=url: http_ok(u + "/health"), 60, f"{url}/health", process=proc)
        yield urls[0], urls[1]
    finally:
        for proc in procs:
            stop_process(proc)


def test_readme_client_examples_run(settings: Settings, services: tuple[str, str]) -> None:
    ingest, serving = services
    printed = io.StringIO()
    for code in readme_examples():
        code = code.replace("http://127.0.0.1:8001", ingest).replace(
            "http://127.0.0.1:8000", serving)
        with contextlib.redirect_stdout(printed):
            exec(compile(code, "README.md", "exec"), {"__name__": "__readme__"})
    lines = printed.getvalue().splitlines()
    assert lines[0].startswith("2 [") and lines[2] == "1200 events, 0 retries", lines
    assert lines[1].startswith("popular None")  # no model yet: the popular fallback
    records = consume(settings.kafka.bootstrap, settings.kafka.events_topic, 1202, timeout_s=60)
    ids = [json.loads(r.value)["event_id"] for r in records]
    assert len(records) == 1202 and len(set(ids)) == 1202
