"""Point-in-time training samples: the ``samples`` topic record of a positive event.

Part of the feature definitions (re-exported by ``feature_store.features``): the history of a
sample is built from the user state *before* the event and holds only interactions strictly
earlier than the event (``ts < event.ts_ms``), never the sample's own item, at most
``history_len`` entries.
"""

from __future__ import annotations

import json
import operator
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import orjson

if TYPE_CHECKING:
    from feature_store.features import Event, UserState


@dataclass(frozen=True, slots=True)
class Sample:
    """A training example (the ``samples`` topic wire format)."""

    sample_id: str
    user_id: str
    item_id: str
    event_type: str
    weight: float
    ts_ms: int
    history: tuple[str, ...]

    def to_wire(self) -> dict[str, Any]:
        return {
            "sample_id": self.sample_id,
            "user_id": self.user_id,
            "item_id": self.item_id,
            "event_type": self.event_type,
            "weight": self.weight,
            "ts": self.ts_ms,
            "history": list(self.history),
        }

    def to_json(self) -> str:
        """Compact JSON, ASCII-escaped: exactly ``json.dumps(to_wire(), separators=(",", ":"))``.

        orjson writes the same bytes (keys in order, no spaces, ints, a float in fixed
        notation as its shortest repr) at a tenth of the cost when every string is ASCII and
        the weight is 0 or in [1e-4, 1e16); anything else (escapes, exponents, NaN) takes
        ``json``.
        """
        wire = self.to_wire()
        w = abs(self.weight)
        if w == 0 or 1e-4 <= w < 1e16:
            try:
                data = orjson.dumps(wire)
            except orjson.JSONEncodeError:
                data = b"\x80"  # e.g. an int over 64 bits: take json
            if data.isascii():
                return data.decode()
        return json.dumps(wire, separators=(",", ":"))


_ITEM_OF = operator.itemgetter(0)


def make_sample(
    user_state_before: UserState, event: Event, weights: Mapping[str, float], history_len: int
) -> Sample | None:
    """The training sample of ``event``, or ``None`` if it is not a positive (weight <= 0).

    ``user_state_before`` is the user's state before ``event`` is applied; only its
    interactions strictly before ``event.ts_ms`` are used, and never ``event.item_id`` itself.
    """
    weight = float(weights.get(event.event_type, 0.0))
    if weight <= 0:
        return None
    ts_ms, target = event.ts_ms, event.item_id
    entries = user_state_before.history
    if entries and entries[0][2] < ts_ms:  # in order: every entry is strictly earlier
        history = list(map(_ITEM_OF, entries))
        if target in history:
            history = [i for i in history if i != target]
    else:
        history = [h[0] for h in entries if h[2] < ts_ms and h[0] != target]
    del history[history_len:]
    return Sample(
        sample_id=event.event_id,
        user_id=event.user_id,
        item_id=event.item_id,
        event_type=event.event_type,
        weight=weight,
        ts_ms=event.ts_ms,
        history=tuple(history),
    )
