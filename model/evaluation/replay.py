"""Test-then-train replay evaluation of a historical log (``streamrec evaluate``).

The log is ordered as ``streamrec replay`` sends it and run through the feature definitions
the Flink job runs, so each positive event yields the point-in-time sample the live trainer
would see. After a warm-up, each positive event is scored before anything learns from it:
every method ranks the candidates for its user, the event counts a hit at K if its item is
among the first K; then every method learns from it, in micro-batches (:class:`EvalOptions`).
Methods: the two-tower model (the live ``Trainer``) and the baselines of
``model.evaluation.baselines``, on the same stream, batches and candidates. Figures: overall,
per chunk in time order, per history size (0, 1-4, 5+ earlier items) and by the target
item's earlier positives (the same groups). The protocol step by
step: docs/internals.md; why B = 128: ``docs/decisions.md#evaluation-batch``.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
import orjson

from feature_store.features import Event, FeatureParams, Sample, UserState, update_user
from model.scoring.topk import top_k_rows
from model.trainer.rolling import recall_ndcg

log = logging.getLogger(__name__)

MOVIELENS_FORMATS = ("movielens", "ml-1m", "ml-100k")
#: ``EvalOptions.exclude``: which earlier items of the user leave the candidates.
EXCLUDE = ("rated", "positives")
#: History-size groups of the report: (name, fewest, most) distinct earlier items of the user.
HISTORY_GROUPS = (("0", 0, 0), ("1-4", 1, 4), ("5+", 5, None))


@dataclass(frozen=True)
class EvalOptions:
    batch_size: int = 128
    warmup_fraction: float = 0.1
    ks: tuple[int, ...] = (10, 20)
    chunks: int = 10
    exclude: str = "rated"

    def __post_init__(self) -> None:
        if self.batch_size < 1 or self.chunks < 1 or not self.ks:
            raise ValueError("batch_size and chunks must be >= 1, ks non-empty")
        if self.exclude not in EXCLUDE:
            raise ValueError(f"exclude must be one of {', '.join(EXCLUDE)}")
        if not 0.0 <= self.warmup_fraction < 1.0:
            raise ValueError("warmup_fraction must be in [0, 1)")


@dataclass(frozen=True, slots=True)
class Positive:
    """One positive event of the stream with what scoring it needs."""

    sample: Sample
    user: int  # user index (first appearance order)
    item: int  # candidate index of the target item
    #: Items the user interacted with before this event: ``user_items[user][:seen]``.
    seen: int
    #: Items that appeared in any event before this one (candidate indices ``< n_items``).
    n_items: int
    #: Items of the user's positive events before this one: ``user_positives[user][:n]``.
    seen_positives: int = 0
    #: Positive events of the target item before this one (its history as a target).
    item_positives: int = 0


@dataclass
class EvalStream:
    """The ordered log, reduced to what the evaluation needs."""

    positives: list[Positive] = field(default_factory=list)
    item_ids: list[str] = field(default_factory=list)
    #: Per user: candidate indices of the items they interacted with, first time first.
    user_items: list[np.ndarray] = field(default_factory=list)
    #: Per user: candidate indices of the items of their positive events, first time first.
    user_positives: list[np.ndarray] = field(default_factory=list)
    #: Item id -> candidate index (the inverse of ``item_ids``).
    item_index: dict[str, int] = field(default_factory=dict)
    events: int = 0
    duplicates: int = 0

    def excluded(self, pos: Positive, exclude: str = "rated") -> np.ndarray:
        """The user's earlier items that leave the candidates of ``pos`` (module doc, 3.)."""
        if exclude == "rated":
            return self.user_items[pos.user][: pos.seen]
        return self.user_positives[pos.user][: pos.seen_positives]


def evaluation_weights(weights: Mapping[str, float], fmt: str) -> dict[str, float]:
    """Event weights of the evaluation: MovieLens ``rating`` events (< threshold) are not positive."""
    out = dict(weights)
    if fmt in MOVIELENS_FORMATS:
        out["rating"] = 0.0
    return out


