"""The feature spec: the slots an item, a user's context and an event's time are described by.

One spec serves the ingest API (what an item may carry), the feature job (what the catalogue
keeps) and the model's attribute slots (``streamrec evaluate --items`` for now; the live trainer
and serving do not read the catalogue yet): each slot turns a raw
value into tokens (:func:`slot_tokens`) and each token into an int64 key of its own key space
(:func:`slot_keys`), the key a TFRA slot table holds a row for (an item's, as the model
composes them: :func:`attribute_row`). Adding a slot is configuration:
a JSON file named by ``features.spec_file`` (``FeatureSpec.load``), else :data:`DEFAULT_SLOTS`.

Kinds: ``categorical`` (one string), ``multi`` (a list of strings: tags, genres), ``numeric``
(a finite number, bucketised by ascending ``buckets`` boundaries), ``text`` (a string: lower-cased
word tokens, the first ``max_values``), and the derived time slots ``hour`` and ``weekday`` (from
the event time, UTC). Sources: ``item`` (catalogue attributes), ``context`` (an event's
``context`` entry of the same name) and ``time``.

Pure functions, no I/O beyond :meth:`FeatureSpec.load`; the catalogue's store layout is in
``feature_store/FORMAT.md`` and the item record on the ``items`` topic in ``stream/items.py``.
"""

from __future__ import annotations

import bisect
import hashlib
import json
import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from streamrec.ids import hash_id

__all__ = [
    "DEFAULT_SLOTS",
    "KINDS",
    "SOURCES",
    "AttributeProblem",
    "FeatureSpec",
    "attribute_row",
    "Slot",
    "check_attributes",
    "slot_keys",
    "slot_tokens",
]

KINDS = ("categorical", "multi", "numeric", "text", "hour", "weekday")
SOURCES = ("item", "context", "time")
#: Longest categorical value or tag, in characters.
MAX_VALUE_LEN = 128
#: Largest integer (in magnitude) a numeric attribute may be: a float holds it exactly.
MAX_EXACT_INT = 2**53
_TOKEN = re.compile(r"[^\W_]+", re.UNICODE)
_MS_PER_HOUR = 3_600_000
_MS_PER_DAY = 24 * _MS_PER_HOUR
#: 1970-01-01 was a Thursday: weekday 0 = Monday.
_EPOCH_WEEKDAY = 3


class AttributeProblem(ValueError):
    """An item attribute that breaks the spec; ``field`` names it (``attributes.tags[3]``)."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


@dataclass(frozen=True)
class Slot:
    """One feature slot: where its value comes from, how it becomes tokens."""

    name: str
    kind: str
    source: str = "item"
    #: ``numeric``: ascending bucket boundaries (a value v falls in bucket bisect_right(v)).
    buckets: tuple[float, ...] = ()
    #: ``multi``: most values; ``text``: most tokens kept (the first ones).
    max_values: int = 32
    #: ``text``: longest accepted text in characters.
    max_len: int = 1000

    def __post_init__(self) -> None:
        if not re.fullmatch(r"[a-z][a-z0-9_]{0,31}", self.name):
            raise ValueError(f"slot name {self.name!r}: lower-case letters, digits, _ (≤ 32)")
        if self.kind not in KINDS:
            raise ValueError(f"slot {self.name}: kind must be one of {', '.join(KINDS)}")
        if self.source not in SOURCES:
            raise ValueError(f"slot {self.name}: source must be one of {', '.join(SOURCES)}")
        if (self.kind in ("hour", "weekday")) != (self.source == "time"):
            raise ValueError(f"slot {self.name}: the time kinds (hour, weekday) need source time")
        if self.kind == "numeric":
            b = self.buckets
            if not b or any(not math.isfinite(x) for x in b) or list(b) != sorted(set(b)):
                raise ValueError(f"slot {self.name}: numeric needs ascending finite buckets")
        if self.max_values < 1 or self.max_len < 1:
            raise ValueError(f"slot {self.name}: max_values and max_len must be >= 1")

    @property
    def key_kind(self) -> str:
        """The hash namespace of this slot's tokens (disjoint from user and item ids)."""
        return f"slot:{self.name}"

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name, "kind": self.kind, "source": self.source}
        if self.kind == "numeric":
            out["buckets"] = list(self.buckets)
        if self.kind in ("multi", "text"):
            out["max_values"] = self.max_values
        if self.kind == "text":
            out["max_len"] = self.max_len
        return out


