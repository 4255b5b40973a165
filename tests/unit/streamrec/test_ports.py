"""Free ports are drawn below the kernel's ephemeral range (where no outgoing connection
takes its local port), distinct, free, and never handed out twice by one process."""

from __future__ import annotations

import socket

import pytest

from streamrec import ports


def test_ports_are_distinct_free_and_below_the_ephemeral_range() -> None:
    got = ports.free_ports(20)
    assert len(set(got)) == 20
    assert all(ports.LOW <= p < ports.ephemeral_low() for p in got)
    for p in got:  # free: each binds
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", p))


def test_a_port_is_not_handed_out_twice() -> None:
    first = set(ports.free_ports(50))
    again = set(ports.free_ports(50))
    assert not first & again


def test_a_listening_port_is_skipped(monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        taken = busy.getsockname()[1]
        draws = iter(range(taken, taken + 100))  # the busy port is drawn first
        monkeypatch.setattr(ports, "LOW", taken)
        monkeypatch.setattr(ports, "ephemeral_low", lambda: taken + 100)
        monkeypatch.setattr(ports._rng, "randrange", lambda lo, hi: next(draws))
        got = ports.free_port()
        assert taken < got < taken + 100


def test_without_room_below_the_range_the_kernel_chooses(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(ports, "ephemeral_low", lambda: ports.LOW + 10)
    got = ports.free_ports(3)
    assert len(set(got)) == 3
