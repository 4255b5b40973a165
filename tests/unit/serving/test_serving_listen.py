"""serve --workers N: each worker listens on its own SO_REUSEPORT socket (serving.workers), and
every serving process sets its GIL switch interval (serving.cli)."""

from __future__ import annotations

import pickle
import socket
import sys

import pytest

from serving.workers import ReusePortListener, run_workers
from tests.support import free_port


def test_each_worker_binds_its_own_socket_and_a_plain_bind_fails() -> None:
    port = free_port()
    # what a worker process receives: the recipe, bound when unpickled there
    first = pickle.loads(pickle.dumps(ReusePortListener("127.0.0.1", port)))
    second = pickle.loads(pickle.dumps(ReusePortListener("127.0.0.1", port)))
    try:
        assert first.fileno() != second.fileno()
        first.listen()
        second.listen()
        assert first.getsockname()[1] == second.getsockname()[1] == port
        plain = socket.socket()
        with pytest.raises(OSError):
            plain.bind(("127.0.0.1", port))
        plain.close()
    finally:
        first.close()
        second.close()


def test_a_port_in_use_stops_the_server_before_workers_start() -> None:
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()

    class Config:
        host, port, workers = "127.0.0.1", taken.getsockname()[1], 2

    try:
        with pytest.raises(SystemExit):
            run_workers(Config())
    finally:
        taken.close()


@pytest.mark.parametrize("interval", [0.0005, 0.002, None])
def test_a_serving_process_takes_its_gil_switch_interval_from_the_settings(
        interval: float | None) -> None:
    from serving.cli import tune_interpreter
    from streamrec.settings import ServingSettings, Settings

    before = sys.getswitchinterval()
    try:
        sys.setswitchinterval(0.004)
        tune_interpreter(Settings(serving=ServingSettings(gil_switch_interval_s=interval)))
        assert sys.getswitchinterval() == pytest.approx(0.004 if interval is None else interval)
    finally:
        sys.setswitchinterval(before)

