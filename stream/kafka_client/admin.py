"""Topic admin: the topics of ours created when missing, the updates topic's record size."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping

from stream.kafka_client.connection import KafkaUnavailable
from streamrec.settings import KafkaSettings

log = logging.getLogger(__name__)


def ensure_topics(
    kafka: KafkaSettings,
    names: Iterable[str],
    partitions: int | None = None,
    timeout_s: float = 30.0,
    configs: Mapping[str, str] | None = None,
) -> list[str]:
    """Create the topics that do not exist yet; returns the names it created. ``configs``:
    more topic configs of the created ones (beside ``min.insync.replicas``)."""
    from kafka.admin import KafkaAdminClient, NewTopic
    from kafka.errors import KafkaError, TopicAlreadyExistsError

    wanted = list(dict.fromkeys(names))
    try:
        admin = KafkaAdminClient(
            bootstrap_servers=kafka.bootstrap, request_timeout_ms=int(timeout_s * 1000)
        )
    except KafkaError as exc:
        raise KafkaUnavailable(f"cannot reach Kafka at {kafka.bootstrap}: {exc}") from exc
    try:
        existing = set(admin.list_topics())
        missing = [n for n in wanted if n not in existing]
        if missing:
            new = [
                NewTopic(
                    n,
                    num_partitions=partitions or kafka.partitions,
                    replication_factor=kafka.replication_factor,
                    topic_configs={
                        "min.insync.replicas": str(kafka.min_insync_replicas), **(configs or {}),
                    },
                )
                for n in missing
            ]
            try:
                admin.create_topics(new, timeout_ms=int(timeout_s * 1000))
            except TopicAlreadyExistsError:
                log.debug("topics created concurrently: %s", missing)
            log.info("created topics %s", ", ".join(missing))
        return missing
    finally:
        admin.close()


#: Largest record of the model updates topic (a delta after a burst, a snapshot is never
#: sent there: it lives beside its full version).
UPDATES_MAX_BYTES = 32 << 20


def ensure_updates_topic(kafka: KafkaSettings, timeout_s: float = 30.0) -> list[str]:
    """Create ``kafka.updates_topic`` if needed: one partition (the deltas are one ordered
    sequence), records up to :data:`UPDATES_MAX_BYTES`."""
    return ensure_topics(kafka, [kafka.updates_topic], 1, timeout_s,
                         {"max.message.bytes": str(UPDATES_MAX_BYTES)})
