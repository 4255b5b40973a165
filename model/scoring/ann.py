"""Candidates for large catalogues: an approximate nearest-neighbour index over one base's
item vectors (faiss IVF-Flat), kept valid for the states deltas compose from that base.

Two-stage ranking (``serving.retrieval``): the index proposes ``candidates`` rows per query;
the rows a version's exact score must see whatever the index says (the co-visitation rows of
the request's history, the top of the prior's column, the cold-start ranking's top, every
row changed or added since the index was built) join them; the union is scored exactly by
the served score (``ServingArtifact.scores`` with ``rows``) and the top ``k`` taken.

The index holds the base's served vectors as an inner-product search turned into a search on
the unit sphere: each row ``v`` becomes ``[v, sqrt(M^2 - |v|^2)] / M`` (``M`` the largest
row norm), a query ``[q, 0]`` normalised, so the nearest rows by angle are the rows of the
largest ``q . v`` (spherical k-means over the rows: the lists are cones of the sphere). A
plain inner-product IVF assigns queries to lists by the centroids' inner products, and lost
most of the exact top 10 on a catalogue with a prior column (figures:
``docs/decisions.md#ann-retrieval``).

A delta rescales the towers' columns (the mix's tower weight) and the prior's column (its
weight, the prior's normaliser) of every row, and rewrites the rows of the items it trained.
:func:`follow` measures both against the base: the two scales go into the query, the
rewritten rows are scored exactly beside the index (:attr:`AnnView.exact_rows`), and when they
exceed ``rebuild_share`` of the catalogue the caller builds a new index.

With a ``cache`` folder (one per server: its workers share it), :func:`build` builds a
version's index once per host: the first worker to ask builds it under a file lock and writes
it there, and every worker, the builder included, maps the file read-only (faiss
``IO_FLAG_MMAP``), the base's vectors beside it, so their pages are held once however many
workers serve.

faiss is imported on first use: a catalogue below ``serving.ann_min_items`` never loads it.
"""

from __future__ import annotations

import fcntl
import hashlib
import logging
import math
import os
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

log = logging.getLogger(__name__)

#: Rows of the prior's column (and of the cold-start ranking) always scored exactly: the
#: items popular enough to rank for any query by their prior alone.
PRIOR_TOP = 512
#: Training rows per list of the coarse quantiser (faiss asks for 39 at least; fewer train
#: faster and a sample of ``TRAIN_PER_LIST * nlist`` rows is the cost of a build).
TRAIN_PER_LIST = 40
#: k-means iterations of the coarse quantiser's training (faiss's default is 25; 10 trained
#: 100k rows in 0.9 s against 2.4 s).
TRAIN_ITERATIONS = 10
#: Relative change of a row (its scale or direction against the base) above which it is
#: scored exactly: float32 sums of a recomputed row differ by ~1e-7.
STALE_TOLERANCE = 1e-4


@dataclass(frozen=True, slots=True)
class AnnParams:
    """How the index is built and searched (``ServingSettings.ann_*``)."""

    #: Lists of the coarse quantiser; None: ``4 * sqrt(N)``.
    nlist: int | None = None
    #: Lists searched per query.
    nprobe: int = 16
    #: Rows the index proposes per query (at least ``k`` plus the history's length).
    candidates: int = 256
    #: Share of the catalogue changed since the base above which :func:`follow` gives up
    #: (the caller builds a new index).
    rebuild_share: float = 0.2
    seed: int = 0


