"""A state and its served artifact in a file that other processes map (numpy only).

With ``serve --workers N`` one composer per host applies the deltas (``serving.shared_state``)
and writes each state it serves into one of a few *slot* files; the workers map the slots
read-only and rebuild the very artifact the composer checked, without arithmetic.

Layout::

    b"SRS1" | u64 LE generation | u32 LE header length | header (UTF-8 JSON) | arrays

The generation is 0 while a slot is written (:func:`mark_writing` first, :func:`write_shared`
last), so a reader that finds another generation than the one it was told of does not read
on. No checksum (the file never leaves the host); a reader checks the magic, the generation,
the size and every array's bounds. The header in detail: docs/internals.md. The session-kNN
index travels as its arrays (``SessionIndex.to_arrays``) with its items' catalog rows; a
reader loads it (``load_arrays``: it sorts the pairs by item once, the one step a reader
computes).
"""

from __future__ import annotations

import json
import mmap
import os
import struct
from collections.abc import Mapping
from typing import Any, BinaryIO

import numpy as np

from model.artifact.files import ServingArtifact
from model.artifact.sessions import ARRAY_NAMES as SESSION_ARRAYS
from model.artifact.sessions import ROWS as SESSION_ROWS
from model.delta.served import item_index, servable
from model.delta.state import Attributes, Constants, ModelState
from model.delta.wire import DeltaError
from model.scoring.sessions import HOLDER_ARRAYS

MAGIC = b"SRS1"
#: Byte alignment of every array in the file.
ALIGN = 64
#: ModelState's arrays, by field name.
STATE_ARRAYS = (
    "user_keys", "user_rows", "default_user_row", "hist_keys", "hist_rows", "item_keys",
    "item_ids", "prior_buckets", "prior_base", "prior_count", "covisit_keys", "covisit_codes",
    "covisit_values",
)
#: A slot that must grow grows by a further 1 / GROWTH of what it holds (catalogs and tables
#: grow a little with most deltas; a reader maps a slot anew only when it grew).
GROWTH = 8
_COVISIT = ("covisit_indptr", "covisit_neighbours", "covisit_weights")
#: A state's :class:`Attributes` (by field, prefixed), and the rows histories are pooled from.
_ATTRIBUTES = ("keys", "rows", "item_keys", "tokens", "weights", "default_row")
_SERVED_HIST = "served_hist_rows"
_PREFIX = struct.Struct("<4sQI")  # magic, generation, header length


