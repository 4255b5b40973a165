"""Playing the guard benchmark's scenarios on the running stack (``bench/guard.py``): the
trainer polled each second, one player per scenario, the recovery after a regression."""

from __future__ import annotations

import argparse
import random
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from bench.freshness import ServedCatalog, _trainer_counters, _trainer_guard, new_item_probe, probe
from bench.guard import Reading, Scenario, grew, summarize
from bench.guard_traffic import (
    Bot,
    Catalogue,
    Load,
    Mirror,
    Renamed,
    SampleLoad,
    broken,
    live_simulator,
    poisoned,
)
from feature_store.features import FeatureParams
from stream.simulate import ClickSimulator, SimConfig, simulated_log, write_ndjson
from streamrec.client import Client


@dataclass
class Poller:
    """Polls the trainer each second into the readings of the current scenario."""

    trainer: str
    readings: list[Reading] = field(default_factory=list)
    bad_rows: Callable[[], int] | None = None
    t0: float = 0.0
    shown: float = 0.0  # when the last progress line was printed

    def poll(self) -> Reading:
        counters = _trainer_counters(self.trainer) or {}
        guard = _trainer_guard(self.trainer) or {}
        r = Reading(round(time.monotonic() - self.t0, 2), counters.get("guard_holds"),
                    counters.get("guard_rollbacks"), counters.get("deltas"),
                    guard.get("held"), guard.get("scored"),
                    int(self.bad_rows()) if self.bad_rows else 0)
        self.readings.append(r)
        return r

    def start(self) -> None:
        self.readings, self.t0, self.bad_rows = [], time.monotonic(), None
        self.shown = self.t0
        self.poll()

    def wait(self, seconds: float, label: str,
             until: Callable[[], bool] | None = None) -> None:
        """Poll each second for ``seconds`` (or until ``until()``), a progress line each 15 s."""
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            time.sleep(1.0)  # the polling cadence of the figures
            r = self.poll()
            if time.monotonic() - self.shown >= 15:
                self.shown = time.monotonic()
                first = self.readings[0]

                def up(a: float | None, b: float | None) -> str:
                    g = grew(a, b)
                    return "?" if g is None else f"+{g:.0f}"

                print(f"  [{label} {r.t:4.0f} s] scored {up(first.scored, r.scored)}, "
                      f"holds {up(first.holds, r.holds)}, rollbacks "
                      f"{up(first.rollbacks, r.rollbacks)}, "
                      f"{'HELD' if r.held else 'publishing'}"
                      f"{f', bad rows {r.bad_rows}' if r.bad_rows else ''}", flush=True)
            if until is not None and until():
                return


def health(url: str) -> bool:
    import httpx

    try:
        return httpx.get(f"{url}/health", timeout=5.0).status_code < 500
    except httpx.HTTPError:
        return False


class Context:
    """What the players share: the arguments, the live traffic and its mirror, the poller."""

    def __init__(self, args: argparse.Namespace, settings: Any) -> None:
        self.args, self.settings = args, settings
        self.tag = time.strftime("%H%M%S", time.gmtime())
        self.sim = live_simulator()
        self.mirror = Mirror(self.sim, FeatureParams.from_settings(settings.features))
        self.poller = Poller(args.trainer)
        self.client = Client(args.ingest, args.serving, timeout_s=30.0)
        self.catalog = ServedCatalog(settings.trainer.registry_dir, settings.trainer.model_name)
        self.rng = np.random.default_rng(17)
        self.live = Load(self.mirror, args.ingest, args.rate)
        self.click_rate = 0.0

    def relive(self, rate: float | None = None) -> None:
        """The live traffic again (at ``rate``, default ``--rate``)."""
        self.live.stop()
        self.live = Load(self.mirror, self.args.ingest, rate or self.args.rate)

    def judged(self) -> bool:
        """A version is served and the guard has a healthy figure and does not hold."""
        guard = _trainer_guard(self.args.trainer) or {}
        return (bool(self.catalog.current()[1]) and guard.get("healthy_recall") is not None
                and not guard.get("held"))


