"""End to end: events in over HTTP, seconds later better recommendations out.

A population of users with two planted tastes (group A clicks only items a*, group B only
items b*) is posted to the ingest API; the Flink job turns events into features and samples,
the trainer publishes versions, and serving hot-swaps them. Then a brand-new user clicks three
A items: within a deadline their recommendations exclude what they saw and are dominated by
the other A items. Every request to either API must succeed; the model version must advance
at least twice.
"""

from __future__ import annotations

import random
import threading
from typing import Any

import httpx
import pytest

from streamrec.settings import Settings
from tests.support import wait_until

pytestmark = pytest.mark.e2e

N_ITEMS = 40  # per group
N_USERS = 60  # per group


def _population(rng: random.Random, t0_ms: int) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = []
    for group in ("a", "b"):
        for u in range(N_USERS):
            for j in range(12):
                item = f"{group}{rng.randrange(N_ITEMS)}"
                ts = t0_ms + (u * 12 + j) * 10
                events.append({"user_id": f"pop-{group}{u}", "item_id": item,
                               "event_type": "click", "ts": ts})
    rng.shuffle(events)
    return events


class Client:
    """Counts every answer; any non-2xx is a failure of the pipeline."""

    def __init__(self, base: str) -> None:
        self.http = httpx.Client(base_url=base, timeout=30.0)
        self.failures: list[str] = []
        self.lock = threading.Lock()

    def call(self, method: str, url: str, **kw: Any) -> httpx.Response:
        resp = self.http.request(method, url, **kw)
        if resp.status_code >= 300:
            with self.lock:
                self.failures.append(f"{method} {url} -> {resp.status_code} {resp.text[:200]}")
        return resp


def test_new_user_recommendations_follow_their_clicks(pipeline: Settings) -> None:
    s = pipeline
    ingest = Client(f"http://127.0.0.1:{s.ingest.port}")
    serving = Client(f"http://127.0.0.1:{s.serving.port}")
    rng = random.Random(11)
    t0_ms = 1_764_000_000_000

    events = _population(rng, t0_ms)
    for i in range(0, len(events), 500):
        resp = ingest.call("POST", "/events", json=events[i:i + 500])
        assert resp.status_code == 202, resp.text

    def version() -> str | None:
        return serving.call("GET", "/model").json().get("version")

    first = wait_until(version, 240, "a first model version to be served")

    # The new user: three A clicks, after the population in event time.
    seen = ["a1", "a2", "a3"]
    new_user = f"new-{rng.randrange(10**9)}"
    resp = ingest.call("POST", "/events", json=[
        {"user_id": new_user, "item_id": item, "event_type": "click", "ts": t0_ms + 10**6 + k}
        for k, item in enumerate(seen)])
    assert resp.status_code == 202

    # Keep the population clicking so the trainer keeps learning and publishing versions.
    more: list[dict[str, Any]] = []
    rounds = [2]
    versions = {first}
    last: dict[str, Any] = {}

    def reflects_the_user() -> dict[str, Any] | None:
        if not more:
            more.extend(_population(rng, t0_ms + rounds[0] * 10**6))
            rounds[0] += 1
        ingest.call("POST", "/events", json=[more.pop() for _ in range(min(500, len(more)))])
        v = version()
        if v:
            versions.add(v)
        answer = serving.call("GET", "/recommend", params={"user_id": new_user, "k": 10}).json()
        last.update(answer, versions=len(versions))
        items = [it["item_id"] for it in answer["items"]]
        share_a = sum(i.startswith("a") for i in items) / max(1, len(items))
        if answer["source"] == "model" and share_a >= 0.8 and len(versions) >= 3:
            return answer
        return None

    try:
        answer = wait_until(reflects_the_user, 300, "the new user's recommendations to reflect "
                            "their clicks and the model version to advance twice", interval_s=0.5)
    except AssertionError as exc:
        raise AssertionError(f"{exc}; last answer: {last}") from None
    items = [it["item_id"] for it in answer["items"]]
    assert not set(items) & set(seen), "items the user already clicked must be excluded"
    assert len(items) == 10
    assert len(versions) >= 3
    assert ingest.failures == [] and serving.failures == []
