"""The panel benchmark's bookkeeping: logs of folders, and one log's row from its seeds' runs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from bench.panel import logs_of, summarise, table


def _run(seed: int, model: float, tower: float, sknn: float = 0.20) -> dict[str, Any]:
    figs = {"recall@10": model, "ndcg@10": model / 2}
    doc = {
        **figs, "events": 100, "scored": 90,
        "baselines": {"sknn": {"recall@10": sknn, "ndcg@10": 0.1},
                      "popularity": {"recall@10": 0.05, "ndcg@10": 0.02}},
        "side": {"model-tower": {"recall@10": tower}},
        "by_history": {"0": {"scored": 10, "model": figs, "sknn": {"recall@10": 0.01}}},
        "score_weights": {"tower": 1.0},
    }
    return {"seed": seed, "doc": doc, "seconds": 1.0, "cpu_seconds": 0.9, "peak_rss_mb": 100.0}


def test_a_log_row_takes_medians_over_seeds_and_the_best_baseline() -> None:
    row = summarise("log", [_run(1, 0.22, 0.1), _run(2, 0.19, 0.3), _run(3, 0.24, 0.2)])
    assert row["best_baseline"] == "sknn"
    assert row["model"]["recall@10"] == pytest.approx(0.22)
    assert row["model"]["recall@10_min"] == pytest.approx(0.19)
    assert row["ratio_to_best"] == pytest.approx(1.1)
    assert row["ratio_to_best_min"] == pytest.approx(0.95)
    assert row["ndcg_ratio_to_best"] == pytest.approx(0.11 / 0.1)
    assert row["model_tower"]["recall@10"] == pytest.approx(0.2)
    assert row["by_history"]["0"] == {"scored": 10, "model": pytest.approx(0.22), "sknn": 0.01}
    assert "sknn" in table([row]) and "1.100x" in table([row])


def test_baselines_that_differ_between_seeds_stop_the_panel() -> None:
    with pytest.raises(SystemExit, match="differs between seeds"):
        summarise("log", [_run(1, 0.2, 0.1), _run(2, 0.2, 0.1, sknn=0.21)])


def test_a_folder_stands_for_its_ndjson_logs(tmp_path: Path) -> None:
    for name in ("b.ndjson", "a.ndjson", "notes.md"):
        (tmp_path / name).write_text("")
    extra = tmp_path / "other.csv"
    extra.write_text("")
    assert logs_of([tmp_path, extra]) == [tmp_path / "a.ndjson", tmp_path / "b.ndjson", extra]
    with pytest.raises(SystemExit, match="does not exist"):
        logs_of([tmp_path / "missing.ndjson"])
