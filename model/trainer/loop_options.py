"""How the service loop runs: :class:`LoopOptions`, the process tuning while it trains,
and the cadence of deltas. Imports no TensorFlow."""

from __future__ import annotations

import logging
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from streamrec.settings import Settings, trainer_default

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LoopOptions:
    batch_timeout_s: float = trainer_default("batch_timeout_s")
    poll_timeout_ms: int = 100
    export_every_s: float = trainer_default("export_every_s")
    export_every_samples: int = trainer_default("export_every_samples")
    max_samples: int | None = None
    #: GIL switch interval while ``run()`` trains (``sys.setswitchinterval``, restored on
    #: return; None = leave it). The training thread releases the GIL at every TF and numpy
    #: call; while the fetch thread decodes, Python's default 5 ms interval can keep it
    #: waiting that long each time it wants the GIL back (docs/decisions.md#trainer-loop).
    gil_switch_interval_s: float | None = 0.0005
    #: numpy's BLAS threads while ``run()`` trains (``threadpoolctl``; restored on return;
    #: None = leave them). OpenBLAS workers busy-wait after each call (the evaluation's
    #: scoring matmul), taking CPU from the TF step and the fetch thread; one thread costs
    #: the matmul little (docs/decisions.md#trainer-loop).
    blas_threads: int | None = 1
    #: Kafka client of the samples consumer: "confluent" (librdkafka, parses record batches
    #: in C, several times cheaper per record: docs/decisions.md#trainer-loop),
    #: "kafka-python", or "auto" (confluent if installed). Both are assigned every partition
    #: at the checkpointed offsets and never commit.
    consumer: str = "auto"
    #: Poll and decode in a child process (``model.trainer.fetch_process``): its Python
    #: then takes neither the GIL nor the training process's cores; False = a thread.
    fetch_process: bool = True
    #: Most records one poll returns (the fetch thread decodes a poll as a whole); None =
    #: four batches, at least 2000.
    max_poll_records: int | None = None
    #: Seconds between deltas on the updates topic (0 = none; ``model.trainer.deltas``).
    delta_every_s: float = trainer_default("delta_every_s")
    #: ... while catching up (every chunk since the last delta was full and came at once),
    #: or while every sample since the last delta is history (below).
    delta_catchup_every_s: float = trainer_default("delta_catchup_every_s")
    #: Samples whose event time lags the wall clock by more than this are history (a
    #: backfill of an old log); 0 = never.
    delta_history_lag_s: float = trainer_default("delta_history_lag_s")
    #: Take, dedupe and prepare the next chunk on a thread while the current one trains
    #: (``model.trainer.prepare``; the same updates in the same order); False = in turn.
    prepare_ahead: bool = True

    @classmethod
    def from_settings(cls, settings: Settings, **overrides: Any) -> LoopOptions:
        """The loop options ``settings.trainer`` names, with ``overrides`` of the fields it
        does not own (``max_samples``, the process tuning); a knob it owns is changed in the
        settings (``streamrec.settings.with_trainer``), never here."""
        owned = set(overrides) & set(type(settings.trainer).model_fields)
        if owned:
            raise ValueError(f"{sorted(owned)} are settings (trainer.*): override them there")
        t = settings.trainer
        named: dict[str, Any] = {
            "batch_timeout_s": t.batch_timeout_s,
            "export_every_s": t.export_every_s,
            "export_every_samples": t.export_every_samples,
            "delta_every_s": t.delta_every_s,
            "delta_catchup_every_s": t.delta_catchup_every_s,
            "delta_history_lag_s": t.delta_history_lag_s,
        }
        return cls(**{**named, **overrides})


@contextmanager
def process_tuning(loop: LoopOptions) -> Iterator[None]:
    """The process settings of ``LoopOptions`` while the loop trains, restored after."""
    previous_switch = sys.getswitchinterval()
    if loop.gil_switch_interval_s is not None:
        sys.setswitchinterval(loop.gil_switch_interval_s)
    blas = None
    if loop.blas_threads is not None:
        try:
            from threadpoolctl import threadpool_limits
        except ImportError:
            log.warning("threadpoolctl is not installed: numpy's BLAS threads left as they are")
        else:
            blas = threadpool_limits(limits=loop.blas_threads, user_api="blas")
    try:
        yield
    finally:
        sys.setswitchinterval(previous_switch)
        if blas is not None:
            blas.restore_original_limits()


def delta_interval(loop: LoopOptions, waited: bool, newest_ms: int | None = None,
                   now_ms: int | None = None, quiet_s: float = 0.0) -> float:
    """Seconds between deltas: ``delta_every_s`` while the trainer keeps up with a live
    stream (it ``waited`` for samples since the last delta: a chunk came short or not at
    all), ``delta_catchup_every_s`` while it catches up on a backlog (a backfill, a restart
    behind the stream) or while it trains only history: the newest event time trained
    since the last delta (``newest_ms``) lags the wall clock (``now_ms``) by more than
    ``delta_history_lag_s``. Either way the model lags what users do now by more than a
    delta would win back, and each delta costs the trainer, and every serving worker, work
    that grows with the rows touched — in a backlog most of them. One live sample in the
    window brings back ``delta_every_s``: a backfill mixed with live traffic stays fresh;
    so does a stream that has gone ``quiet_s`` seconds without a sample for at least
    ``delta_every_s`` (the backlog is drained: what it trained reaches serving now)."""
    if loop.delta_catchup_every_s <= 0 or quiet_s >= loop.delta_every_s:
        return loop.delta_every_s
    history = (
        loop.delta_history_lag_s > 0 and newest_ms is not None and now_ms is not None
        and now_ms - newest_ms > loop.delta_history_lag_s * 1000.0
    )
    if waited and not history:
        return loop.delta_every_s
    return max(loop.delta_catchup_every_s, loop.delta_every_s)