def _aligned(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


def mark_writing(f: BinaryIO) -> None:
    """Set the generation of the slot open in ``f`` to 0 (being written), before a write."""
    os.pwrite(f.fileno(), struct.pack("<Q", 0), 4)


def set_generation(f: BinaryIO, generation: int) -> None:
    """Set the generation of the slot open in ``f`` (a write back to what it was)."""
    os.pwrite(f.fileno(), struct.pack("<Q", generation), 4)


def generation(buf: Any) -> int:
    """The generation of a slot's mapping (0: being written; -1: not a slot)."""
    if len(buf) < _PREFIX.size:
        return -1
    magic, gen, _ = _PREFIX.unpack_from(buf, 0)
    return int(gen) if magic == MAGIC else -1


def write_shared(f: BinaryIO, state: ModelState, artifact: ServingArtifact,
                 status: Mapping[str, Any] | None, gen: int) -> int:
    """Write ``state`` and its ``artifact`` (the one composed from it) into the slot open in
    ``f`` (``r+b``) from its start, over what was there, then its generation ``gen`` (> 0).
    Call :func:`mark_writing` before, so no reader takes the slot half written. Returns the
    bytes in use (the file is never shortened)."""
    if gen <= 0:
        raise DeltaError(f"a slot's generation is positive, not {gen}")
    arrays: dict[str, np.ndarray] = {name: getattr(state, name) for name in STATE_ARRAYS}
    for i, (w, b, _) in enumerate(state.layers):
        arrays[f"layer_{i}_w"], arrays[f"layer_{i}_b"] = w, b
    arrays["item_vectors"] = artifact.item_vectors
    if artifact.item_popularity is not None:
        arrays["item_popularity"] = artifact.item_popularity
    if artifact.covisit is not None:
        arrays.update(zip(_COVISIT, artifact.covisit, strict=True))
    if state.sessions is not None:  # with the holders by recency: no sort in the workers
        arrays.update(state.sessions.to_arrays(holders=True))
    if artifact.sessions_rows is not None:
        arrays[SESSION_ROWS] = artifact.sessions_rows
    if state.attributes is not None:
        arrays.update((f"attr_{name}", getattr(state.attributes, name)) for name in _ATTRIBUTES)
        arrays[_SERVED_HIST] = artifact.item_hist_rows
    meta = {
        "constants": state.constants.to_json(), "base_version": state.base_version,
        "seq": state.seq, "prior_scalars": list(state.prior_scalars),
        "covisit_scale": state.covisit_scale, "weights": list(state.weights),
        "activations": [act for _, _, act in state.layers],
        "trained_through_ms": state.trained_through_ms, "offsets": dict(state.offsets),
        "samples_trained": state.samples_trained, "created_at": state.created_at,
        "cold_start": state.cold_start,
    }
    if state.sessions is not None:
        meta["sessions_weight"] = float(state.sessions_weight)
    if state.history_groups is not None:
        meta["history_groups"] = dict(state.history_groups)
    if state.item_groups is not None:
        meta["item_groups"] = dict(state.item_groups)
    specs: list[dict[str, Any]] = []
    contiguous: dict[str, np.ndarray] = {}
    at = 0
    for name, arr in arrays.items():
        a = np.ascontiguousarray(arr)
        if a.dtype.kind not in "biufU":
            raise DeltaError(f"{name}: dtype {a.dtype} cannot be shared")
        contiguous[name] = a
        specs.append({"name": name, "dtype": a.dtype.str, "shape": list(a.shape),
                      "at": at, "bytes": a.nbytes})
        at = _aligned(at + a.nbytes)
    header: dict[str, Any] = {"meta": meta, "status": dict(status or {}), "arrays": specs}
    # the offsets count from the file's start, after a header sized with room for their
    # longer digits and the size
    head_len = _aligned(_PREFIX.size + len(json.dumps(header).encode()) + 64 + 24 * len(specs))
    for spec in specs:
        spec["at"] += head_len
    header["size"] = head_len + at
    head = json.dumps(header).encode()
    if _PREFIX.size + len(head) > head_len:
        raise DeltaError("shared state header outgrew its room")
    fd = f.fileno()
    os.pwrite(fd, _PREFIX.pack(MAGIC, 0, len(head)) + head, 0)
    for spec in specs:
        a = contiguous[spec["name"]]
        if a.nbytes:
            os.pwrite(fd, a.data.cast("B"), spec["at"])
    if os.fstat(fd).st_size < header["size"]:  # grown: with room, so readers seldom remap
        os.ftruncate(fd, _aligned(header["size"] + header["size"] // GROWTH))
    set_generation(f, gen)
    return int(header["size"])


def map_slot(f: BinaryIO) -> mmap.mmap:
    """A read-only shared mapping of the whole slot open in ``f``, its pages mapped at once
    (no request faults them in)."""
    return mmap.mmap(f.fileno(), 0, flags=mmap.MAP_SHARED | mmap.MAP_POPULATE,
                     prot=mmap.PROT_READ)


def read_shared(buf: Any, gen: int, previous: ServingArtifact | None = None,
                prefix_known: bool = False
                ) -> tuple[ModelState, ServingArtifact, dict[str, Any]]:
    """The state, artifact and composer status of generation ``gen`` in a slot's mapping
    ``buf``: arrays are read-only views of it (they keep it mapped while they live).
    ``previous``: the artifact read before, whose id -> row map is reused when the catalog
    only grew (``model.delta.state.item_index``; ``prefix_known``: the writer said so).
    :class:`DeltaError` if the slot holds
    another generation (rewritten since: the caller must not use it)."""
    found = generation(buf)
    if found != gen:
        raise DeltaError(f"slot holds generation {found}, not {gen}")
    _, _, n = _PREFIX.unpack_from(buf, 0)
    size = len(buf)
    try:
        header = json.loads(buf[_PREFIX.size : _PREFIX.size + n])
        if header["size"] > size:
            raise DeltaError(f"slot of {size} bytes, its header says {header['size']}")
        arrays: dict[str, np.ndarray] = {}
        for spec in header["arrays"]:
            dtype = np.dtype(spec["dtype"])
            count = int(np.prod(spec["shape"], dtype=np.int64))
            if spec["at"] < _PREFIX.size + n or spec["at"] + count * dtype.itemsize > size:
                raise DeltaError(f"{spec['name']} lies outside the slot")
            arrays[spec["name"]] = np.frombuffer(
                buf, dtype, count, spec["at"]).reshape(spec["shape"])
        meta = header["meta"]
        layers = tuple((arrays[f"layer_{i}_w"], arrays[f"layer_{i}_b"], str(act))
                       for i, act in enumerate(meta["activations"]))
        constants = Constants(**meta["constants"])
        sessions = constants.session_index()
        if sessions is not None:
            sessions.load_arrays({name: arrays[name] for name in (*SESSION_ARRAYS,
                                                                  *HOLDER_ARRAYS)})
        state = ModelState(
            constants=constants, base_version=str(meta["base_version"]),
            seq=int(meta["seq"]), prior_scalars=tuple(meta["prior_scalars"]),
            covisit_scale=float(meta["covisit_scale"]),
            weights=tuple(meta["weights"]),
            layers=layers, trained_through_ms=meta["trained_through_ms"],
            offsets={str(k): int(v) for k, v in meta["offsets"].items()},
            samples_trained=int(meta["samples_trained"]), created_at=meta["created_at"],
            cold_start=str(meta.get("cold_start", "mix")),
            sessions=sessions, sessions_weight=float(meta.get("sessions_weight", 0.0)),
            history_groups=meta.get("history_groups"),
            item_groups=meta.get("item_groups"),
            attributes=(Attributes(**{n: arrays[f"attr_{n}"] for n in _ATTRIBUTES})
                        if constants.attr_tokens else None),
            **{name: arrays[name] for name in STATE_ARRAYS},
        )
        covisit = tuple(arrays[name] for name in _COVISIT) if _COVISIT[0] in arrays else None
        artifact = servable(state, arrays["item_vectors"], covisit,  # type: ignore[arg-type]
                            item_index(state.item_ids, previous, prefix_known),
                            arrays.get("item_popularity"), arrays.get(SESSION_ROWS),
                            arrays.get(_SERVED_HIST))
    except (KeyError, TypeError, ValueError) as exc:
        raise DeltaError(f"shared state lacks or garbles {exc}") from exc
    if generation(buf) != gen:  # rewritten while read: the views are not of one state
        raise DeltaError(f"slot rewritten while read (generation {gen})")
    return state, artifact, dict(header["status"])
