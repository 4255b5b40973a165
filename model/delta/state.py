"""The state stage: :class:`ModelState`, the served model in the form deltas change it.

A state holds what the served score depends on in the form the trainer changes it, so a
delta replaces only what moved (format: ``model/delta/FORMAT.md``): user and history rows by
key and the user tower's dense layers, the catalog in row order, the popularity prior and the
all-time counts by hash bucket, the co-visitation pairs relative to the lineage's reference count,
the session-kNN index (``model.scoring.sessions``, a new learned copy per delta) and the mix
weights.

Its methods compute what a full version holds (``Trainer._scoring_items``,
``CoVisitation.csr``); :func:`state_checksum` hashes a state in a canonical order (replicas
that applied the same deltas hash equal). Each part in detail: docs/internals.md.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import numpy as np

from model.artifact.sessions import params_of
from model.scoring.attributes import parts_of, token_rows
from model.scoring.cold import MIX, POPULAR, popularity_scores
from model.scoring.covisit import LOW32, pairs_csr, row_pairs
from model.scoring.prior import served_item_vectors
from model.scoring.rarity import scales_of
from model.scoring.sessions import SessionIndex
from model.scoring.sorted_keys import find_sorted

Layer = tuple[np.ndarray, np.ndarray, str]
#: The session-kNN index's parameters in :attr:`Constants.sknn` (``k`` 0: all neighbours).
SKNN_PARAMS = ("sample_size", "window", "k", "max_sessions")


@dataclass(frozen=True)
class Constants:
    """What a lineage (a base and its deltas) never changes."""

    normalize: bool
    score_bias: bool
    temperature: float
    history_len: int | None
    history_decay: float
    #: Hash buckets of the frequency estimate (``key mod buckets``).
    prior_buckets: int
    #: ``base`` of a bucket the state does not hold (never counted).
    prior_default: float
    covisit_window: int | None = None
    covisit_decay: float = 1.0
    #: The session-kNN index's parameters (:data:`SKNN_PARAMS`, the artifact's ``sessions``
    #: entry without its weight); None: the lineage has no session-kNN part.
    sknn: dict[str, int] | None = None
    #: Attribute keys per item (``ModelConfig.attr_tokens``); 0: the lineage has no
    #: attribute slots (its records carry no :class:`Attributes`).
    attr_tokens: int = 0

    def __post_init__(self) -> None:
        if self.sknn is not None and (
                set(self.sknn) != set(SKNN_PARAMS)
                or not all(isinstance(v, int) and not isinstance(v, bool)
                           for v in self.sknn.values())):
            raise ValueError(f"sknn must hold exactly {list(SKNN_PARAMS)} as ints, "
                             f"not {self.sknn}")

    def to_json(self) -> dict[str, Any]:
        """The constants as the records hold them; ``sknn`` only when there is the part, so a
        lineage without it writes what readers before the part read."""
        out = dict(self.__dict__)
        if not self.attr_tokens:
            del out["attr_tokens"]
        if self.sknn is None:
            del out["sknn"]
        else:
            out["sknn"] = dict(self.sknn)
        return out

    def session_index(self) -> SessionIndex | None:
        """A new, empty session-kNN index of the lineage's parameters (None: no part)."""
        if self.sknn is None:
            return None
        p = self.sknn
        return SessionIndex(p["sample_size"], p["window"], p["k"] or None, p["max_sessions"])


