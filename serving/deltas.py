"""Serving's follower of the delta stream: applies deltas off the request path, in order.

One :class:`DeltaFollower` per serving process (or, with ``serve --workers N``, one for the
host in a composer process whose states the workers map: ``serving.shared_state``). Its
thread reads the updates topic and follows the registry's ``CURRENT`` version: records of
other bases are skipped, a new base starts its lineage from the version's snapshot, a seq
already applied is skipped, a gap or a bad checksum resyncs, and a delta is applied, composed
(``model.delta.served.Composer``), checked and swapped in as one reference. In a worker the
apply is paced (:class:`Pacer`, ``serving.delta_apply_share``) so requests keep most of the
CPU meanwhile (figures: ``docs/decisions.md#delta-stream``). ``status()`` is what ``/model``
shows under ``delta``. The record rules in full: docs/internals.md.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from model.artifact.registry import Registry, RegistryError
from model.delta import (
    SNAPSHOT_FILE,
    DeltaError,
    ModelState,
    apply,
    decode,
    from_snapshot,
    peek,
    state_checksum,
)
from model.delta.served import Composer
from serving.errors import VersionRefused
from serving.loader import LoadedModel, ModelLoader, smoke_check
from streamrec.settings import KafkaSettings

log = logging.getLogger(__name__)

#: How far before a version's creation its lineage's deltas are sought (clock skew).
SEEK_MARGIN_MS = 5_000


class Pacer:
    """Holds a thread to ``share`` of a core while it works: each call sleeps the thread's
    CPU time since the last call (or :meth:`start`) times ``1 / share - 1``. CPU time, not
    wall time: time spent waiting for the interpreter or a core is not the thread's work.
    ``share`` 1: never sleeps."""

    def __init__(self, share: float, sleep: Callable[[float], None] = time.sleep,
                 cpu: Callable[[], float] = time.thread_time) -> None:
        if not 0.0 < share <= 1.0:
            raise ValueError(f"share must be in (0, 1], got {share}")
        self.factor = 1.0 / share - 1.0
        self.sleep, self.cpu = sleep, cpu
        self._mark = cpu()
        #: Seconds slept since :meth:`start`.
        self.slept = 0.0

    def start(self) -> Pacer:
        self._mark, self.slept = self.cpu(), 0.0
        return self

    def __call__(self) -> None:
        used = self.cpu() - self._mark
        if self.factor and used > 0.0:
            wait = used * self.factor
            self.sleep(wait)
            self.slept += wait
        self._mark = self.cpu()


def serve_in(loader: ModelLoader, artifact: Any, clock: Callable[[], datetime]
             ) -> LoadedModel | None:
    """Swap ``artifact`` in; returns the model it replaced, for the caller to hold until its
    next swap: requests still on it finish, and the one that drops it last is then the
    follower's thread, not a request's (freeing a large catalog's arrays and id map takes
    time: ``docs/decisions.md#delta-stream``)."""
    previous = loader.current
    loader.swap(LoadedModel(artifact, artifact.manifest, clock().astimezone(UTC),
                            loader.ann_view(artifact, previous)), quiet=True)
    return previous


class FollowerThread:
    """A follower's daemon thread: :meth:`start` runs ``_run`` until :meth:`stop`."""

    name = "follower"
    _stop: threading.Event
    _thread: threading.Thread | None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 10.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)

    def _run(self) -> None:
        raise NotImplementedError


def state_status(state: ModelState | None, clock: Callable[[], datetime],
                 checksum: bool) -> dict[str, Any]:
    """The served state's part of ``/model``'s ``delta``: base version, sequence,
    trained-through time, lag behind the trainer's delta and (``checksum``) checksum."""
    lag = None
    if state is not None and state.created_at:
        lag = (clock() - datetime.fromisoformat(state.created_at)).total_seconds()
    return {
        "base_version": state.base_version if state else None,
        "seq": state.seq if state else None,
        "trained_through_ms": state.trained_through_ms if state else None,
        "lag_s": lag,
        "state_checksum": state_checksum(state) if checksum and state else None,
    }