def warm_up(ctx: Context) -> str | None:
    """The live traffic for ``--warmup`` s, then until :meth:`Context.judged` (the error
    past ``--warmup-timeout``; None: steady)."""
    a = ctx.args
    print(f"warm-up: {a.warmup:.0f} s of live traffic at {a.rate:.0f} events/s", flush=True)
    t0 = time.monotonic()
    time.sleep(a.warmup)  # the live load itself is the warm-up
    deadline = time.monotonic() + a.warmup_timeout
    while not ctx.judged() and time.monotonic() < deadline:
        time.sleep(1.0)  # polling cadence of the warm-up
    if not ctx.judged():
        ctx.live.stop()
        return (f"warm-up failed: after {a.warmup_timeout:.0f} s more no version is served "
                "with a healthy guard figure and no hold; the scenarios would measure the "
                "stack's start, not the guard")
    ctx.click_rate = ctx.mirror.clicks / max(time.monotonic() - t0, 1.0)
    print(f"steady: version {ctx.catalog.version} served, {ctx.click_rate:.0f} clicks/s live",
          flush=True)
    return None


def _drift(ctx: Context, sc: Scenario) -> dict[str, Any]:
    ctx.poller.wait(sc.seconds, sc.name)
    return {}


def _mix_switch(ctx: Context, sc: Scenario) -> dict[str, Any]:
    out: dict[str, list[float]] = {k: [] for k in (
        "feature_s", "model_s", "recommendation_s", "recommendation_s_known",
        "recommendation_s_unknown", "new_item_s")}
    lock, rng, threads = threading.Lock(), random.Random(5), []
    end, k = time.monotonic() + sc.seconds, 0
    while time.monotonic() < end:
        user = ctx.sim.user_id(rng.randrange(ctx.sim.config.users))
        if k % 2:
            target: Callable[..., None] = new_item_probe
            args: tuple[Any, ...] = (ctx.client, ctx.args.serving, user,
                                     f"new-{ctx.tag}-mix{k}", 30.0, out, lock)
        else:
            target, args = probe, (ctx.client, user, None, 30.0, out, lock, ctx.catalog, rng)
        t = threading.Thread(target=target, args=args, daemon=True)
        t.start()
        threads.append(t)
        k += 1
        ctx.poller.wait(2.0, sc.name)
    for t in threads:
        t.join(35)
    return {"probes": k, "new_item_s": sorted(round(v, 2) for v in out["new_item_s"]),
            "model_s": sorted(round(v, 2) for v in out["model_s"])}


def _rate_step(ctx: Context, sc: Scenario) -> dict[str, Any]:
    ctx.relive(ctx.args.high_rate)
    t0 = time.monotonic()
    ctx.poller.wait(sc.seconds, sc.name)
    stats, span = ctx.live.stats, time.monotonic() - t0
    ctx.relive()
    return {"rate": ctx.args.high_rate, "sent": stats.events,
            "achieved_rate": round(stats.events / span, 1), "failed": stats.failed}


