"""What ``streamrec evaluate`` shows of a report: its table, and its figures over time as a plot.

Both read the document the command prints and writes as JSON (``EvalResult.report`` with
the command's additions); matplotlib is imported only by :func:`plot_over_time`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any


def table(doc: dict[str, Any]) -> str:
    keys = [k for k in doc if k.startswith(("recall@", "ndcg@"))]
    rows = [("model", doc)] + list(doc.get("side", {}).items()) + list(doc["baselines"].items())
    lines = [
        f"events {doc['events']}, scored {doc['scored']}, warm-up {doc['warmup']}, "
        f"exclude {doc['exclude']}, {doc['seconds']} s"
    ]
    lines.append(f"{'method':<20}" + "".join(f"{k:>12}" for k in keys))
    for name, figs in rows:
        lines.append(f"{name:<20}" + "".join(f"{figs[k]:>12.4f}" for k in keys))
    key = keys[0] if keys else "recall@10"
    if doc.get("ratio_to_popularity") is not None:
        lines.append(f"model / popularity {key}: {doc['ratio_to_popularity']:.2f}x")
    if doc.get("ratio_to_best") is not None:
        lines.append(
            f"model / best baseline ({doc['best_baseline']}) {key}: {doc['ratio_to_best']:.2f}x"
        )
    for group, figs in doc.get("by_history", {}).items():
        best = doc.get("best_baseline")
        line = f"users with {group:>3} earlier items: {figs['scored']:>6} scored, model {key} "
        line += f"{figs['model'][key]:.4f}"
        if best is not None:
            line += f", {best} {figs[best][key]:.4f}"
        lines.append(line)
    for codec, figs in doc.get("row_codecs", {}).items():
        change = figs["change_vs_float32"].get(key)
        lines.append(f"served-{codec} {key} vs served-float32: "
                     + ("n/a" if change is None else f"{100 * change:+.2f}%")
                     + f", {figs['delta_bytes_per_batch'] / 1e3:.1f} kB per delta")
    return "\n".join(lines)


def plot_over_time(doc: dict[str, Any], path: Path) -> None:
    """One panel per figure (Recall/NDCG @10/@20), one line per method, x = chunk end time."""
    from datetime import UTC, datetime

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keys = [k for k in doc if k.startswith(("recall@", "ndcg@"))]
    fig, axes = plt.subplots(len(keys), 1, figsize=(9, 2.6 * len(keys)), sharex=True)
    for ax, key in zip(axes, keys, strict=True):
        for name, chunks in doc["over_time"].items():
            x = [datetime.fromtimestamp(c["last_ts"] / 1000, UTC) for c in chunks]
            others = {**doc["baselines"], **doc.get("side", {})}
            overall = doc[key] if name == "model" else others[name][key]
            ax.plot(x, [c[key] for c in chunks], marker="o", label=f"{name} ({overall:.3f})")
        ax.set_ylabel(key)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8, loc="upper left")
    axes[-1].set_xlabel("event time (end of chunk)")
    fig.suptitle(f"test-then-train: {doc['scored']} scored of {doc['events']} events")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
