"""Freshness of the running pipeline: how soon an event shows in features, model, answers.

Needs the stack up (``streamrec up``). Under background load from the simulator, probes click
items and time (a) the click in the user's features, (b) a served model trained through it,
(c) the user's recommendations changing and, with ``--new-items``, (d) a brand-new item
becoming recommendable: posted to the catalogue and never clicked (the trainer needs
attribute slots, ``trainer.attr_tokens``), or clicked once (``--new-item-by click``). Probe gaps are drawn at random so they do not lock onto the delta
period; a warm-up waits for a steady stack (exit 3 if it never gets there); the guard's holds
and the deltas/s of the run are reported beside the figures. Details: docs/internals.md.

    streamrec bench freshness --probes 20 --interval 2 --json bench/results/freshness.json
"""

from __future__ import annotations

import argparse
import json
import logging
import random
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

from bench.harness import add_endpoint_args
from bench.host import host
from streamrec import metric_names as names
from streamrec.client import Client, Event, NotFound

log = logging.getLogger(__name__)

#: Exit code of a run whose warm-up ended with the served model too far behind the events.
WARMUP_FAILED = 3

#: The trainer's counters read at the start and the end of the probes (sample names).
COUNTERS = {
    "guard_holds": f"{names.TRAINER_GUARD_HOLDS}_total",
    "guard_rollbacks": f"{names.TRAINER_GUARD_ROLLBACKS}_total",
    "deltas": f"{names.TRAINER_DELTAS}_total",
}


def gap(rng: random.Random, interval: float) -> float:
    """Seconds to the next probe: uniform in ``[0.5, 1.5] * interval`` (mean ``interval``),
    so the probes fall at every phase of the periodic deltas and versions."""
    return rng.uniform(0.5, 1.5) * interval


def _pct(values: list[float]) -> dict[str, Any]:
    if not values:
        return {"p50": None, "p95": None, "p99": None, "n": 0, "values": []}
    arr = np.asarray(values)
    return {"p50": float(np.percentile(arr, 50)), "p95": float(np.percentile(arr, 95)),
            "p99": float(np.percentile(arr, 99)), "n": len(values),
            "values": [round(v, 3) for v in values]}


def _items(client: Client, user: str) -> list[str]:
    return [it.item_id for it in client.recommend(user, k=20).items]


class ServedCatalog:
    """Item ids of the version the registry serves (``CURRENT``), cached per version."""

    def __init__(self, registry_dir: Path, model_name: str) -> None:
        from model.artifact.registry import Registry

        self.registry = Registry(registry_dir, model_name)
        self.version: str | None = None
        self.items: frozenset[str] = frozenset()
        self.ordered: list[str] = []
        self.lock = threading.Lock()

    def current(self) -> tuple[frozenset[str], list[str]]:
        from model.artifact.files import load_artifact

        with self.lock:
            version = self.registry.current()
            if version is not None and version != self.version:
                art = load_artifact(self.registry.path(version), verify=False)
                self.ordered = [str(i) for i in art.item_ids]
                self.items = frozenset(self.ordered)
                self.version = version
            return self.items, self.ordered


def probe(client: Client, user: str, item: str | None,
          timeout_s: float, out: dict[str, list[float]], lock: threading.Lock,
          catalog: ServedCatalog, rng: random.Random) -> None:
    """One click of ``user`` (on ``item``, or on a served item outside their top 20 if None)."""
    before = _items(client, user)
    served, ordered = catalog.current()
    if item is None:
        shown = set(before)
        with lock:
            choices = [i for i in rng.sample(ordered, min(len(ordered), 64)) if i not in shown]
        if not choices:
            return
        item = choices[0]
    known = item in served
    ts = time.time_ns() // 1_000_000
    t0 = time.monotonic()
    client.send([Event(user, item, "click", ts=ts)])
    pending = {"feature_s", "model_s", "recommendation_s"}
    while pending and time.monotonic() - t0 < timeout_s:
        now = time.monotonic() - t0
        if "feature_s" in pending:
            try:
                history = client.features(user).history
            except NotFound:
                history = []
            if any(h.item_id == item and h.ts_ms == ts for h in history):
                pending.discard("feature_s")
                with lock:
                    out["feature_s"].append(now)
        if "model_s" in pending:
            through = client.model().get("trained_through_ms")
            if through is not None and through >= ts:
                pending.discard("model_s")
                with lock:
                    out["model_s"].append(now)
        if "recommendation_s" in pending:
            after = _items(client, user)
            if after != before:
                pending.discard("recommendation_s")
                with lock:
                    out["recommendation_s"].append(now)
                    out["recommendation_s_known" if known else "recommendation_s_unknown"].append(now)
        time.sleep(0.05)  # polling cadence of the probe
    with lock:
        for name in pending:
            out.setdefault(f"{name}_timeouts", []).append(timeout_s)


