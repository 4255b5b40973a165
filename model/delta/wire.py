"""The wire stage: a delta (:class:`Delta`) as one binary record and back (numpy only).

Record layout (one Kafka value)::

    b"SRD1" | u32 little-endian header length | header (UTF-8 JSON) | payload

The header holds the delta's scalars and each array's name, dtype, shape, codec and byte range;
``checksum`` (BLAKE2b-128 of the header without it, keys sorted, then the payload) catches a
flipped bit anywhere. With ``zlib`` the payload is deflated (level 1) after the checksum.
Row codecs (:data:`CODECS`), for the float32 ``[n, d]`` row arrays only: ``float32``,
``float16``, ``bfloat16`` (upper 16 bits, round to nearest even) and ``int8`` (per row
``q = round(x / s)``, ``s = max|x| / 127``); the dense layers, prior and co-visitation weights
stay exact. A lineage with the session-kNN part carries its index whole in the snapshot
(``SessionIndex.to_arrays``) and, in each delta, the positives it learnt since the record
before (:data:`POSITIVES`). :func:`encode` / :func:`decode` / :func:`peek` turn a
:class:`Delta` into a record and back. Spec: ``model/delta/FORMAT.md``.
"""

from __future__ import annotations

import hashlib
import json
import struct
import zlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from model.artifact.manifest import ArtifactError, check_history_groups
from model.artifact.sessions import ARRAY_NAMES as SESSION_ARRAYS
from model.delta.state import Attributes, Constants, Layer
from model.errors import ModelError
from model.scoring.cold import CHOICES, MIX
from model.scoring.rarity import check_item_groups

MAGIC = b"SRD1"
#: The snapshot (``seq == 0``) of a full version's lineage, beside its artifact files.
SNAPSHOT_FILE = "delta_snapshot.bin"
CODECS = ("float32", "float16", "bfloat16", "int8")
#: A delta's session-kNN positives: user keys, item keys, positives per ``learn`` call.
POSITIVES = ("sessions_pos_users", "sessions_pos_items", "sessions_pos_calls")
#: The arrays of a record's :class:`Attributes` (its rows travel as ``attr_rows.*`` in the
#: record's codec).
ATTRIBUTE_ARRAYS = ("attr_keys", "attr_item_keys", "attr_tokens", "attr_weights",
                    "default_item_row")


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


@dataclass(frozen=True, eq=False)
class Delta:
    """What changed in the trainer since the previous delta (sequence rules: ``model.delta.apply``)."""

    base_version: str
    seq: int
    offsets: Mapping[str, int]
    trained_through_ms: int | None
    samples_trained: int
    user_keys: np.ndarray
    user_rows: np.ndarray
    removed_users: np.ndarray
    default_user_row: np.ndarray
    hist_keys: np.ndarray
    hist_rows: np.ndarray
    removed_hist: np.ndarray
    new_item_keys: np.ndarray
    new_item_ids: np.ndarray
    removed_items: np.ndarray
    prior_buckets: np.ndarray
    prior_base: np.ndarray
    #: All-time positives (float64) of ``prior_buckets`` (``model.scoring.cold``).
    prior_count: np.ndarray
    prior_scalars: tuple[float, float, float]
    #: Dense ids ``first ..`` of the co-visitation's new item keys.
    covisit_first_id: int
    covisit_new_keys: np.ndarray
    covisit_codes: np.ndarray
    covisit_values: np.ndarray
    covisit_removed: np.ndarray
    covisit_scale: float
    weights: tuple[float, float, float, float]
    layers: tuple[Layer, ...]
    #: The lineage's constants: snapshots (``seq == 0``) only.
    constants: Constants | None = None
    created_at: str | None = None
    #: The trainer's :func:`state_checksum` of the state this delta leads to ("" = none).
    state_checksum: str = ""
    extra: Mapping[str, Any] = field(default_factory=dict)
    #: What a user with no history is ranked by (``model.scoring.cold``): "mix", "prior" or
    #: "popular".
    cold_start: str = "mix"
    #: A snapshot's session-kNN index, whole (``SessionIndex.to_arrays``; None: no part).
    sessions: Mapping[str, np.ndarray] | None = None
    #: A delta's session-kNN positives learnt since the record before, as
    #: ``SessionIndex.drain`` gives them: (user keys, item keys, positives per ``learn``
    #: call), replayed by ``SessionIndex.learned_copy`` (None: no part).
    sessions_positives: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None
    #: The session-kNN part's mix weight (read only from a record that carries the part).
    sessions_weight: float = 0.0
    #: Per history group, the neighbour parts' scales (the artifact's ``history_groups``
    #: entry, ``model.scoring.selector``; None: the weights alone). Every record carries the
    #: trainer's current entry.
    history_groups: Mapping[str, Any] | None = None
    #: The towers' scales on rarely chosen items (``model.scoring.rarity.item_groups_entry``;
    #: None: 1 for every item). Every record carries the trainer's current entry.
    item_groups: Mapping[str, Any] | None = None
    #: With attribute slots (``constants.attr_tokens``): the attribute rows and item
    #: entries that changed, and the default item row (every record of such a lineage).
    attributes: Attributes | None = None

    @property
    def rows_changed(self) -> int:
        extra = 0 if self.attributes is None else int(self.attributes.keys.size)
        return int(self.user_keys.size + self.hist_keys.size) + extra

    @property
    def carries_sessions(self) -> bool:
        """Whether the record holds the session-kNN part (its index or positives, and weight)."""
        return self.sessions is not None or self.sessions_positives is not None


