"""Format 9: the session-kNN part of a version (``model.scoring.sessions``), its files, its
manifest entry and its scores as serving adds them.

Files (``int64`` each): the index's arrays as the trainer holds them (``SessionIndex.to_arrays``:
item keys by item index, user keys, recency and size by history, the sorted ``history << 32 |
item`` codes, the count learnt) and ``sessions_item_rows.npy``, the catalogue row of each item
index (-1: not one of the version's items). Manifest: ``"sessions": {"weight": float > 0,
"sample_size": int >= 1, "window": int >= 1, "k": int >= 0 (0 = all), "max_sessions": int >= 1}``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from model.artifact.manifest import ArtifactError
from model.scoring.sessions import SessionIndex, part

#: The index's arrays (``SessionIndex.to_arrays`` names) and the rows of its items.
ARRAY_NAMES = ("sessions_item_keys", "sessions_user_keys", "sessions_last", "sessions_size",
               "sessions_codes", "sessions_learned")
ROWS = "sessions_item_rows"
FILES = tuple(f"{name}.npy" for name in (*ARRAY_NAMES, ROWS))


def check_params(params: Any, where: str = "") -> None:
    """Raise unless ``params`` is a valid ``sessions`` manifest entry."""
    names = {"weight", "sample_size", "window", "k", "max_sessions"}
    if not isinstance(params, dict) or set(params) != names:
        raise ArtifactError(f"{where}sessions must hold exactly {sorted(names)}")
    weight = params["weight"]
    if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not weight > 0:
        raise ArtifactError(f"{where}sessions weight {weight!r} is not > 0")
    for name, low in (("sample_size", 1), ("window", 1), ("k", 0), ("max_sessions", 1)):
        value = params[name]
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ArtifactError(f"{where}sessions {name} {value!r} is not an int >= {low}")


def params_of(index: SessionIndex, weight: float) -> dict[str, Any]:
    """The manifest entry of ``index`` served with ``weight``."""
    p = index.params()
    return {"weight": float(weight), "sample_size": int(p["sample_size"] or 0),
            "window": int(p["window"] or 0), "k": int(p["k"] or 0),
            "max_sessions": int(p["max_sessions"] or 0)}


def file_arrays(arrays: Mapping[str, np.ndarray], item_rows: np.ndarray) -> dict[str, np.ndarray]:
    """The files of an index's arrays and its items' catalogue rows."""
    out = {f"{name}.npy": np.ascontiguousarray(arrays[name], np.int64) for name in ARRAY_NAMES}
    out[f"{ROWS}.npy"] = np.ascontiguousarray(item_rows, np.int64)
    return out


def index_of(params: Mapping[str, Any], arrays: Mapping[str, np.ndarray], n_items: int,
             where: str = "") -> tuple[SessionIndex, np.ndarray]:
    """The index a version's files hold and its items' catalogue rows, checked."""
    lacking = [name for name in FILES if name not in arrays]
    if lacking:
        raise ArtifactError(f"{where}sessions lacks {lacking}")
    got = {name: np.asarray(arrays[f"{name}.npy"]) for name in (*ARRAY_NAMES, ROWS)}
    if any(a.dtype != np.int64 or a.ndim != 1 for a in got.values()):
        raise ArtifactError(f"{where}sessions arrays must be 1-d int64")
    users = got["sessions_user_keys"].size
    if got["sessions_last"].size != users or got["sessions_size"].size != users:
        raise ArtifactError(f"{where}sessions: recency and size are not one per history")
    if got[ROWS].size != got["sessions_item_keys"].size:
        raise ArtifactError(f"{where}sessions: item rows are not one per item")
    rows, codes = got[ROWS], got["sessions_codes"]
    if rows.size and (rows.min() < -1 or rows.max() >= n_items):
        raise ArtifactError(f"{where}sessions: item rows outside [-1, {n_items})")
    if codes.size and (np.any(np.diff(codes) <= 0) or codes[0] < 0
                       or (codes >> 32).max() >= users
                       or (codes & 0xFFFFFFFF).max() >= got["sessions_item_keys"].size):
        raise ArtifactError(f"{where}sessions: codes are not increasing (history, item) pairs")
    index = SessionIndex(int(params["sample_size"]), int(params["window"]),
                         int(params["k"]) or None, int(params["max_sessions"]))
    index.load_arrays({name: got[name] for name in ARRAY_NAMES})
    return index, rows


def session_scores(
    index: SessionIndex, item_rows: np.ndarray, weight: float, user_keys: np.ndarray,
    histories: Sequence[np.ndarray],
) -> list[tuple[np.ndarray, np.ndarray]]:
    """Per history (item keys, most recent first) of users ``user_keys``: ``(item rows,
    added scores)`` of the part, ``weight * log1p(SCALE * s)`` (float32; distinct rows, in
    no particular order), only the version's items with ``s > 0``."""
    width = index.window
    matrix = np.zeros((len(histories), width), np.int64)
    for r, h in enumerate(histories):
        h = np.asarray(h, np.int64)[:width]
        matrix[r, : h.size] = h
    rows, ids, s = index.sums(np.asarray(user_keys, np.int64), matrix)
    item = item_rows[ids]
    ok = item >= 0
    rows, item = rows[ok], item[ok]
    added = (weight * part(s[ok])).astype(np.float32)
    cuts = np.searchsorted(rows, np.arange(len(histories) + 1))  # grouped by history
    return [(item[a:b], added[a:b]) for a, b in zip(cuts[:-1], cuts[1:], strict=True)]
