"""Trainer benchmark: step examples/s, end-to-end examples/s from Kafka, export time and
size, and model freshness.

    streamrec bench train [--json FILE] [--batches 512,2048] [--e2e-samples 300000]
                          [--export-ids 100000,1000000] [--freshness-s 75] [--skip ...]

Samples come from the synthetic stream after a warm-up long enough for histories to be as
full as in a long-running stream. Parts (each skippable): ``step`` (the compiled train step on
pre-built batches), ``e2e`` (the trainer service draining a pre-produced topic),
``export`` (write and load an artifact of N ids), ``freshness`` (sample event time ->
published version). Each part and its JSON keys: docs/internals.md; today's figures:
docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
import threading
import time
import uuid
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

HIST = 50
#: Synthetic samples skipped before a benchmark's batches are taken: with 10k users every
#: user then has ~20 events before, so histories are as full as in a long-running stream
#: (a fresh stream's first 100k samples carry ~3 history entries on average).
WARM_SAMPLES = 200_000


def _batches(
    n_batches: int, batch: int, seed: int = 1, hist: int = HIST, warm: int = 0
) -> list[Any]:
    from model.evaluation.synthetic import SyntheticConfig, SyntheticStream
    from model.trainer.samples import KeyCache, to_batch

    stream = SyntheticStream(SyntheticConfig(users=10_000, items=20_000, clusters=50, seed=seed))
    for _ in range(warm):
        stream.next()
    keys = KeyCache()
    return [to_batch(stream.take(batch), hist, keys) for _ in range(n_batches)]


def _history_entries(batches: list[Any], hist: int) -> float:
    """Mean number of (non-padding) history entries per row in the model's window."""
    return round(float(np.mean([(b.history[:, :hist] != 0).sum(axis=1).mean() for b in batches])), 2)


def _step_trainer(
    batch: int, train_history: bool = True, dedup: bool = True, hist: int = HIST,
    tower: dict[str, Any] | None = None,
) -> Any:
    """``tower``: ``ModelConfig`` fields of the user tower (``--user-tower``, ``--attention-*``);
    ``hist`` is then the pool's window (the attention reads ``attention_len``)."""
    from model.towers.two_tower import ModelConfig
    from model.trainer.trainer import Trainer, TrainOptions

    return Trainer(
        ModelConfig(history_len=hist, train_history=train_history, **(tower or {})),
        TrainOptions(batch_size=batch, eval_rows=0, dedup_lookups=dedup, evict_every_steps=0,
                     spare_epochs=1),
        tag=f"b{batch}{int(train_history)}{int(dedup)}",
    )


def bench_step_compare(
    batch: int, rounds: int, seconds: float
) -> dict[str, dict[str, Any]]:
    """The deduplicated and the reference step (``TrainOptions.dedup_lookups``) side by side:
    ``rounds`` rounds, each timing every variant for ``seconds`` on the same batches, in
    alternating order; per variant the median and all rounds (examples per wall second)."""
    variants = {"dedup": True, "reference": False}
    trainers = {name: _step_trainer(batch, dedup=d) for name, d in variants.items()}
    per_round = max(4, int(seconds * 100_000 / batch))
    batches = _batches(5 + rounds * per_round, batch)
    for trainer in trainers.values():
        for b in batches[:5]:
            trainer.train_step(b, covisit=False)
    runs: dict[str, list[float]] = {name: [] for name in variants}
    for r in range(rounds):
        chunk = batches[5 + r * per_round: 5 + (r + 1) * per_round]
        order = list(variants) if r % 2 == 0 else list(reversed(variants))
        for name in order:
            started = time.perf_counter()
            for b in chunk:
                trainers[name].train_step(b, covisit=False)
            runs[name].append(len(chunk) * batch / (time.perf_counter() - started))
    return {name: {"median": round(float(np.median(v))), "runs": [round(x) for x in v]}
            for name, v in runs.items()}


