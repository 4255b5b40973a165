"""Model artifact: what serving needs, as plain ``.npy`` files plus ``manifest.json``.

The format — files, manifest fields and their readers, format versions, checksums — is the
written spec ``model/artifact/FORMAT.md``. Writer: :func:`write_artifact`; reader:
:func:`load_artifact` (verifies every checksum, shape and dtype; raises :class:`ArtifactError`)
into a :class:`ServingArtifact`, which computes the user tower and the co-visitation term as
the spec says. Numpy only: this module must never import TensorFlow.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np

from model.artifact.attention import AttentionWeights, attention_arrays, load_attention
from model.artifact.manifest import (
    ACTIVATIONS,
    COLD_STARTS,
    COVISIT_FILES,
    FORMAT,
    FORMAT_VERSION,
    MANIFEST,
    POPULARITY_FILE,
    READABLE_VERSIONS,
    RESERVED,
    ArtifactError,
    check_covisit_arrays,
    check_covisit_params,
    check_dims,
    format_version,
    history_groups_entry,
    load_npy,
    read_manifest,
    sha256_file,
    sorted_table,
)
from model.artifact.sessions import check_params as check_sessions_params
from model.artifact.sessions import file_arrays as sessions_files
from model.artifact.sessions import index_of as index_of_sessions
from model.artifact.sessions import session_scores
from model.scoring.covisit import LOW32, accumulate, history_rows, position_weights, term
from model.scoring.pooling import pool_history
from model.scoring.selector import row_scales
from model.scoring.sessions import SessionIndex
from model.scoring.sorted_keys import find_sorted
from streamrec.ids import item_keys, user_key

log = logging.getLogger(__name__)

__all__ = [
    "ACTIVATIONS", "FORMAT", "FORMAT_VERSION", "MANIFEST", "READABLE_VERSIONS", "ArtifactError",
    "ServingArtifact", "load_artifact", "read_manifest", "write_artifact",
]


Layer = tuple[np.ndarray, np.ndarray, str]


def write_artifact(
    directory: str | Path,
    *,
    version: str,
    item_ids: Sequence[str] | np.ndarray,
    item_vectors: np.ndarray,
    item_hist_keys: np.ndarray,
    item_hist_rows: np.ndarray,
    user_keys: np.ndarray,
    user_rows: np.ndarray,
    default_user_row: np.ndarray,
    layers: Sequence[Layer] = (),
    normalize: bool = False,
    score_bias: bool = False,
    history_len: int | None = None,
    history_decay: float = 1.0,
    covisit: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None,
    covisit_params: Mapping[str, Any] | None = None,
    attention: Mapping[str, Any] | None = None,
    cold_start: str = "mix",
    item_popularity: np.ndarray | None = None,
    sessions: tuple[Mapping[str, np.ndarray], np.ndarray] | None = None,
    sessions_params: Mapping[str, Any] | None = None,
    history_groups: Mapping[str, Any] | None = None,
    manifest_extra: Mapping[str, Any] | None = None,
    created_at: datetime | None = None,
) -> dict[str, Any]:
    """Write one artifact into ``directory`` and return its manifest (FORMAT.md).

    ``cold_start`` (``model.scoring.cold``): what a user with no history is ranked by; format
    7 when "prior" (the prior's column alone; needs ``score_bias``), format 8 when
    "popular" (``item_popularity``, one finite score per item, alone).

    ``attention`` (format 5): ``{"pos": [N, e_h], "blocks": [{name: array}], "heads": int,
    "pool": bool}`` (``model.artifact.attention``).

    ``sessions`` (format 9, with ``sessions_params``): the session-kNN index's arrays
    (``SessionIndex.to_arrays``) and the catalogue row of each of its items
    (``model.artifact.sessions``).

    ``history_groups`` (format 10, ``model.scoring.selector``): ``{"window", "starts",
    "scales"}``, the (co-visitation, session-kNN) scales of those parts' weights per history
    group; None, or every scale 1: the weights alone for every row (no entry)."""
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    extra = dict(manifest_extra or {})
    clash = RESERVED & extra.keys()
    if clash:
        raise ArtifactError(f"manifest_extra may not set {sorted(clash)}")
    if created_at is not None and created_at.tzinfo is None:
        raise ArtifactError("created_at must be timezone-aware")
    if cold_start not in COLD_STARTS or (cold_start == "prior" and not score_bias):
        raise ArtifactError(f"cold_start {cold_start!r} needs one of {COLD_STARTS}, "
                            "'prior' with score_bias")
    if (cold_start == "popular") != (item_popularity is not None):
        raise ArtifactError("item_popularity goes with cold_start 'popular', and only with it")

    groups = history_groups_entry(history_groups)
    ids = np.asarray([str(i) for i in item_ids], dtype=np.str_)
    vectors = np.ascontiguousarray(item_vectors, dtype=np.float32)
    if vectors.ndim != 2 or vectors.shape[0] != ids.shape[0]:
        raise ArtifactError(f"item_vectors {vectors.shape} do not match {ids.shape[0]} item ids")
    if len(set(ids.tolist())) != ids.shape[0]:
        raise ArtifactError("duplicate item ids")
    hist_keys, hist_rows = sorted_table(item_hist_keys, item_hist_rows, "item_hist")
    ukeys, urows = sorted_table(user_keys, user_rows, "users")
    default = np.asarray(default_user_row, dtype=np.float32).reshape(-1)
    if default.shape[0] != urows.shape[1]:
        raise ArtifactError(f"default_user_row has {default.shape[0]} dims, users {urows.shape[1]}")

    arrays: dict[str, np.ndarray] = {
        "item_ids.npy": ids,
        "item_vectors.npy": vectors,
        "item_hist_keys.npy": hist_keys,
        "item_hist_rows.npy": hist_rows,
        "user_keys.npy": ukeys,
        "user_rows.npy": urows,
        "default_user_row.npy": default,
    }
    if item_popularity is not None:
        popularity = np.asarray(item_popularity, np.float32)
        if popularity.shape != (ids.shape[0],) or not np.isfinite(popularity).all():
            raise ArtifactError(f"item_popularity {popularity.shape} is not {ids.shape[0]} "
                                "finite scores")
        arrays[POPULARITY_FILE] = popularity
    if (covisit is None) != (covisit_params is None):
        raise ArtifactError("covisit and covisit_params go together")
    if covisit is not None and covisit_params is not None:
        check_covisit_params(dict(covisit_params))
        indptr, neighbours, weights = covisit
        cv = (np.asarray(indptr, np.int64), np.asarray(neighbours, np.int32),
              np.asarray(weights, np.float32))
        check_covisit_arrays(*cv, n=int(ids.shape[0]))
        arrays.update(zip(COVISIT_FILES, cv, strict=True))
    if (sessions is None) != (sessions_params is None):
        raise ArtifactError("sessions and sessions_params go together")
    if sessions is not None and sessions_params is not None:
        check_sessions_params(dict(sessions_params))
        files_of = sessions_files(*sessions)
        index_of_sessions(sessions_params, files_of, int(ids.shape[0]))  # as the reader checks
        arrays.update(files_of)
    attention_entry = None
    if attention is not None:
        arrays.update(attention_arrays(attention["pos"], attention["blocks"]))
        attention_entry = {
            "blocks": len(attention["blocks"]),
            "heads": int(attention["heads"]),
            "len": int(np.shape(attention["pos"])[0]),
            "pool": bool(attention["pool"]),
        }
    layer_specs = []
    for i, (w, b, act) in enumerate(layers):
        if act not in ACTIVATIONS:
            raise ArtifactError(f"layer {i}: activation {act!r} not in {ACTIVATIONS}")
        wn, bn = f"layer_{i}_w.npy", f"layer_{i}_b.npy"
        arrays[wn] = np.ascontiguousarray(w, dtype=np.float32)
        arrays[bn] = np.asarray(b, dtype=np.float32).reshape(-1)
        layer_specs.append({"w": wn, "b": bn, "activation": act})

    files: dict[str, dict[str, Any]] = {}
    for name, arr in arrays.items():
        path = out / name
        np.save(path, arr, allow_pickle=False)
        files[name] = {
            "sha256": sha256_file(path),
            "bytes": path.stat().st_size,
            "shape": list(arr.shape),
            "dtype": arr.dtype.str,
        }
    manifest: dict[str, Any] = {
        "format": FORMAT,
        "format_version": format_version(
            score_bias, history_len, history_decay, covisit is not None, attention is not None,
            bool(covisit_params and covisit_params.get("last_weight", 0.0)),
            cold_start, sessions is not None, groups is not None,
        ),
        "version": version,
        "created_at": created_at.isoformat() if created_at else None,
        "normalize": bool(normalize),
        "dims": {
            "items": int(ids.shape[0]),
            "d": int(vectors.shape[1]),
            "hist_items": int(hist_keys.shape[0]),
            "hist_dim": int(hist_rows.shape[1]),
            "users": int(ukeys.shape[0]),
            "user_dim": int(urows.shape[1]),
        },
        "layers": layer_specs,
        "files": files,
        **extra,
    }
    if score_bias:
        manifest["score_bias"] = True
    if cold_start != "mix":
        manifest["cold_start"] = cold_start
    if history_len is not None:
        if history_len < 1:
            raise ArtifactError(f"history_len must be >= 1, got {history_len}")
        manifest["history_len"] = int(history_len)
    if not 0.0 < history_decay <= 1.0:
        raise ArtifactError(f"history_decay must be in (0, 1], got {history_decay}")
    if history_decay != 1.0:
        manifest["history_decay"] = float(history_decay)
    if covisit_params is not None:
        manifest["covisit"] = {
            "weight": float(covisit_params["weight"]),
            "window": int(covisit_params["window"]),
            "decay": float(covisit_params["decay"]),
        }
        if covisit_params.get("last_weight", 0.0):
            manifest["covisit"]["last_weight"] = float(covisit_params["last_weight"])
    if sessions_params is not None:
        manifest["sessions"] = dict(sessions_params)
    if groups is not None:
        manifest["history_groups"] = groups
    if attention_entry is not None:
        manifest["attention"] = attention_entry
        load_attention(manifest, arrays)  # shapes and values, as the reader checks them
    check_dims(manifest, arrays)
    (out / MANIFEST).write_text(json.dumps(manifest, indent=1, sort_keys=True))
    log.info("wrote artifact %s (%d items) to %s", version, ids.shape[0], out)
    return manifest


@dataclass(frozen=True, eq=False)
class ServingArtifact:
    """One loaded, verified version; immutable once built (arrays are read-only)."""

    path: Path
    manifest: Mapping[str, Any]
    item_ids: np.ndarray
    item_vectors: np.ndarray
    item_hist_keys: np.ndarray
    item_hist_rows: np.ndarray
    user_keys: np.ndarray
    user_rows: np.ndarray
    default_user_row: np.ndarray
    layers: tuple[Layer, ...]
    normalize: bool
    item_index: Mapping[str, int] = field(repr=False)
    #: CSR co-visitation matrix over the items (format 4): (indptr, neighbours, weights).
    covisit: tuple[np.ndarray, np.ndarray, np.ndarray] | None = field(default=None, repr=False)
    #: The attention user tower (format 5).
    attention: AttentionWeights | None = field(default=None, repr=False)
    #: All-time popularity score of each item (format 8, with ``cold_start`` "popular").
    item_popularity: np.ndarray | None = field(default=None, repr=False)
    #: The session-kNN index (format 9) and the catalogue row of each of its items.
    sessions: SessionIndex | None = field(default=None, repr=False)
    sessions_rows: np.ndarray | None = field(default=None, repr=False)

    @property
    def history_len(self) -> int | None:
        """Most recent history items the user tower pools (None: all)."""
        value = self.manifest.get("history_len")
        return None if value is None else int(value)

    @property
    def history_decay(self) -> float:
        """Recency decay of the history pool (1.0: plain mean; FORMAT.md)."""
        return float(self.manifest.get("history_decay", 1.0))

    @property
    def score_bias(self) -> bool:
        """Whether the last item-vector column is an additive score (FORMAT.md)."""
        return bool(self.manifest.get("score_bias", False))

    @property
    def cold_start(self) -> str:
        """What a user with no history is ranked by (``model.scoring.cold``): "mix", the
        prior's column alone ("prior", format 7) or all-time popularity ("popular", format
        8: :attr:`item_popularity`)."""
        return str(self.manifest.get("cold_start", "mix"))

    def cold_column(self) -> np.ndarray | None:
        """The ranking of an empty history when it is not the mix (:attr:`cold_start`):
        the prior's column or all-time popularity, one score per item; None for the mix."""
        cold = self.cold_start
        if cold == "mix":
            return None
        column = self.item_vectors[:, -1] if cold == "prior" else self.item_popularity
        assert column is not None  # load_artifact / servable hold it for "popular"
        return column

    def _cold(self, out: np.ndarray, histories: Sequence[Any],
              rows: np.ndarray | None = None) -> np.ndarray:
        """``out`` (``[N, B]`` scores, or of ``rows`` only) with the columns of empty
        histories replaced by the ranking of :attr:`cold_start` when it is not the mix."""
        column = self.cold_column()
        if column is not None:
            empty = [col for col, h in enumerate(histories) if len(h) == 0]
            if empty:
                out[:, empty] = (column if rows is None else column[rows])[:, None]
        return out

    def covisit_scores(
        self, histories: Sequence[Sequence[str]]
    ) -> list[tuple[np.ndarray, np.ndarray]]:
        """Per history (most recent first): ``(item rows, added scores)`` of the co-visitation
        term (``model.scoring.covisit``: ``weight * log1p(s)``, only rows with ``s > 0``); empty
        arrays for every history when the version has no such term (formats 1-3)."""
        window = int(self.manifest["covisit"]["window"]) if self.covisit is not None else 0
        return self.covisit_scores_of_rows(
            [np.asarray(history_rows(self.item_index, h, window), np.int64) for h in histories])

    def covisit_scores_of_rows(
        self, histories: Sequence[np.ndarray]
    ) -> list[tuple[np.ndarray, np.ndarray]]:
        """:meth:`covisit_scores` of histories given as item rows of this version (-1: not
        one of its items), most recent first."""
        empty = (np.zeros(0, np.int64), np.zeros(0, np.float32))
        if self.covisit is None:
            return [empty] * len(histories)
        params = self.manifest["covisit"]
        window, weight = int(params["window"]), float(params["weight"])
        last = float(params.get("last_weight", 0.0))
        scale = position_weights(window, float(params["decay"]))
        indptr, neighbours, weights = self.covisit
        # every history's slices in one sum, kept apart by history (``groups``): the same
        # float sums as one history at a time (both add in entry order), without a sort
        # per history
        rows_of = [np.asarray(hist[:window], np.int64) for hist in histories]
        pos_of = [np.flatnonzero(rows >= 0) for rows in rows_of]
        groups = np.repeat(np.arange(len(rows_of), dtype=np.int64), [p.size for p in pos_of])
        if not groups.size:
            return [empty] * len(histories)
        rows = np.concatenate([r[p] for r, p in zip(rows_of, pos_of, strict=True)])
        n_items = int(indptr.size) - 1
        codes, sums = accumulate(indptr[rows], indptr[rows + 1],
                                 scale[np.concatenate(pos_of)], neighbours, weights,
                                 groups, n_items)
        added = term(sums, weight)
        if last:  # format 6: the most recent item's own term
            firsts = np.flatnonzero([p.size > 0 and p[0] == 0 for p in pos_of])
            if firsts.size:
                r = np.array([rows_of[g][0] for g in firsts], np.int64)
                lcodes, lsums = accumulate(indptr[r], indptr[r + 1], np.ones(r.size),
                                           neighbours, weights, firsts, n_items)
                at = np.searchsorted(codes, lcodes)  # a subset of codes (both sorted)
                added[at] += term(lsums, last)
        cuts = np.searchsorted(codes >> 32, np.arange(len(histories) + 1))
        cols = (codes & LOW32).astype(np.int64)
        return [(cols[a:b], added[a:b]) for a, b in zip(cuts[:-1], cuts[1:], strict=True)]

    def scores(
        self, user_ids: Sequence[str], histories: Sequence[Sequence[str]],
        rows: np.ndarray | None = None, queries: np.ndarray | None = None,
    ) -> np.ndarray:
        """The served score of every item for each user, ``[N, B]`` (items-major, as
        ``serving.retrieval`` ranks it): the towers and the prior in one matrix product,
        plus the co-visitation term. ``rows`` (sorted, distinct): only those items,
        ``[len(rows), B]`` (two-stage retrieval, ``model.scoring.ann``); ``queries``: the
        users' vectors when the caller has them (:meth:`user_vectors`)."""
        keys = self.request_keys(user_ids, histories)
        if queries is None:
            queries = self.user_vectors_of_keys(*keys)
        return self.assemble(queries, self.sparse_scores(histories, keys), histories, rows)

    def sparse_scores(
        self, histories: Sequence[Sequence[str]], keys: tuple[np.ndarray, list[np.ndarray]],
    ) -> list[list[tuple[np.ndarray, np.ndarray]]]:
        """The parts added at a few rows per user, each as :meth:`covisit_scores` gives it:
        the co-visitation term, then the session-kNN part (those the version has);
        ``keys``: :meth:`request_keys` of the same users and histories."""
        out = []
        scales = self.group_scales(histories)
        if self.covisit is not None:
            out.append(_scaled(self.covisit_scores(histories), scales, 0))
        if self.sessions is not None:
            out.append(_scaled(self.session_scores_of_keys(*keys), scales, 1))
        return out

    def group_scales(self, histories: Sequence[Any]) -> np.ndarray | None:
        """``[B, 2]``: the (co-visitation, session-kNN) scales of each history's group
        (format 10, ``history_groups``: ``model.scoring.selector``); None without groups."""
        entry = self.manifest.get("history_groups")
        if entry is None:
            return None
        window = int(entry["window"])
        counts = np.fromiter((min(len(h), window) for h in histories), np.int64, len(histories))
        return row_scales(np.asarray(entry["scales"], np.float64), counts, entry["starts"])

    def session_scores_of_keys(
        self, user_keys: np.ndarray, histories: Sequence[np.ndarray]
    ) -> list[tuple[np.ndarray, np.ndarray]]:
        """Per user (by key; history as item keys, most recent first): ``(item rows, added
        scores)`` of the session-kNN part (format 9, ``model.artifact.sessions``); empty
        arrays for every user without one."""
        if self.sessions is None or self.sessions_rows is None:
            empty = (np.zeros(0, np.int64), np.zeros(0, np.float32))
            return [empty] * len(histories)
        weight = float(self.manifest["sessions"]["weight"])
        return session_scores(self.sessions, self.sessions_rows, weight, user_keys, histories)

    def scores_of_keys(
        self, user_keys: np.ndarray, histories: Sequence[np.ndarray],
        history_rows: Sequence[np.ndarray],
    ) -> np.ndarray:
        """:meth:`scores` of users given by key, their histories as item keys and as item rows
        of this version (-1: not one of its items), most recent first: the trainer scores its
        rows (keys only) as serving would."""
        scales = self.group_scales(histories)
        sparse = ([_scaled(self.covisit_scores_of_rows(history_rows), scales, 0)]
                  if self.covisit is not None else [])
        if self.sessions is not None:
            sparse.append(_scaled(self.session_scores_of_keys(user_keys, histories), scales, 1))
        return self.assemble(self.user_vectors_of_keys(user_keys, histories), sparse,
                             histories, None)

    def assemble(
        self, queries: np.ndarray, sparse: Sequence[list[tuple[np.ndarray, np.ndarray]]],
        histories: Sequence[Any], rows: np.ndarray | None,
    ) -> np.ndarray:
        """The score put together from its parts, over every item or ``rows`` only (sorted,
        distinct): the users' vectors (:meth:`user_vectors`), the parts added at a few rows
        (:meth:`sparse_scores`) and the cold start of empty histories."""
        vectors = self.item_vectors if rows is None else self.item_vectors[rows]
        out = vectors @ queries.T
        for added_part in sparse:
            for col, (at, added) in enumerate(added_part):
                if rows is None:
                    out[at, col] += added
                else:
                    pos, found = find_sorted(rows, at)
                    out[pos[found], col] += added[found]
        return self._cold(out, histories, rows)

    @property
    def version(self) -> str:
        return str(self.manifest["version"])

    @property
    def dim(self) -> int:
        return int(self.item_vectors.shape[1])

    def _lookup(self, keys: np.ndarray, table: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Positions of ``keys`` in the sorted ``table`` and whether each was found."""
        return find_sorted(table, keys)

    def known_users(self, user_ids: Sequence[str]) -> np.ndarray:
        """Boolean mask: which users have their own row in this version."""
        keys = np.fromiter((user_key(u) for u in user_ids), np.int64, len(user_ids))
        return self._lookup(keys, self.user_keys)[1]

    def user_vectors(
        self, user_ids: Sequence[str], histories: Sequence[Sequence[str]]
    ) -> np.ndarray:
        """User tower output, float32 ``[B, d]``; unknown users get the default row, the
        history (most recent first) is cut to ``history_len``, the items of it the model
        does not know are skipped and the known ones pooled (``model.scoring.pooling``:
        recency weights) and, in format 5, attended to (``model.scoring.attention``). With
        ``score_bias`` the last column is the constant 1 that adds each item's bias to its score."""
        return self.user_vectors_of_keys(*self.request_keys(user_ids, histories))

    def request_keys(
        self, user_ids: Sequence[str], histories: Sequence[Sequence[str]]
    ) -> tuple[np.ndarray, list[np.ndarray]]:
        """The users' keys and their histories' item keys, as far back as any part reads
        (the tower's window, the attention's, the session-kNN part's): hashed once per
        request for every part."""
        if len(user_ids) != len(histories):
            raise ValueError("user_ids and histories differ in length")
        cut = None if self.history_len is None else max(
            self.history_len, self.attention.length if self.attention else 0,
            self.sessions.window if self.sessions is not None else 0)
        return (np.fromiter((user_key(u) for u in user_ids), np.int64, len(user_ids)),
                [item_keys(list(h[:cut])) for h in histories])

    def user_vectors_of_keys(self, keys: np.ndarray, histories: Sequence[np.ndarray]) -> np.ndarray:
        """:meth:`user_vectors` of users given by key, their histories as item keys."""
        b = len(keys)
        pos, found = self._lookup(np.asarray(keys, np.int64), self.user_keys)
        urows = np.empty((b, self.default_user_row.shape[0]), np.float32)
        urows[:] = self.default_user_row
        if found.any():
            urows[found] = self.user_rows[pos[found]]
        hrows = np.zeros((b, self.item_hist_rows.shape[1]), np.float32)
        window, decay, att = self.history_len, self.history_decay, self.attention
        cut = None if window is None else max(window, att.length if att else 0)
        lookups = [self._lookup(np.asarray(h[:cut], np.int64), self.item_hist_keys)
                   for h in histories]
        for i, (hpos, hfound) in enumerate(lookups):
            hpos, hfound = hpos[:window], hfound[:window]
            if hfound.any():
                hrows[i] = pool_history(hpos, hfound, self.item_hist_rows, decay)
        if att is None:
            x = np.concatenate([urows, hrows], axis=1)
        else:
            a = att.outputs(lookups, self.item_hist_rows)
            x = np.concatenate([urows, a, hrows] if att.pool else [urows, a], axis=1)
        for w, bias, act in self.layers:
            x = x @ w + bias
            if act == "relu":
                np.maximum(x, 0.0, out=x)
        if self.normalize:
            x = x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)
        if self.score_bias:
            x = np.concatenate([x, np.ones((b, 1), x.dtype)], axis=1)
        return np.ascontiguousarray(x, dtype=np.float32)


