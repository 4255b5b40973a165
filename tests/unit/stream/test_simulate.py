"""The simulators: schema, determinism, clicks that follow tastes (rating mode), and the
statistics of session mode (session length, re-click share, transition strength)."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest

from stream.simulate import (
    ClickSimulator,
    SessionConfig,
    SessionSimulator,
    SimConfig,
    simulated_log,
    write_ndjson,
)


def test_events_are_wire_shaped_and_deterministic_per_seed() -> None:
    a = ClickSimulator(SimConfig(seed=3)).step(1_700_000_000_000)
    b = ClickSimulator(SimConfig(seed=3)).step(1_700_000_000_000)
    assert a == b and a
    for e in a:
        assert set(e) == {"user_id", "item_id", "event_type", "ts"}
        assert e["event_type"] in {"impression", "click"}
    assert len({e["user_id"] for e in a}) == 1  # one visit = one user


def test_clicks_follow_the_latent_tastes() -> None:
    sim = ClickSimulator(SimConfig(users=50, items=300, seed=5, drift=0.0))
    affinity_clicked, affinity_shown = [], []
    for t in range(3000):
        for e in sim.step(t):
            u = int(e["user_id"].removeprefix("sim-u"))
            i = int(e["item_id"].removeprefix("sim-i"))
            score = float(sim.item_vecs[i] @ sim.tastes[u])
            (affinity_clicked if e["event_type"] == "click" else affinity_shown).append(score)
    assert len(affinity_clicked) > 100
    # Clicked items are much closer to the user's taste than the items merely shown.
    assert np.mean(affinity_clicked) > np.mean(affinity_shown) + 0.3


def _sessions(events: list[dict[str, object]]) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {}
    for e in events:
        out.setdefault(str(e["user_id"]), []).append(int(str(e["item_id"]).removeprefix("sim-i")))
    return out


def test_session_mode_statistics() -> None:
    config = SessionConfig(items=500, concurrent=20, seed=4)
    sim = SessionSimulator(config)
    events = [sim.click(1_700_000_000_000 + t) for t in range(60_000)]
    assert all(e["event_type"] == "click" for e in events)
    sessions = _sessions(events)
    # Sessions still open at the end are cut short; the others have their drawn length.
    lengths = np.array([len(s) for s in sessions.values()])
    assert lengths.max() <= config.max_length
    assert np.mean(lengths >= config.min_length) > 0.99
    assert abs(lengths.mean() - config.mean_length) < 0.5  # capping trims the mean a little
    assert len(sessions) > 60_000 / config.max_length
    reclicks = later = follows = moves = 0
    for clicks in sessions.values():
        for k in range(1, len(clicks)):
            later += 1
            if clicks[k] in clicks[:k]:
                reclicks += 1
                continue
            moves += 1
            follows += clicks[k] in sim.successors[clicks[k - 1]]
    # A transition or a jump may land on an earlier click too: slightly above `reclick`.
    assert config.reclick <= reclicks / later < config.reclick + 0.05
    # Moves to a new item follow the transition matrix with probability `follow`, plus the
    # jumps that land on a successor by chance (5 of 500 items, popularity-weighted).
    share = follows / moves
    assert config.follow - 0.03 < share < config.follow + 0.08, share
    assert len(np.unique(sim.successors, axis=None)) > 0.9 * config.items  # spans the catalogue


def test_session_mode_is_deterministic_per_seed_and_new_users_per_session() -> None:
    a = list(simulated_log("session", 500, seed=3))
    b = list(simulated_log("session", 500, seed=3))
    c = list(simulated_log("session", 500, seed=4))
    assert a == b and a != c
    assert all(str(e["user_id"]).startswith("sess-") for e in a)
    assert [e["ts"] for e in a] == sorted(e["ts"] for e in a)
    assert len({e["ts"] for e in a}) == len(a)  # strictly increasing event times


def test_rating_mode_log_keeps_clicks_unless_impressions_are_asked_for() -> None:
    clicks = list(simulated_log("rating", 300, seed=2))
    assert len(clicks) == 300 and {e["event_type"] for e in clicks} == {"click"}
    everything = list(simulated_log("rating", 300, seed=2, impressions=True))
    assert {e["event_type"] for e in everything} == {"impression", "click"}
    assert list(simulated_log("rating", 300, seed=2)) == clicks
    with pytest.raises(ValueError):
        list(simulated_log("other", 3))


def test_written_log_is_read_by_the_ndjson_replay_reader(tmp_path: Path) -> None:
    from model.evaluation.replay import load_stream
    from streamrec.settings import FeatureSettings

    path = tmp_path / "sim.ndjson"
    assert write_ndjson(path, simulated_log("session", 400, seed=1)) == 400
    again = tmp_path / "again.ndjson"
    write_ndjson(again, simulated_log("session", 400, seed=1))
    assert path.read_bytes() == again.read_bytes()
    stream, report = load_stream([path], "ndjson", FeatureSettings(), now_ms=1_800_000_000_000)
    assert report["rejected"] == 0 and stream.events == 400
    assert len(stream.positives) == 400  # every session event is a click


@pytest.mark.parametrize(
    ("kwargs", "digest"),
    [
        ({"mode": "rating", "events": 3000, "seed": 1}, "6b00d6d857514e8b"),
        ({"mode": "rating", "events": 3000, "seed": 2, "impressions": True, "users": 50,
          "items": 300}, "52c94b707932648e"),
        ({"mode": "session", "events": 2000, "seed": 1}, "92e0a77988d7c56a"),
    ],
)
def test_default_logs_are_pinned(kwargs: dict[str, Any], digest: str) -> None:
    """The catalogue options off (the default), a log is byte for byte what it always was:
    benchmarks and recorded figures stay comparable."""
    raw = b"".join(orjson.dumps(e) + b"\n" for e in simulated_log(**kwargs))
    assert hashlib.sha256(raw).hexdigest()[:16] == digest
