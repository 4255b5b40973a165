"""The stack runner's process supervision, on small real processes (no Kafka/Flink needed)."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

from deploy.components import Component, http_ok
from deploy.process import PidRecord, StackError, is_ours, read_pid, wait_ready, write_pid
from deploy.stack import Stack
from streamrec.settings import load_settings
from tests.support import free_port


class TinyStack(Stack):
    """A stack of one HTTP server process, to exercise the runner itself."""

    def __init__(self, run_dir: Path, port: int, argv: list[str] | None = None) -> None:
        base = load_settings()
        settings = base.model_copy(update={"stack": base.stack.model_copy(
            update={"run_dir": run_dir, "ready_timeout_s": 15.0, "stop_timeout_s": 5.0})})
        super().__init__(settings)
        self.port = port
        self.argv = argv or [sys.executable, "-m", "http.server", str(port),
                             "--bind", "127.0.0.1"]

    def components(self) -> list[Component]:
        return [Component("web", self.port, lambda: self.argv,
                          lambda: http_ok(f"http://127.0.0.1:{self.port}/"), marker="http.server")]

    def _all_known(self) -> list[Component]:
        return self.components()

    def _create_topics(self) -> None:  # no Kafka in this stack
        pass


def test_up_twice_starts_one_process_and_down_stops_it(tmp_path: Path) -> None:
    stack = TinyStack(tmp_path, free_port())
    assert stack.up() == ["web"]
    first = read_pid(stack.pid_path("web"))
    assert is_ours(first)
    assert stack.up() == []  # already running: nothing new
    assert read_pid(stack.pid_path("web")) == first
    [row] = stack.status()
    assert row.state == "running" and row.pid == first.pid and row.healthy
    assert stack.down() == ["web"]
    assert not is_ours(first)
    assert not stack.pid_path("web").exists()
    assert stack.status()[0].state == "stopped"


def test_stale_pid_file_does_not_block_a_start(tmp_path: Path) -> None:
    stack = TinyStack(tmp_path, free_port())
    (tmp_path / "pids").mkdir(parents=True)
    # A pid that exists (this test process) but is not the component: its marker is absent.
    write_pid(stack.pid_path("web"), PidRecord(pid=1, marker="http.server", started_at=0.0))
    try:
        assert stack.up() == ["web"]
        assert read_pid(stack.pid_path("web")).pid != 1
    finally:
        stack.down()


def test_port_taken_by_a_stranger_gives_a_clear_error(tmp_path: Path) -> None:
    port = free_port()
    stranger = TinyStack(tmp_path / "other", port)
    stranger.up()
    try:
        with pytest.raises(StackError, match=f"Port {port}.*already in use"):
            TinyStack(tmp_path / "mine", port).up()
    finally:
        stranger.down()


def test_a_process_that_dies_at_start_is_reported_with_its_log(tmp_path: Path) -> None:
    argv = [sys.executable, "-c", "import sys; print('boom: bad config'); sys.exit(3)"]
    stack = TinyStack(tmp_path, free_port(), argv=argv)
    with pytest.raises(StackError, match="exited during start-up") as info:
        stack.up()
    assert "boom: bad config" in str(info.value)
    assert str(stack.log_path("web")) in str(info.value)


def test_readiness_deadline_names_the_log(tmp_path: Path) -> None:
    log = tmp_path / "x.log"
    log.write_text("line one\nline two\n")
    t0 = time.monotonic()
    with pytest.raises(StackError, match="did not become ready within 1 s") as info:
        wait_ready(lambda: False, name="x", timeout_s=1.0, alive=lambda: True, log_path=log,
                   interval_s=0.05)
    assert time.monotonic() - t0 < 10
    assert "line two" in str(info.value) and str(log) in str(info.value)


def test_kafka_cluster_id_never_starts_with_a_dash() -> None:
    from deploy.components import kafka_cluster_id

    # 0xf8.. encodes to "-" first in URL-safe base64; the id must skip such draws
    draws = iter([b"\xf8" + bytes(15), b"\xf8" + bytes(15), b"\x10" * 16])
    cluster_id = kafka_cluster_id(lambda: next(draws))
    assert cluster_id == "EBAQEBAQEBAQEBAQEBAQEA"
    assert len(kafka_cluster_id()) == 22


def test_cpu_seconds_counts_a_process_and_its_group() -> None:
    import subprocess
    import sys

    from deploy.process import cpu_seconds
    from tests.support import stop_process, wait_until

    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"], start_new_session=True)
    try:
        wait_until(lambda: cpu_seconds(busy.pid) >= 0.3, 30, "the busy process to use CPU")
        assert cpu_seconds(busy.pid, group=True) >= 0.3  # its own session: pgid == pid
        assert cpu_seconds(busy.pid + 10_000_000) == 0.0  # no such process
    finally:
        stop_process(busy)


def test_several_taskmanagers_run_as_one_component_and_stop_together(tmp_path: Path) -> None:
    import os
    import signal
    import subprocess

    from deploy.components import taskmanagers_argv
    from tests.support import stop_process, wait_until

    assert taskmanagers_argv(1)[-1] == "start-foreground"  # one JVM: the plain command
    # A stand-in for taskmanager.sh: records its pid, then runs until stopped.
    script = tmp_path / "taskmanager.sh"
    script.write_text(f'[ "$1" = start-foreground ] || exit 3\necho $$ >> {tmp_path}/pids\n'
                      "exec sleep 60\n")
    argv = taskmanagers_argv(3)
    argv[-1] = str(script)
    group = subprocess.Popen(argv, start_new_session=True)
    pids_file = tmp_path / "pids"

    def started() -> list[int]:
        return [int(p) for p in pids_file.read_text().split()] if pids_file.exists() else []

    try:
        wait_until(lambda: len(started()) == 3, 20, "three TaskManagers to start")
        os.kill(started()[0], signal.SIGKILL)  # one dies: the component ends, with the others
        wait_until(lambda: group.poll() is not None, 20, "the group to end")

        def alive(pid: int) -> bool:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                return False
            return True

        wait_until(lambda: not any(alive(p) for p in started()), 20, "the others to stop")
    finally:
        stop_process(group)
