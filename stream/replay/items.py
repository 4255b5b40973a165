"""Replay of a catalogue file into the ``items`` topic (``streamrec replay --items FILE``).

The records come from :func:`stream.items.read_catalogue` (checked against the feature spec),
are sent with the event replay's producer (:func:`stream.replay.runner.replay_producer_factory`:
``acks=all``, idempotent) keyed by ``item_id``, and the run returns only once Kafka
acknowledged every one of them (a flush every ``flush_every`` records and at the end); a
record Kafka refused, or a bad row of the file, fails the run (:class:`ReplayError`, or
:class:`stream.items.CatalogueError` naming the line). Sending a file again is harmless: the
store keeps the newest version of each item (``feature_store/FORMAT.md``), so no ledger.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from feature_store.catalogue import FeatureSpec
from stream.items import item_record, read_catalogue
from stream.replay.plan import ReplayError
from stream.replay.runner import replay_producer_factory, start_offsets
from streamrec.settings import Settings

log = logging.getLogger(__name__)

#: Seconds between progress lines in the log when no progress bar is shown.
PROGRESS_LOG_S = 5.0


@dataclass
class ItemReplayReport:
    topic: str
    sent: int = 0
    deleted: int = 0
    seconds: float = 0.0

    def summary(self) -> str:
        rate = self.sent / self.seconds if self.seconds > 0 else 0.0
        return (f"replayed {self.sent:,} items ({self.deleted:,} deletes) into {self.topic} "
                f"in {self.seconds:.1f} s ({rate:,.0f} items/s)")

    def as_dict(self) -> dict[str, Any]:
        return {"topic": self.topic, "sent": self.sent, "deleted": self.deleted,
                "seconds": self.seconds}


def run_item_replay(
    settings: Settings,
    path: Path,
    fmt: str | None = None,
    *,
    tags: Path | None = None,
    progress: bool = False,
    flush_every: int = 10_000,
    producer_factory: Callable[[Settings], Any] = replay_producer_factory,
    ensure_topic: Callable[[Settings, str], Any] = start_offsets,
    monotonic: Callable[[], float] = time.monotonic,
) -> ItemReplayReport:
    """Send the items of a catalogue file to ``settings.kafka.items_topic`` (module doc)."""
    from tqdm import tqdm

    topic = settings.kafka.items_topic
    report = ItemReplayReport(topic)
    spec = FeatureSpec.load(settings.features.spec_file)
    records = read_catalogue(path, fmt, tags=tags, spec=spec)
    started = last_log = monotonic()
    ensure_topic(settings, topic)
    failures: list[BaseException] = []

    def flush() -> None:
        producer.flush()
        if failures:
            raise ReplayError(f"Kafka did not acknowledge {len(failures)} item(s): {failures[0]}")

    producer = producer_factory(settings)
    bar = tqdm(unit="item", unit_scale=True, disable=not progress, mininterval=0.5)
    try:
        for wire in records:
            key, value = item_record(wire)
            producer.send(topic, value=value, key=key).add_errback(failures.append)
            report.sent += 1
            report.deleted += wire["deleted"]
            bar.update(1)
            if report.sent % flush_every == 0:
                flush()
                now = monotonic()
                if not progress and now - last_log >= PROGRESS_LOG_S:
                    last_log = now
                    log.info("replay --items: %s sent", f"{report.sent:,}")
        flush()
    finally:
        bar.close()
        producer.close(timeout=10)
    report.seconds = monotonic() - started
    return report
