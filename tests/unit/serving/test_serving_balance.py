"""serving.balance: counting a port's keep-alive connections per worker from /proc, the
excess a worker closes, and the fast path's Connection: close."""

from __future__ import annotations

import asyncio
import os
import socket
import threading
from typing import Any

import pytest

from serving.balance import (
    ConnectionBalancer,
    connections_by_pid,
    established_inodes,
    own_socket_inodes,
    read_tables,
    tables_of,
)
from serving.fastpath import RecommendFastPath
from serving.workers import address_family, workers_balancer
from tests.support import free_port

HEADER = ("  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  "
          "timeout inode\n")
TCP = HEADER + "\n".join([
    # listening on 8000 (0A), two established to 8000, one established from 8000 outwards
    "   0: 0100007F:1F40 00000000:0000 0A 00000000:00000000 00:00000000 00000000  0 0 100 1",
    "   1: 0100007F:1F40 0100007F:D431 01 00000000:00000000 00:00000000 00000000  0 0 101 1",
    "   2: 0100007F:1F40 0100007F:D433 01 00000000:00000000 00:00000000 00000000  0 0 102 1",
    "   3: 0100007F:D431 0100007F:1F40 01 00000000:00000000 00:00000000 00000000  0 0 103 1",
    "   4: 0100007F:1F41 0100007F:D435 01 00000000:00000000 00:00000000 00000000  0 0 104 1",
    "   5: 0100007F:1F40 0100007F:D437 06 00000000:00000000 00:00000000 00000000  0 0 0 1",
])
TCP6 = HEADER + (
    "   0: 00000000000000000000000001000000:1F40 00000000000000000000000001000000:E001 01 "
    "00000000:00000000 00:00000000 00000000  0 0 105 1")


def test_established_connections_to_the_port_only() -> None:
    assert established_inodes(8000, [TCP, TCP6]) == {101, 102, 105}
    assert established_inodes(8001, [TCP]) == {104}
    assert established_inodes(9, [TCP, ""]) == set()


def test_a_worker_closes_its_excess_over_its_share() -> None:
    mine: set[int] = set()
    tables = [""]

    def table(inodes: range) -> str:
        return HEADER + "\n".join(
            f" {i}: 0100007F:1F40 0100007F:{0xC000 + i:04X} 01 00000000:00000000 "
            f"00:00000000 00000000  0 0 {i} 1" for i in inodes)

    balancer = ConnectionBalancer(8000, 2, tables=lambda: tables, own=lambda: mine)
    tables[0], mine = table(range(1, 17)), set(range(1, 11))  # 10 of 16 here: share 8
    assert balancer.refresh() == 2 and balancer.last == (10, 16)
    assert [balancer.should_close() for _ in range(3)] == [True, True, False]
    assert balancer.closed == 2
    tables[0], mine = table(range(1, 18)), set(range(1, 10))  # 9 of 17: share 9
    assert balancer.refresh() == 0 and not balancer.should_close()
    tables[0], mine = table(range(1, 17)), set(range(1, 7))  # the lighter worker: nothing
    assert balancer.refresh() == 0
    tables[0], mine = table(range(1, 17)), set(range(1, 12))
    balancer.refresh()
    tables[0], mine = table(range(1, 17)), set(range(1, 9))  # evened out meanwhile
    assert balancer.refresh() == 0 and not balancer.should_close()  # replaced, not added
    with pytest.raises(ValueError, match="workers"):
        ConnectionBalancer(8000, 0)


def test_counts_this_process_s_real_connections() -> None:
    port = free_port()
    server = socket.create_server(("127.0.0.1", port))
    clients = [socket.create_connection(("127.0.0.1", port)) for _ in range(3)]
    accepted = [server.accept()[0] for _ in clients]
    try:
        inodes = {os.fstat(s.fileno()).st_ino for s in accepted}
        assert established_inodes(port, read_tables()) == inodes  # not the clients' ends
        assert inodes <= own_socket_inodes()
        balancer = ConnectionBalancer(port, 2)
        assert balancer.refresh() == 1 and balancer.last == (3, 3)  # share 2 of 3
        assert ConnectionBalancer(port, 1).refresh() == 0
        assert connections_by_pid(port, [os.getpid(), 2**22 + 7]) == {
            os.getpid(): 3, 2**22 + 7: 0}  # a pid that does not exist holds none
    finally:
        for s in clients + accepted + [server]:
            s.close()