def build_stream(
    wire_events: Iterable[Mapping[str, Any]],
    params: FeatureParams,
    catalogue: Sequence[tuple[str, int]] = (),
) -> EvalStream:
    """Run ordered wire-format events through the feature definitions (see the module doc).

    ``catalogue``: ``(item id, ts ms)`` of a catalogue's items; each is a candidate from its
    ``ts`` on (0: from the start), whether or not an event has named it yet."""
    stream = EvalStream()
    item_index = stream.item_index
    listed = sorted(catalogue, key=lambda entry: entry[1])  # stable: file order within a ts
    at = 0
    item_positives: list[int] = []

    def list_until(ts_ms: int) -> None:
        nonlocal at
        while at < len(listed) and listed[at][1] <= ts_ms:
            item_id = listed[at][0]
            at += 1
            if item_id not in item_index:
                item_index[item_id] = len(stream.item_ids)
                stream.item_ids.append(item_id)
                item_positives.append(0)

    list_until(0)
    user_index: dict[str, int] = {}
    states: list[UserState] = []
    user_lists: list[list[int]] = []
    user_sets: list[set[int]] = []
    pos_lists: list[list[int]] = []
    pos_sets: list[set[int]] = []
    for wire in wire_events:
        stream.events += 1
        event = Event(
            event_id=wire["event_id"],
            user_id=wire["user_id"],
            item_id=wire["item_id"],
            event_type=wire["event_type"],
            ts_ms=int(wire["ts"]),
            value=wire.get("value"),
            context=wire.get("context"),
        )
        list_until(event.ts_ms)
        u = user_index.get(event.user_id)
        if u is None:
            u = user_index[event.user_id] = len(states)
            states.append(UserState())
            user_lists.append([])
            user_sets.append(set())
            pos_lists.append([])
            pos_sets.append(set())
        outcome = update_user(states[u], event, params)
        if outcome.duplicate:
            stream.duplicates += 1
            continue
        n_items = len(item_index)
        i = item_index.get(event.item_id)
        if i is None:
            i = item_index[event.item_id] = n_items
            stream.item_ids.append(event.item_id)
            item_positives.append(0)
        if outcome.sample is not None:
            stream.positives.append(
                Positive(outcome.sample, u, i, len(user_lists[u]), n_items, len(pos_lists[u]),
                         item_positives[i])
            )
            item_positives[i] += 1
            if i not in pos_sets[u]:
                pos_sets[u].add(i)
                pos_lists[u].append(i)
        if i not in user_sets[u]:
            user_sets[u].add(i)
            user_lists[u].append(i)
    stream.user_items = [np.asarray(items, np.int64) for items in user_lists]
    stream.user_positives = [np.asarray(items, np.int64) for items in pos_lists]
    return stream


def stream_from_plan(
    rows: Sequence[tuple[Any, ...]], params: FeatureParams,
    catalogue: Sequence[tuple[str, int]] = (),
) -> EvalStream:
    """:func:`build_stream` over the rows of ``stream.replay.runner.build_plan`` (value = wire JSON)."""
    return build_stream((orjson.loads(row[4]) for row in rows), params, catalogue)


class Learner(Protocol):
    """A method under evaluation.

    ``scores`` returns ``[n_candidates]`` (one score list shared by the batch's users) or
    ``[len(batch), n_candidates]``; higher is better; ``-inf`` means "cannot recommend".
    ``tiebreak`` is ``None`` or integer keys ``[n_candidates]``: ties in per-row scores go to
    the larger key, then to the lower index (see :func:`recommend`).
    """

    name: str

    def scores(self, batch: Sequence[Positive], n_candidates: int) -> np.ndarray: ...

    def tiebreak(self, n_candidates: int) -> np.ndarray | None: ...

    def learn(self, batch: Sequence[Positive]) -> None: ...


def recommend(
    scores: np.ndarray,
    excluded: Sequence[np.ndarray],
    k: int,
    tiebreak: np.ndarray | None = None,
) -> np.ndarray:
    """Top ``k`` candidate indices per row, best first, ``-1``-padded: ``[len(excluded), k]``.

    ``excluded[row]`` (the user's earlier items, :meth:`EvalStream.excluded`) is removed and
    ``-inf`` scores are never recommended. Shared scores (``[N]``): ties go to the lower
    candidate index (the item seen first). Per-row scores with ``tiebreak`` (integer keys
    ``[N]``, the per-user baselines): ties go to the larger key, then to the lower index.
    Per-row scores without it (the model): ``model.scoring.topk.top_k_rows`` on the masked
    scores.
    """
    n = scores.shape[-1]
    out = np.full((len(excluded), k), -1, np.int64)
    if n == 0 or k == 0:
        return out
    if scores.ndim == 1:
        order = np.lexsort((np.arange(n), -scores))
        order = order[np.isfinite(scores[order])]
        mark = np.zeros(n + 1, bool)  # mark[gone]: excluded (gone may hold indices >= n)
        for row, gone in enumerate(excluded):
            head = order[: k + gone.size]
            if gone.size:
                gone = gone[gone < n]
                mark[gone] = True
                head = head[~mark[head]]
                mark[gone] = False
            head = head[:k]
            out[row, : head.size] = head
        return out
    masked = np.array(scores, np.float64)
    for row, gone in enumerate(excluded):
        masked[row, gone[gone < n]] = -np.inf
    if tiebreak is not None:
        return _top_k_ties(masked, np.asarray(tiebreak, np.int64), k, out)
    best = top_k_rows(masked, k)
    best = np.where(np.isfinite(np.take_along_axis(masked, best, axis=1)), best, -1)
    out[:, : best.shape[1]] = best
    return out


