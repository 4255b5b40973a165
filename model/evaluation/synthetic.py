"""A synthetic ``samples`` stream with planted preferences (tests and benchmarks).

Users and items are split into ``clusters``; a user picks, with probability ``affinity``,
an item of their own cluster (Zipf-distributed within the cluster) and otherwise an item
from the global Zipf popularity. A model that learns the user -> cluster structure beats
the popularity baseline by a wide margin; popularity alone cannot.

The generator keeps each user's history (most recent first, strictly before the sample)
exactly as the Flink joiner does, and takes the event-time origin as an argument (no clock).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from feature_store.features import Sample

EVENT_TYPES = ("click", "like", "add_to_cart", "purchase")
EVENT_PROBS = (0.8, 0.1, 0.06, 0.04)
EVENT_WEIGHTS = {"click": 1.0, "like": 2.0, "add_to_cart": 3.0, "purchase": 5.0}


@dataclass(frozen=True)
class SyntheticConfig:
    users: int = 2000
    items: int = 1000
    clusters: int = 20
    affinity: float = 0.9
    zipf: float = 1.05
    history_len: int = 50
    seed: int = 0
    start_ms: int = 1_767_225_600_000  # 2026-01-01T00:00:00Z
    step_ms: int = 10


class SyntheticStream:
    """Deterministic (given the seed) stream of :class:`model.trainer.samples.Sample`."""

    def __init__(self, config: SyntheticConfig | None = None, prefix: str = "") -> None:
        self.config = cfg = config or SyntheticConfig()
        self.prefix = prefix
        self.rng = np.random.default_rng(cfg.seed)
        self.user_cluster = self.rng.integers(0, cfg.clusters, cfg.users)
        item_cluster = self.rng.integers(0, cfg.clusters, cfg.items)
        ranks = self.rng.permutation(cfg.items) + 1
        pop = 1.0 / ranks.astype(np.float64) ** cfg.zipf
        self.global_p = pop / pop.sum()
        self.cluster_items = [np.flatnonzero(item_cluster == c) for c in range(cfg.clusters)]
        self.global_cdf = np.cumsum(self.global_p)
        self.cluster_cdf = [np.cumsum(pop[idx] / pop[idx].sum()) for idx in self.cluster_items]
        self.event_cdf = np.cumsum(EVENT_PROBS)
        self.histories: dict[int, deque[str]] = {}
        self.count = 0

    def item_id(self, j: int) -> str:
        return f"{self.prefix}i{j}"

    def user_id(self, u: int) -> str:
        return f"{self.prefix}u{u}"

    def next(self) -> Sample:
        cfg = self.config
        u = int(self.rng.integers(0, cfg.users))
        c = int(self.user_cluster[u])
        r_pick, r_item, r_event = self.rng.random(3)
        members = self.cluster_items[c]
        if r_pick < cfg.affinity and members.size:
            j = int(members[min(np.searchsorted(self.cluster_cdf[c], r_item), members.size - 1)])
        else:
            j = min(int(np.searchsorted(self.global_cdf, r_item)), cfg.items - 1)
        event = EVENT_TYPES[min(int(np.searchsorted(self.event_cdf, r_event)), len(EVENT_TYPES) - 1)]
        hist = self.histories.setdefault(u, deque(maxlen=cfg.history_len))
        item = self.item_id(j)
        sample = Sample(
            sample_id=f"{self.prefix}s{self.count}",
            user_id=self.user_id(u),
            item_id=item,
            event_type=event,
            weight=EVENT_WEIGHTS[event],
            ts_ms=cfg.start_ms + self.count * cfg.step_ms,
            history=tuple(hist),
        )
        hist.appendleft(item)
        self.count += 1
        return sample

    def take(self, n: int) -> list[Sample]:
        return [self.next() for _ in range(n)]

    def __iter__(self) -> Iterator[Sample]:
        while True:
            yield self.next()