def load_artifact(directory: str | Path, *, verify: bool = True,
                  map_vectors_from: int | None = None) -> ServingArtifact:
    """Load a version directory, verifying every file's size, sha256, shape and dtype.
    ``map_vectors_from``: a catalogue of at least this many items keeps its item vectors
    mapped from the file (shared by every process that loads the version) instead of copied
    into this process's memory: where requests rank through an ANN index
    (``serving.ann_min_items``) no request scans the whole table."""
    path = Path(directory)
    manifest = read_manifest(path)
    files = manifest["files"]
    if not isinstance(files, dict):
        raise ArtifactError(f"{path}: files is not a mapping")
    arrays: dict[str, np.ndarray] = {}
    for name, spec in files.items():
        if "/" in name or name.startswith("."):
            raise ArtifactError(f"{path}: bad file name {name!r}")
        arrays[name] = load_npy(path, name, spec, verify)
    needed = {
        "item_ids.npy", "item_vectors.npy", "item_hist_keys.npy", "item_hist_rows.npy",
        "user_keys.npy", "user_rows.npy", "default_user_row.npy",
    }
    for spec in manifest["layers"]:
        needed |= {spec.get("w"), spec.get("b")}
        if spec.get("activation") not in ACTIVATIONS:
            raise ArtifactError(f"{path}: activation {spec.get('activation')!r}")
    missing = needed - arrays.keys()
    if missing:
        raise ArtifactError(f"{path}: manifest lacks {sorted(str(m) for m in missing)}")
    try:
        check_dims(manifest, arrays)
    except KeyError as exc:
        raise ArtifactError(f"{path}: dims lack {exc}") from exc
    ids = arrays["item_ids.npy"]
    # the one table every request scans whole: in the process's own memory (the kernel backs
    # it with huge pages, a file mapping with 4 kB ones: at 1M items a mapped table served 8%
    # fewer requests/s), unless requests rank through an ANN index (``map_vectors_from``);
    # the other arrays stay mapped and shared (``load_npy``)
    vectors = arrays["item_vectors.npy"]
    if map_vectors_from is None or ids.shape[0] < map_vectors_from:
        vectors = np.array(vectors)
    vectors.setflags(write=False)
    if vectors.ndim != 2 or vectors.shape[0] != ids.shape[0] or not np.isfinite(vectors).all():
        raise ArtifactError(f"{path}: item vectors are malformed or not finite")
    for keys_name in ("item_hist_keys.npy", "user_keys.npy"):
        keys = arrays[keys_name]
        if keys.size > 1 and not np.all(keys[1:] > keys[:-1]):
            raise ArtifactError(f"{path}: {keys_name} not strictly increasing")
    layers = tuple(
        (arrays[s["w"]], arrays[s["b"]], str(s["activation"])) for s in manifest["layers"]
    )
    covisit: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None
    if "covisit" in manifest:
        lacking = [name for name in COVISIT_FILES if name not in arrays]
        if lacking:
            raise ArtifactError(f"{path}: covisit lacks {lacking}")
        indptr, neighbours, weights = (arrays[name] for name in COVISIT_FILES)
        try:
            check_covisit_arrays(indptr, neighbours, weights, n=int(ids.shape[0]))
        except ArtifactError as exc:
            raise ArtifactError(f"{path}: {exc}") from exc
        covisit = (indptr, neighbours, weights)
    attention = load_attention(manifest, arrays, f"{path}: ")
    sessions, sessions_rows = None, None
    if "sessions" in manifest:
        check_sessions_params(manifest["sessions"], f"{path}: ")
        sessions, sessions_rows = index_of_sessions(manifest["sessions"], arrays,
                                                    int(ids.shape[0]), f"{path}: ")
    popularity = None
    if manifest.get("cold_start") == "popular":
        popularity = arrays.get(POPULARITY_FILE)
        if (popularity is None or popularity.shape != ids.shape or popularity.dtype.kind != "f"
                or not np.isfinite(popularity).all()):
            raise ArtifactError(f"{path}: cold_start 'popular' needs {POPULARITY_FILE}, one "
                                f"finite score per item")
    return ServingArtifact(
        path=path,
        manifest=manifest,
        item_ids=ids,
        item_vectors=vectors,
        item_hist_keys=arrays["item_hist_keys.npy"],
        item_hist_rows=arrays["item_hist_rows.npy"],
        user_keys=arrays["user_keys.npy"],
        user_rows=arrays["user_rows.npy"],
        default_user_row=arrays["default_user_row.npy"],
        layers=layers,
        normalize=bool(manifest.get("normalize", False)),
        item_index={str(item): i for i, item in enumerate(ids.tolist())},
        covisit=covisit,
        attention=attention,
        item_popularity=popularity,
        sessions=sessions,
        sessions_rows=sessions_rows,
    )


def _scaled(part: list[tuple[np.ndarray, np.ndarray]], scales: np.ndarray | None, column: int
            ) -> list[tuple[np.ndarray, np.ndarray]]:
    """A part added at a few rows per user (:meth:`ServingArtifact.sparse_scores`), each
    user's times its scale in ``column`` of ``scales`` (:meth:`ServingArtifact.group_scales`;
    None: as it is)."""
    if scales is None:
        return part
    return [(at, added if scales[i, column] == 1.0 else added * np.float32(scales[i, column]))
            for i, (at, added) in enumerate(part)]