def bench_step(
    batch: int, seconds: float, train_history: bool = True, dedup: bool = True,
    hist: int = HIST, warm: int = WARM_SAMPLES, tower: dict[str, Any] | None = None,
) -> tuple[float, float, float]:
    """(examples per wall second, per CPU second of this process, mean history entries per
    row) of the step with a ``hist``-item window on batches taken after ``warm`` samples."""
    trainer = _step_trainer(batch, train_history, dedup, hist, tower)
    window = trainer.config.window
    batches = _batches(max(8, int(seconds * 80_000 / batch) + 6), batch, hist=window, warm=warm)
    for b in batches[:5]:
        trainer.train_step(b, covisit=False)
    done, started, cpu = 0, time.perf_counter(), time.process_time()
    for b in batches[5:]:
        trainer.train_step(b, covisit=False)
        done += len(b)
        if time.perf_counter() - started > seconds:
            break
    wall, per_cpu = done / (time.perf_counter() - started), done / (time.process_time() - cpu)
    return wall, per_cpu, _history_entries(batches[5:], window)


def _settings(root: Path) -> Any:
    from stream.kafka_client import ensure_topics
    from streamrec.settings import load_settings

    base = load_settings()
    uid = f"bench{uuid.uuid4().hex[:8]}"
    s = base.model_copy(update={
        "kafka": base.kafka.model_copy(update={
            "samples_topic": f"{uid}.samples", "dlq_topic": f"{uid}.events.dlq",
            "items_topic": f"{uid}.items",
        }),
        "trainer": base.trainer.model_copy(update={
            "registry_dir": root / uid / "models", "checkpoint_dir": root / uid / "ckpt",
        }),
    })
    ensure_topics(s.kafka, [s.kafka.samples_topic, s.kafka.dlq_topic, s.kafka.items_topic])
    return s


def _service(settings: Any, consumer: str = "auto", fused_loss: bool = True,
             attr_tokens: int = 0, **loop: Any) -> Any:
    """The trainer service as ``streamrec train`` builds it: the live model defaults
    (``ModelConfig()``), the settings' batch size and export cadence (``fused_loss=False``:
    as ``streamrec train --no-fused-loss``; ``attr_tokens``: as ``--attr-tokens``)."""
    from model.towers.two_tower import ModelConfig
    from model.trainer.build import build_service
    from model.trainer.loop_options import LoopOptions
    from model.trainer.trainer import TrainOptions
    from streamrec.settings import with_trainer

    # no eviction, one step per partial batch and no deltas, as this figure has always run
    settings = with_trainer(settings, fused_loss=fused_loss, evict_every_steps=0,
                            spare_epochs=1, delta_every_s=0.0, delta_catchup_every_s=0.0,
                            delta_history_lag_s=0.0)
    service = build_service(
        settings,
        ModelConfig(attr_tokens=attr_tokens),
        TrainOptions.from_settings(settings),
        LoopOptions.from_settings(settings, consumer=consumer, **loop),
        clock=lambda: datetime.now(UTC),
    )
    warm = _batches(2, settings.trainer.batch_size, seed=99, hist=service.history_len)
    for b in warm:  # trace the step and the evaluation before timing
        service.trainer.fit_batch(b)
    return service


def time_fits(trainer: Any) -> list[float]:
    """Wrap ``trainer.fit_batch`` (this instance only) to record when the first batch
    began and the last one returned: ``[first start, last end]``, filled as it trains."""
    marks: list[float] = []
    fit = trainer.fit_batch

    def timed(batch: Any, *args: Any) -> float:
        if not marks:
            marks.extend([time.perf_counter()] * 2)
        loss = fit(batch, *args)
        marks[-1] = time.perf_counter()
        return float(loss)

    trainer.fit_batch = timed
    return marks


