"""The trainer's side of the delta stream: which rows moved, and the delta that carries them.

:class:`DeltaBuilder` listens to every train step (``Trainer.on_step``: every key the
optimizer may move) and, when asked, reads just those rows, the prior's touched buckets (with
their all-time counts), the co-visitation pairs that moved, the positives the session-kNN
index learnt (its journal, ``SessionIndex.keep_journal``: serving replays them) and the mix
and dense weights into one delta. It keeps the state it published (``mirror``) by applying
each delta itself — as decoded, with a lossy row codec — so the trainer can give that state's
checksum and serving prove it converged to it.
Deltas are provisional: a restarted trainer publishes a new full version (a new lineage)
before it trains, so what serving converges to trained every sample exactly once
(``docs/decisions.md#delta-stream``). Details: docs/internals.md.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from model.delta import (
    SNAPSHOT_FILE,
    Attributes,
    Constants,
    Delta,
    ModelState,
    apply,
    decode,
    encode,
    from_snapshot,
    state_checksum,
)
from model.towers.frequency import MIN_COUNT, CountFrequencyEstimator
from model.towers.loss import INITIAL_GAP
from model.towers.tf_env import tf
from model.towers.two_tower import DEFAULT_KEY
from model.trainer.export import tower_fields
from model.trainer.samples import Batch
from model.trainer.trainer import Trainer

log = logging.getLogger(__name__)

#: Relative change of a co-visitation pair's value below which it is not re-sent (the
#: global decay is applied as a scalar; repeated float64 multiplications drift ~1e-16 each).
PAIR_RTOL = 1e-9
_I64 = np.zeros(0, np.int64)


def _unique(parts: list[np.ndarray]) -> np.ndarray:
    if not parts:
        return _I64
    keys = np.unique(np.concatenate([np.asarray(p, np.int64).reshape(-1) for p in parts]))
    return keys[(keys != DEFAULT_KEY) & (keys != 0)]


class DeltaBuilder:
    """Tracks touched keys of a trainer and builds snapshots and deltas (module doc)."""

    def __init__(
        self, trainer: Trainer, item_ids: Callable[[], Mapping[int, str]], checksums: bool = False,
        attr_every: int = 1,
    ) -> None:
        """``checksums``: every delta carries the checksum of the state it leads to (costs a
        pass over the whole state each time; otherwise ask ``state_checksum(mirror)``).
        ``attr_every``: with attribute slots, the attribute rows the steps moved travel with
        every this-many-th delta (``trainer.delta_attr_every``; a new attribute key's row
        with the delta that names it): serving recomposes every attributed item's row when
        they do."""
        if attr_every < 1:
            raise ValueError("attr_every must be >= 1")
        self.trainer = trainer
        self.checksums = checksums
        self.attr_every = attr_every
        #: Attribute keys the steps moved since their rows last travelled, and the deltas since.
        self._attr_moved: list[np.ndarray] = []
        self._attr_deltas = 0
        self.item_ids = item_ids
        self.mirror: ModelState | None = None
        self._users: list[np.ndarray] = []
        self._items: list[np.ndarray] = []
        self._targets: list[np.ndarray] = []
        self._catalogue: list[np.ndarray] = []
        self._evicted_seen = trainer.evicted_rows
        self._covisit_ref = 0
        trainer.on_step = self.record
        trainer.on_catalogue = self.record_catalogue
        if trainer.sessions is not None:  # from now on; the snapshot drops what came before
            trainer.sessions.keep_journal()

    # -- tracking ------------------------------------------------------------------------------
    def record(self, batch: Batch, negatives: np.ndarray) -> None:
        """``Trainer.on_step``: remember the keys of one step."""
        window = self.trainer.config.tower_window  # the rows the step moved
        self._users.append(batch.user_keys)
        self._targets.append(batch.item_keys)
        self._items.extend((batch.item_keys, batch.history[:, :window], negatives))

    def record_catalogue(self, item_keys: np.ndarray) -> None:
        """``Trainer.on_catalogue``: items whose catalogue entry changed (their rows, their
        place in the catalog)."""
        self._catalogue.append(np.asarray(item_keys, np.int64))

    @property
    def pending(self) -> bool:
        """Whether any step ran, or the catalogue changed, since the last delta."""
        return bool(self._targets) or bool(self._catalogue)

    def _take(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(users, items, targets) the steps touched, and the items whose catalogue entry
        changed, since the last call."""
        out = (_unique(self._users), _unique(self._items), _unique(self._targets),
               _unique(self._catalogue))
        self._users, self._items, self._targets, self._catalogue = [], [], [], []
        return out

    # -- reading the trainer -------------------------------------------------------------------
    def _rows(self, table: Any, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(mask of keys with an own row, their rows float32)."""
        model = self.trainer.model
        if not keys.size:
            return np.zeros(0, bool), np.zeros((0, model.config.embedding_dim), np.float32)
        k = tf.constant(keys, tf.int64)
        rows, exists = table.params.lookup(k, return_exists=True)
        known = exists.numpy()
        if model.threshold(table) > 1:
            known &= table.sightings(k).numpy() >= model.threshold(table)
        return known, rows.numpy()[known]

    def _prior(self, buckets: np.ndarray) -> tuple[np.ndarray, tuple[float, float, float], float]:
        """(base of each bucket float64, (shift, floor, log_norm), default base)."""
        freq = self.trainer.freq
        b = tf.constant(buckets, tf.int64)
        if isinstance(freq, CountFrequencyEstimator):
            c = tf.gather(freq.count, b).numpy().astype(np.float64)
            rate = math.log(2.0) / freq.half_life if freq.half_life else 0.0
            a = tf.gather(freq.last, b).numpy().astype(np.float64)
            with np.errstate(divide="ignore"):
                base = np.log(c) + a * rate
            scalars = (float(freq.time.numpy()) * rate, math.log(MIN_COUNT),
                       math.log(max(float(freq.batches.numpy()), 1.0)))
            return base, scalars, -math.inf
        gap = tf.gather(freq.gap, b).numpy().astype(np.float64)
        return -np.log(gap), (0.0, -math.inf, 0.0), -math.log(INITIAL_GAP)

    def _attributes(self, items: np.ndarray | None, touched: np.ndarray) -> Attributes | None:
        """The attribute parts to send (None: no attribute slots): the entries of ``items``
        (None, a snapshot: every item with attributes and the whole attribute table) with the
        default row; the rows of the keys the ``touched`` items' steps moved travel with every
        ``attr_every``-th delta (accumulated until then), a key the state lacks at once."""
        tr = self.trainer
        model = tr.model
        if model.attrs is None:
            return None
        snapshot = items is None
        if items is None:
            items = np.sort(model.attributed_items())
        tokens, weights = tr.attribute_entries(items)
        named = tokens[weights > 0]
        if snapshot:
            self._attr_moved, self._attr_deltas = [], 0
            send = named
        else:
            if touched.size:
                moved, w = tr.attribute_entries(touched)
                self._attr_moved.append(np.unique(moved[w > 0]))
            self._attr_deltas += 1
            held = self.mirror.attributes.keys if self.mirror and self.mirror.attributes \
                else _I64
            send = np.setdiff1d(named, held)
            if self._attr_deltas >= self.attr_every:
                send = np.concatenate([send, *self._attr_moved])
                self._attr_moved, self._attr_deltas = [], 0
        keys, rows = tr.attribute_rows(send)
        return Attributes(keys=keys, rows=rows, item_keys=items, tokens=tokens,
                          weights=weights.astype(np.float32),
                          default_row=tr.default_row(model.items).astype(np.float32))

    def _catalog(self, keys: np.ndarray, own: np.ndarray) -> np.ndarray:
        """Which of item ``keys`` (``own``: which have their own row) are in the catalog:
        named, with a row of their own or (attribute slots) attributes."""
        names = self.item_ids()
        named = np.fromiter((int(k) in names for k in keys), bool, keys.size)
        return named & (own | self.trainer.model.has_attributes(keys))

    def _covisit(self) -> tuple[np.ndarray, np.ndarray, float]:
        """(codes, values relative to the lineage's reference, scale) of the pairs now."""
        cv = self.trainer.covisit
        if cv is None:
            return _I64, np.zeros(0), 1.0
        cv.merge()
        rate = math.log(2.0) / cv.half_life if cv.half_life > 0 else 0.0
        age = cv.samples - self._covisit_ref
        return cv.codes, cv.weights * math.exp(rate * age), math.exp(-rate * age)

    def _common(self) -> dict[str, Any]:
        tr = self.trainer
        tower = tower_fields(tr)
        w = tr.score_weights()
        return {
            "weights": (w[0], w[1], w[2], tr.last_weight()),
            "cold_start": tr.cold_start(),
            "layers": tuple(tower["layers"]),
            "default_user_row": tr.default_row(tr.model.users),
            "sessions_weight": tr.sknn_weight(),
            "history_groups": tr.history_groups(),
            "item_groups": tr.item_groups(),
        }

    def _constants(self) -> Constants:
        config = self.trainer.config
        cv = self.trainer.covisit
        return Constants(
            normalize=config.normalize, score_bias=bool(config.prior_weight),
            temperature=config.temperature, history_len=config.history_len,
            history_decay=config.history_decay,
            prior_buckets=int(self.trainer.freq.buckets),
            prior_default=self._prior(np.zeros(0, np.int64))[2],
            covisit_window=cv.window if cv is not None else None,
            covisit_decay=cv.decay if cv is not None else 1.0,
            sknn=({name: int(value or 0) for name, value in self.trainer.sessions.params().items()}
                  if self.trainer.sessions is not None else None),
            attr_tokens=config.attr_tokens,
        )

    # -- snapshots and deltas ------------------------------------------------------------------
    def snapshot(self, base_version: str, meta: Mapping[str, Any]) -> Delta:
        """Everything of the trainer now as the ``seq == 0`` delta of ``base_version`` (a
        new lineage); ``meta``: offsets, trained_through_ms, samples_trained, created_at."""
        tr = self.trainer
        if tr.model.attention is not None:
            raise ValueError("deltas do not carry the attention tower (ModelConfig.user_tower)")
        tr.wait_evaluation()  # the co-visitation and the session-kNN index learn there
        self._take()
        sessions = None
        if tr.sessions is not None:
            tr.sessions.keep_journal()
            tr.sessions.drain()  # held by the snapshot whole
            # copies: learning writes the recency and size arrays in place
            sessions = {name: a.copy() for name, a in tr.sessions.to_arrays().items()}
        self._evicted_seen = tr.evicted_rows
        ukeys, urows = tr.known_rows(tr.model.users)
        hkeys, hrows = tr.known_rows(tr.model.items)
        names = self.item_ids()
        every = np.concatenate([hkeys, np.setdiff1d(tr.model.attributed_items(), hkeys)])
        cat = every[self._catalog(every, np.arange(every.size) < hkeys.size)]
        buckets = np.unique(np.mod(cat, np.int64(tr.freq.buckets)))
        base, scalars, _ = self._prior(buckets)
        cv = tr.covisit
        if cv is not None:
            cv.merge()
            self._covisit_ref = cv.samples
        codes, values, scale = self._covisit()
        delta = Delta(
            base_version=base_version, seq=0, offsets=dict(meta.get("offsets", {})),
            trained_through_ms=meta.get("trained_through_ms"),
            samples_trained=int(meta.get("samples_trained", 0)),
            user_keys=ukeys, user_rows=urows, removed_users=_I64,
            hist_keys=hkeys, hist_rows=hrows, removed_hist=_I64,
            new_item_keys=cat, new_item_ids=np.array([names[int(k)] for k in cat], np.str_),
            removed_items=_I64, prior_buckets=buckets, prior_base=base,
            prior_count=tr.cold.counts.of_buckets(buckets), prior_scalars=scalars,
            covisit_first_id=0, covisit_new_keys=cv.keys.copy() if cv is not None else _I64,
            covisit_codes=codes.copy(), covisit_values=values, covisit_removed=_I64,
            covisit_scale=scale, constants=self._constants(), sessions=sessions,
            created_at=meta.get("created_at"), attributes=self._attributes(None, _I64),
            **self._common(),
        )
        self.mirror = from_snapshot(delta)
        return _with_checksum(delta, self.mirror) if self.checksums else delta

    def delta(self, meta: Mapping[str, Any]) -> Delta:
        """What changed since the last snapshot or delta, as the next delta of the lineage."""
        mirror = self.mirror
        if mirror is None:
            raise ValueError("no snapshot yet: a lineage starts with snapshot()")
        tr = self.trainer
        tr.wait_evaluation()  # every positive learnt so far is in the session-kNN journal
        users, items, targets, catalogued = self._take()
        positives = tr.sessions.drain() if tr.sessions is not None else None
        if tr.evicted_rows != self._evicted_seen:  # evicted keys leave, touched or not
            self._evicted_seen = tr.evicted_rows
            users = np.union1d(users, mirror.user_keys)
            items = np.union1d(items, mirror.hist_keys)
        ukn, urows = self._rows(tr.model.users, users)
        hkn, hrows = self._rows(tr.model.items, items)
        gone_items = items[~hkn]
        names = self.item_ids()
        known_items = items[hkn]
        # an item joins the catalog with a row or attributes, and leaves it with both gone
        # or with its name (deleted from the catalogue; its row stays for the histories)
        changed = np.union1d(items, catalogued)
        listed = self._catalog(changed, np.isin(changed, known_items))
        new_items = np.setdiff1d(changed[listed], mirror.item_keys)
        unlisted = changed[~listed]
        buckets = np.unique(np.mod(np.concatenate([targets, new_items]),
                                   np.int64(tr.freq.buckets)))
        base, scalars, _ = self._prior(buckets)
        codes, values, scale = self._covisit()
        changed, removed = _diff_pairs(mirror.covisit_codes, mirror.covisit_values, codes, values)
        cv = tr.covisit
        first = mirror.covisit_keys.size
        delta = Delta(
            base_version=mirror.base_version, seq=mirror.seq + 1,
            offsets=dict(meta.get("offsets", {})),
            trained_through_ms=meta.get("trained_through_ms"),
            samples_trained=int(meta.get("samples_trained", 0)),
            user_keys=users[ukn], user_rows=urows,
            removed_users=np.intersect1d(users[~ukn], mirror.user_keys),
            hist_keys=known_items, hist_rows=hrows,
            removed_hist=np.intersect1d(gone_items, mirror.hist_keys),
            new_item_keys=new_items,
            new_item_ids=np.array([names[int(k)] for k in new_items], np.str_),
            removed_items=np.intersect1d(unlisted, mirror.item_keys),
            prior_buckets=buckets, prior_base=base,
            prior_count=tr.cold.counts.of_buckets(buckets), prior_scalars=scalars,
            covisit_first_id=first,
            covisit_new_keys=cv.keys[first:].copy() if cv is not None else _I64,
            covisit_codes=codes[changed], covisit_values=values[changed],
            covisit_removed=removed, covisit_scale=scale, sessions_positives=positives,
            created_at=meta.get("created_at"), attributes=self._attributes(catalogued, items),
            **self._common(),
        )
        self.mirror = apply(mirror, delta)
        return _with_checksum(delta, self.mirror) if self.checksums else delta


def _diff_pairs(
    old_codes: np.ndarray, old_values: np.ndarray, codes: np.ndarray, values: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """(mask of the pairs now that are new or moved, codes of the published pairs gone)."""
    if not old_codes.size:
        return np.ones(codes.size, bool), _I64
    pos = np.minimum(np.searchsorted(old_codes, codes), old_codes.size - 1)
    hit = old_codes[pos] == codes
    old = old_values[pos]
    moved = np.abs(values - old) > PAIR_RTOL * np.abs(old)
    # both sorted: where each old code would go among the codes now tells whether it is there
    at = np.minimum(np.searchsorted(codes, old_codes), max(codes.size - 1, 0))
    gone = old_codes[codes[at] != old_codes] if codes.size else old_codes
    return ~hit | moved, gone


def _with_checksum(delta: Delta, state: ModelState) -> Delta:
    from dataclasses import replace

    return replace(delta, state_checksum=state_checksum(state))


class DeltaPublisher:
    """Deltas of a trainer service onto ``kafka.updates_topic`` (the loop's hooks call it).

    ``snapshot_files(version, meta)`` at each full export starts a lineage and returns the
    snapshot file to write beside the version; ``publish(meta)`` sends the next delta (the
    producer is idempotent and sends in order; :meth:`flush` waits for the broker);
    ``reset()`` forgets the lineage (a failed export) so no delta is sent until the next
    full version."""

    def __init__(
        self, builder: DeltaBuilder, producer: Any, topic: str, key: str,
        codec: str = "float32", compress: bool = False,
    ) -> None:
        self.builder, self.producer, self.topic = builder, producer, topic
        self.key, self.codec, self.compress = key.encode(), codec, compress
        self.sent = 0
        self.bytes_sent = 0
        self.last: Delta | None = None
        #: The last delta as serving applies it (decoded when the row codec is lossy): the
        #: step from the state before it to ``builder.mirror``.
        self.applied: Delta | None = None

    @classmethod
    def start(
        cls, settings: Any, trainer: Trainer, item_ids: Callable[[], Mapping[int, str]]
    ) -> DeltaPublisher | None:
        """The publisher of a trainer service (``streamrec.settings.Settings``): the
        updates topic created, its producer connected; None for a model deltas cannot carry
        (the attention user tower) or a trainer whose rows live elsewhere between
        checkpoints (``Trainer.rows_local`` False: a parameter-server cluster): full versions
        only."""
        if trainer.model.attention is not None:
            log.warning("no deltas: they do not carry the attention user tower (full versions only)")
            return None
        if not trainer.rows_local:
            log.warning("no deltas: the tables live on the parameter servers between checkpoints "
                        "(full versions only)")
            return None
        from stream.kafka_client import ensure_updates_topic, updates_producer

        kafka, tcfg = settings.kafka, settings.trainer
        ensure_updates_topic(kafka)
        return cls(DeltaBuilder(trainer, item_ids, attr_every=tcfg.delta_attr_every),
                   updates_producer(kafka), kafka.updates_topic,
                   tcfg.model_name, tcfg.delta_codec, tcfg.delta_compress)

    def status(self, checksum: bool = False) -> dict[str, Any]:
        """Lineage, last sequence and totals; ``checksum``: also ``state_checksum`` of the
        state published (tens of ms at 100k rows)."""
        mirror = self.builder.mirror
        return {
            "base_version": mirror.base_version if mirror else None,
            "seq": mirror.seq if mirror else None,
            "state_checksum": state_checksum(mirror) if checksum and mirror else None,
            "sent": self.sent,
            "bytes_sent": self.bytes_sent,
        }

    @property
    def active(self) -> bool:
        """Whether a lineage exists (a full version with its snapshot)."""
        return self.builder.mirror is not None

    def snapshot_files(self, version: str, meta: Mapping[str, Any]) -> dict[str, bytes]:
        snap = self.builder.snapshot(version, meta)
        self.last = snap
        return {SNAPSHOT_FILE: encode(snap, "float32", compress=True)}

    def reset(self) -> None:
        self.builder.mirror = None

    def publish(self, meta: Mapping[str, Any]) -> Delta | None:
        """Send the next delta if a lineage exists and a step ran since the last one. A
        delta Kafka refuses would leave a gap: the lineage is dropped instead, so the loop
        publishes a new full version (a new base) next."""
        from kafka.errors import KafkaError

        if not self.active or not self.builder.pending:
            return None
        before = self.builder.mirror
        delta = applied = self.builder.delta(meta)
        record = encode(delta, self.codec, compress=self.compress)
        if self.codec != "float32" and before is not None:
            # the mirror is what serving holds: the rows as the codec delivers them, so its
            # checksum (``status``) is the one every replica converges to
            applied = decode(record)
            self.builder.mirror = apply(before, applied)
        try:
            self.producer.send(self.topic, key=self.key, value=record)
        except KafkaError as exc:
            log.error("delta %d not sent (%s): a new full version follows", delta.seq, exc)
            self.reset()
            return None
        self.sent += 1
        self.bytes_sent += len(record)
        self.last, self.applied = delta, applied
        return delta

    def flush(self) -> None:
        self.producer.flush()

    def close(self) -> None:
        self.producer.flush()
        self.producer.close()
