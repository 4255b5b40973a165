"""Delta stream benchmark (in process, no services): size of the stream, build and apply
cost, and the checkpoint cost that decides how deltas stay exactly-once.

    python -m bench.deltas [--users 20000] [--items 20000] [--warm-samples 40000]
                           [--fill 100000] [--rate 2000] [--deltas 20] [--json FILE]

A warmed trainer with filled tables trains one second of the synthetic stream per delta and
builds its delta; reported are rows and pairs per delta, bytes/s per row codec, the build,
apply and checkpoint costs and, with ``--quality-samples``, Recall@10 per codec. Details:
docs/internals.md; today's figure: docs/benchmarks.md#delta-stream.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np


def _pct(values: list[float]) -> dict[str, float]:
    arr = np.asarray(values, np.float64)
    return {"p50": float(np.percentile(arr, 50)), "p95": float(np.percentile(arr, 95)),
            "mean": float(arr.mean())}


def synthetic_trainer(users: int, items: int, batch_size: int, attr_tokens: int = 0
                      ) -> tuple[Any, dict[int, str], Callable[[int], None], Any]:
    """A live-model Trainer on a synthetic stream: (trainer, key -> item id, ``train(n)``
    training the next ``n`` samples test-then-train, the stream). ``attr_tokens`` > 0:
    attribute slots, every item of the stream catalogued (``bench.catalogue``)."""
    from model.evaluation.synthetic import SyntheticConfig, SyntheticStream
    from model.towers.two_tower import ModelConfig
    from model.trainer.samples import KeyCache, to_batch
    from model.trainer.trainer import Trainer, TrainOptions

    hist = ModelConfig().history_len
    stream = SyntheticStream(SyntheticConfig(users=users, items=items, clusters=50,
                                             history_len=hist, seed=4))
    trainer = Trainer(ModelConfig(attr_tokens=attr_tokens),
                      TrainOptions(batch_size=batch_size, evict_every_steps=0, spare_epochs=1))
    keys = KeyCache()
    item_ids: dict[int, str] = {}
    if attr_tokens:
        catalogue(trainer, item_ids, [stream.item_id(j) for j in range(items)])

    def train(n: int) -> None:
        for start in range(0, n, batch_size):
            samples = stream.take(min(batch_size, n - start))
            batch = to_batch(samples, hist, keys)
            trainer.fit_batch(batch)
            item_ids.update(zip(batch.item_keys.tolist(), [s.item_id for s in samples],
                                strict=True))

    return trainer, item_ids, train, stream


def catalogue(trainer: Any, item_ids: dict[int, str], items: list[str]) -> None:
    """Give ``items`` the attributes of ``bench.catalogue`` (and their names)."""
    from bench.catalogue import catalogue_of
    from feature_store.catalogue import FeatureSpec
    from streamrec.ids import item_key

    trainer.set_catalogue(FeatureSpec(), ((it["item_id"], it["attributes"])
                                          for it in catalogue_of(items)))
    item_ids.update({item_key(i): i for i in items})


def _random_rows(trainer: Any, table: Any, keys: np.ndarray, rng: np.random.Generator) -> None:
    """Upsert a row drawn from ``rng`` (normal, scale 0.1) for each of ``keys`` into ``table``."""
    from model.towers.tf_env import tf

    if keys.size:
        rows = rng.normal(scale=0.1, size=(keys.size, trainer.config.embedding_dim))
        table.params.upsert(tf.constant(keys), tf.constant(rows, tf.float32))


def hold_items(trainer: Any, item_ids: dict[int, str], names: list[str]) -> int:
    """Give each of ``names`` that the item table holds no row for a random row (ids only:
    the catalog a catalogued run serves, every item of the stream); returns how many."""
    from streamrec.ids import item_key

    keys = np.fromiter((item_key(n) for n in names), np.int64, len(names))
    held = set(trainer.known_keys(trainer.model.items).tolist())
    new = np.asarray([k not in held for k in keys.tolist()], bool)
    _random_rows(trainer, trainer.model.items, keys[new], np.random.default_rng(2))
    item_ids.update({int(k): n for k, n, add in zip(keys.tolist(), names, new.tolist(),
                                                    strict=True) if add})
    return int(new.sum())


def fill_tables(trainer: Any, item_ids: dict[int, str], n: int) -> None:
    """Add ``n`` random rows to each table (a large model's catalog; items named fill-j;
    catalogued too with attribute slots)."""
    from streamrec.ids import item_key

    rng = np.random.default_rng(1)
    for table, kind in ((trainer.model.users, "u"), (trainer.model.items, "i")):
        fill_keys = rng.integers(1 << 40, 1 << 62, n, dtype=np.int64)
        if kind == "i":  # the keys of their names (the catalogue finds them by name)
            fill_keys = np.fromiter((item_key(f"fill-{j}") for j in range(n)), np.int64, n)
        _random_rows(trainer, table, fill_keys, rng)
        if kind == "i":
            item_ids.update({int(k): f"fill-{j}" for j, k in enumerate(fill_keys.tolist())})
            if trainer.model.attrs is not None:
                catalogue(trainer, item_ids, [f"fill-{j}" for j in range(n)])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="bench.deltas", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--users", type=int, default=20_000)
    p.add_argument("--items", type=int, default=20_000)
    p.add_argument("--warm-samples", type=int, default=40_000)
    p.add_argument("--fill", type=int, default=100_000, help="random rows added to each table")
    p.add_argument("--rate", type=int, default=2000, help="samples per delta (per second)")
    p.add_argument("--deltas", type=int, default=20)
    p.add_argument("--batch", type=int, default=512)
    p.add_argument("--quality-samples", type=int, default=0)
    p.add_argument("--json", type=Path)
    args = p.parse_args(argv)

    from model.delta import CODECS, Composer, apply, decode, encode, from_snapshot
    from model.trainer.checkpoint import CheckpointStore
    from model.trainer.deltas import DeltaBuilder

    trainer, item_ids, train, stream = synthetic_trainer(args.users, args.items, args.batch)

    builder = DeltaBuilder(trainer, lambda: item_ids)
    t0 = time.perf_counter()
    train(args.warm_samples)
    warm_s = time.perf_counter() - t0
    if args.fill:
        fill_tables(trainer, item_ids, args.fill)
    sizes = trainer.table_sizes()
    print(f"warmed on {args.warm_samples} samples in {warm_s:.0f}s: {sizes}")

    snap = builder.snapshot("bench", {})
    snapshot_record = encode(snap, compress=True)
    state = from_snapshot(decode(snapshot_record))
    composer = Composer()
    served = composer.compose(state)

    with tempfile.TemporaryDirectory() as tmp:
        store = CheckpointStore(Path(tmp), trainer.trackables())
        ckpt_ms = []
        for _ in range(3):
            c0 = time.perf_counter()
            trainer.wait_evaluation()
            arrays = trainer.covisit.to_arrays() if trainer.covisit is not None else {}
            store.save({"bench": True}, {**arrays, **{f"mixer_{k}": v for k, v in
                                                      trainer.mixer.state().items()}})
            ckpt_ms.append((time.perf_counter() - c0) * 1000.0)

    rows, pairs, build_ms, apply_ms = [], [], [], []
    sent: list[Any] = []
    sizes_by: dict[str, list[int]] = {f"{c}{z}": [] for c in CODECS for z in ("", "+zlib")}
    for _ in range(args.deltas):
        train(args.rate)
        b0 = time.perf_counter()
        delta = builder.delta({})
        record = encode(delta)
        sent.append(delta)
        build_ms.append((time.perf_counter() - b0) * 1000.0)
        rows.append(delta.rows_changed)
        pairs.append(int(delta.covisit_codes.size))
        for codec in CODECS:
            sizes_by[codec].append(len(record) if codec == "float32" else len(encode(delta, codec)))
            sizes_by[f"{codec}+zlib"].append(len(encode(delta, codec, compress=True)))
        a0 = time.perf_counter()
        received = decode(record)
        state = apply(state, received)
        served = composer.compose(state, received)
        apply_ms.append((time.perf_counter() - a0) * 1000.0)

    result: dict[str, Any] = {
        "tables": sizes, "catalog_items": int(served.item_ids.shape[0]),
        "rate_samples_per_s": args.rate, "deltas": args.deltas,
        "rows_per_delta": _pct(rows), "pairs_per_delta": _pct(pairs),
        "bytes_per_s": {k: _pct([float(x) for x in v]) for k, v in sizes_by.items()},
        "build_ms": _pct(build_ms), "apply_ms": _pct(apply_ms),
        "snapshot_bytes": len(snapshot_record), "checkpoint_ms": _pct(ckpt_ms),
        "load_avg": list(os.getloadavg()),
    }
    if args.quality_samples:
        quality = _quality(snap, sent, stream.take(args.quality_samples))
        result["top10_differs_from_float32"] = quality.pop("top10_differs")
        result["recall_at_10"] = quality
        base = quality["float32"]
        result["recall_change_vs_float32"] = {
            c: (r - base) / base if base else None for c, r in quality.items()}
        print("recall@10 by codec:", {c: round(r, 4) for c, r in quality.items()})
        print("top 10 differs from float32's:", result["top10_differs_from_float32"])
    print(f"catalog {result['catalog_items']} items; per delta ({args.rate} samples): rows p50 "
          f"{result['rows_per_delta']['p50']:.0f}, pairs p50 {result['pairs_per_delta']['p50']:.0f}")
    for name, r in result["bytes_per_s"].items():
        print(f"  {name:<14} {r['p50'] / 1e3:9.1f} kB/s p50  {r['p95'] / 1e3:9.1f} kB/s p95")
    for name in ("build_ms", "apply_ms", "checkpoint_ms"):
        r = result[name]
        print(f"{name:<14} p50 {r['p50']:8.1f}  p95 {r['p95']:8.1f}")
    print(f"snapshot {len(snapshot_record) / 1e6:.1f} MB; load avg {result['load_avg']}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2))
    return 0


def _quality(snapshot: Any, deltas: list[Any], held_out: list[Any]) -> dict[str, Any]:
    """Recall@10 of the served artifact on ``held_out`` samples, per row codec of the deltas,
    and the share of samples whose top 10 differs from float32's (a finer signal)."""
    from model.delta import CODECS, apply, compose, decode, encode, from_snapshot
    from serving.retrieval import rank_with_model

    out: dict[str, Any] = {}
    tops: dict[str, list[list[str]]] = {}
    for codec in CODECS:
        state = from_snapshot(snapshot)
        for delta in deltas:
            state = apply(state, decode(encode(delta, codec)))
        art = compose(state)
        hits = 0
        for start in range(0, len(held_out), 256):
            part = held_out[start:start + 256]
            ranked = rank_with_model(art, [s.user_id for s in part],
                                     [list(s.history) for s in part], [10] * len(part),
                                     [True] * len(part))
            hits += sum(s.item_id in {x.item_id for x in r} for s, r in zip(part, ranked, strict=True))
            tops.setdefault(codec, []).extend([x.item_id for x in r] for r in ranked)
        out[codec] = hits / max(len(held_out), 1)
    out["top10_differs"] = {c: float(np.mean([a != b for a, b in zip(tops[c], tops["float32"],
                                                                     strict=True)]))
                            for c in CODECS}
    return out


if __name__ == "__main__":
    raise SystemExit(main())
