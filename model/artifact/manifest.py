"""The artifact manifest: format constants, validation and dimension checks (numpy only).

The format is the written spec ``model/artifact/FORMAT.md``; ``model.artifact.files``
re-exports these names.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from model.errors import ModelError

FORMAT = "streamrec-artifact"
FORMAT_VERSION = 10
#: Versions the reader accepts (see the module doc).
READABLE_VERSIONS = (1, 2, 3, 4, 5, 6, 7, 8, 9, 10)
MANIFEST = "manifest.json"
_CHUNK = 1 << 20
ACTIVATIONS = ("relu", "linear")
RESERVED = frozenset(
    {
        "format", "format_version", "version", "created_at", "normalize", "score_bias",
        "history_len", "history_decay", "covisit", "attention", "dims", "layers", "files",
        "cold_start", "sessions", "history_groups",
    }
)


#: What a user with no history is ranked by (``model.scoring.cold.CHOICES``): the learnt
#: mix, the prior's column alone (format 7), all-time popularity (format 8).
COLD_STARTS = ("mix", "prior", "popular")
#: Format 8: the all-time popularity scores of ``cold_start`` "popular".
POPULARITY_FILE = "item_popularity.npy"


class ArtifactError(ModelError):
    """An artifact is missing, malformed, or fails its checksums."""


def format_version(
    score_bias: bool,
    history_len: int | None,
    history_decay: float,
    covisit: bool = False,
    attention: bool = False,
    covisit_last: bool = False,
    cold_start: str = "mix",
    sessions: bool = False,
    history_groups: bool = False,
) -> int:
    if history_groups:
        return 10
    if sessions:
        return 9
    if cold_start == "popular":
        return 8
    if cold_start == "prior":
        return 7
    if covisit_last:
        return 6
    if attention:
        return 5
    if covisit:
        return 4
    if history_decay != 1.0:
        return 3
    return 2 if score_bias or history_len is not None else 1


def check_dims(manifest: Mapping[str, Any], arrays: Mapping[str, np.ndarray]) -> None:
    dims = manifest["dims"]
    width = dims["user_dim"] + dims["hist_dim"]
    attention = manifest.get("attention")
    if isinstance(attention, dict) and attention.get("pool", False):
        width += dims["hist_dim"]  # format 5: the attention output beside the pool
    for i, spec in enumerate(manifest["layers"]):
        w, b = arrays[spec["w"]], arrays[spec["b"]]
        if w.ndim != 2 or w.shape[0] != width or b.shape != (w.shape[1],):
            raise ArtifactError(f"layer {i}: W {w.shape} b {b.shape} after width {width}")
        width = w.shape[1]
    if manifest.get("score_bias", False):
        width += 1
    if width != dims["d"]:
        raise ArtifactError(f"user tower outputs {width} dims, item vectors have {dims['d']}")


def read_manifest(directory: str | Path) -> dict[str, Any]:
    """Parse and sanity-check ``manifest.json`` (no checksum verification)."""
    path = Path(directory) / MANIFEST
    try:
        manifest = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ArtifactError(f"cannot read {path}: {exc}") from exc
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise ArtifactError(f"{path}: not a {FORMAT} manifest")
    version = manifest.get("format_version")
    if version not in READABLE_VERSIONS:
        raise ArtifactError(f"{path}: unsupported format_version {version}")
    bias = manifest.get("score_bias", False)
    if not isinstance(bias, bool) or (bias and version < 2):
        raise ArtifactError(f"{path}: score_bias {bias!r} is not valid in format {version}")
    hist_len = manifest.get("history_len")
    if hist_len is not None and (
        version < 2 or isinstance(hist_len, bool) or not isinstance(hist_len, int) or hist_len < 1
    ):
        raise ArtifactError(f"{path}: history_len {hist_len!r} is not valid in format {version}")
    decay = manifest.get("history_decay", 1.0)
    if isinstance(decay, bool) or not isinstance(decay, (int, float)) or not 0.0 < decay <= 1.0:
        raise ArtifactError(f"{path}: history_decay {decay!r} is not in (0, 1]")
    if version < 3 and "history_decay" in manifest:
        raise ArtifactError(f"{path}: history_decay is not valid in format {version}")
    if "covisit" in manifest:
        check_covisit_params(manifest["covisit"], f"{path}: ", version)
    cold = manifest.get("cold_start", "mix")
    if (cold not in COLD_STARTS or (cold == "prior" and (version < 7 or not bias))
            or (cold == "popular" and version < 8)):
        raise ArtifactError(f"{path}: cold_start {cold!r} is not valid in format {version}"
                            + ("" if bias or cold != "prior" else " without score_bias"))
    if "sessions" in manifest and version < 9:
        raise ArtifactError(f"{path}: sessions is not valid in format {version}")
    if "history_groups" in manifest:
        if version < 10:
            raise ArtifactError(f"{path}: history_groups is not valid in format {version}")
        check_history_groups(manifest["history_groups"], f"{path}: ")
    for key in ("version", "dims", "layers", "files"):
        if key not in manifest:
            raise ArtifactError(f"{path}: missing {key!r}")
    return manifest


def check_history_groups(entry: Any, where: str = "") -> None:
    """Raise unless ``entry`` is a valid ``history_groups`` manifest entry (format 10,
    ``model.scoring.selector``): ``window`` (int >= 1), ``starts`` (increasing ints >= 1) and
    one ``[co-visitation, session-kNN]`` pair of scales > 0 per start."""
    if not isinstance(entry, dict) or set(entry) != {"window", "starts", "scales"}:
        raise ArtifactError(f"{where}history_groups must hold window, starts and scales")
    window, starts, scales = entry["window"], entry["starts"], entry["scales"]
    if isinstance(window, bool) or not isinstance(window, int) or window < 1:
        raise ArtifactError(f"{where}history_groups window {window!r} is not an int >= 1")
    if (not isinstance(starts, list) or not starts
            or not all(isinstance(s, int) and not isinstance(s, bool) for s in starts)
            or starts[0] < 1 or starts != sorted(set(starts))):
        raise ArtifactError(f"{where}history_groups starts {starts!r} are not increasing ints >= 1")
    if (not isinstance(scales, list) or len(scales) != len(starts)
            or not all(isinstance(p, list) and len(p) == 2 and all(
                isinstance(x, (int, float)) and not isinstance(x, bool) and x > 0 for x in p)
                for p in scales)):
        raise ArtifactError(f"{where}history_groups scales {scales!r} are not one pair of "
                            "numbers > 0 per start")


def history_groups_entry(groups: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """The manifest's ``history_groups`` entry of ``groups`` (checked), or None when there
    are none or every scale is 1 (the same scores without the entry)."""
    if groups is None:
        return None
    scales = [[float(x) for x in pair] for pair in np.asarray(groups["scales"]).tolist()]
    entry = {"window": int(groups["window"]), "starts": [int(s) for s in groups["starts"]],
             "scales": scales}
    check_history_groups(entry)
    if all(x == 1.0 for pair in scales for x in pair):
        return None
    return entry


#: Files of the co-visitation term (format 4; ``model.scoring.covisit``).
COVISIT_FILES = ("covisit_indptr.npy", "covisit_items.npy", "covisit_weights.npy")


def check_covisit_params(params: Any, where: str = "", version: int = FORMAT_VERSION) -> None:
    """Raise unless ``params`` is a valid ``covisit`` manifest entry (format 4; format 6 adds
    ``last_weight``, the weight of the most recent history item's own term)."""
    if version < 4:
        raise ArtifactError(f"{where}covisit is not valid in format {version}")
    keys = {"weight", "window", "decay"} | ({"last_weight"} if version >= 6 else set())
    if not isinstance(params, dict) or not {"weight", "window", "decay"} <= set(params) <= keys:
        raise ArtifactError(f"{where}covisit must hold weight, window and decay"
                            + (" (and last_weight)" if version >= 6 else ""))
    last = params.get("last_weight", 0.0)
    if isinstance(last, bool) or not isinstance(last, (int, float)) or not last >= 0:
        raise ArtifactError(f"{where}covisit last_weight {last!r} is not >= 0")
    weight, window, decay = params["weight"], params["window"], params["decay"]
    if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not weight > 0:
        raise ArtifactError(f"{where}covisit weight {weight!r} is not > 0")
    if isinstance(window, bool) or not isinstance(window, int) or window < 1:
        raise ArtifactError(f"{where}covisit window {window!r} is not an int >= 1")
    if isinstance(decay, bool) or not isinstance(decay, (int, float)) or not 0.0 < decay <= 1.0:
        raise ArtifactError(f"{where}covisit decay {decay!r} is not in (0, 1]")


def check_covisit_arrays(indptr: np.ndarray, items: np.ndarray, weights: np.ndarray, n: int) -> None:
    """Raise unless the CSR arrays are a valid co-visitation matrix over ``n`` items."""
    if indptr.shape != (n + 1,) or indptr.dtype.kind != "i" or items.dtype.kind != "i":
        raise ArtifactError(f"covisit: indptr {indptr.shape} is not [{n + 1}] ints")
    if items.ndim != 1 or weights.shape != items.shape or weights.dtype.kind != "f":
        raise ArtifactError(f"covisit: items {items.shape} and weights {weights.shape} differ")
    if indptr[0] != 0 or indptr[-1] != items.size or np.any(np.diff(indptr) < 0):
        raise ArtifactError("covisit: indptr is not a non-decreasing 0..nnz")
    if items.size and (items.min() < 0 or items.max() >= n):
        raise ArtifactError(f"covisit: neighbour rows outside [0, {n})")
    if not np.isfinite(weights).all() or (weights < 0).any():
        raise ArtifactError("covisit: weights must be finite and >= 0")


def sha256_file(path: Path) -> str:
    """Hex SHA-256 of a file, read in chunks."""
    h = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def sorted_table(keys: np.ndarray, rows: np.ndarray, what: str) -> tuple[np.ndarray, np.ndarray]:
    """``(keys, rows)`` sorted by key; refuses mismatched shapes and duplicate keys."""
    keys = np.asarray(keys, dtype=np.int64).reshape(-1)
    rows = np.asarray(rows, dtype=np.float32)
    if rows.ndim != 2 or rows.shape[0] != keys.shape[0]:
        raise ArtifactError(f"{what}: rows {rows.shape} do not match {keys.shape[0]} keys")
    order = np.argsort(keys, kind="stable")
    keys, rows = keys[order], rows[order]
    if keys.size > 1 and not np.all(keys[1:] > keys[:-1]):
        raise ArtifactError(f"{what}: duplicate keys")
    return keys, rows


def load_npy(directory: Path, name: str, spec: Mapping[str, Any], verify: bool) -> np.ndarray:
    """One array of a version, checked against its manifest entry ``spec``; read-only and
    memory-mapped from its file (an empty one is read): the processes that load one version
    (serving's workers) share its pages instead of each holding a copy. A version's files
    are never rewritten in place (the registry publishes a new directory)."""
    path = directory / name
    if not path.is_file():
        raise ArtifactError(f"{path}: missing")
    if path.stat().st_size != spec.get("bytes"):
        raise ArtifactError(f"{path}: {path.stat().st_size} bytes, manifest says {spec.get('bytes')}")
    if verify and sha256_file(path) != spec.get("sha256"):
        raise ArtifactError(f"{path}: sha256 mismatch")
    empty = 0 in spec.get("shape", [])
    try:
        arr = np.load(path, allow_pickle=False, mmap_mode=None if empty else "r")
    except (OSError, ValueError) as exc:
        raise ArtifactError(f"{path}: {exc}") from exc
    if list(arr.shape) != list(spec.get("shape", [])) or arr.dtype.str != spec.get("dtype"):
        raise ArtifactError(f"{path}: {arr.dtype.str}{arr.shape} differs from the manifest")
    arr.setflags(write=False)
    return arr
