"""The feature job's catalogue stage: records of the ``items`` topic into the online store.

The JVM reads ``items`` (a second Kafka table source of the job, its offsets checkpointed
with the rest of the job's state), keys the records by their Kafka partition and collects
them over the same short processing-time windows as the events; :class:`CatalogueStage`
parses each batch (:func:`stream.items.parse_item_record`, against the job's feature spec),
writes the valid records in one round trip (``OnlineStore.write_catalogue``: only-if-newer by
``ts``, so at-least-once redelivery after a restart rewrites what is there) before the call
returns, and emits the invalid ones as DLQ records with their reason. No keyed state: the
store's only-if-newer rule is the whole of the catalogue's logic.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from typing import Any

from pyflink.common import Row
from pyflink.common.typeinfo import Types
from pyflink.datastream import KeyedProcessFunction, RuntimeContext

from feature_store.catalogue import FeatureSpec
from feature_store.store import CatalogueItem
from stream.flink.stage import Stage
from stream.items import BadItem, parse_item_record
from stream.kafka_client import dlq_record
from streamrec.settings import Settings

log = logging.getLogger(__name__)

#: SQL of a catalogue record for the stage: ``partition:offset:value`` (the key is the
#: partition: an item's records share one, so a batch applied in offset order keeps theirs).
CATALOGUE_INPUT_SQL = (
    "CONCAT(CAST(`partition` AS STRING), ':', CAST(`offset` AS STRING), ':',"
    " COALESCE(`value`, ''))"
)
#: Output of the stage: the batch's DLQ records (JSON), one row per batch that has any.
CATALOGUE_OUTPUT = Types.ROW_NAMED(["dlq"], [Types.BASIC_ARRAY(Types.STRING())])


def parse_catalogue_input(value: str) -> tuple[int, int, str]:
    """``(partition, offset, raw)`` of a :data:`CATALOGUE_INPUT_SQL` value."""
    partition, offset, raw = value.split(":", 2)
    return int(partition), int(offset), raw


def catalogue_batch(
    values: list[str], spec: FeatureSpec
) -> tuple[list[CatalogueItem], list[tuple[int, int, str, str]]]:
    """The batch's valid records in ``(partition, offset)`` order, and its bad ones as
    ``(partition, offset, raw, reason)``."""
    records: list[CatalogueItem] = []
    bad: list[tuple[int, int, str, str]] = []
    for partition, offset, raw in sorted(map(parse_catalogue_input, values)):
        try:
            w = parse_item_record(raw, spec)
        except BadItem as exc:
            bad.append((partition, offset, raw, str(exc)))
            continue
        records.append(CatalogueItem(w["item_id"], w["attributes"], w["ts"], w["deleted"]))
    return records, bad


class CatalogueStage(Stage):
    """Keyed by the ``items`` partition: parse, write to the store, invalid records to the DLQ."""

    def __init__(self, settings_json: str, topic: str) -> None:
        super().__init__(settings_json, bucket_ms=0)
        self._topic = topic

    def open(self, runtime_context: RuntimeContext) -> None:
        self._setup(runtime_context)
        settings = Settings(**json.loads(self._settings_json))
        self.spec = FeatureSpec.load(settings.features.spec_file)
        for name in ("items_bad", "items_written"):
            self._counter(name)

    def process_element(self, values: list[str], ctx: KeyedProcessFunction.Context) -> Iterator[Any]:
        records, bad = catalogue_batch(values, self.spec)
        if records:
            self.store.write_catalogue(records)
            self._counts["items_written"] += len(records)
        dlq = []
        for partition, offset, raw, reason in bad:
            log.warning("bad item at %s/%s@%s: %s", self._topic, partition, offset, reason)
            dlq.append(
                dlq_record(reason, "features.items", self._topic, partition, offset, raw).decode()
            )
        self._counts["items_bad"] += len(dlq)
        self._publish_metrics()
        if dlq:
            yield Row(dlq)
