"""A synthetic catalogue for the benchmarks: every item slot of the default feature spec
filled (``feature_store.catalogue``), the same on every run."""

from __future__ import annotations

from typing import Any

#: Attribute keys per item of :func:`catalogue_of` (its items fill 11), with room.
ATTR_TOKENS = 16


def catalogue_of(item_ids: list[str]) -> list[dict[str, Any]]:
    """Wire catalogue records of ``item_ids`` filling every item slot of the default spec
    (category, brand, 2 genres, 3 tags, price, a 3-word title: 11 attribute keys), drawn
    from each id's hash so every run writes the same catalogue."""
    out = []
    for item in item_ids:
        h = int.from_bytes(item.encode()[-8:].rjust(8, b"\0"), "little") * 2654435761
        out.append({"item_id": item, "ts": 1, "deleted": False, "attributes": {
            "category": f"c{h % 50}", "brand": f"b{h % 997}",
            "genres": [f"g{h % 20}", f"g{(h >> 8) % 20}"],
            "tags": [f"t{(h >> 4) % 100}", f"t{(h >> 12) % 100}", f"t{(h >> 20) % 100}"],
            "price": float(h % 1000), "title": f"w{h % 500} w{(h >> 9) % 300} w{(h >> 17) % 77}"}})
    return out