def new_item_probe(client: Client, serving: str, user: str, item: str, timeout_s: float,
                   out: dict[str, list[float]], lock: threading.Lock,
                   by: str = "catalogue") -> None:
    """(d): a never-seen ``item`` posted to the catalogue (``by`` "catalogue": no click; the
    trainer needs attribute slots, ``trainer.attr_tokens``) or clicked once by ``user``
    ("click"), timed until serving's catalog holds it (a candidate of every request)."""
    import httpx

    ts = time.time_ns() // 1_000_000
    t0 = time.monotonic()
    if by == "catalogue":
        client.upsert_items([{"item_id": item, "ts": ts, "attributes": {
            "category": "probe", "tags": ["fresh", item[-1]]}}])
    else:
        client.send([Event(user, item, "click", ts=ts)])
    while time.monotonic() - t0 < timeout_s:
        try:
            found = httpx.get(f"{serving}/model/items/{item}", timeout=5.0).json()["in_catalog"]
        except (httpx.HTTPError, KeyError, ValueError):
            found = False
        if found:
            with lock:
                out["new_item_s"].append(time.monotonic() - t0)
            return
        time.sleep(0.05)  # polling cadence of the probe
    with lock:
        out.setdefault("new_item_s_timeouts", []).append(timeout_s)


def warm_up(client: Client, seconds: float, steady_lag_s: float, timeout_s: float) -> float | None:
    """Let the background load run ``seconds``, then wait until the served model's
    trained-through age (``GET /model`` ``trained_through_age_s``, what ``model_s`` polls)
    is at most ``steady_lag_s`` (or ``timeout_s`` passed); returns the last age seen (None:
    the model reported none). :func:`warmup_failure` judges it."""
    if seconds > 0:
        print(f"warm-up: {seconds:.0f} s of background load", flush=True)
        time.sleep(seconds)  # the load itself is the warm-up
    deadline = time.monotonic() + timeout_s
    age = client.model().get("trained_through_age_s")
    while (age is None or age > steady_lag_s) and time.monotonic() < deadline:
        time.sleep(0.5)  # polling cadence of the warm-up
        age = client.model().get("trained_through_age_s")
    return age


def warmup_failure(age: float | None, steady_lag_s: float, timeout_s: float,
                   guard: dict[str, Any] | None = None) -> str | None:
    """The error of a warm-up that ended with the served model trained through events
    ``age`` seconds old, more than ``steady_lag_s`` (None: steady). ``guard``: the
    trainer's ``/health`` ``guard``, named when it holds (the likely cause)."""
    if age is not None and age <= steady_lag_s:
        return None
    shown = "no trained-through time" if age is None else f"a lag of {age:.1f} s"
    message = (f"warm-up failed: after {timeout_s:.0f} s the served model still shows {shown} "
               f"behind the events (limit {steady_lag_s:.1f} s); the figures would time its "
               "catching up, not its freshness")
    if guard and guard.get("held"):
        held, reason = guard.get("held_for_s"), guard.get("last_reason")
        message += (f"; the trainer's quality guard holds publication"
                    f"{'' if held is None else f' for {held:.0f} s'}"
                    f"{f' ({reason})' if reason else ''}")
    return message


def parse_counters(text: str) -> dict[str, float]:
    """:data:`COUNTERS` from a Prometheus text exposition (absent ones: not in the dict)."""
    from prometheus_client.parser import text_string_to_metric_families

    wanted = {sample: key for key, sample in COUNTERS.items()}
    found: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name in wanted:
                found[wanted[sample.name]] = found.get(wanted[sample.name], 0.0) + sample.value
    return found


def run_causes(start: dict[str, float] | None, end: dict[str, float] | None,
               seconds: float) -> dict[str, float | None]:
    """``guard_holds``, ``guard_rollbacks`` and ``deltas_per_s`` between two readings of
    :func:`parse_counters` ``seconds`` apart (None: not read). A counter lower at the end
    was reset by a trainer restart: its end value is what happened since."""

    def grew(key: str) -> float | None:
        if start is None or end is None or key not in start or key not in end:
            return None
        return end[key] - start[key] if end[key] >= start[key] else end[key]

    deltas = grew("deltas")
    holds, rollbacks = grew("guard_holds"), grew("guard_rollbacks")
    return {
        "guard_holds": None if holds is None else int(holds),
        "guard_rollbacks": None if rollbacks is None else int(rollbacks),
        "deltas_per_s": None if deltas is None or seconds <= 0 else deltas / seconds,
    }


