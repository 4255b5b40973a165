"""The quality guard on the real stack: a trainer (in this process) consumes samples from
Kafka and publishes deltas on the updates topic; a burst of poisoned samples (random items
for many users) holds publication, so nothing trained on the burst reaches the registry or
the topic serving follows; ordinary samples before it do not trip it, after it resume."""

from __future__ import annotations

import threading
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

import numpy as np
import pytest

from model.delta import decode
from model.evaluation.synthetic import SyntheticConfig, SyntheticStream
from model.trainer.rolling import RECENT_TARGETS
from model.trainer.samples import Sample
from streamrec.settings import Settings, with_trainer
from tests.support import produce_samples, wait_until

pytestmark = pytest.mark.integration

#: A catalogue (every item once first) larger than what the ordinary traffic touches of late:
#: a random item is then often rarer than all of it (``model.trainer.guard_rule``; on a
#: catalogue the traffic covers whole, random items look like its own).
USERS, ITEMS = 400, 2000

def _catalogue(stream: SyntheticStream) -> list[Sample]:
    """Samples of the stream's users, each item of the catalogue once (its launch)."""
    return [replace(s, item_id=stream.item_id(i)) for i, s in enumerate(stream.take(ITEMS))]


def _poisoned(stream: SyntheticStream, n: int, seed: int) -> list[Sample]:
    """Samples of the stream's users with a uniformly random item each."""
    rng = np.random.default_rng(seed)
    return [replace(s, item_id=stream.item_id(int(rng.integers(ITEMS))))
            for s in stream.take(n)]


def _updates(settings: Settings) -> list[Any]:
    """Every delta on the updates topic so far, decoded."""
    from kafka import KafkaConsumer, TopicPartition

    consumer = KafkaConsumer(bootstrap_servers=settings.kafka.bootstrap, group_id=None,
                             enable_auto_commit=False, consumer_timeout_ms=1500)
    try:
        tp = TopicPartition(settings.kafka.updates_topic, 0)
        consumer.assign([tp])
        consumer.seek_to_beginning(tp)
        return [decode(r.value) for r in consumer]
    finally:
        consumer.close()


def test_a_poisoned_burst_holds_publication_and_ordinary_samples_do_not(
    settings: Settings,
) -> None:
    from model.towers.two_tower import ModelConfig
    from model.trainer.build import build_service
    from model.trainer.loop_options import LoopOptions
    from model.trainer.trainer import TrainOptions

    settings = with_trainer(settings, guard_margin=0.2, guard_min_scored=512)
    stream = SyntheticStream(SyntheticConfig(users=USERS, items=ITEMS, clusters=10,
                                             history_len=20, seed=3))
    service = build_service(
        settings, ModelConfig(history_len=20),
        TrainOptions(batch_size=256, eval_rows=128, eval_every=1, eval_refresh_steps=5,
                     eval_window=4000, evict_every_steps=0, spare_epochs=1),
        LoopOptions.from_settings(with_trainer(
            settings, export_every_s=3600, export_every_samples=4000, delta_every_s=0.3,
            delta_catchup_every_s=0.0, delta_history_lag_s=0.0)),
        clock=lambda: datetime.now(UTC),
    )
    guard = service.guard
    assert guard is not None
    thread = threading.Thread(target=service.run, name="trainer", daemon=True)
    thread.start()
    try:
        # the catalogue, then ordinary samples: versions and deltas flow, the guard never holds;
        # enough of them that ``unexplained`` warms up (its rarity needs RECENT_TARGETS training
        # targets, then ``min_scored`` judged rows before a publication sets its reference)
        normal = 2 * RECENT_TARGETS
        produce_samples(settings, _catalogue(stream) + stream.take(normal - ITEMS))

        def published_through(n: int) -> bool:
            d = service.deltas
            return d is not None and d.last is not None and d.last.samples_trained == n

        wait_until(lambda: published_through(normal), 120, "the ordinary samples published")
        assert guard.holds == 0, guard.status()
        assert guard.reference is not None and guard.reference > 0.15, guard.status()
        assert guard.cusums["unexplained"].judging, guard.status()
        served_before = service.registry.current()

        # the burst: every row it scores misses far more than the healthy figure allows
        burst = 3_000
        produce_samples(settings, _poisoned(stream, burst, seed=9))
        wait_until(lambda: service.state.samples_trained >= normal + burst, 120,
                   "the burst trained")
        wait_until(lambda: guard.held, 10, "the guard holding")
        assert guard.holds == 1
        status = service.status()["guard"]
        assert status["held"] and status["current_recall"] is not None
        note = service.registry.guard()  # what serving's /model shows under "guard"
        assert note is not None and note["held"] and note["healthy_recall"] > 0.15
        # nothing trained on the burst was published: not as a delta, not as a version
        deltas = _updates(settings)
        assert deltas and max(d.samples_trained for d in deltas) == normal
        current = service.registry.current()
        assert current is not None
        assert service.registry.show(current)["samples_trained"] <= normal
        assert current == served_before or service.guard_status()["pinned"] == current

        # ordinary samples again: the figure recovers and publication resumes
        after = 6_000
        produce_samples(settings, stream.take(after))
        wait_until(lambda: published_through(normal + burst + after), 120,
                   "publication resumed")
        assert not guard.held and guard.holds == 1, guard.status()
        assert service.metrics.guard_held._value.get() == 0
        note = service.registry.guard()
        assert note is not None and not note["held"] and note["action"] == "resume"
    finally:
        service.stop_event.set()
        thread.join(60)
    assert not thread.is_alive()