def _replay(ctx: Context, sc: Scenario) -> dict[str, Any]:
    path = ctx.args.replay_log
    if path is None:
        path = Path(tempfile.gettempdir()) / f"guard-bench-replay-{ctx.tag}.ndjson"
        write_ndjson(path, simulated_log("rating", ctx.args.replay_events,
                                         seed=int(ctx.tag) % 1000 + 11))
    proc = subprocess.Popen(  # the CLI as a user runs it
        [sys.executable, "-m", "deploy.cli", "replay", str(path), "--no-ledger",
         "--no-progress", "--speed", "max"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        cwd=Path(__file__).resolve().parent.parent)
    ctx.poller.wait(sc.seconds, sc.name)
    code = proc.poll()
    if code is None:
        proc.terminate()
        proc.wait(30)
    return {"replay_log": str(path), "replay_exit": code}


def _new_users(ctx: Context, sc: Scenario) -> dict[str, Any]:
    burst = Load(Renamed(ClickSimulator(SimConfig(users=300, items=2000, seed=23)),
                         f"nu{ctx.tag}"), ctx.args.ingest, ctx.args.rate)
    ctx.poller.wait(sc.seconds, sc.name)
    burst.stop()
    return {"users": 300, "rate": ctx.args.rate}


def _new_catalogue(ctx: Context, sc: Scenario) -> dict[str, Any]:
    prefix, probes = f"cat{ctx.tag}", ctx.args.new_items
    launch = Load(Catalogue(prefix, 300, 500, seed=29), ctx.args.ingest, ctx.args.rate)
    out: dict[str, list[float]] = {"new_item_s": []}
    lock, threads = threading.Lock(), []
    gap = sc.seconds / max(probes + 1, 2)
    for k in range(probes):
        t = threading.Thread(target=new_item_probe, args=(
            ctx.client, ctx.args.serving, f"{prefix}-u{k}", f"{prefix}-new{k}",
            max(sc.seconds - k * gap, 10.0), out, lock), daemon=True)
        t.start()
        threads.append(t)
        ctx.poller.wait(gap, sc.name)
    ctx.poller.wait(gap, sc.name)
    for t in threads:
        t.join(max(sc.seconds, 10.0))
    launch.stop()
    found = sorted(out["new_item_s"])

    def pct(q: float) -> float | None:
        return round(float(np.percentile(found, q)), 2) if found else None

    return {"users": 300, "items": 500, "new_item_s": [round(v, 2) for v in found],
            "new_item_p50_s": pct(50), "new_item_p95_s": pct(95),
            "new_item_timeouts": len(out.get("new_item_s_timeouts", []))}


def _samples(ctx: Context, sc: Scenario) -> dict[str, Any]:
    """poisoned / broken-feature: the live traffic as samples, with bad rows among them."""
    share = 1.0 if sc.name == "broken-feature" else ctx.args.poison_share
    items, item_id, rng = ctx.sim.config.items, ctx.sim.item_id, ctx.rng
    transform = broken if sc.name == "broken-feature" else (
        lambda x: poisoned(x, rng, items, share, item_id))
    ctx.live.stop()
    samples = SampleLoad(ctx.mirror, ctx.settings, ctx.args.rate, ctx.args.regression_rows,
                         transform)
    ctx.poller.bad_rows = lambda: samples.bad
    ctx.poller.wait(sc.seconds, sc.name, until=lambda: samples.done)
    samples.stop()
    ctx.relive()
    return {"share": share, "samples_sent": samples.sent}


def _bot(ctx: Context, sc: Scenario) -> dict[str, Any]:
    share, rows = ctx.args.poison_share, ctx.args.regression_rows
    rate = max(ctx.click_rate * share / (1.0 - share), 1.0)
    bot = Load(Bot(f"bot{ctx.tag}", ctx.sim.item_id(0)), ctx.args.ingest, rate)
    ctx.poller.bad_rows = lambda: bot.stats.events
    ctx.poller.wait(sc.seconds, sc.name, until=lambda: bot.stats.events >= rows)
    bot.stop()
    return {"share": share, "bot_rate": round(rate, 1)}


PLAYERS: dict[str, Callable[[Context, Scenario], dict[str, Any]]] = {
    "drift": _drift, "mix-switch": _mix_switch, "rate-step": _rate_step, "replay": _replay,
    "new-users": _new_users, "new-catalogue": _new_catalogue, "poisoned": _samples,
    "bot": _bot, "broken-feature": _samples,
}


def _settle(ctx: Context, sc: Scenario) -> dict[str, Any]:
    """Before a regression: the live traffic until a hold left by the scenario before ends
    (at most a scenario), so the regression's first hold is its own."""
    poller = ctx.poller
    poller.start()
    if poller.readings[-1].held:
        print(f"  settle: the guard still holds; live traffic until it resumes (at most "
              f"{sc.seconds:.0f} s)", flush=True)
        poller.wait(sc.seconds, f"{sc.name} settle",
                    until=lambda: poller.readings[-1].held is False)
    return {"settle_s": poller.readings[-1].t,
            "started_held": bool(poller.readings[-1].held)}


def play(ctx: Context, sc: Scenario) -> dict[str, Any]:
    """One scenario's figures (``bench.guard.summarize``); a regression's recovery after."""
    poller = ctx.poller
    settle: dict[str, Any] = {}
    if sc.kind == "regression":
        settle = _settle(ctx, sc)
    poller.start()
    result = summarize(sc, poller.readings, **PLAYERS[sc.name](ctx, sc), **settle)
    if sc.kind == "regression":
        t0, end_t = time.monotonic(), poller.readings[-1].t
        print(f"  recovery: live traffic until the guard resumes (at most {sc.seconds:.0f} s)",
              flush=True)
        poller.wait(sc.seconds, f"{sc.name} recovery",
                    until=lambda: poller.readings[-1].held is False)
        resumed = poller.readings[-1].held is False
        result["resumed_after_s"] = round(time.monotonic() - t0, 1) if resumed else None
        result["recovery"] = summarize(Scenario("recovery", "benign", 0.0),
                                       [r for r in poller.readings if r.t >= end_t])
    result["readings"] = [asdict(r) for r in poller.readings]
    return result
