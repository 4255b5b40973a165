"""The fetch thread: chunk boundaries, dead letters and offsets (``model.trainer_fetch``)."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import NamedTuple

import numpy as np

from model.dedupe import id_hashes
from model.samples import Sample, encode_sample
from model.trainer_fetch import Chunk, ChunkFetcher


class TP(NamedTuple):
    topic: str
    partition: int


class Record(NamedTuple):
    topic: str
    partition: int
    offset: int
    key: bytes
    value: bytes


class ScriptedConsumer:
    """Returns the scripted polls in order, then nothing."""

    def __init__(self, polls: list[dict[TP, list[Record]]]) -> None:
        self.polls: Iterator[dict[TP, list[Record]]] = iter(polls)

    def poll(self, timeout_ms: int) -> dict[TP, list[Record]]:
        return next(self.polls, {})


def _ok(partition: int, offset: int) -> Record:
    s = Sample(f"p{partition}o{offset}", "u1", f"i{offset}", "click", 1.0, 100 * offset + partition,
               ("h1", "h2"))
    return Record("t", partition, offset, b"u1", encode_sample(s))


def _bad(partition: int, offset: int) -> Record:
    return Record("t", partition, offset, b"u1", b"{broken")


def _fetch(polls: list[dict[TP, list[Record]]], n_chunks: int, batch_size: int = 3) -> list[Chunk]:
    ticks = itertools.count(step=1.0)
    fetcher = ChunkFetcher(ScriptedConsumer(polls), batch_size, history_len=4,
                           batch_timeout_s=0.5, poll_timeout_ms=1,
                           monotonic=lambda: float(next(ticks)))
    fetcher.start()
    try:
        chunks = []
        for _ in range(n_chunks):
            chunk = fetcher.get(timeout_s=10.0)
            assert chunk is not None
            chunks.append(chunk)
        return chunks
    finally:
        fetcher.stop()


def test_chunks_carry_samples_dead_letters_and_next_offsets_in_record_order() -> None:
    p0 = [_ok(0, 0), _bad(0, 1), _ok(0, 2), _ok(0, 3), _ok(0, 4)]
    p1 = [_ok(1, 0), _ok(1, 1)]
    polls = [{TP("t", 0): p0, TP("t", 1): p1}, {TP("t", 1): [_bad(1, 2)]}]
    first, second, third = _fetch(polls, 3)

    assert [s.sample_id for s in first.samples] == ["p0o0", "p0o2", "p0o3"]
    assert [(r.offset, reason.split(":")[0]) for r, reason in first.rejected] == [(1, "not JSON")]
    assert first.offsets == {"t:0": 4}
    assert first.batch is not None and len(first.batch) == 3

    assert [s.sample_id for s in second.samples] == ["p0o4", "p1o0", "p1o1"]
    assert second.offsets == {"t:0": 5, "t:1": 2}
    assert second.id_hashes.tolist() == id_hashes(["p0o4", "p1o0", "p1o1"]).tolist()
    np.testing.assert_array_equal(second.ts_ms, [400, 1, 101])

    # a chunk of only undecodable records still advances its offsets (by the batch timeout)
    assert third.samples == [] and third.batch is None and third.id_hashes.size == 0
    assert [r.offset for r, _ in third.rejected] == [2]
    assert third.offsets == {"t:1": 3}