def test_the_table_of_the_listener_s_family_only() -> None:
    assert tables_of(address_family("127.0.0.1")) == tables_of(socket.AF_INET) == ("tcp",)
    assert tables_of(address_family("::")) == tables_of(socket.AF_INET6) == ("tcp6",)
    port = free_port()
    server = socket.create_server(("127.0.0.1", port))
    client = socket.create_connection(("127.0.0.1", port))
    accepted = server.accept()[0]
    try:
        inode = os.fstat(accepted.fileno()).st_ino
        assert established_inodes(port, read_tables(names=tables_of(socket.AF_INET))) == {inode}
        assert established_inodes(port, read_tables(names=("tcp6",))) == set()
    finally:
        for s in (client, accepted, server):
            s.close()


def test_a_worker_counts_from_its_listener_s_table() -> None:
    port = free_port()
    server = socket.create_server(("127.0.0.1", port))
    client = socket.create_connection(("127.0.0.1", port))
    accepted = server.accept()[0]
    try:
        for spec, seen in ((f"{port} 2 127.0.0.1", 1), (f"{port} 2", 1), (f"{port} 2 ::1", 0)):
            balancer = workers_balancer(spec)
            balancer.refresh()
            assert (balancer.port, balancer.workers, balancer.last) == (port, 2, (seen, seen))
    finally:
        for s in (client, accepted, server):
            s.close()


def test_the_count_runs_off_the_event_loop() -> None:
    """A count blocked in the kernel must not hold the event loop (``serving.balance``):
    the loop hears that the count started while the count is still blocked."""
    release = threading.Event()
    counted_on: list[threading.Thread] = []
    finished: list[bool] = []
    wake: list[Any] = []  # (loop, started event), set before the first count

    def tables() -> list[str]:
        counted_on.append(threading.current_thread())
        loop, started = wake[0]
        loop.call_soon_threadsafe(started.set)
        release.wait(5.0)  # on the loop's thread this would stop the loop for 5 s
        finished.append(True)
        return [""]

    async def main() -> bool:
        started = asyncio.Event()
        wake.append((asyncio.get_running_loop(), started))
        balancer = ConnectionBalancer(8000, 2, interval_s=0.0, tables=tables, own=set)
        task = asyncio.create_task(balancer.run())
        await asyncio.wait_for(started.wait(), 10.0)
        still_blocked = not finished
        release.set()
        task.cancel()
        return still_blocked

    assert asyncio.run(main()), "the event loop waited for the count"
    assert counted_on[0] is not threading.main_thread()


def _get(app: Any) -> list[dict[str, Any]]:
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {"type": "http", "method": "GET", "path": "/recommend", "headers": [],
             "query_string": b"user_id=alice&k=3"}
    asyncio.run(app(scope, receive, send))
    return sent


def test_the_fast_path_closes_the_connection_when_asked() -> None:
    async def answer(user_id: str, k: int, exclude_seen: bool) -> dict[str, Any]:
        return {"user_id": user_id, "items": []}

    async def routed(scope: Any, receive: Any, send: Any) -> None:
        raise AssertionError("a well-formed request is not routed")

    closes = iter([False, True])
    app = RecommendFastPath(routed, answer, 20, 500, close=lambda: next(closes))
    for expected in (False, True):
        start = _get(app)[0]
        assert start["status"] == 200
        assert ((b"connection", b"close") in start["headers"]) is expected
    assert (b"connection", b"close") not in _get(RecommendFastPath(routed, answer, 20, 500))[0][
        "headers"]
