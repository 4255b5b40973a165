"""The live demo: simulated traffic into the running stack, and a status line every 2 s.

The simulator (``stream.simulate``) posts impressions and clicks to the ingest API; a small
probe asks the serving API for recommendations of simulated users; both go through
``streamrec.client``, as a user's code would. Each status line shows:
events/s accepted by ingest, samples/s on the ``samples`` topic, examples/s trained, the served
model version (``+N``: with N deltas applied) and its age (of the last delta, if any), the
trainer's rolling test-then-train Recall@10, and the serving p99 latency seen by the probe
with the share of ``popular``/``degraded`` answers. With attribute slots
(``trainer.attr_tokens`` > 0) a new item is posted to the catalogue every
``NEW_ITEM_EVERY_S`` and a line tells when serving's catalog held it, never clicked.
"""

from __future__ import annotations

import logging
import random
import threading
import time
import urllib.error
import urllib.request
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import httpx

from streamrec import metric_names as names
from streamrec.client import Client, StreamrecError
from streamrec.settings import Settings

log = logging.getLogger(__name__)


def scrape(url: str, timeout_s: float = 2.0) -> dict[str, float]:
    """Prometheus text at ``url`` as {sample name + labels: value}; {} if unreachable."""
    from prometheus_client.parser import text_string_to_metric_families

    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as resp:  # noqa: S310 - loopback
            text = resp.read().decode()
    except (urllib.error.URLError, OSError):
        return {}
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            labels = ",".join(f"{k}={v}" for k, v in sorted(s.labels.items()))
            out[f"{s.name}{{{labels}}}" if labels else s.name] = float(s.value)
    return out


def samples_end_offset(settings: Settings) -> int | None:
    from kafka.errors import KafkaError

    from stream.kafka_client import topic_end_offsets

    try:
        ends = topic_end_offsets(settings.kafka, settings.kafka.samples_topic, timeout_s=4.0)
    except KafkaError:
        return None
    return int(sum(ends.values()))


@dataclass
class Probe:
    latencies_ms: deque[float] = field(default_factory=lambda: deque(maxlen=500))
    sources: deque[str] = field(default_factory=lambda: deque(maxlen=500))
    errors: int = 0

    def p99(self) -> float | None:
        if not self.latencies_ms:
            return None
        ordered = sorted(self.latencies_ms)
        return ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]

    def share(self, *sources: str) -> float:
        return sum(s in sources for s in self.sources) / max(1, len(self.sources))


def _probe_loop(serving: Client, users: int, probe: Probe, stop: threading.Event) -> None:
    rng = random.Random(7)
    while not stop.is_set():
        user = f"sim-u{rng.randrange(users)}"
        t0 = time.perf_counter()
        try:
            answer = serving.recommend(user, k=10)
        except (StreamrecError, httpx.HTTPError):
            probe.errors += 1
        else:
            probe.latencies_ms.append((time.perf_counter() - t0) * 1000)
            probe.sources.append(answer.source)
        stop.wait(0.1)


#: Seconds between the demo's new catalogue items.
NEW_ITEM_EVERY_S = 15.0
#: Categories the demo's new items are drawn from.
NEW_ITEM_CATEGORIES = ("books", "music", "garden", "toys", "kitchen")


def _new_items_loop(ingest: Client, serving_url: str, stop: threading.Event,
                    every_s: float = NEW_ITEM_EVERY_S, timeout_s: float = 30.0) -> None:
    """Post a never-seen item to the catalogue every ``every_s`` and print how long until
    serving's catalog holds it (a candidate of every request, before any click)."""
    n = 0
    while not stop.wait(every_s if n else 5.0):
        n += 1
        item = f"demo-new-{int(time.time())}-{n}"
        category = NEW_ITEM_CATEGORIES[n % len(NEW_ITEM_CATEGORIES)]
        t0 = time.monotonic()
        try:
            ingest.upsert_items([{"item_id": item, "attributes": {
                "category": category, "tags": ["new", category]}}])
        except StreamrecError as exc:
            print(f"new item {item}: not posted ({exc})", flush=True)
            continue
        while not stop.is_set() and time.monotonic() - t0 < timeout_s:
            try:
                held = httpx.get(f"{serving_url}/model/items/{item}", timeout=2.0).json()
            except (httpx.HTTPError, ValueError):
                held = {}
            if held.get("in_catalog"):
                print(f"new item {item} ({category}): recommendable "
                      f"{time.monotonic() - t0:.1f} s after POST /items, never clicked",
                      flush=True)
                break
            stop.wait(0.1)
        else:
            if not stop.is_set():
                print(f"new item {item}: not in serving's catalog after {timeout_s:.0f} s",
                      flush=True)


def _model(serving: Client) -> dict[str, Any]:
    try:
        return serving.model()
    except (StreamrecError, httpx.HTTPError):
        return {}