def _top_k_ties(masked: np.ndarray, tiebreak: np.ndarray, k: int, out: np.ndarray) -> np.ndarray:
    """Exact top ``k`` by (score desc, ``tiebreak`` desc, index asc), finite scores only."""
    b, n = masked.shape
    kk = min(k, n)
    # Secondary key, unique per column: larger tiebreak first, then lower index.
    second = tiebreak[:n] * n + (n - 1 - np.arange(n))
    top = np.argpartition(-masked, kk - 1, axis=1)[:, :kk]
    threshold = np.take_along_axis(masked, top, axis=1).min(axis=1, keepdims=True)
    # Rows whose k-th score is shared with columns left out: pick those ties by the key.
    inside = (np.take_along_axis(masked, top, axis=1) == threshold).sum(axis=1)
    total = (masked == threshold).sum(axis=1)
    for row in np.flatnonzero((total > inside) & np.isfinite(threshold[:, 0])):
        scores, t = masked[row], threshold[row, 0]
        above, ties = np.flatnonzero(scores > t), np.flatnonzero(scores == t)
        best = ties[np.argsort(-second[ties], kind="stable")[: kk - above.size]]
        top[row] = np.concatenate([above, best])
    values = np.take_along_axis(masked, top, axis=1)
    order = np.lexsort((-second[top], -values), axis=1)
    ranked = np.take_along_axis(top, order, axis=1)
    finite = np.isfinite(np.take_along_axis(values, order, axis=1))
    out[:, :kk] = np.where(finite, ranked, -1)
    return out


@dataclass
class EvalResult:
    """Per-method, per-figure values of every scored event (in order) and their event times."""

    ks: tuple[int, ...]
    events: int
    warmup: int
    ts_ms: np.ndarray
    #: method -> figure name (``recall@K``, ``ndcg@K``) -> value per scored event.
    values: dict[str, dict[str, np.ndarray]]
    #: Distinct items the user had before each scored event (``Positive.seen``).
    seen: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    #: Earlier positives of each scored event's item (``Positive.item_positives``).
    item_seen: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))

    @property
    def scored(self) -> int:
        return int(self.ts_ms.size)

    def overall(self, method: str) -> dict[str, float]:
        return _means(self.values[method], slice(None))

    def chunks(self, method: str, n: int) -> list[dict[str, float]]:
        """Figures of ``n`` consecutive near-equal parts of the scored events, in time order."""
        out = []
        for part in np.array_split(np.arange(self.scored), min(n, max(self.scored, 1))):
            if part.size == 0:
                continue
            row: dict[str, float] = {
                "first_ts": int(self.ts_ms[part[0]]),
                "last_ts": int(self.ts_ms[part[-1]]),
                "scored": int(part.size),
            }
            row.update(_means(self.values[method], slice(int(part[0]), int(part[-1]) + 1)))
            out.append(row)
        return out

    def by_history(self) -> dict[str, dict[str, Any]]:
        """Per history-size group (``HISTORY_GROUPS``): its scored events and every method's
        figures on them."""
        return self._groups(self.seen)

    def by_item(self) -> dict[str, dict[str, Any]]:
        """The same groups by the target item's earlier positives (0: an item nobody chose
        before, reachable only through what the catalogue says of it)."""
        return self._groups(self.item_seen)

    def _groups(self, sizes: np.ndarray) -> dict[str, dict[str, Any]]:
        out: dict[str, dict[str, Any]] = {}
        for name, lo, hi in HISTORY_GROUPS:
            pick = sizes >= lo
            if hi is not None:
                pick &= sizes <= hi
            row: dict[str, Any] = {"scored": int(pick.sum())}
            for method, values in self.values.items():
                row[method] = {k: float(v[pick].mean()) if pick.any() else 0.0
                               for k, v in values.items()}
            out[name] = row
        return out

    def report(self, model: str, chunks: int, side: Sequence[str] = ()) -> dict[str, Any]:
        """The ``--json`` document: model figures at the top, baselines under ``baselines``,
        the best baseline by Recall@``ks[0]`` and the model's ratios to it and to popularity
        (``None`` where the baseline scored 0); methods named in ``side`` (variants of the
        model, not baselines) under ``side``; every method's figures per history size under
        ``by_history``."""
        doc: dict[str, Any] = dict(self.overall(model))
        doc.update({"events": self.events, "scored": self.scored, "warmup": self.warmup})
        doc["baselines"] = {
            name: {**self.overall(name), "events": self.events, "scored": self.scored}
            for name in self.values
            if name != model and name not in side
        }
        if side:
            doc["side"] = {name: self.overall(name) for name in side}
        key = f"recall@{self.ks[0]}"
        if doc["baselines"]:
            best = max(doc["baselines"], key=lambda name: doc["baselines"][name][key])
            doc["best_baseline"] = best
            doc["ratio_to_best"] = _ratio(doc[key], doc["baselines"][best][key])
        if "popularity" in doc["baselines"]:
            doc["ratio_to_popularity"] = _ratio(doc[key], doc["baselines"]["popularity"][key])
        if self.seen.size == self.scored:
            doc["by_history"] = self.by_history()
        if self.item_seen.size == self.scored:
            doc["by_item"] = self.by_item()
        doc["over_time"] = {name: self.chunks(name, chunks) for name in self.values}
        return doc


