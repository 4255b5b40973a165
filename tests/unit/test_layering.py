"""The dependency ladder of README "Layout", enforced on every import of our packages.

Every ``import``/``from ... import`` is read from the source (also those inside functions and
``if TYPE_CHECKING`` blocks), so a lazy import cannot hide a back-edge.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

from tests.layering import Violation, violations
from tests.support import REPO_ROOT


def test_the_tree_keeps_the_ladder() -> None:
    found = violations(REPO_ROOT)
    assert not found, "imports against the ladder:\n" + "\n".join(map(str, found))


def _tree(tmp_path: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        path = tmp_path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    return tmp_path


def _edges(found: list[Violation]) -> set[tuple[str, str]]:
    return {(v.module, v.imported) for v in found}


def test_a_back_edge_is_reported_also_inside_a_function(tmp_path: Path) -> None:
    root = _tree(tmp_path, {
        "feature_store/__init__.py": "",
        "streamrec/ids.py": "def f():\n    from stream.schema import x\n",
        "stream/__init__.py": "",
        "stream/schema.py": "import streamrec.ids\n",
    })
    assert _edges(violations(root)) == {("streamrec.ids", "stream.schema")}


def test_serving_may_read_artifacts_but_not_reach_the_trainer_or_tensorflow(
    tmp_path: Path,
) -> None:
    root = _tree(tmp_path, {
        "serving/__init__.py": "",
        "serving/app.py": """
            from model.artifact.files import load_artifact
            from model.scoring import covisit
            from stream.kafka_client import make_producer
            from model.trainer.trainer import Trainer
            from stream.flink import job
            import tensorflow as tf
        """,
    })
    assert _edges(violations(root)) == {
        ("serving.app", "model.trainer.trainer"),
        ("serving.app", "stream.flink"),
        ("serving.app", "tensorflow"),
    }


def test_numpy_only_subpackages_stay_free_of_tensorflow(tmp_path: Path) -> None:
    root = _tree(tmp_path, {
        "model/__init__.py": "",
        "model/scoring/__init__.py": "",
        "model/scoring/prior.py": "from model.towers.tf_env import tf\n",
        "model/artifact/__init__.py": "",
        "model/artifact/files.py": "from model.scoring import prior\nimport tensorflow\n",
        "model/towers/__init__.py": "",
        "model/towers/tf_env.py": "import tensorflow as tf\n",
    })
    assert _edges(violations(root)) == {
        ("model.scoring.prior", "model.towers.tf_env"),
        ("model.artifact.files", "tensorflow"),
    }


def test_nothing_imports_deploy_or_serving_from_below(tmp_path: Path) -> None:
    root = _tree(tmp_path, {
        "model/__init__.py": "",
        "model/cli/__init__.py": "",
        "model/cli/train.py": "from serving.app import create_app\nfrom deploy import stack\n",
        "deploy/__init__.py": "",
        "deploy/cli.py": "from serving.app import create_app\nfrom model.cli import train\n",
    })
    assert _edges(violations(root)) == {
        ("model.cli.train", "serving.app"),
        ("model.cli.train", "deploy"),
    }


def test_deltas_sit_on_artifacts_and_serving_may_read_them(tmp_path: Path) -> None:
    root = _tree(tmp_path, {
        "model/__init__.py": "",
        "model/delta/__init__.py": "",
        "model/delta/state.py": "from model.artifact import files\nfrom model.towers import tf_env\n",
        "model/artifact/__init__.py": "",
        "model/artifact/files.py": "from model.delta import state\n",
        "model/towers/__init__.py": "",
        "model/towers/tf_env.py": "import tensorflow as tf\n",
        "serving/__init__.py": "",
        "serving/deltas.py": "from model.delta import apply\nfrom model.trainer import deltas\n",
    })
    assert _edges(violations(root)) == {
        ("model.delta.state", "model.towers.tf_env"),
        ("model.artifact.files", "model.delta.state"),
        ("serving.deltas", "model.trainer"),
    }
