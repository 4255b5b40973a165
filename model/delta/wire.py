"""Wire encoding of a delta: row codecs and one binary record with a checksum (numpy only).

Record layout (one Kafka value)::

    b"SRD1" | u32 little-endian header length | header (UTF-8 JSON) | payload

The header holds the delta's scalars and each array's name, dtype, shape, codec and byte range;
``checksum`` (BLAKE2b-128 of the header without it, keys sorted, then the payload) catches a
flipped bit anywhere. With ``zlib`` the payload is deflated (level 1) after the checksum.
Row codecs (:data:`CODECS`), for the float32 ``[n, d]`` row arrays only: ``float32``,
``float16``, ``bfloat16`` (upper 16 bits, round to nearest even) and ``int8`` (per row
``q = round(x / s)``, ``s = max|x| / 127``); the dense layers, prior and co-visitation weights
stay exact. Spec: ``model/delta/FORMAT.md``.
"""

from __future__ import annotations

import hashlib
import json
import struct
import zlib
from collections.abc import Mapping
from typing import Any

import numpy as np

from model.errors import ModelError

MAGIC = b"SRD1"
#: The snapshot (``seq == 0``) of a full version's lineage, beside its artifact files.
SNAPSHOT_FILE = "delta_snapshot.bin"
CODECS = ("float32", "float16", "bfloat16", "int8")


class DeltaError(ModelError):
    """A delta that does not decode, fails its checksum, or does not apply."""


def encode_rows(rows: np.ndarray, codec: str) -> dict[str, np.ndarray]:
    """``[n, d]`` float32 rows as the arrays of ``codec`` (``{"q": ..., "scale": ...}``)."""
    rows = np.ascontiguousarray(rows, np.float32)
    if codec == "float32":
        return {"q": rows}
    if codec == "float16":
        return {"q": rows.astype(np.float16)}
    if codec == "bfloat16":
        u = rows.view(np.uint32).astype(np.uint64)
        rounded = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
        return {"q": rounded.astype(np.uint16)}
    if codec == "int8":
        peak = np.abs(rows).max(axis=1) if rows.size else np.zeros(rows.shape[0], np.float32)
        scale = np.where(peak > 0, peak / 127.0, 1.0).astype(np.float32)
        q = np.clip(np.rint(rows / scale[:, None]), -127, 127).astype(np.int8)
        return {"q": q, "scale": scale}
    raise DeltaError(f"unknown row codec {codec!r}; known: {CODECS}")


def decode_rows(parts: Mapping[str, np.ndarray], codec: str) -> np.ndarray:
    """Inverse of :func:`encode_rows` (float32; lossy for every codec but float32)."""
    q = parts["q"]
    if codec == "float32":
        return np.asarray(q, np.float32)
    if codec == "float16":
        return q.astype(np.float32)
    if codec == "bfloat16":
        return (q.astype(np.uint32) << 16).view(np.float32)
    if codec == "int8":
        return q.astype(np.float32) * parts["scale"][:, None]
    raise DeltaError(f"unknown row codec {codec!r}; known: {CODECS}")


def _digest(header: Mapping[str, Any], payload: bytes) -> str:
    h = hashlib.blake2b(digest_size=16)
    h.update(json.dumps(header, sort_keys=True).encode())
    h.update(payload)
    return h.hexdigest()


def pack(meta: Mapping[str, Any], arrays: Mapping[str, np.ndarray], *, compress: bool = False) -> bytes:
    """One record of ``meta`` (JSON-able scalars) and ``arrays`` (numeric or unicode)."""
    specs, chunks, offset = [], [], 0
    for name, arr in arrays.items():
        a = np.ascontiguousarray(arr)
        if a.dtype.kind not in "biufU":
            raise DeltaError(f"{name}: dtype {a.dtype} cannot be packed")
        raw = a.tobytes()
        specs.append({"name": name, "dtype": a.dtype.str, "shape": list(a.shape),
                      "at": offset, "bytes": len(raw)})
        chunks.append(raw)
        offset += len(raw)
    payload = b"".join(chunks)
    header: dict[str, Any] = {"meta": dict(meta), "arrays": specs, "zlib": compress}
    header["checksum"] = _digest(header, payload)
    body = zlib.compress(payload, 1) if compress else payload
    head = json.dumps(header, sort_keys=True).encode()
    return MAGIC + struct.pack("<I", len(head)) + head + body


def unpack(record: bytes) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """Inverse of :func:`pack`; raises :class:`DeltaError` on any damage."""
    if len(record) < 8 or record[:4] != MAGIC:
        raise DeltaError("not a delta record (bad magic)")
    (n,) = struct.unpack("<I", record[4:8])
    try:
        header = json.loads(record[8 : 8 + n])
        body = record[8 + n :]
        payload = zlib.decompress(body) if header.get("zlib") else body
    except (ValueError, zlib.error) as exc:
        raise DeltaError(f"delta header or payload does not decode: {exc}") from exc
    checksum = header.pop("checksum", None)
    if checksum != _digest(header, payload):
        raise DeltaError("delta checksum mismatch")
    arrays: dict[str, np.ndarray] = {}
    for spec in header["arrays"]:
        end = spec["at"] + spec["bytes"]
        if end > len(payload):
            raise DeltaError(f"{spec['name']}: beyond the payload")
        a = np.frombuffer(payload[spec["at"] : end], dtype=np.dtype(spec["dtype"]))
        a = a.reshape(spec["shape"])
        a.setflags(write=False)
        arrays[spec["name"]] = a
    return dict(header["meta"]), arrays
