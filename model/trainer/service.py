"""The trainer service: ``samples`` from Kafka -> test-then-train -> checkpoints -> versions.

Exactly once: partitions are assigned manually and nothing is committed to Kafka; the offsets
a model state has trained on are saved inside its checkpoint (``model.trainer.checkpoint``),
restored on start, so a crash retrains only what came after the last checkpoint. A record
that does not decode goes to the dead-letter topic and counts as consumed. Every
``export_every_s`` / ``export_every_samples`` the trainer checkpoints and publishes a version;
with ``delta_every_s`` > 0 deltas follow in between (provisional:
``docs/decisions.md#delta-stream``); with ``trainer.guard_margin`` > 0 the quality guard
(``model.trainer.guard_rule``) may hold publication and pin CURRENT back. Its options:
``model.trainer.loop_options``; built from settings by ``model.trainer.build``. Details:
docs/internals.md.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from datetime import datetime
from typing import Any

import numpy as np

from model.artifact.files import ArtifactError
from model.artifact.registry import Registry, RegistryError
from model.trainer.catalogue_feed import CatalogueFeed
from model.trainer.checkpoint import CheckpointStore, LoopState, check_offsets
from model.trainer.dedupe import TrainedIds
from model.trainer.deltas import DeltaPublisher
from model.trainer.export import feature_schema_hash, publish_version
from model.trainer.fetch_process import ProcessFetcher
from model.trainer.fetch_thread import Chunk, ChunkFetcher, RecordSource, Rejected, open_source
from model.trainer.guard_publishing import GuardedPublishing
from model.trainer.guard_rule import Guard
from model.trainer.guard_served import ServedView
from model.trainer.loop_options import LoopOptions, delta_interval, process_tuning
from model.trainer.metrics import TrainerMetrics
from model.trainer.prepare import Admitted, Preparer, admit
from model.trainer.samples import digest_of_hashes
from model.trainer.trainer import Trainer
from streamrec.settings import Settings

log = logging.getLogger(__name__)

Clock = Callable[[], datetime]


class TrainerService:
    """Consumes samples, trains, checkpoints and publishes; see the module doc."""

    def __init__(
        self,
        settings: Settings,
        trainer: Trainer,
        loop: LoopOptions | None = None,
        *,
        clock: Clock,
        monotonic: Callable[[], float] = time.monotonic,
        metrics: TrainerMetrics | None = None,
        redis_client: Any | None = None,
    ) -> None:
        self.settings = settings
        self.trainer = trainer
        self.loop = loop or LoopOptions.from_settings(settings)
        self.clock = clock
        self.monotonic = monotonic
        self.metrics = metrics or TrainerMetrics(trainer.options.eval_k)
        self.history_len = settings.features.history_len
        tcfg = settings.trainer
        self.checkpoints = CheckpointStore(tcfg.checkpoint_dir, trainer.trackables())
        self.registry = Registry(
            tcfg.registry_dir, tcfg.model_name, redis_client, settings.redis.key_prefix,
            tcfg.keep_versions,
        )
        self.state = LoopState()
        self.item_ids: dict[int, str] = {}
        #: The catalogue read live (a model with attribute slots; made when ``run()`` starts)
        #: and the keys of the items it deleted (not named again by their clicks).
        self.catalogue: CatalogueFeed | None = None
        self.deleted_items: set[int] = set()
        self.trained_ids = TrainedIds()
        self.stop_event = threading.Event()
        self.running = False
        self._source: RecordSource | None = None
        self._producer: Any = None
        self._last_loss = float("nan")
        self._batches_done = 0
        self._window_newest_ms: int | None = None  # newest event time since the last delta
        #: The thread preparing chunks ahead while ``run()`` trains (``prepare_ahead``).
        self._preparer: Preparer | None = None
        #: The delta stream (``LoopOptions.delta_every_s``), made when ``run()`` starts.
        self.deltas: DeltaPublisher | None = None
        #: The quality guard of publications (None: ``trainer.guard_margin`` 0).
        self.guard: Guard | None = None
        #: What the service does with the guard's decisions (pin, note, metrics, logs).
        self.guarding: GuardedPublishing | None = None
        if tcfg.guard_margin > 0:
            self.guard = Guard(tcfg.guard_margin, tcfg.guard_min_scored,
                               max(trainer.options.eval_window, tcfg.guard_min_scored))
            trainer.evaluator.listeners.append(self.guard.observe)
            self.guarding = GuardedPublishing(self.guard, self.registry, self.metrics, clock,
                                              tcfg.guard_hold_alarm_s)

    # -- state ---------------------------------------------------------------------------------
    def restore(self) -> bool:
        restored = self.checkpoints.restore()
        if restored is None:
            log.info("no checkpoint in %s: starting fresh", self.checkpoints.directory)
            return False
        self.trainer.restored(str(restored.path / "tf"))
        self.state = LoopState.from_json(restored.state)
        if self.guarding is not None and self.state.guard:
            self.guarding.restore(self.state.guard)
        keys = restored.arrays.get("item_keys", np.zeros(0, np.int64))
        ids = restored.arrays.get("item_ids", np.zeros(0, str))
        self.item_ids = dict(zip(keys.tolist(), ids.tolist(), strict=True))
        # "recent_sample_ids": the bounded memory of earlier checkpoints (a subset)
        self.trained_ids = TrainedIds.from_array(restored.arrays.get(
            "trained_sample_ids", restored.arrays.get("recent_sample_ids", np.zeros(0, np.int64))))
        if self.trainer.covisit is not None:
            self.trainer.covisit.load_arrays(restored.arrays)
        if self.trainer.sessions is not None:
            self.trainer.sessions.load_arrays(restored.arrays)
        mixer = {k[len("mixer_"):]: v for k, v in restored.arrays.items() if k.startswith("mixer_")}
        if mixer:
            self.trainer.mixer.load_state(mixer)
        cold = {k[len("cold_"):]: v for k, v in restored.arrays.items() if k.startswith("cold_")}
        if cold:
            self.trainer.cold.load_state(cold)
        select = {k[len("select_"):]: v for k, v in restored.arrays.items()
                  if k.startswith("select_")}
        if select and self.trainer.selector is not None:
            try:
                self.trainer.selector.load_state(select)
            except ValueError as exc:  # other parts or scales since: counts begin again
                log.warning("mix selector state not restored (%s); counting afresh", exc)
        rare = {k[len("rare_"):]: v for k, v in restored.arrays.items() if k.startswith("rare_")}
        if rare and self.trainer.rarity is not None:
            try:
                self.trainer.rarity.load_state(rare)
            except ValueError as exc:  # other scales since: counts begin again
                log.warning("rare-item selector state not restored (%s); counting afresh", exc)
        self.metrics.samples_total.set(self.state.samples_trained)
        self.metrics.consumed_offsets.set(sum(self.state.offsets.values()))
        log.info(
            "resuming at %s (%d samples trained)", self.state.offsets, self.state.samples_trained
        )
        return True

    def checkpoint(self) -> None:
        self.trainer.sync()  # every scheduled step is in the state saved with the offsets
        self.trainer.wait_evaluation()  # the co-visitation state is complete up to the offsets
        keys = np.fromiter(self.item_ids.keys(), np.int64, len(self.item_ids))
        ids = np.array(list(self.item_ids.values()), dtype=np.str_)
        covisit = self.trainer.covisit.to_arrays() if self.trainer.covisit is not None else {}
        sessions = self.trainer.sessions.to_arrays() if self.trainer.sessions is not None else {}
        self.state.guard = self.guarding.to_json() if self.guarding is not None else None
        self.checkpoints.save(
            self.state.to_json(),
            {
                "item_keys": keys,
                "item_ids": ids,
                "trained_sample_ids": (self.trained_ids.to_array() if self._preparer is None
                                       else self._preparer.trained_ids()),
                **covisit,
                **sessions,
                **{f"mixer_{k}": v for k, v in self.trainer.mixer.state().items()},
                **{f"cold_{k}": v for k, v in self.trainer.cold.state().items()},
                **({f"select_{k}": v for k, v in self.trainer.selector.state().items()}
                   if self.trainer.selector is not None else {}),
                **({f"rare_{k}": v for k, v in self.trainer.rarity.state().items()}
                   if self.trainer.rarity is not None else {}),
            },
        )

    def status(self) -> dict[str, Any]:
        """``/health``: ``degraded`` (HTTP 200 all the same) lists why the trainer is
        ``degraded`` — a quality guard hold older than ``trainer.guard_hold_alarm_s``."""
        degraded = self.guarding.degraded() if self.guarding is not None else []
        return {
            "status": "starting" if not self.running else "degraded" if degraded else "ok",
            "degraded": degraded,
            "samples_trained": self.state.samples_trained,
            "duplicates_dropped": self.state.duplicates_dropped,
            "digest": str(self.state.digest),
            "dlq_records": self.state.dlq_records,
            "offsets": dict(self.state.offsets),
            "last_version": self.state.last_version,
            "trained_through_ms": self.state.trained_through_ms,
            "metrics": self.trainer.evaluator.summary(),  # a few batches behind at most
            "delta": self.delta_status(),
            "guard": self.guard_status(),
        }

    def guard_status(self) -> dict[str, Any] | None:
        """The quality guard's figures and state (None: off)."""
        return None if self.guarding is None else self.guarding.status()

    def delta_status(self, checksum: bool = False) -> dict[str, Any] | None:
        """The delta stream's lineage and last sequence (None: deltas off); ``checksum``:
        also ``model.delta.state_checksum`` of the state published (tens of ms at 100k rows:
        the trainer's ``/delta`` route, not ``/health``)."""
        return self.deltas.status(checksum) if self.deltas is not None else None

    # -- kafka ---------------------------------------------------------------------------------
    def _fetcher(self) -> ChunkFetcher | ProcessFetcher:
        """Create the topics if needed and the samples fetcher (a child process, or a
        thread with ``LoopOptions.fetch_process`` False), reading from the restored offsets.
        The dead-letter producer is made when a first record needs it (connecting one
        would slow every start: docs/decisions.md#trainer-loop)."""
        from stream.kafka_client import ensure_topics, topic_end_offsets

        kafka = self.settings.kafka
        ensure_topics(kafka, [kafka.samples_topic, kafka.dlq_topic])
        if self.state.offsets:
            ends = topic_end_offsets(kafka, kafka.samples_topic, 30.0)
            if ends:  # no metadata yet: the consumer's own wait for partitions follows
                check_offsets(self.state.offsets, ends, kafka.samples_topic,
                              self.checkpoints.directory)
        source_args = (
            kafka, self.settings.trainer.group_id, self.state.offsets, self.loop.consumer,
            self.loop.max_poll_records or max(4 * self.trainer.options.batch_size, 2000),
        )
        fetch_args = (
            self.trainer.options.batch_size,
            # only the model's window is hashed into keys (a sample carries the features'
            # longer history: 50 entries against the model's 10 by default)
            min(self.history_len, self.trainer.config.window),
            self.loop.batch_timeout_s,
            self.loop.poll_timeout_ms,
        )
        if self.loop.fetch_process:
            return ProcessFetcher(*source_args, *fetch_args)
        self._source = open_source(*source_args, self.monotonic, self.stop_event.wait)
        return ChunkFetcher(self._source, *fetch_args, self.monotonic)

    def _start_catalogue(self) -> None:
        """With attribute slots (``ModelConfig.attr_tokens``), read the ``items`` topic from
        its beginning on a thread (``model.trainer.catalogue_feed``)."""
        if self.trainer.model.attrs is None or self.catalogue is not None:
            return
        from feature_store.catalogue import FeatureSpec
        from stream.kafka_client import ensure_topics

        kafka = self.settings.kafka
        ensure_topics(kafka, [kafka.items_topic])

        def source() -> RecordSource:
            return open_source(kafka, f"{self.settings.trainer.group_id}-catalogue", {},
                               self.loop.consumer, 5000, self.monotonic, self.stop_event.wait,
                               topic=kafka.items_topic)

        self.catalogue = CatalogueFeed(source, FeatureSpec.load(self.settings.features.spec_file))
        self.catalogue.start()

    def _apply_catalogue(self) -> None:
        """Give the items the feed read since the last call their attributes (or take them
        out of the catalogue), on the training thread."""
        if self.catalogue is None:
            return
        items = self.catalogue.take()
        if not items:
            return
        from streamrec.ids import item_key

        upserts = [it for it in items if not it["deleted"]]
        deletes = [it["item_id"] for it in items if it["deleted"]]
        self.trainer.set_catalogue(self.catalogue.spec,
                                   ((it["item_id"], it["attributes"]) for it in upserts))
        for it in upserts:
            key = item_key(it["item_id"])
            self.item_ids[key] = it["item_id"]
            self.deleted_items.discard(key)
        self.trainer.remove_catalogue(deletes)
        for item_id in deletes:
            key = item_key(item_id)
            self.item_ids.pop(key, None)
            self.deleted_items.add(key)
        self.metrics.catalogue_items.inc(len(items))

    def _dead_letter(self, record: Rejected, reason: str) -> None:
        from stream.kafka_client import dlq_record, make_producer

        log.warning(
            "dead-lettering %s:%d@%d: %s", record.topic, record.partition, record.offset, reason
        )
        value = dlq_record(reason, "trainer", record.topic, record.partition, record.offset, record.value)
        if self._producer is None:
            self._producer = make_producer(self.settings.kafka)
        self._producer.send(self.settings.kafka.dlq_topic, key=record.key, value=value)
        self.state.dlq_records += 1
        self.metrics.dlq.inc()

    # -- main loop -----------------------------------------------------------------------------
    def run(self) -> LoopState:
        """Train until ``stop_event`` is set (or ``max_samples``); returns the final state."""
        self.restore()
        fetcher = self._fetcher()
        self._start_deltas()
        last_export = last_delta = self.monotonic()
        since_export = 0
        waited = False  # waited for samples since the last delta (the trainer keeps up)
        last_sample = self.monotonic()  # when a chunk last brought samples
        with process_tuning(self.loop):
            fetcher.start()
            self._start_catalogue()
            self.trainer.warm()  # the step's trace overlaps the fetch process's start
            source: ChunkFetcher | ProcessFetcher | Preparer = fetcher
            if self.loop.prepare_ahead:
                source = self._preparer = Preparer(fetcher, self.trained_ids, self.trainer)
                self._preparer.start()
            self.running = True
            try:
                while not self.stop_event.is_set() and not self._limit_reached():
                    waiting = self.monotonic()
                    chunk = source.get(timeout_s=0.1)
                    self.metrics.fetch_wait.observe(self.monotonic() - waiting)
                    if chunk is None or len(chunk) < self.trainer.options.batch_size:
                        waited = True
                    if chunk is not None and len(chunk):
                        last_sample = self.monotonic()
                    self._apply_catalogue()
                    if chunk is None:  # idle: the evaluation catches up (a cluster's
                        self.trainer.wait_evaluation()  # heads are fetched steps later)
                    if chunk is not None:
                        since_export += self._train(chunk)
                    now = self.monotonic()
                    if since_export > 0 and (
                        now - last_export >= self.loop.export_every_s
                        or since_export >= self.loop.export_every_samples
                    ):
                        if self._guarded():
                            self._export_logged()
                        else:  # held: the offsets stay safe, nothing is published
                            self.checkpoint()
                        last_export, since_export = self.monotonic(), 0
                    if self.deltas is not None and self.state.samples_trained:
                        if not self.deltas.active:  # a new lineage first (also on restart)
                            if self._guarded():
                                self._export_logged()
                                last_export, since_export = self.monotonic(), 0
                        elif now - last_delta >= delta_interval(
                            self.loop, waited, self._window_newest_ms, self._now_ms(),
                            now - last_sample,
                        ):
                            if self._guarded():
                                self._publish_delta()
                            last_delta, waited = now, False
                            self._window_newest_ms = None
                # Nothing more is trained: the fetch winds down (its consumer closes) while
                # the last export is written, instead of after it.
                if self._preparer is not None:
                    self._preparer.request_stop()
                fetcher.request_stop()
                if since_export > 0:
                    if self._guarded():
                        self._export_logged()
                    else:
                        self.checkpoint()
                return self.state
            finally:
                self.running = False
                if self._preparer is not None:  # the chunks it admitted ahead are untrained
                    self.trained_ids = self._preparer.stop()
                    self._preparer = None
                fetcher.stop()
                if self.catalogue is not None:
                    self.catalogue.stop()
                    self.catalogue = None
                self.close()

    def _export_logged(self) -> None:
        """Export; a failed publication is logged and retried at the next export (the
        checkpoint it follows is already safe, so training goes on)."""
        try:
            self.export()
        except (RegistryError, ArtifactError, OSError) as exc:
            log.error("export of version %s failed: %s", self.state.last_version, exc)

    def _guarded(self) -> bool:
        """Ask the quality guard before a publication; True = publish."""
        if self.guarding is None:
            return True
        self.trainer.wait_evaluation()  # every trained batch's head is scored
        return self.guarding.allows(self.deltas)

    def _start_deltas(self) -> None:
        if self.loop.delta_every_s > 0 and self.deltas is None:
            self.deltas = DeltaPublisher.start(self.settings, self.trainer, lambda: self.item_ids)
            if self.deltas is not None and self.guard is not None:
                # the paired signal: the state serving holds, on the guard's rows
                self.guard.served = ServedView(self.deltas, self.trainer.evaluator.k).ranks

    def _delta_meta(self) -> dict[str, Any]:
        st = self.state
        return {
            "offsets": dict(st.offsets), "trained_through_ms": st.trained_through_ms,
            "samples_trained": st.samples_trained,
            "created_at": self.clock().isoformat(),
        }

    def _publish_delta(self) -> None:
        assert self.deltas is not None
        started = self.monotonic()
        delta = self.deltas.publish(self._delta_meta())
        if delta is not None:
            if self.guarding is not None:
                self.guarding.published(f"{delta.base_version}#{delta.seq}", full=False)
            self.metrics.deltas.inc()
            self.metrics.delta_rows.observe(delta.rows_changed)
            self.metrics.delta_seconds.observe(self.monotonic() - started)

    def _now_ms(self) -> int:
        return int(self.clock().timestamp() * 1000)

    def _limit_reached(self) -> bool:
        cap = self.loop.max_samples
        return cap is not None and self.state.samples_trained >= cap

    def _train(self, fetched: Chunk | Admitted) -> int:
        """Train a chunk (admitted here, or by the preparer with its inputs made ahead)."""
        chunk = fetched.chunk if isinstance(fetched, Admitted) else fetched
        for record, reason in chunk.rejected:
            self._dead_letter(record, reason)
        got = fetched if isinstance(fetched, Admitted) else admit(self.trained_ids, fetched)
        st = self.state
        sample_ids, item_ids, batch, hashes, ts = (
            got.sample_ids, got.item_ids, got.batch, got.hashes, got.ts_ms)
        if got.dropped:
            st.duplicates_dropped += got.dropped
            self.metrics.duplicates.inc(got.dropped)
            log.info("dropped %d samples trained before (same sample_id)", got.dropped)
        if batch is not None:
            started = self.monotonic()
            fit = self.trainer.fit_batch
            self._last_loss = fit(batch) if got.prepared is None else fit(batch, got.prepared)
            self.item_ids.update(zip(batch.item_keys.tolist(), item_ids, strict=True))
            if self.deleted_items:  # clicks do not bring a deleted item back
                for key in self.deleted_items.intersection(batch.item_keys.tolist()):
                    self.item_ids.pop(key, None)
            st.samples_trained += len(sample_ids)
            st.digest = (st.digest + digest_of_hashes(hashes)) % (1 << 64)
            newest = int(ts.max())
            st.trained_through_ms = max(newest, st.trained_through_ms or newest)
            self._window_newest_ms = max(newest, self._window_newest_ms or newest)
            m = self.metrics
            m.samples.inc(len(sample_ids))
            m.samples_total.set(st.samples_trained)
            m.batches.inc()
            m.loss.set(self._last_loss)
            m.trained_through.set(st.trained_through_ms / 1000.0)
            m.step_seconds.observe(self.monotonic() - started)
            self._batches_done += 1
            if self._batches_done % 20 == 0:
                m.set_quality(self.trainer.evaluator.summary())  # a few batches behind at most
        st.offsets.update(chunk.offsets)
        self.metrics.consumed_offsets.set(sum(st.offsets.values()))
        return len(sample_ids) if batch is not None else 0

    def export(self) -> str:
        """Checkpoint (model + offsets), then publish a version of the same state."""
        started = self.monotonic()
        if self._producer is not None:
            self._producer.flush()  # dead letters reach Kafka before their offsets are saved
        st = self.state
        st.export_seq += 1
        now = self.clock()
        version = f"{now.strftime('%Y%m%dT%H%M%SZ')}-{st.export_seq:06d}"
        st.last_version = version
        sizes = self.trainer.table_sizes()
        if len(self.item_ids) > 2 * sizes["item_rows"] + 1000:  # rows were evicted
            live = set(self.trainer.known_keys(self.trainer.model.items).tolist())
            live.update(self.trainer.model.attributed_items().tolist())  # catalogued
            self.item_ids = {k: v for k, v in self.item_ids.items() if k in live}
        self.checkpoint()
        summary = self.trainer.quality()
        extra = {
            "trained_through_ms": st.trained_through_ms,
            "kafka_offsets": dict(st.offsets),
            "metrics": {**summary, "loss": self._last_loss, **sizes},
            "feature_schema_hash": feature_schema_hash(self.history_len, self.trainer.config),
            "samples_trained": st.samples_trained,
            "sample_digest": str(st.digest),
            "dlq_records": st.dlq_records,
            "model": {
                "embedding_dim": self.trainer.config.embedding_dim,
                "user_layers": list(self.trainer.config.user_layers),
                "admit_after": self.trainer.config.admit_after,
                "temperature": self.trainer.config.temperature,
                "mix": self.trainer.config.mix,
                "score_weights": self.trainer.mixer.as_dict(),
                "cold_start": self.trainer.cold_start(),
                # the towers' scales baked into this version's rare items (model.scoring.rarity)
                "item_groups": self.trainer.item_groups(),
            },
        }
        files = None
        if self.deltas is not None:  # the new lineage's snapshot, of this very state
            files = self.deltas.snapshot_files(version, {**self._delta_meta(), "created_at": now.isoformat()})
        try:
            publish_version(self.registry, self.trainer, self.item_ids, version, extra,
                            created_at=now, extra_files=files)
        except BaseException:
            if self.deltas is not None:
                self.deltas.reset()  # no deltas of a version that does not exist
            raise
        if self.guarding is not None:
            self.guarding.published(version, full=True)
        self.metrics.exports.inc()
        self.metrics.set_quality(summary)
        for table, rows in sizes.items():
            self.metrics.table_rows.labels(table).set(rows)
        self.metrics.export_seconds.observe(self.monotonic() - started)
        return version

    def close(self) -> None:
        if self.deltas is not None:
            self.deltas.close()
            self.deltas = None
        if self._source is not None:
            self._source.close()
            self._source = None
        if self._producer is not None:
            self._producer.flush()
            self._producer.close()
            self._producer = None
