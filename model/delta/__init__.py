"""Deltas: what changed in the trainer between two full versions (numpy only; spec
``model/delta/FORMAT.md``). Serving imports this package; it never imports TensorFlow.

A delta goes through four stages, one module each, in this order:

* ``wire`` — :class:`Delta` and its record: :func:`encode` / :func:`decode` / :func:`peek`,
  the header, arrays and checksum, and the row codecs (float32, float16, bfloat16, int8).
* ``state`` — :class:`ModelState` (the served model in the form deltas change it),
  :class:`Constants`, :func:`state_checksum`.
* ``apply`` — :func:`apply` (pure: a new state; idempotent by sequence; :class:`DeltaGap` /
  :class:`UnknownBase` ask for a resync), :func:`from_snapshot`, :func:`empty_state`.
* ``served`` — :func:`compose` (a state as a ``ServingArtifact``) and :class:`Composer`
  (each state of a lineage, patched per delta from the last one).
* ``shared`` — a state and its artifact as one file other processes map.
"""

from model.delta.apply import DeltaGap, UnknownBase, apply, empty_state, from_snapshot
from model.delta.served import Composer, compose
from model.delta.state import Attributes, Constants, ModelState, state_checksum
from model.delta.wire import (
    CODECS,
    SNAPSHOT_FILE,
    Delta,
    DeltaError,
    decode,
    decode_rows,
    encode,
    encode_rows,
    peek,
)

__all__ = [
    "CODECS", "SNAPSHOT_FILE", "Attributes", "Composer", "Constants", "Delta", "DeltaError", "DeltaGap", "ModelState", "UnknownBase",
    "apply", "compose", "decode", "decode_rows", "empty_state", "encode", "encode_rows",
    "from_snapshot", "peek", "state_checksum",
]