def _ratio(value: float, base: float) -> float | None:
    return value / base if base > 0 else None


def _means(values: Mapping[str, np.ndarray], part: slice) -> dict[str, float]:
    return {name: float(v[part].mean()) if v[part].size else 0.0 for name, v in values.items()}


def evaluate(
    stream: EvalStream,
    learners: Sequence[Learner],
    options: EvalOptions,
    progress: Callable[[int, int], None] | None = None,
) -> EvalResult:
    """Run the protocol of the module doc over ``stream`` for every learner."""
    positives = stream.positives
    warmup = int(math.floor(options.warmup_fraction * len(positives)))
    max_k = max(options.ks)
    names = [f"{f}@{k}" for k in options.ks for f in ("recall", "ndcg")]
    parts: dict[str, dict[str, list[np.ndarray]]] = {
        m.name: {name: [] for name in names} for m in learners
    }
    ts: list[int] = []
    seen: list[int] = []
    item_seen: list[int] = []
    starts = list(range(0, warmup, options.batch_size)) + list(
        range(warmup, len(positives), options.batch_size)
    )
    for n, start in enumerate(starts):
        end = min(start + options.batch_size, warmup if start < warmup else len(positives))
        batch = positives[start:end]
        if start >= warmup:
            n_candidates = batch[0].n_items
            targets = np.fromiter((p.item for p in batch), np.int64, len(batch))
            excluded = [stream.excluded(p, options.exclude) for p in batch]
            for method in learners:
                scores = method.scores(batch, n_candidates)
                tiebreak = method.tiebreak(n_candidates) if scores.ndim == 2 else None
                ranked = recommend(scores, excluded, max_k, tiebreak)
                for k in options.ks:
                    recall, ndcg = recall_ndcg(ranked[:, :k], targets)
                    parts[method.name][f"recall@{k}"].append(recall)
                    parts[method.name][f"ndcg@{k}"].append(ndcg)
            ts.extend(p.sample.ts_ms for p in batch)
            seen.extend(p.seen for p in batch)
            item_seen.extend(p.item_positives for p in batch)
        for method in learners:
            method.learn(batch)
        if progress is not None:
            progress(n + 1, len(starts))
    return EvalResult(
        ks=tuple(options.ks),
        events=stream.events,
        warmup=warmup,
        ts_ms=np.asarray(ts, np.int64),
        values={
            method: {name: np.concatenate(v) if v else np.zeros(0) for name, v in figs.items()}
            for method, figs in parts.items()
        },
        seen=np.asarray(seen, np.int64),
        item_seen=np.asarray(item_seen, np.int64),
    )


def load_stream(
    paths: Sequence[Any],
    fmt: str | None,
    features: Any,
    now_ms: int,
    *,
    mapping: Mapping[str, str] | None = None,
    like_threshold: float = 4.0,
    event_type: str | None = None,
    limit: int | None = None,
    catalogue: Sequence[tuple[str, int]] = (),
) -> tuple[EvalStream, dict[str, Any]]:
    """Read and order ``paths`` like ``streamrec replay`` and build the :class:`EvalStream`.

    ``features`` is the ``settings.features`` section; ``now_ms`` bounds "future" event
    times (the schema rule); ``catalogue``: ``(item id, ts)`` of items that are candidates
    from their ``ts`` on.
    Returns the stream and the replay report (rejected rows).
    """
    from pathlib import Path

    from stream.replay.runner import ReplayOptions, ReplayReport, ReplaySource, build_plan

    sources = [ReplaySource.of(Path(p), fmt) for p in paths]
    options = ReplayOptions(
        limit=limit,
        like_threshold=like_threshold,
        mapping=dict(mapping or {}),
        event_type=event_type,
    )
    report = ReplayReport()
    rows = build_plan(sources, options, list(features.event_weights), now_ms, report)
    weights = features.event_weights
    for source in sources:
        weights = evaluation_weights(weights, source.fmt)
    params = FeatureParams.from_settings(features, event_weights=weights)
    stream = stream_from_plan(rows, params, catalogue)
    log.info(
        "%d events, %d positives, %d items, %d rejected rows",
        stream.events,
        len(stream.positives),
        len(stream.item_ids),
        report.rejected_total,
    )
    return stream, report.as_dict()
