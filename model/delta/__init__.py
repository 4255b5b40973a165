"""Deltas: what changed in the trainer between two full versions (numpy only; spec
``model/delta/FORMAT.md``). Serving imports this package; it never imports TensorFlow.

* ``wire`` — the binary record (header + arrays + checksum) and the row codecs
  (float32, float16, bfloat16, int8 with a per-row scale).
* ``state`` — :class:`ModelState`, the served model in the form deltas change it, and
  :func:`compose` (a state as a ``ServingArtifact``), :func:`state_checksum`.
* ``served`` — :class:`Composer`: each state of a lineage as an artifact, patched per
  delta from the last one (equal to :func:`compose`).
* ``shared`` — a state and its artifact as one file other processes map (one composer per
  host, ``serving.shared_state``).
* ``apply`` — :class:`Delta`, :func:`encode` / :func:`decode`, :func:`apply` (pure: a new
  state; idempotent by sequence; :class:`DeltaGap` / :class:`UnknownBase` ask for a resync).
"""

from model.delta.apply import (
    Delta,
    DeltaGap,
    UnknownBase,
    apply,
    decode,
    empty_state,
    encode,
    from_snapshot,
    peek,
)
from model.delta.wire import CODECS, SNAPSHOT_FILE, DeltaError, decode_rows, encode_rows
from model.delta.served import Composer
from model.delta.state import Constants, ModelState, compose, state_checksum

__all__ = [
    "CODECS", "SNAPSHOT_FILE", "Composer", "Constants", "Delta", "DeltaError", "DeltaGap", "ModelState", "UnknownBase",
    "apply", "compose", "decode", "decode_rows", "empty_state", "encode", "encode_rows",
    "from_snapshot", "peek", "state_checksum",
]
