"""Cheaper cyclic garbage collection for processes that decode many records.

Decoding a record allocates a handful of containers (its dict, its history list, tuples of
unpacked state); with CPython's default threshold (700 allocations) the young generation
is collected every few records, and every tenth of those collections goes on to older
generations that walk every tracked object the process holds (caches of ids, buffered
records). :func:`tune_gc` moves the objects alive at start-up into the permanent
generation (``gc.freeze``: full collections skip them) and collects the young generation
every :data:`GC_GEN0_THRESHOLD` allocations instead. What the collector cost before:
``docs/decisions.md#gc-tuning``.
"""

from __future__ import annotations

import gc

#: Allocations between young collections (CPython's default: 700).
GC_GEN0_THRESHOLD = 10_000


def tune_gc() -> None:
    """Freeze what is alive now and collect the young generation less often (see above).
    Only for a process (or interpreter) that runs our decoding loop, not a library caller's."""
    gc.freeze()
    gen0, gen1, gen2 = gc.get_threshold()
    gc.set_threshold(max(GC_GEN0_THRESHOLD, gen0), gen1, gen2)