@dataclass(frozen=True, eq=False)
class Attributes:
    """The item attribute parts of a lineage with attribute slots (``constants.attr_tokens``,
    ``model.scoring.attributes``). In a state: the whole attribute table and every item's
    entry. In a record: the attribute rows that changed or were added, the entries that
    changed (all weights 0: the item lost its attributes) and, always, the default row."""

    #: Attribute keys (sorted, distinct) and their rows ``[a, d]`` float32.
    keys: np.ndarray
    rows: np.ndarray
    #: Items (sorted, distinct) and their attribute keys and weights ``[m, attr_tokens]``.
    item_keys: np.ndarray
    tokens: np.ndarray
    weights: np.ndarray
    #: The item table's shared row (an item without its own row), float32 ``[d]``.
    default_row: np.ndarray

    def entries(self, item_keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(tokens, weights)`` of items (zeros: no entry)."""
        item_keys = np.asarray(item_keys, np.int64)
        t = self.tokens.shape[1] if self.tokens.ndim == 2 else 0
        tokens = np.zeros((item_keys.size, t), np.int64)
        weights = np.zeros((item_keys.size, t), np.float32)
        pos, hit = find_sorted(self.item_keys, item_keys)
        tokens[hit], weights[hit] = self.tokens[pos[hit]], self.weights[pos[hit]]
        return tokens, weights

    @cached_property
    def token_rows(self) -> tuple[np.ndarray, np.ndarray]:
        """``(pos, w)`` ``[m, attr_tokens]`` of each item's entry in :attr:`keys`
        (``model.scoring.attributes.token_rows``; computed on first use; ``model.delta.apply``
        carries them to the next state, recomputing only the changed entries', while no
        attribute key is added)."""
        return token_rows(self.tokens, self.weights, self.keys)

    @cached_property
    def item_parts(self) -> np.ndarray:
        """``[m, d]``: the attribute part of each item of ``item_keys`` (computed on first use;
        ``model.delta.apply`` carries it to the next state, recomputing only what changed,
        when no attribute row it read moved)."""
        return parts_of(*self.token_rows, self.rows)

    def parts(self, item_keys: np.ndarray) -> np.ndarray:
        """``[n, d]``: the attribute parts of items (zeros without an entry)."""
        item_keys = np.asarray(item_keys, np.int64)
        if not self.item_keys.size:
            return np.zeros((item_keys.size, self.default_row.shape[0]), np.float32)
        pos, hit = find_sorted(self.item_keys, item_keys)
        out = np.take(self.item_parts, pos, axis=0)  # a gather, then the misses cleared:
        out[~hit] = 0.0  # far cheaper than masked reads and writes of the whole
        return out

    def has(self, item_keys: np.ndarray) -> np.ndarray:
        """bool per item: whether it has attributes."""
        return (self.entries(item_keys)[1] > 0).any(axis=1)


@dataclass(frozen=True, eq=False)
class ModelState:
    """One immutable state; :func:`model.delta.apply` returns a new one (arrays shared
    where nothing changed, never written)."""

    constants: Constants
    base_version: str
    seq: int
    user_keys: np.ndarray
    user_rows: np.ndarray
    default_user_row: np.ndarray
    hist_keys: np.ndarray
    hist_rows: np.ndarray
    item_keys: np.ndarray
    item_ids: np.ndarray
    prior_buckets: np.ndarray
    prior_base: np.ndarray
    #: All-time positives of the same buckets (float64): the cold start's popularity
    #: ranking (``model.scoring.cold``).
    prior_count: np.ndarray
    #: (shift, floor, log_norm) of the prior.
    prior_scalars: tuple[float, float, float]
    covisit_keys: np.ndarray
    covisit_codes: np.ndarray
    covisit_values: np.ndarray
    covisit_scale: float
    #: (tower, prior, covisit, covisit_last) weights of the score.
    weights: tuple[float, float, float, float]
    layers: tuple[Layer, ...]
    trained_through_ms: int | None = None
    offsets: Mapping[str, int] = field(default_factory=dict)
    samples_trained: int = 0
    created_at: str | None = None
    #: What a user with no history is ranked by (``model.scoring.cold``): "mix", "prior"
    #: or "popular".
    cold_start: str = MIX
    #: The session-kNN index (``constants.sknn``; None: no such part). Never learnt on in
    #: place: :func:`model.delta.apply` gives the next state a learned copy, so artifacts and
    #: requests holding this one keep their scores.
    sessions: SessionIndex | None = None
    #: The mix weight of the session-kNN part (served only when > 0, as a full version's).
    sessions_weight: float = 0.0
    #: Per history group, the neighbour parts' scales (the artifact's ``history_groups``
    #: entry, ``model.scoring.selector``; None: the weights alone).
    history_groups: Mapping[str, Any] | None = None
    #: The towers' scales on rarely chosen items (``model.scoring.rarity``; None: 1).
    item_groups: Mapping[str, Any] | None = None
    #: The item attribute parts (``constants.attr_tokens`` > 0; else None).
    attributes: Attributes | None = None

    @property
    def serves_sessions(self) -> bool:
        """Whether the served score has the session-kNN part (an index, weight > 0)."""
        return self.sessions is not None and self.sessions_weight > 0

    def _of_buckets(self, keys: np.ndarray, values: np.ndarray, default: float) -> np.ndarray:
        """``values`` (float64, aligned with ``prior_buckets``) of item ``keys``' buckets, or
        ``default`` for a bucket the state does not hold."""
        buckets = np.mod(np.asarray(keys, np.int64), np.int64(self.constants.prior_buckets))
        out = np.full(buckets.shape, default, np.float64)
        if self.prior_buckets.size:
            pos = np.minimum(np.searchsorted(self.prior_buckets, buckets), self.prior_buckets.size - 1)
            hit = self.prior_buckets[pos] == buckets
            out[hit] = values[pos[hit]]
        return out

    def prior_base_of(self, keys: np.ndarray) -> np.ndarray:
        """The prior's ``base`` (float64) of item ``keys``: their bucket's, or the default."""
        return self._of_buckets(keys, self.prior_base, self.constants.prior_default)

    def prior_count_of(self, keys: np.ndarray) -> np.ndarray:
        """All-time positives (float64) of item ``keys``' buckets (0: none held)."""
        return self._of_buckets(keys, self.prior_count, 0.0)

    def item_popularity(self) -> np.ndarray:
        """The all-time popularity ranking's scores of the catalog, in its row order
        (``model.scoring.cold.popularity_scores``; the artifact's ``item_popularity``)."""
        return popularity_scores(self.prior_count_of(self.item_keys))

    def log_q_of_base(self, base: np.ndarray) -> np.ndarray:
        """``log q`` (float32) from ``base`` values (:meth:`prior_base_of`): elementwise, so a
        part of the catalog computes exactly what the whole does."""
        shift, floor, log_norm = self.prior_scalars
        return (np.maximum(base - shift, floor) - log_norm).astype(np.float32)

    def log_q(self, keys: np.ndarray) -> np.ndarray:
        """The prior's ``log q`` of item ``keys`` (float32)."""
        return self.log_q_of_base(self.prior_base_of(keys))

    @cached_property
    def catalog_index(self) -> tuple[np.ndarray, np.ndarray]:
        """(catalog keys sorted, their catalog rows): key -> row by binary search. Derived
        (not a field, so ``replace`` never carries a stale one); ``apply`` seeds the next
        state's from this one's (:func:`seed_catalog_index`), else built on first use."""
        order = np.argsort(self.item_keys, kind="stable")
        return self.item_keys[order], order.astype(np.int64)

    def catalog_rows(self, keys: np.ndarray) -> np.ndarray:
        """Catalog rows of ``keys`` (-1: not in the catalog)."""
        sorted_keys, rows = self.catalog_index
        out = np.full(keys.shape, -1, np.int64)
        if sorted_keys.size and keys.size:
            pos = np.minimum(np.searchsorted(sorted_keys, keys), sorted_keys.size - 1)
            hit = sorted_keys[pos] == keys
            out[hit] = rows[pos[hit]]
        return out

    def catalog_hist_rows(self, rows: np.ndarray | None = None) -> np.ndarray:
        """Item rows of the catalog's ``rows`` (all: None), in that order: the history (item
        table) row, with attribute slots plus the item's attribute part (an item without an
        own row: the default row plus its part)."""
        keys = self.item_keys if rows is None else self.item_keys[rows]
        if not keys.size:
            return np.zeros((0, self.hist_rows.shape[1]), np.float32)
        attrs = self.attributes
        if attrs is None:
            return self.hist_rows[np.searchsorted(self.hist_keys, keys)]
        pos, own = find_sorted(self.hist_keys, keys)
        if self.hist_keys.size:
            out = np.take(self.hist_rows, pos, axis=0).astype(np.float32, copy=False)
            out[~own] = attrs.default_row
        else:
            out = np.repeat(attrs.default_row[None].astype(np.float32), keys.size, axis=0)
        if attrs.keys.size:
            out += attrs.parts(keys)
        return out

    @cached_property
    def served_hist_rows(self) -> np.ndarray:
        """The rows histories are pooled from, aligned with ``hist_keys``: the history rows,
        with attribute slots each plus its item's attribute part (a full version's
        ``item_hist_rows``)."""
        if self.attributes is None or not self.attributes.keys.size:
            return self.hist_rows
        return self.hist_rows + self.attributes.parts(self.hist_keys)

    def item_vectors(self) -> np.ndarray:
        """Scoring vectors of the catalog, in its row order (``Trainer._scoring_items``)."""
        c = self.constants
        log_q = self.log_q(self.item_keys) if c.score_bias else None
        return served_item_vectors(self.catalog_hist_rows(), log_q, normalize=c.normalize,
                                   tower_weight=self.weights[0], prior_weight=self.weights[1],
                                   temperature=c.temperature, item_scale=self.item_scales())

    def item_scales(self, counts: np.ndarray | None = None) -> np.ndarray | None:
        """The towers' scale of each catalog item (``model.scoring.rarity``, by its all-time
        positives, or by ``counts`` given in catalog order); None: 1 for every item."""
        if self.item_groups is None:
            return None
        return scales_of(self.item_groups,
                         self.prior_count_of(self.item_keys) if counts is None else counts)

    def covisit_csr(self, pause: Callable[[], None] | None = None
                    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The pairs among the catalog as CSR arrays over its rows (``CoVisitation.csr``):
        O(pairs log pairs + catalog), the catalog's keys found by :attr:`catalog_index`.
        ``pause``: called once, before the sort (as ``model.delta.apply``'s)."""
        codes, values = row_pairs(self.catalog_rows(self.covisit_keys), self.covisit_codes,
                                  self.covisit_values)
        if pause is not None:
            pause()
        order = np.argsort(codes)  # (a, b) pairs are distinct: no ties
        return pairs_csr(codes[order], values[order] * self.covisit_scale, self.item_keys.size)

    def artifact_arrays(self) -> dict[str, Any]:
        """The arrays a full version of this state would hold (names of ``write_artifact``)."""
        out: dict[str, Any] = {
            "item_ids": self.item_ids,
            "item_vectors": self.item_vectors(),
            "item_hist_keys": self.hist_keys,
            "item_hist_rows": self.served_hist_rows,
            "user_keys": self.user_keys,
            "user_rows": self.user_rows,
            "default_user_row": self.default_user_row,
            "layers": list(self.layers),
            "cold_start": self.cold_start,
            "history_groups": self.history_groups,
        }
        if self.cold_start == POPULAR:
            out["item_popularity"] = self.item_popularity()
        if self.constants.covisit_window is not None:
            out["covisit"] = self.covisit_csr()
        if self.sessions is not None and self.serves_sessions:
            out["sessions"] = (self.sessions.to_arrays(),
                               self.catalog_rows(self.sessions.items.keys))
            out["sessions_params"] = params_of(self.sessions, self.sessions_weight)
        return out


def state_checksum(state: ModelState) -> str:
    """BLAKE2b-128 of everything the served score reads, in a canonical order (catalog by
    key), so states equal in content hash equal whatever order their items joined in."""
    h = hashlib.blake2b(digest_size=16)
    order = np.argsort(state.item_keys, kind="stable")

    def put(arr: np.ndarray) -> None:
        a = np.ascontiguousarray(arr)
        h.update(f"{a.dtype.str}{a.shape}".encode())
        h.update(a.tobytes())

    for arr in (state.user_keys, state.user_rows, state.default_user_row, state.hist_keys,
                state.hist_rows, state.item_keys[order], state.item_ids[order],
                state.item_vectors()[order]):
        put(arr)
    for w, b, act in state.layers:
        put(w)
        put(b)
        h.update(act.encode())
    if state.constants.covisit_window is not None:
        # pairs as (key a, key b, weight), sorted: independent of dense ids and row order
        ka = state.covisit_keys[state.covisit_codes >> 32]
        kb = state.covisit_keys[state.covisit_codes & LOW32]
        w = (state.covisit_values * state.covisit_scale).astype(np.float32)
        o = np.lexsort((kb, ka))
        for arr in (ka[o], kb[o], w[o]):
            put(arr)
    h.update(repr(tuple(float(x) for x in state.weights)).encode())
    if state.cold_start != MIX:
        h.update(state.cold_start.encode())
    if state.cold_start == POPULAR:
        put(state.item_popularity()[order])
    if state.history_groups is not None:
        h.update(json.dumps(state.history_groups, sort_keys=True).encode())
    if state.item_groups is not None:
        h.update(json.dumps(state.item_groups, sort_keys=True).encode())
    if state.attributes is not None:
        a = state.attributes
        for arr in (a.keys, a.rows, a.item_keys, a.tokens, a.weights, a.default_row):
            put(arr)
    if state.sessions is not None:
        # replicas that replayed the same positives hold the same dense ids: the arrays as
        # they are, by name
        arrays = state.sessions.to_arrays()
        for name in sorted(arrays):
            h.update(name.encode())
            put(arrays[name])
        h.update(repr((sorted(state.sessions.params().items()),
                       float(state.sessions_weight))).encode())
    return h.hexdigest()