#: The slots of a spec nobody wrote: common catalogue attributes, a device context and time.
DEFAULT_SLOTS: tuple[Slot, ...] = (
    Slot("category", "categorical"),
    Slot("brand", "categorical"),
    Slot("genres", "multi"),
    Slot("tags", "multi"),
    Slot("price", "numeric", buckets=(1, 2, 5, 10, 20, 50, 100, 200, 500, 1000)),
    Slot("title", "text", max_values=16),
    Slot("device", "categorical", source="context"),
    Slot("hour", "hour", source="time"),
    Slot("weekday", "weekday", source="time"),
)


@dataclass(frozen=True)
class FeatureSpec:
    """The declared slots (see the module doc); ``digest`` names the spec in manifests."""

    slots: tuple[Slot, ...] = DEFAULT_SLOTS

    def __post_init__(self) -> None:
        names = [s.name for s in self.slots]
        if len(set(names)) != len(names):
            raise ValueError("slot names must be distinct")

    @property
    def by_name(self) -> Mapping[str, Slot]:
        return {s.name: s for s in self.slots}

    @classmethod
    def from_json(cls, obj: Any) -> FeatureSpec:
        """From ``{"slots": [{"name", "kind", "source"?, "buckets"?, "max_values"?,
        "max_len"?}, ...]}``; unknown keys are errors."""
        if not isinstance(obj, dict) or set(obj) != {"slots"} or not isinstance(obj["slots"], list):
            raise ValueError('a feature spec is {"slots": [...]}')
        slots = []
        allowed = {"name", "kind", "source", "buckets", "max_values", "max_len"}
        for i, s in enumerate(obj["slots"]):
            if not isinstance(s, dict) or not set(s) <= allowed or not {"name", "kind"} <= set(s):
                raise ValueError(f"slots[{i}]: needs name and kind, may have {sorted(allowed)}")
            s = dict(s)
            if "buckets" in s:
                s["buckets"] = tuple(float(x) for x in s["buckets"])
            slots.append(Slot(**s))
        return cls(tuple(slots))

    @classmethod
    def load(cls, path: Path | str | None) -> FeatureSpec:
        """The spec of a JSON file, or the default spec when ``path`` is None."""
        if path is None:
            return cls()
        try:
            return cls.from_json(json.loads(Path(path).read_text()))
        except (OSError, ValueError, TypeError) as exc:
            raise ValueError(f"feature spec {path}: {exc}") from exc

    def to_json(self) -> dict[str, Any]:
        return {"slots": [s.to_json() for s in self.slots]}

    @property
    def digest(self) -> str:
        """A short hash of the spec: artifacts and checkpoints name the spec they were built with."""
        raw = json.dumps(self.to_json(), sort_keys=True).encode()
        return hashlib.blake2b(raw, digest_size=8).hexdigest()

    def of_source(self, source: str) -> tuple[Slot, ...]:
        return tuple(s for s in self.slots if s.source == source)

    @property
    def item_slots(self) -> tuple[Slot, ...]:
        return self.of_source("item")


def _check_str(name: str, value: Any, limit: int) -> str:
    if type(value) is not str:
        raise AttributeProblem(name, "should be a string")
    if not value.strip():
        raise AttributeProblem(name, "should not be empty")
    if len(value) > limit:
        raise AttributeProblem(name, f"longer than {limit} characters")
    if not value.isascii():
        try:
            value.encode()
        except UnicodeEncodeError:
            raise AttributeProblem(name, "should be valid Unicode text") from None
    return value


