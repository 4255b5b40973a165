"""The ``events.dlq`` record."""

from __future__ import annotations

import json

DLQ_RAW_LIMIT = 64 * 1024


def dlq_record(
    reason: str, stage: str, topic: str, partition: int, offset: int, raw: bytes | str | None
) -> bytes:
    """The JSON value of an ``events.dlq`` record (format in docs/design.md, "Wire formats")."""
    if isinstance(raw, bytes):
        raw_text = raw[:DLQ_RAW_LIMIT].decode("utf-8", errors="replace")
    else:
        raw_text = (raw or "")[:DLQ_RAW_LIMIT]
    return json.dumps(
        {
            "reason": reason,
            "stage": stage,
            "topic": topic,
            "partition": partition,
            "offset": offset,
            "raw": raw_text,
        }
    ).encode()