def _trainer_counters(trainer: str) -> dict[str, float] | None:
    import httpx

    try:
        resp = httpx.get(f"{trainer}/metrics", timeout=10.0)
        resp.raise_for_status()
        return parse_counters(resp.text)
    except (httpx.HTTPError, ValueError) as exc:
        log.warning("could not read the trainer's /metrics at %s: %s", trainer, exc)
        return None


def _trainer_guard(trainer: str) -> dict[str, Any] | None:
    import httpx

    try:
        guard = httpx.get(f"{trainer}/health", timeout=10.0).json().get("guard")
    except (httpx.HTTPError, ValueError, AttributeError) as exc:
        log.warning("could not read the trainer's /health at %s: %s", trainer, exc)
        return None
    return guard if isinstance(guard, dict) else None


def causes_line(result: dict[str, Any]) -> str:
    """The run's causes (:func:`run_causes`) as the line printed under the percentiles."""
    def shown(value: float | None, fmt: str) -> str:
        return "?" if value is None else format(value, fmt)

    return (f"{'during the run':<17} guard holds {shown(result['guard_holds'], 'd')}, "
            f"rollbacks {shown(result['guard_rollbacks'], 'd')}, "
            f"{shown(result['deltas_per_s'], '.2f')} deltas/s")


def _delta_figures(trainer: str) -> dict[str, Any] | None:
    import httpx

    try:
        return httpx.get(f"{trainer}/delta", timeout=10.0).json()
    except (httpx.HTTPError, ValueError) as exc:
        log.warning("could not read the trainer's /delta at %s: %s", trainer, exc)
        return None