def encode(delta: Delta, codec: str = "float32", *, compress: bool = False) -> bytes:
    """The delta as one record (``model.delta.wire``); user and history rows in ``codec``."""
    meta: dict[str, Any] = {
        "base_version": delta.base_version, "seq": delta.seq, "offsets": dict(delta.offsets),
        "trained_through_ms": delta.trained_through_ms, "samples_trained": delta.samples_trained,
        "prior_scalars": list(delta.prior_scalars), "covisit_first_id": delta.covisit_first_id,
        "covisit_scale": delta.covisit_scale, "weights": list(delta.weights),
        "activations": [act for _, _, act in delta.layers], "codec": codec,
        "constants": delta.constants.to_json() if delta.constants else None,
        "created_at": delta.created_at, "state_checksum": delta.state_checksum,
        "extra": dict(delta.extra), "cold_start": delta.cold_start,
    }
    arrays: dict[str, np.ndarray] = {}
    for name in ("user", "hist"):
        for part, arr in encode_rows(getattr(delta, f"{name}_rows"), codec).items():
            arrays[f"{name}_rows.{part}"] = arr
    for name in ("user_keys", "removed_users", "default_user_row", "hist_keys", "removed_hist",
                 "new_item_keys", "new_item_ids", "removed_items", "prior_buckets",
                 "prior_base", "prior_count", "covisit_new_keys", "covisit_codes", "covisit_values",
                 "covisit_removed"):
        arrays[name] = getattr(delta, name)
    for i, (w, b, _) in enumerate(delta.layers):
        arrays[f"layer_{i}_w"], arrays[f"layer_{i}_b"] = w, b
    if delta.history_groups is not None:
        meta["history_groups"] = dict(delta.history_groups)
    if delta.item_groups is not None:
        meta["item_groups"] = dict(delta.item_groups)
    if delta.attributes is not None:
        a = delta.attributes
        for part, arr in encode_rows(a.rows, codec).items():
            arrays[f"attr_rows.{part}"] = arr
        arrays.update(zip(ATTRIBUTE_ARRAYS, (
            np.asarray(a.keys, np.int64), np.asarray(a.item_keys, np.int64),
            np.asarray(a.tokens, np.int64), np.asarray(a.weights, np.float32),
            np.asarray(a.default_row, np.float32)), strict=True))
    if delta.carries_sessions:
        meta["sessions_weight"] = float(delta.sessions_weight)
        if delta.sessions is not None:
            arrays.update({name: np.asarray(delta.sessions[name], np.int64)
                           for name in SESSION_ARRAYS})
        if delta.sessions_positives is not None:
            arrays.update({name: np.asarray(a, np.int64)
                           for name, a in zip(POSITIVES, delta.sessions_positives, strict=True)})
    return pack(meta, arrays, compress=compress)


def decode(record: bytes) -> Delta:
    """Inverse of :func:`encode` (checksum verified; rows back in float32)."""
    meta, arrays = unpack(record)
    try:
        codec = meta["codec"]
        rows = {
            name: decode_rows({k.split(".", 1)[1]: v for k, v in arrays.items()
                               if k.startswith(f"{name}_rows.")}, codec)
            for name in ("user", "hist")
        }
        layers = tuple(
            (arrays[f"layer_{i}_w"], arrays[f"layer_{i}_b"], str(act))
            for i, act in enumerate(meta["activations"])
        )
        constants = Constants(**meta["constants"]) if meta.get("constants") else None
        return Delta(
            base_version=str(meta["base_version"]), seq=int(meta["seq"]),
            offsets={str(k): int(v) for k, v in meta["offsets"].items()},
            trained_through_ms=meta["trained_through_ms"],
            samples_trained=int(meta["samples_trained"]),
            user_keys=arrays["user_keys"], user_rows=rows["user"],
            removed_users=arrays["removed_users"], default_user_row=arrays["default_user_row"],
            hist_keys=arrays["hist_keys"], hist_rows=rows["hist"],
            removed_hist=arrays["removed_hist"], new_item_keys=arrays["new_item_keys"],
            new_item_ids=arrays["new_item_ids"], removed_items=arrays["removed_items"],
            prior_buckets=arrays["prior_buckets"], prior_base=arrays["prior_base"],
            prior_count=_prior_count(arrays),
            prior_scalars=tuple(float(x) for x in meta["prior_scalars"]),  # type: ignore[arg-type]
            covisit_first_id=int(meta["covisit_first_id"]),
            covisit_new_keys=arrays["covisit_new_keys"], covisit_codes=arrays["covisit_codes"],
            covisit_values=arrays["covisit_values"], covisit_removed=arrays["covisit_removed"],
            covisit_scale=float(meta["covisit_scale"]),
            weights=tuple(float(x) for x in meta["weights"]),  # type: ignore[arg-type]
            layers=layers, constants=constants, created_at=meta.get("created_at"),
            state_checksum=str(meta.get("state_checksum", "")), extra=meta.get("extra", {}),
            cold_start=_cold_start(meta.get("cold_start", MIX)),
            history_groups=_history_groups(meta.get("history_groups")),
            item_groups=_item_groups(meta.get("item_groups")),
            attributes=_attributes(arrays, codec),
            **_sessions(meta, arrays),
        )
    except (KeyError, TypeError, ValueError, ArtifactError) as exc:
        raise DeltaError(f"delta record lacks or garbles {exc}") from exc