def served_model(model: dict[str, Any]) -> tuple[str, float | None]:
    """The served state as ``version`` or ``version+seq`` (deltas applied on top of it) and
    its age: of the last applied delta, else of the version."""
    delta = model.get("delta") or {}
    version = model.get("version") or "-"
    if delta.get("seq"):
        return f"{version}+{delta['seq']}", delta.get("lag_s")
    return version, model.get("age_s")


def run_demo(settings: Settings, rate: float, duration_s: float | None, users: int,
             items: int, interval_s: float = 2.0) -> int:
    from stream.simulate import ClickSimulator, SimConfig, run

    host = settings.stack.bind_host
    ingest = f"http://{host}:{settings.ingest.port}"
    serving = f"http://{host}:{settings.serving.port}"
    trainer = f"http://{host}:{settings.trainer.metrics_port}"
    key = settings.ingest.api_key.get_secret_value() if settings.ingest.api_key else None
    stop = threading.Event()
    probe = Probe()
    sim = ClickSimulator(SimConfig(users=users, items=items))
    sim_thread = threading.Thread(
        target=run, name="simulator", daemon=True,
        args=(sim, ingest, rate),
        kwargs={"api_key": key, "duration_s": duration_s, "should_stop": stop.is_set},
    )
    prober = Client(None, serving, timeout_s=5.0)
    status_client = Client(None, serving, timeout_s=2.0)
    probe_thread = threading.Thread(target=_probe_loop, args=(prober, users, probe, stop),
                                    name="probe", daemon=True)
    poster = Client(ingest, serving, api_key=key, timeout_s=5.0)
    new_items = threading.Thread(target=_new_items_loop, args=(poster, serving, stop),
                                 name="new-items", daemon=True)
    print(f"demo: {users} simulated users, {items} items, {rate:.0f} events/s -> {ingest}; "
          f"recommendations from {serving}; Ctrl-C stops (the stack keeps running).")
    sim_thread.start()
    probe_thread.start()
    if settings.trainer.attr_tokens:
        new_items.start()
    else:
        print("catalogue items are not in the model (trainer.attr_tokens is 0): no new-item "
              "lines", flush=True)
    t0 = time.monotonic()
    prev: dict[str, float] = {}
    prev_t = t0
    try:
        while duration_s is None or time.monotonic() - t0 < duration_s:
            stop.wait(interval_s)
            now = time.monotonic()
            dt = max(1e-6, now - prev_t)
            ing = scrape(f"{ingest}/metrics")
            trn = scrape(f"{trainer}/metrics")
            accepted = ing.get(names.INGEST_ACCEPTED_TOTAL)
            trained = trn.get(names.TRAINER_SAMPLES_TOTAL)
            samples = samples_end_offset(settings)
            model = _model(status_client)
            recall = trn.get(f"{names.TRAINER_QUALITY}{{metric=recall@10}}")
            pop = trn.get(f"{names.TRAINER_QUALITY}{{metric=popularity_recall@10}}")
            i2i = trn.get(f"{names.TRAINER_QUALITY}{{metric=item2item_recall@10}}")
            knn = trn.get(f"{names.TRAINER_QUALITY}{{metric=itemknn_recall@10}}")
            cur = {"accepted": accepted, "samples": samples, "trained": trained}

            def rate_of(name: str, now_vals: dict[str, Any] = cur,
                        before: dict[str, float] = prev, span: float = dt) -> str:
                if now_vals.get(name) is None or before.get(name) is None:
                    return "-"
                return f"{(now_vals[name] - before[name]) / span:,.0f}"

            p99 = probe.p99()
            served, age = served_model(model)
            print(
                f"[{now - t0:6.0f}s] events/s {rate_of('accepted'):>7}  samples/s "
                f"{rate_of('samples'):>6}  trained/s {rate_of('trained'):>7}  model "
                f"{served} age {f'{age:.0f}s' if age is not None else '-'}"
                f"  recall@10 {f'{recall:.3f}' if recall is not None else '-'}"
                f" (popularity {f'{pop:.3f}' if pop is not None else '-'}, item-to-item "
                f"{f'{i2i:.3f}' if i2i is not None else '-'}, item-kNN "
                f"{f'{knn:.3f}' if knn is not None else '-'})  serving p99 "
                f"{f'{p99:.1f}ms' if p99 is not None else '-'} popular/degraded "
                f"{probe.share('popular', 'degraded'):.0%}",
                flush=True,
            )
            prev = {k: v for k, v in cur.items() if v is not None}
            prev_t = now
    except KeyboardInterrupt:
        print("\ndemo stopped; the stack is still running (`streamrec down` stops it).")
    finally:
        stop.set()
        sim_thread.join(timeout=5)
        probe_thread.join(timeout=5)
        if new_items.is_alive():
            new_items.join(timeout=5)
        prober.close()
        poster.close()
        status_client.close()
    return 0
