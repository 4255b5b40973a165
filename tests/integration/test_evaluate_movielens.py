"""``streamrec evaluate`` on MovieLens latest-small: the model against its baselines.

No services needed (the evaluation runs in-process), but it loads TensorFlow and trains the
two-tower model on the whole file (100,836 ratings), so it lives with the integration tests.
The evaluation runs once per module; the tests read its ``--json`` report.

The floors below are Recall@10 ratios in the same run, a margin under what the defaults
measure (docs/decisions.md#score-mix): the model against popularity and against the best
baseline, and the towers' part of the learned mix on its own (``model-tower``) against
popularity and against item co-occurrence.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from deploy.cli import main
from tests.support import shared_data

pytestmark = pytest.mark.integration

RATINGS = shared_data() / "ml-latest-small" / "ratings.csv"
POSITIVES = 48_580  # ratings >= 4.0 in the file
#: Model / popularity (measured 2.19x, seed 7).
MIN_RATIO = 2.0
#: Model / the best baseline (item-kNN with popularity damping, tuned across the real-log
#: panel: measured 1.25x, seed 7; against the untuned session-kNN it was 1.39x).
MIN_BEST_RATIO = 1.15
#: The towers' part of the learned mix alone (``model-tower``) / popularity (measured
#: 1.64x, seed 7).
MIN_TOWERS_RATIO = 1.5
#: The towers' part alone / item co-occurrence (measured 1.15x, seed 7).
MIN_TOWERS_COOC_RATIO = 1.05
#: Ratings the two-stage ranking is checked on (measured there, seed 7: 0.1500 through the
#: index, one list probed, and 0.1500 ranking every candidate; 80% of the items scored).
ANN_LIMIT = 30_000


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    if not RATINGS.is_file():
        pytest.skip(f"{RATINGS} is not there")
    folder = tmp_path_factory.mktemp("evaluate")
    out, png = folder / "eval.json", folder / "eval.png"
    argv = ["evaluate", str(RATINGS), "--format", "movielens", "--json", str(out)]
    assert main([*argv, "--plot", str(png)]) == 0
    doc: dict[str, Any] = json.loads(out.read_text())
    doc["_png"] = png.read_bytes()
    return doc


def _ratio(doc: dict[str, Any]) -> float:
    popularity = doc["baselines"]["popularity"]["recall@10"]
    assert popularity > 0.0
    return float(doc["recall@10"] / popularity)


@pytest.mark.timeout(900)
def test_report_covers_the_whole_file(report: dict[str, Any]) -> None:
    assert report["events"] == 100_836
    assert report["scored"] == POSITIVES - POSITIVES // 10
    for figs in (report, *report["baselines"].values()):
        assert set(figs) >= {"recall@10", "ndcg@10", "recall@20", "ndcg@20", "events", "scored"}
        assert 0.0 < figs["ndcg@10"] <= figs["recall@10"] <= figs["recall@20"] <= 1.0
        assert figs["scored"] == report["scored"]
    assert set(report["baselines"]) == {
        "popularity", "recent_popularity", "cooccurrence", "itemknn", "sr", "sknn"}
    assert report["exclude"] == report["config"]["exclude"] == "rated"
    best = report["best_baseline"]
    assert report["baselines"][best]["recall@10"] == max(
        b["recall@10"] for b in report["baselines"].values()
    )
    assert report["ratio_to_best"] == pytest.approx(
        report["recall@10"] / report["baselines"][best]["recall@10"]
    )
    assert report["ratio_to_popularity"] == pytest.approx(_ratio(report))
    assert set(report["over_time"]) == {"model", "model-tower", *report["baselines"]}
    # the towers alone, and every method per history size, on the same scored events
    assert 0.0 < report["side"]["model-tower"]["recall@10"] < report["recall@10"]
    groups = report["by_history"]
    assert list(groups) == ["0", "1-4", "5+"]
    assert sum(g["scored"] for g in groups.values()) == report["scored"]
    assert sum(g["scored"] * g["model"]["recall@10"] for g in groups.values()) == pytest.approx(
        report["scored"] * report["recall@10"])
    chunks = report["over_time"]["model"]
    assert sum(c["scored"] for c in chunks) == report["scored"]
    assert report["_png"][:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.timeout(900)
def test_model_reaches_twice_popularity(report: dict[str, Any]) -> None:
    assert report["config"]["covisit_weight"] > 0
    assert _ratio(report) >= MIN_RATIO, report["config"]


@pytest.mark.timeout(900)
def test_the_model_beats_the_best_baseline(report: dict[str, Any]) -> None:
    """The model above the best baseline, and the per-user baselines above popularity."""
    assert report["ratio_to_best"] >= MIN_BEST_RATIO, report["best_baseline"]
    base = report["baselines"]
    popularity = base["popularity"]["recall@10"]
    assert base["cooccurrence"]["recall@10"] > popularity
    assert base["sknn"]["recall@10"] > popularity


@pytest.mark.timeout(900)
def test_towers_alone_against_popularity(report: dict[str, Any]) -> None:
    """The towers' part of the learned mix alone, on the same rows (``model-tower``)."""
    towers = report["side"]["model-tower"]["recall@10"]
    popularity = report["baselines"]["popularity"]["recall@10"]
    assert towers >= MIN_TOWERS_RATIO * popularity, report["config"]
    cooc = report["baselines"]["cooccurrence"]["recall@10"]
    assert towers >= MIN_TOWERS_COOC_RATIO * cooc, report["config"]