class DeltaFollower(FollowerThread):
    """Follows ``kafka.updates_topic`` for one serving process (see the module doc)."""

    name = "delta-follower"

    def __init__(
        self,
        loader: ModelLoader,
        registry: Registry,
        kafka: KafkaSettings,
        clock: Callable[[], datetime],
        consumer_factory: Callable[[], Any] | None = None,
        apply_share: float = 1.0,
    ) -> None:
        self.loader, self.registry, self.kafka, self.clock = loader, registry, kafka, clock
        self._factory = consumer_factory
        #: Paces each delta's apply to ``apply_share`` of a core (module doc).
        self.pacer = Pacer(apply_share)
        self.state: ModelState | None = None
        self.applied = 0
        self.resyncs = 0
        self.errors = 0
        self.last_apply_ms: float | None = None
        #: CPU time of the follower thread for it (the wall time grows with the load).
        self.last_apply_cpu_ms: float | None = None
        self.last_created_at: str | None = None
        #: Builds each state's artifact, patching the last one (``model.delta.served``).
        self.composer = Composer()
        self._stuck: tuple[str, int] | None = None
        #: The last version found without a snapshot (not looked for again).
        self._missing: str | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._retired: LoadedModel | None = None

    # -- lifecycle -----------------------------------------------------------------------------
    def _consumer(self) -> Any:
        if self._factory is not None:
            return self._factory()
        from stream.kafka_client import ensure_updates_topic, updates_consumer

        ensure_updates_topic(self.kafka)
        return updates_consumer(self.kafka)

    def _run(self) -> None:
        consumer = None
        while not self._stop.is_set():
            try:
                if consumer is None:
                    consumer = self._consumer()
                    self._resync(consumer, self.registry.current())
                for records in consumer.poll(timeout_ms=200).values():
                    for record in records:
                        if self.handle(consumer, record.offset, record.value):
                            break  # sought elsewhere: the rest of this poll is stale
                self.follow_pointer()
            except Exception as exc:  # noqa: BLE001 - Kafka or registry trouble: retry later
                self.errors += 1
                log.warning("delta follower: %s; reconnecting", exc)
                if consumer is not None:
                    consumer.close()
                consumer = None
                self._stop.wait(1.0)
        if consumer is not None:
            consumer.close()

    # -- records -------------------------------------------------------------------------------
    def handle(self, consumer: Any, offset: int, value: bytes) -> bool:
        """One record of the topic (module doc); True when it made the consumer seek."""
        try:
            base, seq = peek(value)
        except DeltaError as exc:
            log.error("delta at offset %d does not decode: %s", offset, exc)
            self.errors += 1
            return False
        current = self.registry.current()
        if base != current:
            return False
        state = self.state
        if state is None or state.base_version != base:
            state = self._lineage(base)
            if state is None:
                return False
        if seq <= state.seq:
            return False
        if seq > state.seq + 1:
            if self._stuck == (base, seq):
                return False  # replayed once already: wait for the next lineage
            log.warning("delta %d of %s after %d: resync", seq, base, state.seq)
            self._stuck = (base, seq)
            self._resync(consumer, base)
            return True
        started, cpu = time.perf_counter(), time.thread_time()
        pause = self.pacer.start()
        try:
            delta = decode(value)
            pause()
            new = apply(state, delta, pause)
            artifact = self.composer.compose(new, delta, pause)
            pause()
            smoke_check(artifact)
        except (DeltaError, VersionRefused, ValueError) as exc:
            log.error("delta %d of %s at offset %d refused: %s", seq, base, offset, exc)
            self.errors += 1
            return False
        self.applied += 1
        self.last_apply_ms = (time.perf_counter() - started) * 1000.0
        self.last_apply_cpu_ms = (time.thread_time() - cpu) * 1000.0
        self._serve(new, artifact)
        return False

    def follow_pointer(self) -> None:
        """Start the lineage of ``CURRENT`` when it moved (a new full version, a pin or a
        rollback): its deltas, if any, come later on the topic than its snapshot."""
        current = self.registry.current()
        if current is None or current == self._missing:
            return
        if self.state is None or self.state.base_version != current:
            self._lineage(current)

    def _serve(self, state: ModelState, artifact: Any) -> None:
        """Serve ``state`` (its ``artifact`` composed and checked); the composer of a host's
        workers writes it for them instead (``serving.shared_state``)."""
        self.state = state
        self.last_created_at = state.created_at
        self._retired = serve_in(self.loader, artifact, self.clock)

    def _lineage(self, base: str) -> ModelState | None:
        """The snapshot state of ``base`` from the registry (served at once), or None."""
        try:
            record = (self.registry.path(base) / SNAPSHOT_FILE).read_bytes()
            state = from_snapshot(decode(record))
        except (RegistryError, OSError, DeltaError) as exc:
            if base != self._missing:
                log.warning("no delta snapshot of version %s: %s", base, exc)
            self._missing = base
            return None
        artifact = self.composer.compose(state)
        self._serve(state, artifact)
        return state

    def _resync(self, consumer: Any, base: str | None) -> None:
        """Start ``base``'s lineage from its snapshot and seek to just before its deltas."""
        from stream.kafka_client import seek_to_time

        self.resyncs += 1
        state = self._lineage(base) if base is not None else None
        at = 1 << 62  # nothing to follow yet: from the end
        if state is not None and state.created_at is not None:
            created = datetime.fromisoformat(state.created_at)
            at = int(created.timestamp() * 1000) - SEEK_MARGIN_MS
        seek_to_time(consumer, self.kafka.updates_topic, at)

    def status(self, checksum: bool = False) -> dict[str, Any]:
        """What ``/model`` shows under ``delta``; ``checksum``: also the state's
        ``state_checksum``."""
        return {
            **state_status(self.state, self.clock, checksum),
            "applied": self.applied,
            "resyncs": self.resyncs,
            "errors": self.errors,
            "last_apply_ms": self.last_apply_ms,
            "last_apply_cpu_ms": self.last_apply_cpu_ms,
        }
