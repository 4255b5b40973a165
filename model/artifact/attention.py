"""The attention user tower in the artifact (format 5): its manifest entry and files.

``manifest["attention"] = {"blocks": 1 | 2, "heads": int, "len": N, "pool": bool}`` with the
files ``attention_pos.npy`` (f32 ``[N, e_h]``) and ``attention_<i>_<name>.npy`` per block i
and name of ``model.scoring.attention.BLOCK_PARAMS`` (f32; ``w*`` ``[e_h, e_h]``, ``w1``
``[e_h, F]``, ``b1`` ``[F]``, ``w2`` ``[F, e_h]``, the rest ``[e_h]``), each listed in
``manifest["files"]`` with its checksum like every other file. The tower is the math of
``model.scoring.attention`` over the first N entries of the history; the dense layers read
``concat(user row, attention, pool)`` with ``pool``, else ``concat(user row, attention)``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from model.artifact.manifest import ArtifactError
from model.scoring.attention import BLOCK_PARAMS, attend, check_weights

POS_FILE = "attention_pos.npy"
MAX_BLOCKS = 2
MAX_LEN = 50


def block_file(i: int, name: str) -> str:
    return f"attention_{i}_{name}.npy"


@dataclass(frozen=True, eq=False)
class AttentionWeights:
    """The loaded tower (read-only arrays)."""

    pos: np.ndarray
    blocks: tuple[Mapping[str, np.ndarray], ...]
    heads: int
    pool: bool

    @property
    def length(self) -> int:
        return int(self.pos.shape[0])

    def outputs(
        self, lookups: Sequence[tuple[np.ndarray, np.ndarray]], rows: np.ndarray
    ) -> np.ndarray:
        """``[B, e_h]``: the tower over each history, given as (row of each entry in ``rows``,
        whether it has one) for its most recent entries (cut here to ``length``)."""
        n = self.length
        seq = np.zeros((len(lookups), n, rows.shape[1]), np.float32)
        known = np.zeros((len(lookups), n), bool)
        for i, (pos, found) in enumerate(lookups):
            sel = np.flatnonzero(found[:n])
            known[i, sel] = True
            seq[i, sel] = rows[pos[sel]]
        return attend(seq, known, self.pos, self.blocks, self.heads)


def attention_arrays(pos: np.ndarray, blocks: Sequence[Mapping[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """File name -> float32 array of the tower's weights, as the writer stores them."""
    out = {POS_FILE: np.ascontiguousarray(pos, dtype=np.float32)}
    for i, params in enumerate(blocks):
        for name in BLOCK_PARAMS:
            out[block_file(i, name)] = np.ascontiguousarray(params[name], dtype=np.float32)
    return out


def check_attention_params(params: Any, where: str = "", version: int = 5) -> None:
    """Raise unless ``params`` is a valid ``attention`` manifest entry (format 5)."""
    if version < 5:
        raise ArtifactError(f"{where}attention is not valid in format {version}")
    if not isinstance(params, dict) or set(params) != {"blocks", "heads", "len", "pool"}:
        raise ArtifactError(f"{where}attention must hold exactly blocks, heads, len and pool")
    for key, top in (("blocks", MAX_BLOCKS), ("heads", None), ("len", MAX_LEN)):
        value = params[key]
        if isinstance(value, bool) or not isinstance(value, int) or value < 1 or (top and value > top):
            raise ArtifactError(f"{where}attention {key} {value!r} is not an int in [1, {top or 'inf'}]")
    if not isinstance(params["pool"], bool):
        raise ArtifactError(f"{where}attention pool {params['pool']!r} is not a bool")


def load_attention(
    manifest: Mapping[str, Any], arrays: Mapping[str, np.ndarray], where: str = ""
) -> AttentionWeights | None:
    """The tower of a loaded artifact (None without one); raises :class:`ArtifactError`."""
    params = manifest.get("attention")
    if params is None:
        return None
    check_attention_params(params, where, int(manifest["format_version"]))
    names = [POS_FILE] + [block_file(i, n) for i in range(params["blocks"]) for n in BLOCK_PARAMS]
    lacking = [n for n in names if n not in arrays]
    if lacking:
        raise ArtifactError(f"{where}attention lacks {lacking}")
    pos = arrays[POS_FILE]
    blocks = tuple(
        {n: arrays[block_file(i, n)] for n in BLOCK_PARAMS} for i in range(params["blocks"])
    )
    try:
        check_weights(pos, blocks, params["heads"], int(manifest["dims"]["hist_dim"]))
    except ValueError as exc:
        raise ArtifactError(f"{where}{exc}") from exc
    if pos.shape[0] != params["len"]:
        raise ArtifactError(f"{where}attention_pos has {pos.shape[0]} rows, len is {params['len']}")
    if not all(np.isfinite(a).all() for a in (pos, *(v for b in blocks for v in b.values()))):
        raise ArtifactError(f"{where}attention weights are not finite")
    return AttentionWeights(pos, blocks, int(params["heads"]), bool(params["pool"]))
