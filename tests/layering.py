"""The dependency ladder of README "Layout" as data, and an AST check of every import.

``python -m tests.layering`` prints the imports that break it (``make lint`` runs it);
``tests/unit/test_layering.py`` runs the same check in the suite.

Rules, read top to bottom; a module's import is allowed when every rule that applies allows it:

1. Top-level packages form a ladder: ``streamrec`` (the kernel) <- ``feature_store`` <-
   ``stream`` <- ``model`` <- ``serving`` <- ``deploy`` <- ``bench`` (each may import only
   those to its left; nothing of ours imports ``tests``). ``streamrec.client`` (the HTTP
   client users import) is a leaf: it imports nothing of ours, the kernel included.
2. ``serving`` takes from ``model`` only ``model.artifact``, ``model.scoring`` and
   ``model.delta`` (numpy only)
   and from ``stream`` only ``stream.kafka_client``.
3. Inside ``model``: ``scoring`` <- ``artifact`` <- ``delta``, ``towers`` <- ``trainer`` <-
   ``cluster`` <- ``evaluation`` <- ``cli`` (``artifact`` and ``towers`` both sit on
   ``scoring`` and not on each other; ``delta`` sits on ``artifact``, not on ``towers``;
   ``evaluation`` does not need ``cluster``).
4. TensorFlow, TFRA and tf_keras are imported in ``model.towers.tf_env`` only.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

PACKAGES = ("streamrec", "feature_store", "stream", "model", "serving", "deploy", "bench")

#: Rule 1: what each top-level package may import of ours (its own modules always).
LADDER: dict[str, frozenset[str]] = {
    "streamrec": frozenset(),
    "feature_store": frozenset({"streamrec"}),
    "stream": frozenset({"streamrec", "feature_store"}),
    "model": frozenset({"streamrec", "feature_store", "stream"}),
    "serving": frozenset({"streamrec", "feature_store", "stream", "model"}),
    "deploy": frozenset({"streamrec", "feature_store", "stream", "model", "serving"}),
    "bench": frozenset(PACKAGES),
}
#: Rule 1: the leaf of the bottom rung.
CLIENT = "streamrec.client"
#: Rule 1: nothing of ours imports it.
TESTS = "tests"


#: Rule 2: (importer package, imported package) -> the only modules allowed (prefixes).
NARROW: dict[tuple[str, str], tuple[str, ...]] = {
    ("serving", "model"): ("model.artifact", "model.scoring", "model.delta"),
    ("serving", "stream"): ("stream.kafka_client",),
}

#: Rule 3: sub-packages of model and what each may import of model.
MODEL_LADDER: dict[str, frozenset[str]] = {
    "scoring": frozenset(),
    "artifact": frozenset({"scoring"}),
    "delta": frozenset({"scoring", "artifact"}),
    "towers": frozenset({"scoring"}),
    "trainer": frozenset({"scoring", "artifact", "delta", "towers"}),
    "cluster": frozenset({"scoring", "artifact", "delta", "towers", "trainer"}),
    "evaluation": frozenset({"scoring", "artifact", "delta", "towers", "trainer"}),
    "cli": frozenset({"scoring", "artifact", "delta", "towers", "trainer", "cluster",
                      "evaluation"}),
}

#: Rule 4.
TENSORFLOW = ("tensorflow", "tensorflow_recommenders_addons", "tf_keras", "keras")
TENSORFLOW_HOME = "model.towers.tf_env"


@dataclass(frozen=True)
class Violation:
    module: str
    imported: str
    where: str
    rule: str

    def __str__(self) -> str:
        return f"{self.where}: {self.module} imports {self.imported} ({self.rule})"


def module_name(root: Path, path: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _resolve(root: Path, module: str, node: ast.ImportFrom) -> list[str]:
    """Modules named by ``from X import a, b``: ``X.a`` where that is a module, else ``X``."""
    if node.level:
        base = module.split(".")
        if not module_is_package(root, module):
            base = base[:-1]
        base = base[: len(base) - (node.level - 1)]
        target = ".".join(base + ([node.module] if node.module else []))
    else:
        target = node.module or ""
    out = []
    for alias in node.names:
        candidate = f"{target}.{alias.name}"
        path = root.joinpath(*candidate.split("."))
        out.append(candidate if path.is_dir() or path.with_suffix(".py").is_file() else target)
    return out


def module_is_package(root: Path, module: str) -> bool:
    return root.joinpath(*module.split("."), "__init__.py").is_file()


def imports_of(root: Path, path: Path) -> Iterator[tuple[str, int]]:
    module = module_name(root, path)
    tree = ast.parse(path.read_text(), filename=str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, node.lineno
        elif isinstance(node, ast.ImportFrom):
            for name in _resolve(root, module, node):
                yield name, node.lineno


def _within(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def check_import(module: str, imported: str) -> str | None:
    """The rule ``module`` breaks by importing ``imported``, or None."""
    top, other = module.split(".")[0], imported.split(".")[0]
    if other == TESTS and top != TESTS:
        return "nothing of ours imports tests"
    if _within(module, CLIENT) and other in PACKAGES:
        return "streamrec.client imports nothing of ours"
    if other in TENSORFLOW:
        return None if module == TENSORFLOW_HOME else "TensorFlow only through model.towers.tf_env"
    if other not in PACKAGES or other == top:
        if top == "model" and other == "model":
            return _check_model(module, imported)
        return None
    if other not in LADDER[top]:
        return f"{top} may import {', '.join(sorted(LADDER[top])) or 'nothing of ours'}"
    allowed = NARROW.get((top, other))
    if allowed and not any(_within(imported, p) for p in allowed):
        return f"{top} may import from {other} only {', '.join(allowed)}"
    return None


def _check_model(module: str, imported: str) -> str | None:
    mine, theirs = module.split("."), imported.split(".")
    if len(mine) < 2 or len(theirs) < 2 or mine[1] == theirs[1]:
        return None
    sub, other = mine[1], theirs[1]
    if sub not in MODEL_LADDER or other not in MODEL_LADDER:
        return None
    if other not in MODEL_LADDER[sub]:
        may = ", ".join(f"model.{s}" for s in sorted(MODEL_LADDER[sub])) or "nothing of model"
        return f"model.{sub} may import {may}"
    return None


def violations(root: Path) -> list[Violation]:
    found = []
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            module = module_name(root, path)
            for imported, line in imports_of(root, path):
                rule = check_import(module, imported)
                if rule:
                    where = f"{path.relative_to(root)}:{line}"
                    found.append(Violation(module, imported, where, rule))
    return found


def main() -> int:
    root = Path(__file__).resolve().parent.parent
    found = violations(root)
    for v in found:
        print(v)
    print(f"layering: {len(found)} import(s) against the ladder")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
