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

import pytest

from tests.support import REPO_ROOT

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