def default_nlist(n: int) -> int:
    """``4 * sqrt(n)`` lists, at least 1 and at most ``n / TRAIN_PER_LIST``."""
    return max(1, min(int(round(4 * math.sqrt(n))), n // TRAIN_PER_LIST))


def _faiss() -> Any:
    import faiss

    # one thread per serving worker: batches of 16 queries on 2 OpenMP threads were slower
    # than on one (docs/decisions.md#ann-library), and the other worker holds the other core
    faiss.omp_set_num_threads(1)
    return faiss


def sphere_rows(vectors: np.ndarray) -> np.ndarray:
    """``[v, sqrt(M^2 - |v|^2)] / M`` per row (float32): unit rows whose angles to a query
    ``[q, 0]`` order them as ``q . v`` does."""
    v = np.asarray(vectors, np.float32)
    sq = np.einsum("ij,ij->i", v, v, dtype=np.float64)
    big = float(sq.max()) if sq.size else 0.0
    scale = math.sqrt(big) if big > 0 else 1.0
    extra = np.sqrt(np.maximum(big - sq, 0.0))
    out = np.empty((v.shape[0], v.shape[1] + 1), np.float32)
    np.multiply(v, np.float32(1.0 / scale), out=out[:, :-1])
    out[:, -1] = extra / scale
    return out


def sphere_queries(queries: np.ndarray) -> np.ndarray:
    """``[q, 0] / |q|`` per query (float32; a zero query stays zero)."""
    q = np.asarray(queries, np.float32)
    out = np.zeros((q.shape[0], q.shape[1] + 1), np.float32)
    norms = np.linalg.norm(q, axis=1, keepdims=True)
    np.divide(q, norms, out=out[:, :-1], where=norms > 0)
    return out


class AnnIndex:
    """One base's index: built once, then only searched (concurrent searches are safe)."""

    faiss_index: Any
    base: np.ndarray
    nlist: int
    build_s: float
    #: The file the index is mapped from (None: built in this process's memory).
    path: Path | None = None

    def __init__(self, vectors: np.ndarray, params: AnnParams) -> None:
        faiss = _faiss()
        started = time.perf_counter()
        n, d = vectors.shape
        if n == 0:
            raise ValueError("no item vectors to index")
        self.params = params
        #: The base's served vectors (read-only, not copied): rows changed since are measured
        #: against them.
        self.base = vectors
        self.nlist = min(params.nlist or default_nlist(n), n)
        rows = sphere_rows(vectors)
        quantizer = faiss.IndexFlatIP(d + 1)
        index = faiss.IndexIVFFlat(quantizer, d + 1, self.nlist, faiss.METRIC_INNER_PRODUCT)
        index.cp.spherical = True
        index.cp.seed = params.seed
        index.cp.niter = TRAIN_ITERATIONS
        rng = np.random.default_rng(params.seed)
        train = TRAIN_PER_LIST * self.nlist
        index.train(rows if train >= n else rows[np.sort(rng.choice(n, train, replace=False))])
        index.add(rows)
        index.nprobe = min(params.nprobe, self.nlist)
        self.faiss_index = index
        self.build_s = time.perf_counter() - started
        log.log(logging.INFO if self.build_s >= 1.0 else logging.DEBUG,
                "built an ANN index over %d items (%d lists, %d probed) in %.1f s",
                n, self.nlist, index.nprobe, self.build_s)

    @classmethod
    def shared(cls, vectors: np.ndarray, params: AnnParams, cache: Path, name: str
               ) -> AnnIndex:
        """The index of ``vectors`` mapped from ``cache``: built and written there first by
        whichever process asks first (the others wait on its lock), then mapped by all."""
        faiss = _faiss()
        n = int(vectors.shape[0])
        nlist = min(params.nlist or default_nlist(n), n)
        key = f"{re.sub(r'[^A-Za-z0-9._-]', '_', name)[:64]}-{fingerprint(vectors)}-{nlist}"
        index_path, base_path = cache / f"{key}.faiss", cache / f"{key}.npy"
        cache.mkdir(parents=True, exist_ok=True)
        started = time.perf_counter()
        with open(cache / f"{key}.lock", "a+b") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            built_s = 0.0
            if not index_path.exists():
                built = cls(vectors, params)
                built_s = built.build_s
                # the base first: an index file always has its base beside it
                tmp = base_path.with_name(f".{base_path.name}.{os.getpid()}.tmp")
                with open(tmp, "wb") as f:
                    np.save(f, np.asarray(vectors, np.float32))
                os.replace(tmp, base_path)
                tmp = index_path.with_name(f".{index_path.name}.{os.getpid()}.tmp")
                faiss.write_index(built.faiss_index, str(tmp))
                os.replace(tmp, index_path)
                del built
                _prune(cache, keep=key)
        out = cls.__new__(cls)
        out.params, out.nlist, out.path = params, nlist, index_path
        out.base = np.load(base_path, mmap_mode="r")
        index = faiss.read_index(str(index_path), faiss.IO_FLAG_MMAP | faiss.IO_FLAG_READ_ONLY)
        lists = faiss.downcast_InvertedLists(faiss.extract_index_ivf(index).invlists)
        if hasattr(lists, "prefetch_nthread"):
            # else every search starts 32 prefetch threads (docs/decisions.md#ann-library)
            lists.prefetch_nthread = 0
        index.nprobe = min(params.nprobe, nlist)
        out.faiss_index = index
        out.build_s = built_s or time.perf_counter() - started
        if not built_s:
            log.info("mapped the ANN index %s (%d items) in %.2f s", index_path.name, n,
                     out.build_s)
        return out

    @property
    def size(self) -> int:
        return int(self.base.shape[0])

    def search(self, queries: np.ndarray, k: int) -> np.ndarray:
        """Rows of the ``k`` largest ``q . v`` by the index, per query ``[B, k]`` (-1 where
        the probed lists hold fewer)."""
        _, rows = self.faiss_index.search(sphere_queries(queries), k)
        return np.asarray(rows, np.int64)


@dataclass(frozen=True, slots=True)
class AnnView:
    """The index as it stands for one served artifact: the scales a query takes for the
    artifact's columns and the rows scored exactly beside what the index proposes."""

    index: AnnIndex
    #: Multiplier of the towers' columns of a query (the artifact's over the base's).
    tower_scale: float
    #: Multiplier of the prior's column of a query (1 without a prior column).
    prior_scale: float
    #: Whether the last column is the prior's (``score_bias``).
    has_prior: bool
    #: Rows changed since the base, added since, and the top of the prior's column and of
    #: the cold-start ranking: always scored exactly (sorted, distinct).
    exact_rows: np.ndarray = field(repr=False)
    #: Of them, the rows changed or added since the base.
    stale: int = 0

    def candidates(self, queries: np.ndarray, k: int) -> np.ndarray:
        """The index's ``k`` rows per query ``[B, k]`` (-1 padded), the queries scaled to
        the base's columns."""
        q = np.array(queries, np.float32)
        if self.has_prior:
            q[:, :-1] *= self.tower_scale
            q[:, -1] *= self.prior_scale
        else:
            q *= self.tower_scale
        return self.index.search(q, k)


#: Rows of the sample the scales are measured on.
SAMPLE_ROWS = 4096
#: Random directions a row's change is measured along (:func:`_changed`).
PROBES = 2


def _changed(base: np.ndarray, vectors: np.ndarray, cols: slice, scale: np.float32
             ) -> np.ndarray:
    """Per row of ``base``: whether ``vectors``' row differs from ``scale`` times it, along
    :data:`PROBES` fixed random directions of ``cols`` (two matrix products, not a pass per
    component: a rewritten row keeps its projections on both only by chance), by more than
    :data:`STALE_TOLERANCE` of the projections' size (plus their mean size)."""
    n0, d = base.shape
    probes = np.zeros((d, PROBES), np.float32)
    probes[cols] = np.random.default_rng(0).normal(size=(len(range(d)[cols]), PROBES))
    now = vectors[:n0] @ probes
    then = base @ probes
    then *= scale
    size = np.abs(now) + np.abs(then)
    # a projection near 0 is the difference of large terms: its rounding is relative to the
    # rows' typical projection, not to itself
    size += size.mean(axis=0)
    now -= then
    np.abs(now, out=now)
    return (now > STALE_TOLERANCE * size).any(axis=1)


def _top_rows(column: np.ndarray, k: int) -> np.ndarray:
    if column.size <= k:
        return np.arange(column.size, dtype=np.int64)
    return np.argpartition(column, column.size - k)[column.size - k:].astype(np.int64)


def follow(index: AnnIndex, vectors: np.ndarray, has_prior: bool,
           cold_column: np.ndarray | None = None) -> AnnView | None:
    """The view of ``index`` for an artifact whose item ``vectors`` are the base's rows
    rescaled (any positive scale of the towers' columns, any affine change of the prior's),
    some rows rewritten and rows appended; None when the rewritten and appended rows exceed
    ``rebuild_share`` of the catalogue or the catalogue shrank (build a new index).
    ``cold_column``: the artifact's cold-start ranking when it is not the mix."""
    base = index.base
    n0, n = base.shape[0], vectors.shape[0]
    if n < n0 or vectors.shape[1] != base.shape[1]:
        return None
    t = slice(0, base.shape[1] - 1) if has_prior else slice(None)
    # a row the deltas did not rewrite is the base's row times the one scale: the median
    # ratio over a sample of the rows, then every row against the base's times it (zero
    # rows, items without a vector, are zero both times)
    sample = np.arange(0, n0, max(1, n0 // SAMPLE_ROWS))
    b = np.asarray(base[sample, t], np.float64)
    v = np.asarray(vectors[sample, t], np.float64)
    bb = np.einsum("ij,ij->i", b, b)
    some = bb > 0
    scale = float(np.median(np.einsum("ij,ij->i", b, v)[some] / bb[some])) if some.any() else 1.0
    if not scale > 0:
        return None
    stale = _changed(base, vectors, t, np.float32(scale))
    changed = int(stale.sum()) + (n - n0)
    if changed > index.params.rebuild_share * n:
        return None
    prior_scale = 1.0
    if has_prior:
        keep = ~stale[sample]
        x = np.asarray(base[sample[keep], -1], np.float64)
        y = np.asarray(vectors[sample[keep], -1], np.float64)
        var = float(x.var()) if x.size else 0.0
        if var > 0:
            prior_scale = float(((x - x.mean()) * (y - y.mean())).mean() / var)
        if not prior_scale > 0:  # the prior's weight went to 0 or the fit failed: score it
            prior_scale = 0.0     # exactly from the top of its column only
    return AnnView(index, scale, prior_scale, has_prior,
                   _always(vectors, has_prior, cold_column, np.flatnonzero(stale),
                           np.arange(n0, n, dtype=np.int64)), changed)


def _always(vectors: np.ndarray, has_prior: bool, cold_column: np.ndarray | None,
            *changed: np.ndarray) -> np.ndarray:
    """The rows scored exactly beside the index's candidates: ``changed`` ones, the top of
    the prior's column and of the cold-start ranking (sorted, distinct)."""
    parts = [*changed, np.zeros(0, np.int64)]
    if has_prior:
        parts.append(_top_rows(vectors[:, -1], PRIOR_TOP))
    if cold_column is not None:
        parts.append(_top_rows(np.asarray(cold_column), PRIOR_TOP))
    return np.unique(np.concatenate(parts).astype(np.int64))


def fingerprint(vectors: np.ndarray) -> str:
    """A short hash of ``vectors``' shape and of up to 4,096 of its rows (evenly spaced):
    which cached index belongs to them."""
    n = int(vectors.shape[0])
    digest = hashlib.sha256(repr(vectors.shape).encode())
    digest.update(np.ascontiguousarray(vectors[:: max(1, n // 4096)], np.float32).tobytes())
    return digest.hexdigest()[:16]


#: Indexes a cache folder keeps (the newest by time written): the versions workers may still
#: be moving from. A file removed while mapped stays readable to whoever mapped it.
CACHE_KEEP = 3


def _prune(cache: Path, keep: str) -> None:
    keys = {p.name[: -len(".faiss")]: p.stat().st_mtime for p in cache.glob("*.faiss")}
    old = sorted((k for k in keys if k != keep), key=keys.__getitem__)[: max(0, len(keys) - CACHE_KEEP)]
    for key in old:
        for suffix in (".faiss", ".npy", ".lock"):
            (cache / f"{key}{suffix}").unlink(missing_ok=True)


def build(vectors: np.ndarray, has_prior: bool, params: AnnParams,
          cold_column: np.ndarray | None = None, cache: Path | None = None,
          name: str = "") -> AnnView:
    """A new index over ``vectors`` and its view (nothing stale); with ``cache``, the
    index of the host's workers (:meth:`AnnIndex.shared`, ``name``: the version)."""
    index = AnnIndex(vectors, params) if cache is None else AnnIndex.shared(
        vectors, params, cache, name)
    return AnnView(index, 1.0, 1.0, has_prior, _always(vectors, has_prior, cold_column))


def allowed(view: AnnView, queries: np.ndarray, k: int, n: int) -> np.ndarray:
    """``[B, n]`` bool: per query, the rows the index proposes (``k``) and the view's exact
    rows, over a catalogue of ``n`` rows: what the two stages let one request rank (without
    its history's co-visitation rows, which the caller adds)."""
    proposed = view.candidates(queries, k)
    out = np.zeros((len(queries), n), bool)
    row, col = np.nonzero((proposed >= 0) & (proposed < n))
    out[row, proposed[row, col]] = True
    out[:, view.exact_rows[view.exact_rows < n]] = True
    return out


def candidate_rows(view: AnnView, queries: np.ndarray, k: int,
                   extra: list[np.ndarray]) -> np.ndarray:
    """The rows a batch of ``queries`` is scored on: the index's ``k`` per query, the view's
    exact rows and ``extra`` (e.g. the co-visitation rows of the histories), sorted and
    distinct."""
    proposed = view.candidates(queries, k).ravel()
    parts = [proposed[proposed >= 0], view.exact_rows, *extra]
    return np.unique(np.concatenate(parts).astype(np.int64))