def bench_e2e(
    n: int, root: Path, consumer: str = "auto", warm: int = WARM_SAMPLES,
    fused_loss: bool = True, attr_tokens: int = 0, **loop: Any
) -> dict[str, float]:
    """Figures of ``run()`` with the samples consumer ``consumer`` (``LoopOptions.consumer``)
    on the ``n`` samples after the first ``warm`` of the synthetic stream (full histories;
    the trainer starts empty): ``wall`` (examples per wall second of the whole run),
    ``cpu`` (examples per CPU second of this process: the samples fetch process is not
    counted), ``steady`` (examples per wall second from the first batch's start to the last
    one's end: the rate of a running trainer, exports at the default cadence included),
    with ``attr_tokens`` > 0 every item catalogued on the items topic first
    (``bench.catalogue.catalogue_of``) and read by the trainer, ``startup_s`` (run start to the first batch: consumer start and partition assignment)
    and ``tail_s`` (the last batch's end to the run's end: the final checkpoint and
    export)."""
    from model.evaluation.synthetic import SyntheticConfig, SyntheticStream
    from model.trainer.samples import encode_sample
    from stream.kafka_client import make_producer

    settings = _settings(root)
    stream = SyntheticStream(SyntheticConfig(users=10_000, items=20_000, clusters=50, seed=3))
    for _ in range(warm):
        stream.next()
    producer = make_producer(settings.kafka, linger_ms=50, batch_size=512 * 1024,
                             max_in_flight_requests_per_connection=5)
    samples = stream.take(n)
    if attr_tokens:
        from bench.catalogue import catalogue_of
        from stream.items import item_record

        for item in catalogue_of(sorted({s.item_id for s in samples})):
            key, value = item_record(item)
            producer.send(settings.kafka.items_topic, key=key, value=value)
    for s in samples:
        producer.send(settings.kafka.samples_topic, key=s.user_id.encode(), value=encode_sample(s))
    producer.flush(timeout=300)
    producer.close()
    service = _service(settings, consumer, fused_loss, attr_tokens, **loop)
    service.loop = replace(service.loop, max_samples=n)
    fits = time_fits(service.trainer)
    started, cpu = time.perf_counter(), time.process_time()
    state = service.run()
    ended, cpu_s = time.perf_counter(), time.process_time() - cpu
    assert state.samples_trained == n, state
    return {"wall": n / (ended - started), "cpu": n / cpu_s, "steady": n / (fits[1] - fits[0]),
            "startup_s": fits[0] - started, "tail_s": ended - fits[1]}


def bench_export(n_ids: int, root: Path) -> dict[str, Any]:
    from model.artifact.files import load_artifact
    from model.towers.tf_env import tf
    from model.towers.two_tower import ModelConfig
    from model.trainer.export import write_version
    from model.trainer.trainer import Trainer, TrainOptions

    trainer = Trainer(ModelConfig(), TrainOptions(evict_every_steps=0, spare_epochs=1),
                      tag=f"x{n_ids}")
    rng = np.random.default_rng(0)
    d = trainer.config.embedding_dim
    item_ids: dict[int, str] = {}
    for start in range(0, n_ids, 100_000):
        m = min(100_000, n_ids - start)
        ukeys = rng.integers(1, 2**62, m, dtype=np.int64)
        ikeys = rng.integers(1, 2**62, m, dtype=np.int64)
        trainer.model.users.params.upsert(tf.constant(ukeys), tf.constant(rng.normal(size=(m, d)), tf.float32))
        trainer.model.items.params.upsert(tf.constant(ikeys), tf.constant(rng.normal(size=(m, d)), tf.float32))
        item_ids.update({int(k): f"item-{start + i}" for i, k in enumerate(ikeys.tolist())})
    out = root / f"export-{n_ids}"
    started = time.perf_counter()
    write_version(out, trainer, item_ids, f"v{n_ids}", created_at=datetime.now(UTC))
    export_s = time.perf_counter() - started
    size = sum(p.stat().st_size for p in out.iterdir())
    started = time.perf_counter()
    load_artifact(out)
    load_s = time.perf_counter() - started
    shutil.rmtree(out, ignore_errors=True)
    return {"ids": n_ids, "export_s": round(export_s, 3), "bytes": size,
            "load_verify_s": round(load_s, 3)}


