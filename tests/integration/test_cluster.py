"""The parameter-server cluster on real processes (``model.cluster``): exactness probe.

Each probe runs as a child process (its chief joins the cluster, which a pytest process
must not), on free ports, with 2 parameter servers and 2 workers of its own.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from feature_store.settings import Settings
from model.artifact.files import load_artifact
from model.artifact.registry import Registry
from model.evaluation.synthetic import SyntheticConfig, SyntheticStream
from model.trainer.samples import sample_digest
from tests.integration.test_trainer import _encoded, _env, _produce
from tests.support import REPO_ROOT, free_port

pytestmark = pytest.mark.integration


def _probe(tmp_path: Path, *args: str) -> dict[str, object]:
    out = tmp_path / "probe.json"
    proc = subprocess.run(
        [sys.executable, "-m", "model.cluster.probe", "--ps", "2", "--workers", "2",
         "--json", str(out), *args],
        cwd=REPO_ROOT, env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
        capture_output=True, timeout=240, check=False,
    )
    assert out.is_file(), proc.stderr.decode()[-3000:]
    return json.loads(out.read_text())


@pytest.mark.parametrize("keys", ["shared", "disjoint"])
def test_no_update_lost_or_doubled_on_two_ps_two_workers(tmp_path: Path, keys: str) -> None:
    r = _probe(tmp_path, "--keys", keys, "--steps", "150", "--per-step", "48")
    assert r["wrong_rows"] == 0, r["examples_wrong"]
    assert r["wrong_accumulators"] == 0
    assert r["rows"] == r["keys"]
    # both shards hold rows (key % 2), and the shared run really shares keys between steps
    assert all(n > 0 for n in r["rows_per_shard"])  # type: ignore[attr-defined]
    if keys == "shared":
        assert r["keys_in_several_steps"] == r["keys"]
    else:
        assert r["keys_in_several_steps"] == 0


# -- the trainer on the cluster, from Kafka --------------------------------------------------


def _train(settings: Settings, root: Path, cluster: bool, total: int) -> dict[str, Any]:
    """Run ``streamrec train`` (one process or 2 PS + 2 workers) over the samples topic
    until ``total`` samples are trained; returns the manifest of its last version."""
    s = settings.model_copy(update={"trainer": settings.trainer.model_copy(update={
        "registry_dir": root / "models", "checkpoint_dir": root / "trainer",
        "group_id": f"{settings.trainer.group_id}-{root.name}"})})
    env = _env(s, free_port())
    env["STREAMREC_STACK__RUN_DIR"] = str(root / "run")
    argv = [sys.executable, "-m", "deploy.cli", "train", "--batch-size", "256",
            "--eval-rows", "64", "--eval-every", "1", "--export-every-s", "3600",
            "--evict-every", "0", "--max-samples", str(total)]
    if cluster:
        argv += ["--ps", "2", "--workers", "2"]
    root.mkdir(parents=True, exist_ok=True)
    with (root / "train.log").open("wb") as log:
        proc = subprocess.run(argv, cwd=REPO_ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
                              timeout=300, check=False)
    assert proc.returncode == 0, (root / "train.log").read_text()[-3000:]
    registry = Registry(s.trainer.registry_dir, s.trainer.model_name)
    current = registry.current()
    assert current is not None
    return {**registry.show(current), "path": registry.path(current)}


def test_cluster_trainer_from_kafka_exports_what_one_process_exports(
    settings: Settings, tmp_path: Path
) -> None:
    stream = SyntheticStream(SyntheticConfig(users=400, items=300, clusters=10, history_len=20,
                                             seed=3))
    samples = stream.take(12_000)
    _produce(settings, _encoded(samples))
    cluster = _train(settings, tmp_path / "cluster", True, len(samples))
    single = _train(settings, tmp_path / "single", False, len(samples))
    expected = str(sample_digest([s.sample_id for s in samples]))
    for manifest in (cluster, single):
        assert manifest["samples_trained"] == len(samples)
        assert manifest["sample_digest"] == expected
        assert sum(manifest["kafka_offsets"].values()) == len(samples)
    a, b = load_artifact(cluster["path"]), load_artifact(single["path"])
    # serving cannot tell them apart: the same format, ids and shapes
    assert sorted(a.item_ids) == sorted(b.item_ids)
    assert set(a.user_keys.tolist()) == set(b.user_keys.tolist())
    assert a.item_vectors.shape == b.item_vectors.shape
    assert [w.shape for w, _, _ in a.layers] == [w.shape for w, _, _ in b.layers]
    qa, qb = cluster["metrics"], single["metrics"]
    assert qa["ndcg@10"] > qa["popularity_ndcg@10"], qa
    assert abs(qa["recall@10"] - qb["recall@10"]) < 0.1, (qa, qb)