@pytest.mark.timeout(900)
def test_ranking_through_the_ann_index_keeps_the_exact_figures(tmp_path: Path) -> None:
    """``--retrieval ann``: each event ranked over what serving's two stages would score (one
    list of the index's probed, a quarter of the usual candidates, so the index leaves most
    items out); Recall@10 within 2% of the same model ranking every candidate on the same
    rows (``model-exact``; measured: equal at the serving defaults). The first
    ANN_LIMIT ratings."""
    if not RATINGS.is_file():
        pytest.skip(f"{RATINGS} is not there")
    out = tmp_path / "ann.json"
    argv = ["evaluate", str(RATINGS), "--format", "movielens", "--retrieval", "ann",
            "--ann-nprobe", "1", "--ann-candidates", "64", "--limit", str(ANN_LIMIT),
            "--json", str(out)]
    assert main(argv) == 0
    doc = json.loads(out.read_text())
    assert doc["config"]["retrieval"] == "ann"
    assert 0.0 < doc["retrieval_share"] < 0.9, doc["retrieval_share"]
    exact = doc["side"]["model-exact"]["recall@10"]
    assert exact > 0.0
    assert doc["recall@10"] >= 0.98 * exact, (doc["recall@10"], exact)


@pytest.mark.timeout(900)
def test_a_catalogue_makes_new_items_candidates_the_model_reaches(tmp_path: Path) -> None:
    """``--items movies.csv``: the catalogue's items are candidates from the start; the
    towers, whose item rows compose genres and title tokens, reach items nobody chose before
    (the ids-only towers cannot: such an item has no row), and the figures are given by the
    item's earlier positives. First 15,000 positives (measured, seed 7: 2,214 events of new
    items, towers 0.005 on them; model 0.130, content baseline 0.063)."""
    positives = shared_data() / "real" / "ml-latest-small-positives.ndjson"
    movies = shared_data() / "ml-latest-small" / "movies.csv"
    if not positives.is_file() or not movies.is_file():
        pytest.skip("the ml-latest-small positives or movies.csv are not there")
    out = tmp_path / "items.json"
    argv = ["evaluate", str(positives), "--format", "ndjson", "--items", str(movies),
            "--limit", "15000", "--json", str(out)]
    assert main(argv) == 0
    doc = json.loads(out.read_text())
    fresh = doc["by_item"]["0"]
    assert fresh["scored"] > 1_000
    assert fresh["model-tower"]["recall@10"] > 0.0
    assert fresh["popularity"]["recall@10"] == 0.0  # nobody chose them: no count
    assert doc["config"]["attr_tokens"] > 0
    assert doc["recall@10"] >= 1.5 * doc["baselines"]["content"]["recall@10"] > 0.0