def check_value(slot: Slot, value: Any, where: str) -> Any:
    """``value`` normalised for ``slot`` (multi values deduplicated, order kept), or
    :class:`AttributeProblem` naming ``where``."""
    if slot.kind == "categorical":
        return _check_str(where, value, MAX_VALUE_LEN)
    if slot.kind == "multi":
        if not isinstance(value, list):
            raise AttributeProblem(where, "should be a list of strings")
        if len(value) > slot.max_values:
            raise AttributeProblem(where, f"more than {slot.max_values} values")
        seen: dict[str, None] = {}
        for i, v in enumerate(value):
            seen[_check_str(f"{where}[{i}]", v, MAX_VALUE_LEN)] = None
        return list(seen)
    if slot.kind == "numeric":
        if type(value) is int:
            if abs(value) > MAX_EXACT_INT:
                raise AttributeProblem(where, "integers beyond ±2^53 are not exact numbers")
        elif type(value) is not float or not math.isfinite(value):
            raise AttributeProblem(where, "should be a finite number")
        return value
    if slot.kind == "text":
        return _check_str(where, value, slot.max_len)
    raise AttributeProblem(where, f"slot {slot.name} is derived ({slot.kind}), not given")


def check_attributes(spec: FeatureSpec, attributes: Any, prefix: str = "attributes") -> dict[str, Any]:
    """An item's attributes checked against the spec's item slots: every key must be an item
    slot, every value of its kind (:func:`check_value`); returns them normalised."""
    if not isinstance(attributes, dict):
        raise AttributeProblem(prefix, "should be an object")
    out: dict[str, Any] = {}
    for name, value in attributes.items():
        slot = spec.by_name.get(name)
        if slot is None or slot.source != "item":
            known = ", ".join(s.name for s in spec.item_slots) or "none"
            raise AttributeProblem(f"{prefix}.{name}", f"unknown attribute (item slots: {known})")
        out[name] = check_value(slot, value, f"{prefix}.{name}")
    return out


def slot_tokens(slot: Slot, value: Any) -> list[str]:
    """The tokens a (checked) value stands for in ``slot``; time slots take epoch ms."""
    if value is None:
        return []
    kind = slot.kind
    if kind == "categorical":
        return [str(value)]
    if kind == "multi":
        return [str(v) for v in value]
    if kind == "numeric":
        return [f"b{bisect.bisect_right(slot.buckets, float(value))}"]
    if kind == "text":
        seen: dict[str, None] = {}
        for tok in _TOKEN.findall(str(value).lower()):
            seen[tok] = None
            if len(seen) >= slot.max_values:
                break
        return list(seen)
    if kind == "hour":
        return [str((int(value) // _MS_PER_HOUR) % 24)]
    return [str((int(value) // _MS_PER_DAY + _EPOCH_WEEKDAY) % 7)]  # weekday


def slot_keys(slot: Slot, tokens: Iterable[str]) -> list[int]:
    """int64 keys of ``tokens`` in the slot's own key space (``streamrec.ids.hash_id``)."""
    return [hash_id(slot.key_kind, t) for t in tokens]


def attribute_row(
    spec: FeatureSpec, attributes: Mapping[str, Any], width: int
) -> tuple[np.ndarray, np.ndarray]:
    """An item's attribute keys and weights as the model composes them: per item slot with
    values, each of its ``n`` tokens weighs ``1 / n`` (a slot counts once however many values
    it has); slots in spec order, ``width`` entries at most, 0-padded (key 0, weight 0)."""
    keys = np.zeros(width, np.int64)
    weights = np.zeros(width, np.float32)
    at = 0
    for slot in spec.item_slots:
        toks = slot_keys(slot, slot_tokens(slot, attributes.get(slot.name)))[: width - at]
        if toks:
            keys[at : at + len(toks)] = toks
            weights[at : at + len(toks)] = 1.0 / len(toks)
            at += len(toks)
    return keys, weights