def bench_freshness(seconds: float, rate: float, root: Path) -> dict[str, float]:
    from model.evaluation.synthetic import SyntheticConfig, SyntheticStream
    from model.trainer.samples import Sample, encode_sample
    from stream.kafka_client import make_producer

    settings = _settings(root)
    service = _service(settings)
    published: list[tuple[float, dict[str, int]]] = []
    export = service.export

    def recording_export() -> str:
        version = export()
        published.append((time.time() * 1000.0, dict(service.state.offsets)))
        return version

    service.export = recording_export  # type: ignore[method-assign]
    produced: list[tuple[str, int]] = []  # ("topic:partition", offset) per sample, with ts
    stamps: list[int] = []
    lock = threading.Lock()
    stop_producing = threading.Event()

    def produce() -> None:
        stream = SyntheticStream(SyntheticConfig(users=10_000, items=20_000, clusters=50, seed=4))
        producer = make_producer(settings.kafka)
        started = time.monotonic()
        sent = 0
        while not stop_producing.is_set() and time.monotonic() - started < seconds:
            due = int((time.monotonic() - started) * rate)
            while sent < due:
                s = stream.next()
                now_ms = int(time.time() * 1000)
                s = Sample(s.sample_id, s.user_id, s.item_id, s.event_type, s.weight, now_ms, s.history)

                def done(meta: Any, ts: int = now_ms) -> None:
                    with lock:
                        produced.append((f"{meta.topic}:{meta.partition}", meta.offset))
                        stamps.append(ts)

                producer.send(settings.kafka.samples_topic, key=s.user_id.encode(),
                              value=encode_sample(s)).add_callback(done)
                sent += 1
            time.sleep(0.01)
        producer.flush(timeout=60)
        producer.close()

    runner = threading.Thread(target=service.run, name="trainer")
    producer_thread = threading.Thread(target=produce, name="producer")
    runner.start()
    producer_thread.start()
    producer_thread.join()
    periodic = len(published)
    service.stop_event.set()
    runner.join(timeout=300)
    versions = published[:periodic]  # the stop-time export is not a periodic publication
    fresh: list[float] = []
    for (part, offset), ts in zip(produced, stamps, strict=True):
        for at_ms, offsets in versions:
            if offsets.get(part, 0) > offset:
                fresh.append((at_ms - ts) / 1000.0)
                break
    if not fresh:
        return {"p50": float("nan"), "p95": float("nan"), "n": 0, "versions": periodic}
    arr = np.array(fresh)
    return {"p50": round(float(np.percentile(arr, 50)), 2),
            "p95": round(float(np.percentile(arr, 95)), 2), "n": int(arr.size),
            "versions": periodic, "export_every_s": settings.trainer.export_every_s}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="streamrec bench train", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", help="write the figures to this file")
    parser.add_argument("--batches", default="512,2048")
    parser.add_argument("--step-seconds", type=float, default=4.0)
    parser.add_argument("--step-history", type=int, default=0,
                        help="history window of the step's model (default: the live model's, "
                             "ModelConfig.history_len)")
    parser.add_argument("--warm-samples", type=int, default=WARM_SAMPLES,
                        help="synthetic samples skipped before the step's and e2e's samples "
                             "are taken, so that histories are full (default %(default)s)")
    parser.add_argument("--e2e-samples", type=int, default=300_000,
                        help="samples the e2e run trains (default %(default)s: long enough "
                             "for a sustained rate, with exports at the default cadence)")
    parser.add_argument("--export-ids", default="100000,1000000")
    parser.add_argument("--e2e-consumer", default="auto",
                        help="comma list of samples consumers (LoopOptions.consumer: auto, "
                             "confluent, kafka-python) timed in alternating order; the JSON "
                             "e2e figures are the first one's")
    parser.add_argument("--e2e-attr-tokens", default="0",
                        help="attribute keys per item of the e2e trainer, a comma list to "
                        "alternate (e.g. 0,16: ids only against every item slot filled; "
                        "default 0)")
    parser.add_argument("--e2e-rounds", type=int, default=1,
                        help="rounds of the e2e run per consumer (medians reported)")
    parser.add_argument("--no-fused-loss", action="store_true",
                        help="e2e: the trainer's loss op by op (streamrec train --no-fused-loss)")
    parser.add_argument("--freshness-s", type=float, default=75.0)
    parser.add_argument("--freshness-rate", type=float, default=2000.0)
    parser.add_argument("--skip", default="", help="comma list of step,e2e,export,freshness")
    parser.add_argument("--compare-rounds", type=int, default=0,
                        help="also time the deduplicated and the reference step side by side at "
                             "batch 512 for this many rounds of --step-seconds each")
    parser.add_argument("--user-tower", choices=("pool", "attention"), default="pool",
                        help="user tower of the step's model (ModelConfig.user_tower)")
    parser.add_argument("--attention-len", type=int, default=None)
    parser.add_argument("--attention-blocks", type=int, default=None)
    args = parser.parse_args(argv)
    skip = set(filter(None, args.skip.split(",")))
    from model.towers.two_tower import ModelConfig
    tower: dict[str, Any] = {"user_tower": args.user_tower}
    for name in ("attention_len", "attention_blocks"):
        if getattr(args, name) is not None:
            tower[name] = getattr(args, name)
    result: dict[str, Any] = {"load_avg_start": os.getloadavg()[0]}
    root = Path(tempfile.mkdtemp(prefix="bench-train-"))
    try:
        if "step" not in skip:
            by_batch, by_cpu = {}, {}
            hist = args.step_history or ModelConfig().history_len
            for b in (int(x) for x in args.batches.split(",")):
                wall, cpu, entries = bench_step(b, args.step_seconds, hist=hist, warm=args.warm_samples,
                                                tower=tower)
                by_batch[str(b)], by_cpu[str(b)] = round(wall), round(cpu)
                print(f"step batch {b} (history window {hist}, {entries} entries per row): "
                      f"{wall:,.0f} examples/s ({cpu:,.0f} per CPU second)")
            result["step_history_len"] = hist
            result["step_tower"] = tower
            result["step_mean_history_entries"] = entries
            result["step_examples_per_s_by_batch"] = by_batch
            result["step_examples_per_cpu_s_by_batch"] = by_cpu
            result["step_examples_per_s"] = by_batch.get("512", next(iter(by_batch.values())))
            wall, cpu, _ = bench_step(512, args.step_seconds, train_history=False, hist=hist,
                                      warm=args.warm_samples, tower=tower)
            result["step_examples_per_s_frozen_history"] = round(wall)
            result["step_examples_per_cpu_s_frozen_history"] = round(cpu)
            print(f"step batch 512, history rows frozen: {wall:,.0f} examples/s "
                  f"({cpu:,.0f} per CPU second)")
        if args.compare_rounds > 0:
            cmp = bench_step_compare(512, args.compare_rounds, args.step_seconds)
            result["step_compare_512"] = cmp
            for name, fig in cmp.items():
                print(f"step batch 512 {name}: median {fig['median']:,} examples/s, rounds {fig['runs']}")
        if "e2e" not in skip:
            attrs = [int(t) for t in args.e2e_attr_tokens.split(",")]
            variants = {(c if len(attrs) == 1 else f"{c}/attr_tokens={t}"): (c, t)
                        for c in args.e2e_consumer.split(",") for t in attrs}
            consumers = list(variants)
            runs: dict[str, list[dict[str, float]]] = {c: [] for c in consumers}
            for r in range(args.e2e_rounds):
                for c in consumers if r % 2 == 0 else consumers[::-1]:
                    fig = bench_e2e(args.e2e_samples, root, variants[c][0], args.warm_samples,
                                    fused_loss=not args.no_fused_loss,
                                    attr_tokens=variants[c][1])
                    runs[c].append(fig)
                    print(f"end to end from Kafka ({c}): {fig['wall']:,.0f} examples/s "
                          f"({fig['cpu']:,.0f} per CPU second); while training "
                          f"{fig['steady']:,.0f} examples/s (startup {fig['startup_s']:.2f} s, "
                          f"final export {fig['tail_s']:.2f} s), load {os.getloadavg()[0]:.2f}")

            def med(v: list[dict[str, float]], key: str, nd: int = 0) -> float:
                return round(float(np.median([f[key] for f in v])), nd)

            by = {c: {"median": med(v, "wall"), "median_per_cpu_s": med(v, "cpu"),
                      "median_steady": med(v, "steady"),
                      "median_startup_s": med(v, "startup_s", 2),
                      "median_tail_s": med(v, "tail_s", 2),
                      "runs": [round(f["wall"]) for f in v],
                      "runs_per_cpu_s": [round(f["cpu"]) for f in v],
                      "runs_steady": [round(f["steady"]) for f in v]}
                  for c, v in runs.items()}
            first = by[consumers[0]]
            result["e2e_fused_loss"] = not args.no_fused_loss
            result["e2e_examples_per_s"] = first["median"]
            result["e2e_examples_per_cpu_s"] = first["median_per_cpu_s"]
            result["e2e_examples_per_s_steady"] = first["median_steady"]
            if len(consumers) > 1 or args.e2e_rounds > 1:
                result["e2e_by_consumer"] = by
        if "export" not in skip:
            result["export"] = []
            for n in (int(x) for x in args.export_ids.split(",")):
                fig = bench_export(n, root)
                result["export"].append(fig)
                print(f"export {n:,} ids: {fig['export_s']} s, {fig['bytes'] / 1e6:.1f} MB, "
                      f"load+verify {fig['load_verify_s']} s")
        if "freshness" not in skip:
            result["model_freshness_s"] = bench_freshness(args.freshness_s, args.freshness_rate, root)
            print(f"model freshness: {result['model_freshness_s']}")
    finally:
        shutil.rmtree(root, ignore_errors=True)
    result["load_avg_end"] = os.getloadavg()[0]
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
