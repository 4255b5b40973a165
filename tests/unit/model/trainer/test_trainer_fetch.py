"""The fetch thread: chunk boundaries, dead letters and offsets (``model.trainer.fetch_thread``), the
whole-poll decoder it uses (``model.trainer.samples.decode_columns``) and the librdkafka source."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import NamedTuple

import numpy as np
import orjson
import pytest

from model.trainer.dedupe import id_hashes
from model.trainer.fetch_thread import Chunk, ChunkFetcher, ConfluentSource, KafkaPythonSource
from model.trainer.samples import (
    KeyCache,
    Sample,
    SampleError,
    _fast_columns,
    batch_from_columns,
    decode_columns,
    decode_sample,
    encode_sample,
    to_batch,
)


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
    fetcher = ChunkFetcher(KafkaPythonSource(ScriptedConsumer(polls)), batch_size, history_len=4,
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

    assert first.sample_ids == ["p0o0", "p0o2", "p0o3"]
    assert [(r.offset, reason.split(":")[0]) for r, reason in first.rejected] == [(1, "not JSON")]
    assert first.offsets == {"t:0": 4}
    assert first.batch is not None and len(first.batch) == 3

    assert second.sample_ids == ["p0o4", "p1o0", "p1o1"]
    assert second.offsets == {"t:0": 5, "t:1": 2}
    assert second.id_hashes.tolist() == id_hashes(["p0o4", "p1o0", "p1o1"]).tolist()
    np.testing.assert_array_equal(second.ts_ms, [400, 1, 101])

    # a chunk of only undecodable records still advances its offsets (by the batch timeout)
    assert third.sample_ids == [] and third.batch is None and third.id_hashes.size == 0
    assert [r.offset for r, _ in third.rejected] == [2]
    assert third.offsets == {"t:1": 3}


# -- whole-poll decoding: the same verdicts as decode_sample ---------------------------------

_GOOD = {"sample_id": "s", "user_id": "u", "item_id": "i", "event_type": "click", "weight": 2,
         "ts": 5, "history": ["a", "b"]}


def _wire(**changes: object) -> bytes:
    obj = {**_GOOD, **changes}
    return orjson.dumps({k: v for k, v in obj.items() if v is not _ABSENT})


_ABSENT = object()

_INVALID = [
    b"{broken", b"[1, 2]", b'"text"', None,
    _wire(weight=0), _wire(weight=-1.5), _wire(weight=True), _wire(weight="1"), _wire(weight=_ABSENT),
    _wire(ts=1.5), _wire(ts=False), _wire(ts=_ABSENT), _wire(ts=2**64 - 1),
    _wire(history=None), _wire(history="a"), _wire(history=[""]), _wire(history=["a", 3]),
    _wire(sample_id=""), _wire(user_id=7), _wire(item_id=_ABSENT), _wire(event_type=None),
    # the column path parses with a typed decoder: what JSON allows beyond the dict above
    _wire()[:-1] + b',"weight":-1}',  # a repeated key: the last one counts (as in orjson)
    _wire(weight=_ABSENT)[:-1] + b',"weight":1e400}',  # overflows to inf
    _wire(ts=_ABSENT)[:-1] + b',"ts":-9223372036854775809}',  # below int64
]


@pytest.mark.parametrize("bad", range(len(_INVALID)))
def test_a_poll_with_one_bad_record_names_it_and_keeps_the_others_in_order(bad: int) -> None:
    values = [_wire(sample_id="a"), _INVALID[bad], _wire(sample_id="b", history=_ABSENT)]
    with pytest.raises(SampleError) as reason:
        decode_sample(_INVALID[bad])
    cols, rejected = decode_columns(values)
    assert rejected == [(1, str(reason.value))]
    assert cols.sample_ids == ["a", "b"] and cols.histories == [["a", "b"], []]


def test_a_clean_poll_decodes_to_the_columns_of_decode_sample() -> None:
    values = [_wire(sample_id=f"s{i}", weight=0.5 + i, ts=10 * i, history=["h"] * i)
              for i in range(6)] + [_wire(history=_ABSENT), _wire(extra={"x": [1]})]
    cols, rejected = decode_columns(values)
    samples = [decode_sample(v) for v in values]
    assert rejected == []
    assert _fast_columns(values) == cols  # decoded on the column path, not record by record
    assert cols.sample_ids == [s.sample_id for s in samples]
    assert cols.user_ids == [s.user_id for s in samples]
    assert cols.item_ids == [s.item_id for s in samples]
    assert cols.weights == [s.weight for s in samples]
    assert cols.ts_ms == [s.ts_ms for s in samples]
    assert [tuple(h) for h in cols.histories] == [s.history for s in samples]
    keys = KeyCache()
    by_columns = batch_from_columns(cols.user_ids, cols.item_ids, cols.histories,
                                    np.array(cols.weights, np.float32), 3, keys)
    by_samples = to_batch(samples, 3, keys)
    for name in ("user_keys", "item_keys", "history", "weights"):
        np.testing.assert_array_equal(getattr(by_columns, name), getattr(by_samples, name))


# -- the librdkafka source ---------------------------------------------------------------------

class FakeError:
    def __init__(self, code: int, fatal: bool = False) -> None:
        self._code, self._fatal = code, fatal

    def code(self) -> int:
        return self._code

    def fatal(self) -> bool:
        return self._fatal

    def __str__(self) -> str:
        return f"error {self._code}"


class FakeMessage:
    def __init__(self, partition: int, offset: int, value: bytes | None,
                 error: FakeError | None = None) -> None:
        self._p, self._o, self._v, self._e = partition, offset, value, error

    def error(self) -> FakeError | None:
        return self._e

    def topic(self) -> str:
        return "t"

    def partition(self) -> int:
        return self._p

    def offset(self) -> int:
        return self._o

    def key(self) -> bytes:
        return b"u1"

    def value(self) -> bytes | None:
        return self._v


class ScriptedConfluent:
    def __init__(self, batches: list[list[FakeMessage]]) -> None:
        self.batches = iter(batches)
        self.asked: list[int] = []

    def consume(self, num_messages: int, timeout: float) -> list[FakeMessage]:
        self.asked.append(num_messages)
        return next(self.batches, [])


def test_confluent_source_skips_eof_and_transient_errors_and_raises_a_fatal_one() -> None:
    from confluent_kafka import KafkaError, KafkaException

    ok = [FakeMessage(0, o, _ok(0, o).value) for o in range(3)]
    consumer = ScriptedConfluent([
        [ok[0], FakeMessage(0, -1, None, FakeError(KafkaError._PARTITION_EOF)), ok[1]],
        [FakeMessage(0, -1, None, FakeError(KafkaError._TRANSPORT))],
        [ok[2], FakeMessage(0, -1, None, FakeError(KafkaError._FATAL, fatal=True))],
    ])
    source = ConfluentSource(consumer, max_records=7, monotonic=lambda: 0.0)
    first = source.poll(0.01)
    assert first is not None and first.offsets == [0, 1] and first.partitions == [0, 0]
    assert source.poll(0.01) is None
    with pytest.raises(KafkaException):
        source.poll(0.01)
    assert source.poll(0.01) is None
    assert consumer.asked == [7, 7, 7, 7]


def test_chunks_from_the_confluent_source_cut_at_the_batch_size_or_the_timeout() -> None:
    msgs = [FakeMessage(0, o, _ok(0, o).value if o != 2 else b"{broken") for o in range(6)]
    consumer = ScriptedConfluent([msgs[:4], msgs[4:]])
    ticks = itertools.count(step=1.0)
    fetcher = ChunkFetcher(ConfluentSource(consumer, 100, lambda: 0.0), 2, history_len=4,
                           batch_timeout_s=0.5, poll_timeout_ms=1,
                           monotonic=lambda: float(next(ticks)))
    fetcher.start()
    try:
        chunks = [fetcher.get(timeout_s=10.0) for _ in range(3)]
    finally:
        fetcher.stop()
    assert all(c is not None for c in chunks)
    # every clock reading is a second later: the rest of the first poll leaves by the timeout
    assert [c.sample_ids for c in chunks if c] == [["p0o0", "p0o1"], ["p0o3"], ["p0o4", "p0o5"]]
    assert [c.offsets for c in chunks if c] == [{"t:0": 2}, {"t:0": 4}, {"t:0": 6}]
    assert [[(r.offset, r.value) for r, _ in c.rejected] for c in chunks if c] == [
        [], [(2, b"{broken")], []]


def test_fetch_process_reports_a_failure_of_its_child() -> None:
    """The child's error reaches ``get`` as a RuntimeError (here: an unknown consumer
    backend, raised by ``open_source`` in the child) and the child exits."""
    import time

    from model.trainer.fetch_process import ProcessFetcher
    from streamrec.settings import KafkaSettings

    fetcher = ProcessFetcher(KafkaSettings(), "g", {}, "no-such-client", 10, 4, 4, 0.2, 100)
    fetcher.start()
    deadline = time.monotonic() + 60.0
    with pytest.raises(RuntimeError, match="no-such-client"):
        while time.monotonic() < deadline:
            fetcher.get(0.5)
    fetcher.stop()
    assert not fetcher._process.is_alive()
