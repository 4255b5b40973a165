"""The real-log panel: ``streamrec evaluate`` on every log of a folder, over several seeds.

Each (log, seed) runs as its own ``streamrec evaluate LOG --seed S --json F`` process (its own
runtime, peak memory and a fresh model), one after another. Per log: the model's Recall@10 and
NDCG@10 (median and lowest seed), every baseline (seed-independent; checked to agree), the
ratio to the best baseline, the towers alone, Recall@10 by history size (0, 1-4, 5+), seconds
and peak memory. Today's panel: ``docs/benchmarks.md#real-log-panel``; the full table and how
the baselines were tuned: ``docs/decisions.md#real-log-panel``.

    streamrec bench panel ../shared/data/real /tmp/ml100k --seeds 1,2,3 --json panel.json
    streamrec bench panel LOG.ndjson --seeds 1 -- --epochs 5   # after --: evaluate's options

A folder stands for its ``*.ndjson`` files (sorted by name); a file is taken as it is.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.host import host

_REPO = Path(__file__).resolve().parent.parent
KEY, NDCG = "recall@10", "ndcg@10"


def logs_of(paths: list[Path]) -> list[Path]:
    """The logs a list of files and folders names (a folder: its ``*.ndjson``, sorted)."""
    out: list[Path] = []
    for path in paths:
        if path.is_dir():
            out.extend(sorted(path.glob("*.ndjson")))
        elif path.exists():
            out.append(path)
        else:
            raise SystemExit(f"panel: {path} does not exist")
    if not out:
        raise SystemExit("panel: no logs found (a folder stands for its *.ndjson files)")
    return out


def run_one(log: Path, seed: int, extra: list[str]) -> dict[str, Any]:
    """One ``streamrec evaluate`` process: its JSON document, wall seconds, peak RSS."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "eval.json"
        cmd = [sys.executable, "-m", "deploy.cli", "evaluate", str(log), "--seed", str(seed),
               "--json", str(out), *extra]
        if log.suffix == ".ndjson" and "--format" not in extra:
            cmd[5:5] = ["--format", "ndjson"]
        started = time.monotonic()
        proc = subprocess.Popen(cmd, cwd=_REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        assert proc.stdout is not None
        output = proc.stdout.read()
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
        seconds = time.monotonic() - started
        if proc.returncode != 0 or not out.exists():
            raise SystemExit(f"panel: evaluate {log.name} seed {seed} failed "
                             f"(exit {proc.returncode}):\n{output.decode(errors='replace')[-3000:]}")
        doc = json.loads(out.read_text())
    doc.pop("over_time", None)
    return {"seed": seed, "doc": doc, "seconds": round(seconds, 1),
            "peak_rss_mb": round(usage.ru_maxrss / 1024, 1),
            "cpu_seconds": round(usage.ru_utime + usage.ru_stime, 1)}


def summarise(log: str, runs: list[dict[str, Any]]) -> dict[str, Any]:
    """One log's row of the panel (module doc) from its runs, one per seed."""
    docs = [r["doc"] for r in runs]
    base = docs[0]["baselines"]
    for doc in docs[1:]:
        for name, figs in doc["baselines"].items():
            if abs(figs[KEY] - base[name][KEY]) > 1e-12:
                raise SystemExit(f"panel: baseline {name} differs between seeds on {log}")
    best = max(base, key=lambda name: base[name][KEY])
    model = [d[KEY] for d in docs]
    ratios = [m / base[best][KEY] if base[best][KEY] else None for m in model]
    ndcg = [d[NDCG] for d in docs]
    side = [d.get("side", {}).get("model-tower", {}).get(KEY) for d in docs]
    groups: dict[str, Any] = {}
    for name in docs[0].get("by_history", {}):
        rows = [d["by_history"][name] for d in docs]
        groups[name] = {
            "scored": rows[0]["scored"],
            "model": statistics.median(r["model"][KEY] for r in rows),
            best: rows[0].get(best, {}).get(KEY),
        }
    return {
        "log": log,
        "events": docs[0]["events"],
        "scored": docs[0]["scored"],
        "seeds": [r["seed"] for r in runs],
        "model": {KEY: statistics.median(model), f"{KEY}_min": min(model),
                  f"{KEY}_per_seed": model, NDCG: statistics.median(ndcg), f"{NDCG}_min": min(ndcg)},
        "model_tower": {KEY: statistics.median(s for s in side if s is not None)
                        if any(s is not None for s in side) else None},
        "baselines": {name: {KEY: f[KEY], NDCG: f[NDCG]} for name, f in base.items()},
        "best_baseline": best,
        "ratio_to_best": statistics.median(r for r in ratios if r is not None)
        if any(r is not None for r in ratios) else None,
        "ratio_to_best_min": min((r for r in ratios if r is not None), default=None),
        "ndcg_ratio_to_best": (statistics.median(ndcg) / base[best][NDCG]
                               if base[best][NDCG] else None),
        "by_history": groups,
        "seconds": [r["seconds"] for r in runs],
        "cpu_seconds": [r["cpu_seconds"] for r in runs],
        "peak_rss_mb": max(r["peak_rss_mb"] for r in runs),
        "score_weights": [r["doc"].get("score_weights") for r in runs],
        "history_groups": [r["doc"].get("history_groups") for r in runs],
        "item_groups": [r["doc"].get("item_groups") for r in runs],
    }


def table(rows: list[dict[str, Any]]) -> str:
    """The panel as text: one block per log."""
    lines = []
    for row in rows:
        best = row["best_baseline"]
        lines.append(f"{row['log']}: {row['events']} events, {row['scored']} scored, "
                     f"seeds {row['seeds']}")
        m = row["model"]
        lines.append(f"  {'model':<22}{m[KEY]:>9.4f} (min {m[KEY + '_min']:.4f})   "
                     f"ndcg@10 {m[NDCG]:.4f}")
        if row["model_tower"][KEY] is not None:
            lines.append(f"  {'model-tower (alone)':<22}{row['model_tower'][KEY]:>9.4f}")
        for name, figs in sorted(row["baselines"].items(), key=lambda kv: -kv[1][KEY]):
            mark = " *" if name == best else ""
            lines.append(f"  {name:<22}{figs[KEY]:>9.4f}   ndcg@10 {figs[NDCG]:.4f}{mark}")
        ratio, low = row["ratio_to_best"], row["ratio_to_best_min"]
        if ratio is not None:
            lines.append(f"  model / {best}: Recall@10 {ratio:.3f}x (lowest seed {low:.3f}x), "
                         f"NDCG@10 {row['ndcg_ratio_to_best']:.3f}x")
        for name, g in row["by_history"].items():
            other = g.get(best)
            lines.append(f"  users with {name:>3} earlier items: {g['scored']:>6} scored, model "
                         f"{g['model']:.4f}" + ("" if other is None else f", {best} {other:.4f}"))
        lines.append(f"  seconds {row['seconds']}, cpu seconds {row['cpu_seconds']}, "
                     f"peak memory {row['peak_rss_mb']:.0f} MB")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    extra: list[str] = []
    if "--" in argv:
        at = argv.index("--")
        argv, extra = argv[:at], argv[at + 1:]
    p = argparse.ArgumentParser(prog="streamrec bench panel", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("paths", nargs="+", type=Path, metavar="PATH", help="log files or folders")
    p.add_argument("--seeds", default="1,2,3", help="model seeds, comma-separated")
    p.add_argument("--json", type=Path, default=None, help="write the panel as JSON")
    args = p.parse_args(argv)
    seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    logs = logs_of(args.paths)
    rows = []
    for log in logs:
        runs = []
        for seed in seeds:
            print(f"panel: {log.name} seed {seed} ...", file=sys.stderr, flush=True)
            runs.append(run_one(log, seed, extra))
        rows.append(summarise(log.name, runs))
        print(table(rows[-1:]), flush=True)
    result = {"evaluate_args": extra, "seeds": seeds, "logs": rows, "host": host()}
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
