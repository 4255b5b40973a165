"""The trainer's quality guard under benign shifts of traffic and under real regressions.

Needs the stack up (``streamrec up``, default ports). Plays scenarios one after another
(:data:`SCENARIOS`, ``--help``) and reads the guard's counters from the trainer's /metrics
and /health each second: false holds and rollbacks per hour over the benign ones, and how
many scored rows and seconds each regression takes to be held and rolled back. The pure
logic is here; the players in bench/guard_play.py, the traffic in bench/guard_traffic.py.
Details: docs/internals.md.

    streamrec bench guard --minutes-per-scenario 1 --json bench/results/guard.json
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

BENIGN = ("drift", "mix-switch", "rate-step", "replay", "new-users", "new-catalogue")
REGRESSIONS = ("poisoned", "bot", "broken-feature")
#: Benign minutes the issue's target counts (0 holds and rollbacks over 30 minutes).
BENIGN_MINUTES = 30.0
DEFAULT_MINUTES = BENIGN_MINUTES / len(BENIGN)
#: Exit codes: the stack is not up; the warm-up never reached a served, judged model.
NOT_UP, WARMUP_FAILED = 2, 3

SCENARIOS = """\
A warm-up of the live simulator's traffic (500 users, 2,000 items, --rate events/s through
ingest) waits for a served version and the guard's healthy figure. Then, one after another,
each for --minutes-per-scenario:

benign (the guard should stay quiet)
  drift           the simulator's ordinary drifting traffic
  mix-switch      plus the freshness bench's probe users and never-seen items
  rate-step       the live traffic at --high-rate (300 -> 2,000 events/s)
  replay          plus `streamrec replay` of an old NDJSON log (--replay-log, or one the
                  simulator writes: --replay-events events from 2024)
  new-users       plus a burst of 300 new users (the simulator's tastes, new ids)
  new-catalogue   plus 300 new users clicking 500 new items uniformly; --new-items probes
                  time a never-seen item of it until recommendable (the freshness probe)
regressions (the guard should hold and roll back), each --regression-rows bad rows at most
  poisoned        --poison-share of the samples with a uniformly random item (ingest paused:
                  the live traffic's samples, built with the feature job's own function,
                  go onto the samples topic as tests/integration/test_guard.py sends them)
  bot             one user clicking one item through ingest, --poison-share of the clicks
  broken-feature  every sample with an empty history (ingest paused, samples topic)
After a regression the live traffic runs until the guard resumes (at most a scenario).

Figures per scenario, from the trainer's /metrics and /health polled each second: holds
and rollbacks (counter growth), seconds held, deltas/s; for a regression the scored rows
(every row the guard scored since the regression began, good and bad) and seconds until
the first hold and the first rollback, or "not caught". Over the benign scenarios: holds
and rollbacks per hour (all of them false). --json keeps every figure, each poll and the
host record (bench.host).
"""


@dataclass(frozen=True)
class Scenario:
    name: str
    kind: str  # "benign" or "regression"
    seconds: float


def schedule(minutes: float, only: list[str] | None = None) -> list[Scenario]:
    """The scenarios in play order (benign first), ``minutes`` each; ``only`` picks some."""
    if minutes <= 0:
        raise ValueError("minutes per scenario must be > 0")
    names = [n for n in BENIGN + REGRESSIONS if only is None or n in only]
    unknown = set(only or ()) - set(BENIGN + REGRESSIONS)
    if unknown:
        raise ValueError(f"unknown scenarios: {', '.join(sorted(unknown))}")
    return [Scenario(n, "benign" if n in BENIGN else "regression", minutes * 60.0)
            for n in names]


@dataclass
class Reading:
    """One poll of the trainer, ``t`` seconds into the scenario (None: not read)."""

    t: float
    holds: float | None = None
    rollbacks: float | None = None
    deltas: float | None = None
    held: bool | None = None
    scored: int | None = None
    bad_rows: int = 0


def grew(start: float | None, end: float | None) -> float | None:
    """A counter's growth; lower at the end = the trainer restarted: its end value."""
    if start is None or end is None:
        return None
    return end - start if end >= start else end


def held_seconds(readings: list[Reading]) -> float:
    """Seconds between polls that began with the guard holding."""
    return sum(b.t - a.t for a, b in zip(readings, readings[1:], strict=False) if a.held)


def first_growth(readings: list[Reading], key: str) -> Reading | None:
    """The first poll whose ``key`` counter (holds, rollbacks) grew since the first poll
    (a hold already on at the start is not a new one)."""
    if not readings:
        return None
    base = getattr(readings[0], key)
    for r in readings[1:]:
        value = getattr(r, key)
        if base is None:
            base = value
        elif value is not None and value != base:  # lower: a restarted trainer counted anew
            return r
    return None


def caught_after(readings: list[Reading], key: str) -> dict[str, Any] | None:
    """Scored rows, seconds and bad rows sent from the first poll to the first growth of
    ``key`` (None: not caught)."""
    hit = first_growth(readings, key)
    if hit is None:
        return None
    start = readings[0]
    rows = (None if hit.scored is None or start.scored is None
            else hit.scored - start.scored if hit.scored >= start.scored else hit.scored)
    return {"rows": rows, "seconds": round(hit.t - start.t, 1), "bad_rows": hit.bad_rows}


def per_hour(count: float | None, seconds: float) -> float | None:
    return None if count is None or seconds <= 0 else count * 3600.0 / seconds


def summarize(scenario: Scenario, readings: list[Reading], **extra: Any) -> dict[str, Any]:
    """The figures of one scenario from its polls (module doc)."""
    first, last = (readings[0], readings[-1]) if readings else (Reading(0.0), Reading(0.0))
    span = last.t - first.t
    holds, rollbacks = grew(first.holds, last.holds), grew(first.rollbacks, last.rollbacks)
    deltas = grew(first.deltas, last.deltas)
    out: dict[str, Any] = {
        "name": scenario.name, "kind": scenario.kind, "seconds": round(span, 1),
        "holds": None if holds is None else int(holds),
        "rollbacks": None if rollbacks is None else int(rollbacks),
        "held_s": round(held_seconds(readings), 1),
        "deltas_per_s": None if deltas is None or span <= 0 else round(deltas / span, 3),
        "scored": grew(first.scored, last.scored),
    }
    if scenario.kind == "regression":
        out["first_hold"] = caught_after(readings, "holds")
        out["first_rollback"] = caught_after(readings, "rollbacks")
        out["bad_rows"] = last.bad_rows
    out.update(extra)
    return out


def benign_rates(results: list[dict[str, Any]]) -> dict[str, Any]:
    """False holds and rollbacks (and per hour) over the benign scenarios."""
    benign = [r for r in results if r["kind"] == "benign"]
    seconds = sum(r["seconds"] for r in benign)
    known = [r for r in benign if r["holds"] is not None and r["rollbacks"] is not None]
    holds = sum(r["holds"] for r in known) if known else None
    rollbacks = sum(r["rollbacks"] for r in known) if known else None
    return {"seconds": round(seconds, 1), "holds": holds, "rollbacks": rollbacks,
            "held_s": round(sum(r["held_s"] for r in benign), 1),
            "holds_per_hour": per_hour(holds, seconds),
            "rollbacks_per_hour": per_hour(rollbacks, seconds)}


def _caught(c: dict[str, Any] | None) -> str:
    if c is None:
        return "not caught"
    rows = "?" if c["rows"] is None else f"{c['rows']}"
    return f"{rows} rows, {c['seconds']:.0f} s"


def table(results: list[dict[str, Any]], rates: dict[str, Any]) -> str:
    """The run as the table printed at the end."""
    def n(v: Any, fmt: str = "d") -> str:
        return "?" if v is None else format(v, fmt)

    lines = [f"{'scenario':<15} {'kind':<10} {'s':>5} {'holds':>5} {'rollb':>5} {'held s':>6} "
             f"{'deltas/s':>8}  {'first hold':<20} {'first rollback':<20}"]
    for r in results:
        hold = _caught(r["first_hold"]) if r["kind"] == "regression" else ""
        if r.get("started_held") and r["first_hold"] is None:
            hold = "held from the start"
        back = _caught(r["first_rollback"]) if r["kind"] == "regression" else ""
        lines.append(f"{r['name']:<15} {r['kind']:<10} {r['seconds']:>5.0f} {n(r['holds']):>5} "
                     f"{n(r['rollbacks']):>5} {r['held_s']:>6.0f} "
                     f"{n(r['deltas_per_s'], '.2f'):>8}  {hold:<20} {back:<20}")
    lines.append(f"benign: {rates['seconds'] / 60:.1f} min, holds {n(rates['holds'])} "
                 f"({n(rates['holds_per_hour'], '.1f')}/h), rollbacks {n(rates['rollbacks'])} "
                 f"({n(rates['rollbacks_per_hour'], '.1f')}/h), held {rates['held_s']:.0f} s")
    return "\n".join(lines)


def not_up(answers: dict[str, bool]) -> str | None:
    """The refusal when a service of the stack did not answer its /health (None: all up)."""
    down = [name for name, ok in answers.items() if not ok]
    if not down:
        return None
    return (f"the stack is not up: {', '.join(down)} did not answer /health; start it with "
            "`streamrec up` (default ports) and run the benchmark again")


def main(argv: list[str] | None = None) -> int:
    from bench.guard_play import Context, health, play, warm_up
    from bench.harness import add_endpoint_args
    from bench.host import host
    from streamrec.settings import load_settings

    s = load_settings()
    p = argparse.ArgumentParser(prog="streamrec bench guard", description=__doc__,
                                epilog=SCENARIOS, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--minutes-per-scenario", type=float, default=DEFAULT_MINUTES,
                   help=f"minutes of each scenario (default {DEFAULT_MINUTES:g}: the benign "
                   f"ones total {BENIGN_MINUTES:g})")
    p.add_argument("--only", help="comma-separated scenarios to play (default: all)")
    p.add_argument("--rate", type=float, default=300.0, help="live events/s (default 300)")
    p.add_argument("--high-rate", type=float, default=2000.0,
                   help="events/s of the rate step (default 2000)")
    p.add_argument("--replay-log", type=Path, help="NDJSON log to replay (default: the "
                   "simulator writes --replay-events events from 2024)")
    p.add_argument("--replay-events", type=int, default=20_000)
    p.add_argument("--new-items", type=int, default=10,
                   help="never-seen items of the new catalogue timed until recommendable")
    p.add_argument("--regression-rows", type=int, default=3000,
                   help="bad rows a regression sends at most (default 3000)")
    p.add_argument("--poison-share", type=float, default=0.3,
                   help="share of bad rows of the poisoned and bot scenarios (default 0.3)")
    p.add_argument("--warmup", type=float, default=60.0,
                   help="seconds of live traffic before the scenarios (default 60)")
    p.add_argument("--warmup-timeout", type=float, default=300.0,
                   help="then wait at most this long for a served version and the guard's "
                   f"healthy figure, not holding (exit {WARMUP_FAILED} past it)")
    add_endpoint_args(p, s)
    p.add_argument("--json", type=Path)
    args = p.parse_args(argv)
    plan = schedule(args.minutes_per_scenario, args.only.split(",") if args.only else None)

    refusal = not_up({name: health(url) for name, url in (
        ("ingest", args.ingest), ("serving", args.serving), ("trainer", args.trainer))})
    if refusal:
        print(refusal, file=sys.stderr)
        return NOT_UP
    ctx = Context(args, s)
    failure = warm_up(ctx)
    if failure:
        print(failure, file=sys.stderr)
        return WARMUP_FAILED
    results = []
    try:
        for n, sc in enumerate(plan, 1):
            print(f"[{n}/{len(plan)}] {sc.name} ({sc.kind}, {sc.seconds:.0f} s)", flush=True)
            r = play(ctx, sc)
            results.append(r)
            print(f"  {sc.name}: holds {r['holds']}, rollbacks {r['rollbacks']}, held "
                  f"{r['held_s']:.0f} s, {r['deltas_per_s']} deltas/s", flush=True)
    finally:
        ctx.live.stop()
    rates = benign_rates(results)
    print(table(results, rates))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({
            "scenarios": results, "benign": rates,
            "regressions": {r["name"]: {k: r.get(k) for k in (
                "first_hold", "first_rollback", "bad_rows", "resumed_after_s")}
                for r in results if r["kind"] == "regression"},
            "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
            "click_rate": round(ctx.click_rate, 1), "host": host()}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