def _sessions(meta: Mapping[str, Any], arrays: Mapping[str, np.ndarray]) -> dict[str, Any]:
    """The record's session-kNN fields of :class:`Delta` (none in a record without the part,
    among them every record written before the part travelled)."""
    if "sessions_weight" not in meta:
        return {}
    out: dict[str, Any] = {"sessions_weight": float(meta["sessions_weight"])}
    held = [name in arrays for name in SESSION_ARRAYS]
    if any(held):
        if not all(held):
            raise ValueError(f"the session-kNN index needs every one of {SESSION_ARRAYS}")
        out["sessions"] = {name: arrays[name] for name in SESSION_ARRAYS}
    if any(name in arrays for name in POSITIVES):
        users, items, calls = (arrays[name] for name in POSITIVES)
        if (any(a.dtype != np.int64 for a in (users, items, calls))
                or users.ndim != 1 or items.shape != users.shape or calls.ndim != 1
                or (calls < 0).any() or int(calls.sum()) != users.size):
            raise ValueError("the session-kNN positives do not add up to their calls")
        out["sessions_positives"] = (users, items, calls)
    if not out.keys() & {"sessions", "sessions_positives"}:
        raise ValueError("sessions_weight without the session-kNN index or positives")
    return out


def _attributes(arrays: Mapping[str, np.ndarray], codec: str) -> Attributes | None:
    """The record's :class:`Attributes` (None in a record without attribute slots)."""
    held = [name in arrays for name in ATTRIBUTE_ARRAYS]
    if not any(held):
        return None
    if not all(held):
        raise ValueError(f"attributes need every one of {ATTRIBUTE_ARRAYS}")
    rows = decode_rows({k.split(".", 1)[1]: v for k, v in arrays.items()
                        if k.startswith("attr_rows.")}, codec)
    keys, items, tokens, weights, default = (arrays[n] for n in ATTRIBUTE_ARRAYS)
    if (keys.ndim != 1 or rows.shape[0] != keys.size or items.ndim != 1
            or tokens.ndim != 2 or tokens.shape[0] != items.size or weights.shape != tokens.shape
            or default.ndim != 1 or (keys.size and rows.shape[1] != default.size)):
        raise ValueError("attribute arrays of mismatched shapes")
    return Attributes(keys=keys, rows=rows, item_keys=items, tokens=tokens, weights=weights,
                      default_row=default)


def _prior_count(arrays: Mapping[str, np.ndarray]) -> np.ndarray:
    """The record's ``prior_count``: one per prior bucket (a record written before the
    counts travelled has none: zeros, and it never chose the popularity ranking)."""
    buckets = arrays["prior_buckets"]
    count = arrays.get("prior_count")
    if count is None:
        return np.zeros(buckets.shape, np.float64)
    if count.shape != buckets.shape:
        raise ValueError(f"prior_count {count.shape} does not match prior_buckets {buckets.shape}")
    return np.asarray(count, np.float64)


def _history_groups(entry: Any) -> dict[str, Any] | None:
    """The record's ``history_groups`` entry, checked as the artifact reader checks it."""
    if entry is None:
        return None
    check_history_groups(entry, "delta: ")
    return dict(entry)


def _item_groups(entry: Any) -> dict[str, Any] | None:
    """The record's ``item_groups`` entry, checked (``model.scoring.rarity``)."""
    if entry is None:
        return None
    check_item_groups(entry, "delta: ")
    return dict(entry)


def _cold_start(value: Any) -> str:
    if value not in CHOICES:
        raise ValueError(f"cold_start {value!r} not in {CHOICES}")
    return str(value)


def peek(record: bytes) -> tuple[str, int]:
    """(base version, seq) of a record, checksum verified, without building the delta."""
    meta, _ = unpack(record)
    return str(meta["base_version"]), int(meta["seq"])
