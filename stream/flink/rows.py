"""The records the feature job's SQL and its Python stages hand each other: the user stage's
input (built in SQL, :data:`USER_INPUT_SQL`), the item rows it emits (keyed by
:func:`item_bucket`), the order a batch is applied in, and the stages' Flink types."""

from __future__ import annotations

import operator
import zlib

from pyflink.common.typeinfo import Types

#: SQL of the user stage's key: one hex digit of MD5(user_id), 16 buckets (the JVM computes
#: it before the shuffle; it spreads users over up to 16 subtasks).
USER_BUCKET_SQL = "SUBSTR(MD5(`user_key`), 1, 1)"
#: SQL building :func:`user_input` from the Kafka table's columns (the same format).
USER_INPUT_SQL = (
    "CONCAT(`user_key`, CHR(0), CAST(`partition` AS STRING), ':', CAST(`offset` AS STRING),"
    " ':', COALESCE(`value`, ''))"
)
#: Input of a batched stage (after the JVM key): the batch's records, in arrival order.
BATCH_INPUT = Types.BASIC_ARRAY(Types.STRING())
#: Output of the user stage: ``samples`` JSON, ``events.dlq`` JSON, item rows
#: (:func:`item_row`), one row per batch.
USER_BATCH_OUTPUT = Types.ROW_NAMED(
    ["samples", "dlq", "items"], [Types.BASIC_ARRAY(Types.STRING())] * 3
)
#: Output of the item stage: ``(key, batch)`` for the trending stage (one key, ``"0"``).
ITEM_BATCH_OUTPUT = Types.ROW([Types.STRING(), Types.PICKLED_BYTE_ARRAY()])
#: The item stage's key is the first character of an item row: one hex digit of crc32.
ITEM_BUCKET_BITS = 4


def user_input(user_key: str, partition: int, offset: int, raw: str) -> str:
    """``user_key NUL partition:offset:raw`` (built by :data:`USER_INPUT_SQL` in the job)."""
    return f"{user_key}\x00{partition}:{offset}:{raw}"


def parse_user_input(value: str) -> tuple[str, int, int, str]:
    """``(user_key, partition, offset, raw)`` of a :func:`user_input` value. A key holding NUL
    splits early: it then differs from the parsed user_id, and the record goes to the DLQ."""
    key, rest = value.split("\x00", 1)
    partition, offset, raw = rest.split(":", 2)
    return key, int(partition), int(offset), raw


#: Sort key of parsed :func:`user_input` values: ``(partition, offset)``, the order a batch is
#: applied in (a user's events share a partition, so this is each user's arrival order).
KAFKA_ORDER = operator.itemgetter(1, 2)


def item_bucket(item_id: str) -> str:
    """Key of the item stage for ``item_id``: deterministic in every process (not ``hash``)."""
    return "%x" % (zlib.crc32(item_id.encode()) & ((1 << ITEM_BUCKET_BITS) - 1))


def item_row(item_id: str, event_type: str, ts_ms: int) -> str:
    """An item row of the user stage's output: ``bucket event_type TAB ts_ms TAB item_id``
    (the JVM keys it by its first character, :func:`item_bucket`)."""
    return f"{item_bucket(item_id)}{event_type}\t{ts_ms}\t{item_id}"


def parse_item_row(value: str) -> tuple[str, str, int]:
    """``(item_id, event_type, ts_ms)`` of an :func:`item_row` value."""
    event_type, ts, item_id = value[1:].split("\t", 2)
    return item_id, event_type, int(ts)
