"""The dashboard's cluster panel: the trainer cluster's per-role series, read from the
trainer's ``/metrics`` (``model/cluster/metrics.py`` exports them, labelled ``role`` /
``index``; a one-process trainer has none, and the panel stays hidden).

:func:`cluster_figures` picks one scrape's cumulative figures; :func:`cluster_view` turns the
newest scrape and an older one into the panel's JSON (``GET /stats`` ``cluster``): per role
its rows, bytes and bytes/s, steps and mean step time over the window; the chief's time per
step and its waits (mean ms and share of the window's wall time).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from streamrec import metric_names as names

Labels = tuple[tuple[str, str], ...]
Samples = dict[tuple[str, Labels], float]

_ORDER = {"chief": 0, "ps": 1, "worker": 2}
#: (name in the view, histogram family) of the chief's timings
_CHIEF_TIMES = (
    ("schedule", names.CLUSTER_SCHEDULE_SECONDS),
    ("fetch", names.CLUSTER_WAIT_SECONDS),
    ("join", names.CLUSTER_WAIT_SECONDS),
    ("samples", names.TRAINER_FETCH_WAIT_SECONDS),
)


@dataclass
class ClusterFigures:
    """One scrape: the roles (``chief-0``, ``ps-1``, ...) and cumulative figures per role."""

    roles: list[dict[str, str]] = field(default_factory=list)
    rows: dict[str, dict[str, float]] = field(default_factory=dict)
    counters: dict[str, float] = field(default_factory=dict)
    gauges: dict[str, float] = field(default_factory=dict)


def _role(labels: dict[str, str]) -> str:
    return f"{labels.get('role', '?')}-{labels.get('index', '0')}"


def cluster_figures(samples: Samples) -> ClusterFigures | None:
    """The cluster's figures of one trainer scrape; None for a one-process trainer."""
    out = ClusterFigures()
    for (name, labels), value in samples.items():
        lab = dict(labels)
        if name == names.CLUSTER_ROLE:
            out.roles.append({"id": _role(lab), "role": lab.get("role", "?"),
                              "index": lab.get("index", "0"), "address": lab.get("address", "")})
        elif name in (names.CLUSTER_SHARD_ROWS, names.CLUSTER_ADMITTED_ROWS):
            out.rows.setdefault(_role(lab), {})[lab.get("table", "?")] = value
        elif name == f"{names.CLUSTER_SENT_BYTES}_total":
            out.counters[f"{_role(lab)}:sent"] = value
        elif name == f"{names.CLUSTER_RECEIVED_BYTES}_total":
            out.counters[f"{_role(lab)}:received"] = value
        elif name in (f"{names.CLUSTER_STEP_SECONDS}_count", f"{names.CLUSTER_STEP_SECONDS}_sum"):
            out.counters[f"{_role(lab)}:step_{name.rsplit('_', 1)[1]}"] = value
        elif name == names.CLUSTER_STEPS_IN_FLIGHT:
            out.gauges["in_flight"] = value
        elif name == names.CLUSTER_SAMPLED:
            out.gauges["sampled_s"] = value
        else:
            for key, family in _CHIEF_TIMES:
                wait = lab.get("wait")
                if (family == names.CLUSTER_WAIT_SECONDS and wait != key) or not name.startswith(family):
                    continue
                suffix = name[len(family):]
                if suffix in ("_count", "_sum"):
                    out.counters[f"chief-0:{key}{suffix}"] = value
    if not out.roles:
        return None
    out.roles.sort(key=lambda r: (_ORDER.get(r["role"], 9), int(r["index"] or 0)))
    return out


def _delta(now: ClusterFigures, base: ClusterFigures | None, key: str) -> float | None:
    if base is None or key not in now.counters or key not in base.counters:
        return None
    d = now.counters[key] - base.counters[key]
    return d if d >= 0 else None


def _mean_ms(now: ClusterFigures, base: ClusterFigures | None, what: str) -> float | None:
    """Mean of a timing over the window (lifetime mean if no older scrape), in ms."""
    count, total = f"{what}_count", f"{what}_sum"
    dc, ds = _delta(now, base, count), _delta(now, base, total)
    if dc is None or ds is None or dc <= 0:
        dc, ds = now.counters.get(count), now.counters.get(total)
    return ds / dc * 1000.0 if dc and ds is not None else None


def cluster_view(now: ClusterFigures, base: ClusterFigures | None, dt_s: float) -> dict[str, Any]:
    """The panel's JSON: ``roles`` (one entry per role) and ``chief`` (its times and waits);
    rates and window means need ``base``, a scrape ``dt_s`` seconds older (else null)."""
    base = base if dt_s > 0 else None

    def rate(key: str) -> float | None:
        d = _delta(now, base, key)
        return d / dt_s if d is not None else None

    roles = []
    for r in now.roles:
        rid = r["id"]
        roles.append({
            **r,
            "rows": now.rows.get(rid),
            "sent_bytes": now.counters.get(f"{rid}:sent"),
            "received_bytes": now.counters.get(f"{rid}:received"),
            "sent_bps": rate(f"{rid}:sent"),
            "received_bps": rate(f"{rid}:received"),
            "steps": now.counters.get(f"{rid}:step_count"),
            "step_ms": _mean_ms(now, base, f"{rid}:step"),
        })
    chief: dict[str, Any] = {"in_flight": now.gauges.get("in_flight"),
                             "sampled_s": now.gauges.get("sampled_s")}
    for key, _ in _CHIEF_TIMES:
        chief[f"{key}_ms"] = _mean_ms(now, base, f"chief-0:{key}")
        waited = _delta(now, base, f"chief-0:{key}_sum")
        chief[f"{key}_share"] = waited / dt_s if waited is not None else None
    return {"roles": roles, "chief": chief}
