"""External string ids -> int64 TFRA keys.

A fixed 64-bit hash (BLAKE2b, 8-byte digest) of ``"<kind>\\x1f<id>"`` read as a signed
little-endian int64, so the same id always maps to the same key in every process and
language, and user and item ids never share a key space by accident. Key 0 is reserved
(padding in history tensors); an id whose hash is 0 maps to 1.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable

import numpy as np

USER = "user"
ITEM = "item"
PAD_KEY = 0


def hash_id(kind: str, external_id: str) -> int:
    digest = hashlib.blake2b(f"{kind}\x1f{external_id}".encode(), digest_size=8).digest()
    key = int.from_bytes(digest, "little", signed=True)
    return key if key != PAD_KEY else 1


def user_key(user_id: str) -> int:
    return hash_id(USER, user_id)


def item_key(item_id: str) -> int:
    return hash_id(ITEM, item_id)


def item_keys(item_ids: Iterable[str]) -> np.ndarray:
    """Keys of many items as an int64 array."""
    return np.fromiter((item_key(i) for i in item_ids), dtype=np.int64)
