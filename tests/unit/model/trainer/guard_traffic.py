"""Hand-made scored heads for the quality guard's unit tests (``model.trainer.guard_rule``).

:class:`Traffic` yields :class:`ScoredRows` as the evaluation gives them: returning users
with histories, targets ranked near the top (a tail of ``tail`` ranked anywhere), Recall@10
hits from the ranks, each target's rarity as the traffic's own draws give it (rarely rarer than
every item of the recent targets) or as uniformly random items give it (often); and the shifts and
regressions the guard must tell apart."""

from __future__ import annotations

import numpy as np

from model.trainer.guard_rule import Guard
from model.trainer.rolling import ScoredRows

CANDIDATES = 2000
BOT_USER, BOT_ITEM = 9_999_999, 8_888_888


class Traffic:
    """Scored heads of a steady stream, and of its shifts (module doc)."""

    def __init__(self, seed: int, users: int = 500, tail: float = 0.05) -> None:
        self.rng = np.random.default_rng(seed)
        self.users, self.tail = users, tail
        self.next_user = 1_000_000
        self.clock = 0
        #: The served state's ranks of the last rows' targets (the guard's ``served``).
        self.served: np.ndarray | None = None

    def rows(self, n: int, *, random_share: float = 0.0, broken: bool = False,
             bot_share: float = 0.0, new_users: bool = False, served_better: float = 0.0,
             tail: float | None = None) -> ScoredRows:
        rng = self.rng
        if new_users:
            users = np.arange(self.next_user, self.next_user + n, dtype=np.int64)
            self.next_user += n
        else:
            users = rng.integers(1, self.users + 1, n).astype(np.int64)
        items = rng.integers(1, CANDIDATES + 1, n).astype(np.int64)
        ranks = np.minimum(rng.geometric(0.08, n) - 1, CANDIDATES - 1)
        anywhere = rng.random(n) < (self.tail if tail is None else tail)
        random = rng.random(n) < random_share
        anywhere |= random
        ranks = np.where(anywhere, rng.integers(0, CANDIDATES, n), ranks)
        # a random item is rarer than every item of the recent targets half the time; the
        # traffic's own target one time in 21
        rarity = np.where(random, 0.6 + 0.8 * rng.random(n), 1.05 * rng.random(n))
        history = rng.integers(1, CANDIDATES + 1, (n, 5)).astype(np.int64)
        if new_users or broken:
            history[:] = 0
        bot = rng.random(n) < bot_share
        users[bot], items[bot], ranks[bot] = BOT_USER, BOT_ITEM, 0
        history[bot] = BOT_ITEM
        hits = (ranks < 10).astype(np.float64)
        flip = (rng.random(n) < served_better) & (hits == 0)
        self.served = np.where(flip, 0, ranks)
        self.clock += n
        times = self.clock + np.arange(n, dtype=np.int64)
        return ScoredRows(hits, ranks, CANDIDATES, users, items, history, times, rarity)

    def feed(self, guard: Guard, rows: int, head: int = 32, **shift: float | bool) -> None:
        for _ in range(rows // head):
            guard.observe(self.rows(head, **shift))  # type: ignore[arg-type]


def paired(guard: Guard, traffic: Traffic) -> Guard:
    """``guard`` with the traffic's served ranks as its served state's."""
    guard.served = lambda rows: traffic.served
    return guard


def healthy(guard: Guard, traffic: Traffic, publications: int = 200) -> None:
    """Publications every 64 rows of the steady stream (a full version every tenth) until
    the references are set."""
    for i in range(publications):
        traffic.feed(guard, 64)
        d = guard.check()
        assert d.publishes, d
        guard.published(f"v{i}" if i % 10 == 0 else f"v{i - i % 10}#{i % 10}", full=i % 10 == 0)
    assert guard.reference is not None
    assert guard.detectors["unexplained"].p0 is not None
