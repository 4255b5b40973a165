"""The rating simulator's item catalogue: categories that predict taste, tags, items that
arrive along the stream, the catalogue file read back by ``read_catalogue``, and the live
path posting each item before its first click."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest

from deploy.cli import main
from feature_store.catalogue import FeatureSpec
from stream.items import read_catalogue
from stream.simulate import (
    ClickSimulator,
    SimConfig,
    SimStats,
    catalogue_input,
    log_visits,
    rating_log,
    run,
    write_ndjson,
)

CATALOGUE = SimConfig(users=100, items=400, categories=8, new_item_share=0.3,
                      arrival_visits=1_500, seed=2)


def test_items_of_a_category_lie_closer_than_items_across() -> None:
    sim = ClickSimulator(CATALOGUE)
    cos = sim.item_vecs @ sim.item_vecs.T
    same = sim.item_category[:, None] == sim.item_category[None, :]
    np.fill_diagonal(same, False)
    across = ~same
    np.fill_diagonal(across, False)
    assert set(sim.item_category.tolist()) == set(range(CATALOGUE.categories))
    assert cos[same].mean() > 0.6 > 0.1 > abs(cos[across].mean())
    # Tags follow the category: a tag's items cluster in few categories.
    tag_share = []
    for t in range(CATALOGUE.tags):
        cats = [int(sim.item_category[i]) for i, tags in enumerate(sim.item_tags) if t in tags]
        if len(cats) >= 5:
            tag_share.append(np.bincount(cats).max() / len(cats))
    assert np.mean(tag_share) > 2.0 / CATALOGUE.categories
    assert all(1 <= len(tags) <= CATALOGUE.max_tags for tags in sim.item_tags)


def test_new_items_are_never_shown_or_clicked_before_their_introduction() -> None:
    sim = ClickSimulator(CATALOGUE)
    pending = {sim.item_id(i) for i in range(CATALOGUE.items)} - {
        sim.item_id(i) for i in sim.introduced
    }
    assert len(pending) == 120
    events = list(rating_log(sim, 20_000, impressions=True))
    intro = {sim.item_id(i): ts for i, ts in sim.introduced.items()}
    assert pending <= set(intro)  # the whole schedule fits in the log
    for e in events:
        assert e["ts"] >= intro[e["item_id"]], e
    clicked_new = {e["item_id"] for e in events if e["event_type"] == "click"} & pending
    assert len(clicked_new) > 30  # they do get clicked once introduced
    times = [intro[i] for i in pending]
    assert min(times) > events[0]["ts"] and len(set(times)) > 100  # spread along the stream


def test_catalogue_file_reads_back_with_the_default_spec(tmp_path: Path) -> None:
    sim = ClickSimulator(CATALOGUE)
    list(rating_log(sim, 3_000))
    path = tmp_path / "items.ndjson"
    write_ndjson(path, (catalogue_input(r) for r in sim.catalogue()))
    back = list(read_catalogue(path, spec=FeatureSpec()))
    assert back == sim.catalogue()
    assert {tuple(r) for r in back} == {("item_id", "attributes", "ts", "deleted")}
    assert all(set(r["attributes"]) == {"category", "tags"} for r in back)
    assert sum(r["ts"] == 0 for r in back) == 280
    arrived = [r["ts"] for r in back if r["ts"]]
    assert arrived == sorted(arrived) and arrived


def test_new_items_without_categories_have_no_attributes() -> None:
    sim = ClickSimulator(SimConfig(items=50, new_item_share=0.2, arrival_visits=10))
    for t in range(20):
        sim.step(1_700_000_000_000 + t)
    assert len(sim.catalogue()) == 50
    assert {str(r["attributes"]) for r in sim.catalogue()} == {"{}"}


def test_bad_catalogue_options_are_refused() -> None:
    with pytest.raises(ValueError):
        SimConfig(new_item_share=1.0)
    with pytest.raises(ValueError):
        SimConfig(categories=-1)


def test_log_visits_spreads_arrivals_over_the_log() -> None:
    config = SimConfig()
    assert log_visits(config, 30_000) == 20_000
    assert log_visits(config, 11_500, impressions=True) == 1_000


class FakeClient:
    def __init__(self) -> None:
        self.calls: list[tuple[str, list[dict[str, Any]]]] = []

    def upsert_items(self, items: list[dict[str, Any]]) -> None:
        self.calls.append(("items", list(items)))

    def send(self, events: list[dict[str, Any]]) -> Any:
        self.calls.append(("events", list(events)))
        return type("Sent", (), {"retries": 0})()


def test_live_run_posts_each_item_before_its_first_event() -> None:
    sim = ClickSimulator(SimConfig(users=50, items=200, categories=5, new_item_share=0.3,
                                   arrival_visits=300, seed=4))
    fake = FakeClient()
    batches: list[SimStats] = []
    clock = iter(range(1_700_000_000_000, 1_800_000_000_000, 7))
    stats = run(sim, "http://unused", 1e9, batch=50, client=fake, clock_ms=lambda: next(clock),
                on_batch=batches.append, should_stop=lambda: len(batches) >= 80)
    posted: dict[str, dict[str, Any]] = {}
    for kind, records in fake.calls:
        if kind == "items":
            for r in records:
                posted[r["item_id"]] = r
        else:
            assert all(e["item_id"] in posted for e in records)
    kind, first = fake.calls[0]
    # The start's items first, without ts (the API stamps receipt), then the batch's arrivals.
    assert kind == "items" and len(first) >= 140
    assert not any("ts" in r for r in first[:140]) and all("ts" in r for r in first[140:])
    assert len(posted) == stats.items == 200
    assert all(set(r["attributes"]) == {"category", "tags"} for r in posted.values())
    late = [r for r in posted.values() if "ts" in r]
    assert len(late) == 60 and all(r["ts"] >= 1_700_000_000_000 for r in late)


def test_live_run_without_a_catalogue_posts_no_items() -> None:
    fake = FakeClient()
    batches: list[SimStats] = []
    run(ClickSimulator(SimConfig(items=100)), "http://unused", 1e9, batch=20, client=fake,
        on_batch=batches.append, should_stop=lambda: len(batches) >= 3)
    assert [kind for kind, _ in fake.calls] == ["events"] * 3


def test_cli_writes_the_log_and_the_catalogue(tmp_path: Path) -> None:
    log, items = tmp_path / "log.ndjson", tmp_path / "items.ndjson"
    argv = ["simulate", "--to-file", str(log), "--items-file", str(items), "--events", "2000",
            "--users", "80", "--items", "300", "--categories", "6", "--new-item-share", "0.2"]
    assert main(argv) == 0
    events = [orjson.loads(line) for line in log.read_bytes().splitlines()]
    catalogue = {r["item_id"]: r for r in read_catalogue(items)}
    assert len(events) == 2000 and len(catalogue) > 280
    assert all(e["ts"] >= catalogue[e["item_id"]]["ts"] for e in events)
    assert sum(r["ts"] > 0 for r in catalogue.values()) > 40


def test_cli_refuses_catalogue_options_it_cannot_honour(tmp_path: Path) -> None:
    log, items = str(tmp_path / "log.ndjson"), str(tmp_path / "items.ndjson")
    assert main(["simulate", "--items-file", items]) == 2
    assert main(["simulate", "--mode", "session", "--to-file", log, "--events", "5",
                 "--items-file", items]) == 2
    assert main(["simulate", "--to-file", log, "--events", "5", "--new-item-share", "1.5"]) == 2
