"""``streamrec evaluate`` on MovieLens latest-small: the model against its baselines.

No services needed (the evaluation runs in-process), but it loads TensorFlow and trains the
two-tower model on the whole file (100,836 ratings), so it lives with the integration tests.
The evaluation runs once per module; the tests read its ``--json`` report.

``MIN_RATIO`` is the Recall@10 ratio (model / popularity, same run) that the default
settings must reach: the target of issue 7 (2x popularity). A second test keeps the two
towers honest on their own (the model without its co-visitation term, ``model.scoring.covisit``).
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
#: Model Recall@10 / popularity Recall@10 the default settings must reach (measured
#: 2.13x/2.14x/2.16x on seeds 7/1/2 with the defaults of ModelConfig/TrainOptions).
MIN_RATIO = 2.0
#: The same for the towers and the prior alone (``--covisit-weight 0``: 1.88x/1.90x/1.91x;
#: 1.86x/1.84x/1.83x before the pool residual; 1.73x/1.76x/1.72x at temperature 0.05 and
#: prior weight 3; 1.63x-1.67x before explicit ratings entered the history; 1.45x without
#: the auxiliary history-pool loss; 1.04x before mixed negatives, the decayed-count prior
#: and the 10-item history window).
MIN_TOWERS_RATIO = 1.75


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
    assert set(report["baselines"]) == {"popularity", "recent_popularity", "cooccurrence", "sknn"}
    assert report["exclude"] == report["config"]["exclude"] == "rated"
    best = report["best_baseline"]
    assert report["baselines"][best]["recall@10"] == max(
        b["recall@10"] for b in report["baselines"].values()
    )
    assert report["ratio_to_best"] == pytest.approx(
        report["recall@10"] / report["baselines"][best]["recall@10"]
    )
    assert report["ratio_to_popularity"] == pytest.approx(_ratio(report))
    assert set(report["over_time"]) == {"model", *report["baselines"]}
    chunks = report["over_time"]["model"]
    assert sum(c["scored"] for c in chunks) == report["scored"]
    assert report["_png"][:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.timeout(900)
def test_model_reaches_twice_popularity(report: dict[str, Any]) -> None:
    assert report["config"]["covisit_weight"] > 0
    assert _ratio(report) >= MIN_RATIO, report["config"]


@pytest.mark.timeout(900)
def test_default_figures_and_the_neighbour_baselines(report: dict[str, Any]) -> None:
    """The default protocol's figures (seed 7) and the per-user baselines above popularity."""
    assert (report["recall@10"], report["ndcg@10"]) == pytest.approx((0.1145, 0.0617), abs=5e-5)
    assert (report["recall@20"], report["ndcg@20"]) == pytest.approx((0.1705, 0.0758), abs=5e-5)
    base = report["baselines"]
    popularity = base["popularity"]["recall@10"]
    assert base["cooccurrence"]["recall@10"] > popularity
    assert base["sknn"]["recall@10"] > popularity


@pytest.mark.timeout(900)
def test_towers_alone_against_popularity(tmp_path: Path) -> None:
    if not RATINGS.is_file():
        pytest.skip(f"{RATINGS} is not there")
    out = tmp_path / "towers.json"
    argv = ["evaluate", str(RATINGS), "--format", "movielens", "--covisit-weight", "0"]
    assert main([*argv, "--json", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc["config"]["covisit_weight"] == 0
    assert _ratio(doc) >= MIN_TOWERS_RATIO, doc["config"]