def main(argv: list[str] | None = None) -> int:
    from stream.simulate import ClickSimulator, SimConfig, run
    from streamrec.settings import load_settings

    s = load_settings()
    p = argparse.ArgumentParser(prog="streamrec bench freshness", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--probes", type=int, default=20)
    p.add_argument("--interval", type=float, default=2.0, help="mean seconds between probes (each gap drawn from 0.5-1.5x this)")
    p.add_argument("--rate", type=float, default=300.0, help="background events/s")
    p.add_argument("--timeout", type=float, default=180.0, help="per-probe deadline (s)")
    p.add_argument("--probe-items", choices=("served", "any"), default="served",
                   help="served: an item of the served version outside the user's top 20; "
                        "any: any simulator item (see above)")
    add_endpoint_args(p, s)
    p.add_argument("--new-items", type=int, default=0,
                   help="probes of a never-seen item, timed until serving's catalog holds it")
    p.add_argument("--new-item-by", choices=("catalogue", "click"), default="catalogue",
                   help="catalogue: the item is posted to POST /items and never clicked (the "
                        "trainer needs attribute slots: trainer.attr_tokens > 0); click: one "
                        "click on it (default catalogue)")
    p.add_argument("--warmup", type=float, default=20.0,
                   help="seconds of background load before the first probe (default 20)")
    p.add_argument("--steady-lag", type=float, default=2.0,
                   help="then wait until the served model's trained-through age is at most "
                        "this many seconds (default 2)")
    p.add_argument("--warmup-timeout", type=float, default=120.0,
                   help="deadline of that wait, s (default 120): past it the run fails "
                        f"(exit {WARMUP_FAILED})")
    p.add_argument("--json", type=Path)
    p.add_argument("--png", type=Path)
    args = p.parse_args(argv)

    config = SimConfig(users=500, items=2000, seed=3)
    sim = ClickSimulator(config)
    stop = threading.Event()
    load = threading.Thread(target=run, args=(sim, args.ingest, args.rate),
                            kwargs={"should_stop": stop.is_set}, daemon=True)
    load.start()
    out: dict[str, list[float]] = {"feature_s": [], "model_s": [], "recommendation_s": [],
                                   "recommendation_s_known": [], "recommendation_s_unknown": [],
                                   "new_item_s": []}
    lock = threading.Lock()
    rng = random.Random(5)
    cadence = random.Random(11)
    catalog = ServedCatalog(s.trainer.registry_dir, s.trainer.model_name)
    if not catalog.current()[1]:
        print("no model version is served yet: start the stack (`streamrec up`) and let the "
              "trainer publish one")
        return 2
    threads = []
    client = Client(args.ingest, args.serving, timeout_s=30.0)
    lag_at_start = warm_up(client, args.warmup, args.steady_lag, args.warmup_timeout)
    failure = warmup_failure(lag_at_start, args.steady_lag, args.warmup_timeout,
                             _trainer_guard(args.trainer))
    if failure is not None:
        stop.set()
        print(failure, file=sys.stderr, flush=True)
        return WARMUP_FAILED
    print(f"steady: the served model is trained through events {lag_at_start:.1f} s old",
          flush=True)
    print(f"freshness: {args.probes} probes every {args.interval}s under {args.rate:.0f} "
          f"events/s of background load")
    counters_start = _trainer_counters(args.trainer)
    stream_start = (_delta_figures(args.trainer), time.monotonic())
    apply_ms: list[float] = []
    for n in range(max(args.probes, args.new_items)):
        if n < args.new_items:
            t = threading.Thread(target=new_item_probe, args=(
                client, args.serving, sim.user_id(rng.randrange(config.users)),
                f"new-{time.time_ns()}-{n}", args.timeout, out, lock, args.new_item_by),
                daemon=True)
            t.start()
            threads.append(t)
        delta = client.model().get("delta") or {}
        if delta.get("last_apply_ms") is not None:
            apply_ms.append(float(delta["last_apply_ms"]))
        if n >= args.probes:
            time.sleep(gap(cadence, args.interval))  # probe cadence
            continue
        user = sim.user_id(rng.randrange(config.users))
        item = sim.item_id(rng.randrange(config.items)) if args.probe_items == "any" else None
        t = threading.Thread(target=probe, args=(client, user, item,
                                                 args.timeout, out, lock, catalog, rng),
                             daemon=True)
        t.start()
        threads.append(t)
        time.sleep(gap(cadence, args.interval))  # probe cadence
    for t in threads:
        t.join(args.timeout + 30)
    stop.set()
    stream_end = (_delta_figures(args.trainer), time.monotonic())
    counters_end = _trainer_counters(args.trainer)
    result: dict[str, Any] = {name: _pct(out.get(name, [])) for name in (
        "feature_s", "model_s", "recommendation_s", "new_item_s")}
    result.update(run_causes(counters_start, counters_end, stream_end[1] - stream_start[1]))
    if stream_start[0] and stream_end[0]:
        span = stream_end[1] - stream_start[1]
        result["delta_stream"] = {
            "bytes_per_s": (stream_end[0]["bytes_sent"] - stream_start[0]["bytes_sent"]) / span,
            "deltas_per_s": (stream_end[0]["sent"] - stream_start[0]["sent"]) / span,
            "serving_apply_ms": _pct(apply_ms),
        }
    result["recommendation_s_by_item"] = {
        "known": _pct(out["recommendation_s_known"]),
        "unknown": _pct(out["recommendation_s_unknown"])}
    result["timeouts"] = {k: len(v) for k, v in out.items() if k.endswith("_timeouts")}
    result["probes"] = args.probes
    result["warmup"] = {"seconds": args.warmup, "steady_lag_s": args.steady_lag,
                        "lag_at_start_s": lag_at_start}
    result["probe_items"] = args.probe_items
    result["new_item_by"] = args.new_item_by
    result["background_rate"] = args.rate
    result["host"] = host()
    for name in ("feature_s", "model_s", "recommendation_s", "new_item_s"):
        r = result[name]
        if r["n"]:
            print(f"{name:<17} p50 {r['p50']:7.2f}  p95 {r['p95']:7.2f}  p99 {r['p99']:7.2f}  "
                  f"(n={r['n']})")
        else:
            print(f"{name:<17} no probe completed")
    print(causes_line(result))
    for kind in ("known", "unknown"):
        r = result["recommendation_s_by_item"][kind]
        if r["n"]:
            print(f"  item {kind + ' to the served version':<28} p50 {r['p50']:7.2f}  "
                  f"p95 {r['p95']:7.2f}  (n={r['n']})")
    if "delta_stream" in result:
        ds = result["delta_stream"]
        print(f"delta stream      {ds['bytes_per_s'] / 1e3:.1f} kB/s, {ds['deltas_per_s']:.2f} "
              f"deltas/s; serving apply p50 {ds['serving_apply_ms'].get('p50')} ms")
    if result["timeouts"]:
        print(f"timeouts: {result['timeouts']}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2))
    if args.png:
        _plot(result, args.png)
    return 0


def _plot(result: dict[str, Any], path: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no PNG written")
        return
    fig, ax = plt.subplots(figsize=(7, 4))
    names = ["feature_s", "recommendation_s", "model_s"]
    ax.boxplot([result[n]["values"] or [0] for n in names], tick_labels=["feature", "recs change",
                                                                    "model version"])
    ax.set_ylabel("seconds after the event")
    ax.set_title("streamrec freshness")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)


if __name__ == "__main__":
    raise SystemExit(main())
