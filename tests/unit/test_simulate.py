"""The click simulator's events: schema, determinism, and that clicks follow tastes."""

from __future__ import annotations

import numpy as np

from stream.simulate import ClickSimulator, SimConfig


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
