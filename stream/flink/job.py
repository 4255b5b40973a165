"""The Flink feature job: ``events`` -> user/item/trending features in Redis + ``samples``;
``items`` -> the item catalogue in Redis.

SQL moves and keys records (user buckets, processing-time windows, ``ARRAY_AGG``); Python
``KeyedProcessFunction``s in ``thread`` mode run the feature definitions once per batch
(``stream/flink/functions.py``): user stage -> samples, DLQ and item rows; item stage; trending;
and, from a second source, the catalogue stage (``stream/flink/catalogue.py``) -> store, DLQ.
All feature logic is ``feature_store.features``; this module only wires it. Run it submitted
to a cluster (``streamrec features``), in-process (``python -m stream.flink.job --local``) or
from a retained checkpoint (``--restore <chk dir>``). State and source offsets are
checkpointed together, Redis writes are idempotent and the ``samples`` sink is at-least-once
(the trainer dedupes by ``sample_id``). The graph, delivery, thread-mode setup:
docs/internals.md; why: ``docs/decisions.md#feature-job-batches``.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

CONNECTOR_JAR = "deploy/jvm/lib/flink/flink-sql-connector-kafka-5.0.0-2.2.jar"


def repo_root() -> Path:
    return Path(__file__).resolve().parents[2]


def connector_jar() -> Path:
    return repo_root() / CONNECTOR_JAR


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="flink_features", description=__doc__.splitlines()[0])
    p.add_argument("--settings-json", required=True, help="Settings.model_dump_json()")
    p.add_argument("--local", action="store_true", help="run in an in-process MiniCluster")
    p.add_argument("--parallelism", type=int, default=None)
    p.add_argument("--group-id", default="streamrec-features")
    p.add_argument("--job-name", default="streamrec-features")
    p.add_argument("--checkpoint-dir", default=None, help="file:// URI or path for checkpoints")
    p.add_argument("--restore", default=None, help="checkpoint/savepoint path to resume from")
    p.add_argument(
        "--window-ms",
        type=int,
        default=100,
        help="processing-time window the JVM collects a key bucket's records over before "
        "one call of a Python stage (the most a record waits for its stage)",
    )
    p.add_argument(
        "--item-window-ms",
        type=int,
        default=None,
        help="the item stage's window (default: --window-ms x ITEM_WINDOW_FACTOR, 1 s): item "
        "scores and trending may lag that much, user features (what freshness measures) "
        "do not; during a backlog each item is written once per bucket and window",
    )
    p.add_argument("--flush-ms", type=int, default=100, help="max delay of the trending write")
    p.add_argument("--bucket-ms", type=int, default=60_000, help="window bucket size")
    p.add_argument("--bundle-ms", type=int, default=100, help="python.fn-execution.bundle.time")
    p.add_argument(
        "--python-mode",
        choices=("thread", "process"),
        default="thread",
        help="python.execution-mode (thread on a cluster needs flink-python on its classpath)",
    )
    p.add_argument("--bundle-size", type=int, default=1000, help="python.fn-execution.bundle.size")
    p.add_argument(
        "--state-cache-size", type=int, default=100_000, help="python.state.cache-size (keys)"
    )
    p.add_argument(
        "--stages",
        choices=("all", "users"),
        default="all",
        help="users: only the user stage (dedupe, user features, samples); for measurements",
    )
    p.add_argument("--bounded", action="store_true", help="stop at the offsets seen at start")
    return p


def worker_pythonpath() -> list[str]:
    import sysconfig

    return [sysconfig.get_paths()["purelib"], str(repo_root())]


def _file_uri(path: str) -> str:
    return path if "://" in path else Path(path).resolve().as_uri()


def build_env(args: argparse.Namespace, settings: Any) -> Any:
    """A configured StreamExecutionEnvironment (checkpoints, Python mode, connector jar)."""
    from pyflink.common import Configuration
    from pyflink.datastream import CheckpointingMode, StreamExecutionEnvironment
    from pyflink.datastream.externalized_checkpoint_retention import (
        ExternalizedCheckpointRetention,
    )

    conf = Configuration()
    conf.set_string("python.execution-mode", args.python_mode)
    conf.set_string("python.fn-execution.bundle.time", str(args.bundle_ms))
    conf.set_string("python.fn-execution.bundle.size", str(args.bundle_size))
    conf.set_string("python.state.cache-size", str(args.state_cache_size))
    # Chained SQL operators hand rows on without a defensive copy (the UNNEST of the user
    # stage's arrays copied every array per row); every operator here is reuse-safe: SQL
    # operators by design, the Python ones convert their input on entry.
    conf.set_string("pipeline.object-reuse", "true")
    # The embedded (thread-mode) interpreter starts from the base Python's prefix, not the
    # venv's: hand it the venv's site-packages and the repo (editable install) explicitly.
    conf.set_string("python.pythonpath", os.pathsep.join(worker_pythonpath()))
    # A failing task (e.g. Redis down) restarts from the last checkpoint, backing off to 30 s.
    conf.set_string("restart-strategy.type", "exponential-delay")
    conf.set_string("restart-strategy.exponential-delay.initial-backoff", "1 s")
    conf.set_string("restart-strategy.exponential-delay.max-backoff", "30 s")
    if args.checkpoint_dir:
        conf.set_string("execution.checkpointing.dir", _file_uri(args.checkpoint_dir))
        conf.set_string("state.checkpoints.dir", _file_uri(args.checkpoint_dir))
    if args.restore:
        conf.set_string("execution.state-recovery.path", _file_uri(args.restore))
    if args.local:
        conf.set_string("python.executable", sys.executable)
        conf.set_string("python.client.executable", sys.executable)
    env = StreamExecutionEnvironment.get_execution_environment(conf)
    # add_jars appends: `flink run -py` has already put flink-python's jar in pipeline.jars.
    env.add_jars(connector_jar().as_uri())
    env.set_parallelism(args.parallelism or settings.flink.parallelism)
    env.enable_checkpointing(settings.flink.checkpoint_interval_ms, CheckpointingMode.EXACTLY_ONCE)
    cc = env.get_checkpoint_config()
    cc.set_externalized_checkpoint_retention(ExternalizedCheckpointRetention.RETAIN_ON_CANCELLATION)
    cc.set_min_pause_between_checkpoints(min(1000, settings.flink.checkpoint_interval_ms))
    return env


def _seconds(ms: int) -> str:
    return f"{ms / 1000:.3f}"


def kafka_source(t_env: Any, args: argparse.Namespace, settings: Any) -> Any:
    """``events`` as a stream of ``Row(user_id, user_input(...))`` (``stream/flink_functions``).

    The Kafka connector's table source (``raw`` format, metadata columns) is used instead of
    the DataStream ``KafkaSource`` because PyFlink's KafkaSource only hands Python the value,
    and a DLQ record must name the partition and offset. The JVM extracts the key (``user_id``,
    ``''`` if absent: the user stage sends such records to the DLQ) and the event time with SQL
    JSON functions, and generates the watermarks (bounded out-of-orderness) in the source, so
    no Python runs before the shuffle. Offsets are checkpointed with the job state; without a
    checkpoint the job starts from the group's committed offsets, else from the earliest.
    """
    from pyflink.common import Types

    from stream.flink.functions import BATCH_INPUT, USER_BUCKET_SQL, USER_INPUT_SQL

    kafka = settings.kafka
    out_of_order = _seconds(settings.features.max_out_of_orderness_ms)
    ts = "TRY_CAST(JSON_VALUE(`value`, '$.ts') AS BIGINT)"
    t_env.execute_sql(f"""
        CREATE TEMPORARY TABLE kafka_events (
            `value` STRING,
            `partition` INT METADATA VIRTUAL,
            `offset` BIGINT METADATA VIRTUAL,
            `pt` AS PROCTIME(),
            `user_key` AS COALESCE(JSON_VALUE(`value`, '$.user_id'), ''),
            `event_time` AS TO_TIMESTAMP_LTZ(
                CASE WHEN {ts} BETWEEN 0 AND {MAX_TS_MS} THEN {ts} ELSE 0 END, 3),
            WATERMARK FOR `event_time` AS `event_time` - INTERVAL '{out_of_order}' SECOND
        ) WITH ({kafka_options(kafka, kafka.events_topic, args)})""")
    t_env.execute_sql(f"""
        CREATE TEMPORARY VIEW user_records AS
        SELECT {USER_BUCKET_SQL} AS b, {USER_INPUT_SQL} AS v, `pt` FROM kafka_events""")
    table = t_env.sql_query(window_batches("user_records", args.window_ms))
    return t_env.to_append_stream(table, Types.ROW([Types.STRING(), BATCH_INPUT]))


def kafka_options(kafka: Any, topic: str, args: argparse.Namespace) -> str:
    """The Kafka connector options of a source of the job: the job's group, started from its
    offsets (earliest without), read as raw bytes; bounded at the latest offset with
    ``--bounded``."""
    bounded = "'scan.bounded.mode' = 'latest-offset'," if args.bounded else ""
    return f"""
            'connector' = 'kafka',
            'topic' = '{topic}',
            'properties.bootstrap.servers' = '{kafka.bootstrap}',
            'properties.group.id' = '{args.group_id}',
            'properties.auto.offset.reset' = 'earliest',
            'scan.startup.mode' = 'group-offsets',
            'scan.topic-partition-discovery.interval' = '10 s',
            {bounded}
            'format' = 'raw'
        """


def catalogue_source(t_env: Any, args: argparse.Namespace, settings: Any) -> Any:
    """``items`` as a stream of ``Row(partition, batch)`` for the catalogue stage
    (``stream/flink/catalogue.py``): the same connector options, group and startup as the
    events source (so its offsets are checkpointed with the job's state too), no watermarks
    (nothing downstream uses event time)."""
    from pyflink.common import Types

    from stream.flink.catalogue import CATALOGUE_INPUT_SQL
    from stream.flink.functions import BATCH_INPUT

    kafka = settings.kafka
    t_env.execute_sql(f"""
        CREATE TEMPORARY TABLE kafka_items (
            `value` STRING,
            `partition` INT METADATA VIRTUAL,
            `offset` BIGINT METADATA VIRTUAL,
            `pt` AS PROCTIME()
        ) WITH ({kafka_options(kafka, kafka.items_topic, args)})""")
    t_env.execute_sql(f"""
        CREATE TEMPORARY VIEW catalogue_records AS
        SELECT CAST(`partition` AS STRING) AS b, {CATALOGUE_INPUT_SQL} AS v, `pt`
        FROM kafka_items""")
    table = t_env.sql_query(window_batches("catalogue_records", args.window_ms))
    return t_env.to_append_stream(table, Types.ROW([Types.STRING(), BATCH_INPUT]))


def window_batches(view: str, window_ms: int) -> str:
    """SQL: the ``v`` column of ``view`` collected per bucket ``b`` and processing-time
    window of ``window_ms`` into one array, as rows ``(b, batch)``. ``ARRAY_AGG`` keeps
    arrival order, and the records of a key reach the window in the order their source
    subtask read them (the user stage still sorts a batch by partition and offset)."""
    return f"""
        SELECT b, ARRAY_AGG(v) AS batch
        FROM TABLE(TUMBLE(TABLE {view}, DESCRIPTOR(`pt`), INTERVAL '{_seconds(window_ms)}' SECOND))
        GROUP BY window_start, window_end, b"""


#: The item stage's window over the user stage's (``--item-window-ms``): an item's rows of a
#: window are folded into one state update and one Redis record. At 100 ms a backlog hands
#: the stage ~25 rows per bucket and call, and popular items are written ten times a second;
#: per 1 s window the calls, the Redis round trips and the item writes are ~10x fewer.
ITEM_WINDOW_FACTOR = 10


def item_window_ms(args: argparse.Namespace) -> int:
    value = getattr(args, "item_window_ms", None)
    return int(value) if value else args.window_ms * ITEM_WINDOW_FACTOR


def kafka_sink_table(t_env: Any, name: str, topic: str, bootstrap: str) -> None:
    """A one-column (``v STRING``) table writing each row as one Kafka record value."""
    t_env.execute_sql(f"""
        CREATE TEMPORARY TABLE {name} (`v` STRING) WITH (
            'connector' = 'kafka',
            'topic' = '{topic}',
            'properties.bootstrap.servers' = '{bootstrap}',
            'sink.delivery-guarantee' = 'at-least-once',
            'format' = 'raw'
        )""")


#: Largest event time the source turns into a watermark (9999-12-31); others count as 0.
MAX_TS_MS = 253_402_300_799_999


def keyed_by_first_field(stream: Any, value_type: Any) -> Any:
    """``stream`` of ``Row(key: STRING, value)`` keyed by ``key`` in the JVM.

    ``DataStream.key_by`` runs a Python key selector in an extra operator (one more Python
    call per record); this builds the same ``KeyedStream`` with the Java ``KeyByKeySelector``
    that PyFlink's ``key_by`` itself uses on its ``Row(key, value)`` output, so the keyed
    Python function receives ``value`` exactly as after ``key_by``.
    """
    from pyflink.common import Types
    from pyflink.datastream.data_stream import KeyedStream
    from pyflink.java_gateway import get_gateway

    selector = get_gateway().jvm.KeyByKeySelector()
    key_type = Types.ROW([Types.STRING()]).get_java_type_info()
    return KeyedStream(stream._j_data_stream.keyBy(selector, key_type), value_type, stream)  # noqa: SLF001 - PyFlink has no public Java handle


def build_job(env: Any, args: argparse.Namespace, settings: Any) -> None:
    """Add the feature pipeline to ``env`` (graph in the module docstring)."""
    from pyflink.common import Types
    from pyflink.table import Schema, StreamTableEnvironment

    from stream.flink.catalogue import CATALOGUE_OUTPUT, CatalogueStage
    from stream.flink.functions import (
        BATCH_INPUT,
        ITEM_BATCH_OUTPUT,
        USER_BATCH_OUTPUT,
        ItemBatchStage,
        TrendingStage,
        UserBatchStage,
    )

    kafka = settings.kafka
    t_env = StreamTableEnvironment.create(env)
    t_env.get_config().set("table.exec.source.idle-timeout", "10 s")
    # One-phase window aggregation: ARRAY_AGG then appends in arrival order at one operator.
    t_env.get_config().set("table.optimizer.agg-phase-strategy", "ONE_PHASE")
    settings_json = args.settings_json
    users = (
        keyed_by_first_field(kafka_source(t_env, args, settings), BATCH_INPUT)
        .process(
            UserBatchStage(
                settings_json, args.bucket_ms, kafka.events_topic, args.state_cache_size
            ),
            output_type=USER_BATCH_OUTPUT,
        )
        .name("user-features")
        .uid("user-features-batched")
    )
    # The user stage's arrays, unnested in the JVM: samples and DLQ records to Kafka (at least
    # once: consumers dedupe samples by sample_id), item rows on to the item stage's windows.
    t_env.create_temporary_view(
        "user_out",
        t_env.from_data_stream(
            users, Schema.new_builder().column_by_expression("pt", "PROCTIME()").build()
        ),
    )
    kafka_sink_table(t_env, "samples_sink", kafka.samples_topic, kafka.bootstrap)
    kafka_sink_table(t_env, "dlq_sink", kafka.dlq_topic, kafka.bootstrap)
    sinks = t_env.create_statement_set()
    for sink, column in (("samples_sink", "samples"), ("dlq_sink", "dlq")):
        sinks.add_insert_sql(
            f"INSERT INTO {sink} SELECT v FROM user_out CROSS JOIN UNNEST({column}) AS t(v)"
        )
    if args.stages == "users":
        sinks.attach_as_datastream()
        return
    # The catalogue: items -> the store; its invalid records into the same DLQ.
    catalogue = (
        keyed_by_first_field(catalogue_source(t_env, args, settings), BATCH_INPUT)
        .process(CatalogueStage(settings_json, kafka.items_topic), output_type=CATALOGUE_OUTPUT)
        .name("catalogue")
        .uid("catalogue-batched")
    )
    t_env.create_temporary_view("catalogue_out", t_env.from_data_stream(catalogue))
    sinks.add_insert_sql(
        "INSERT INTO dlq_sink SELECT v FROM catalogue_out CROSS JOIN UNNEST(dlq) AS t(v)"
    )
    sinks.attach_as_datastream()
    t_env.execute_sql("""
        CREATE TEMPORARY VIEW item_records AS
        SELECT SUBSTR(v, 1, 1) AS b, v, `pt` FROM user_out CROSS JOIN UNNEST(items) AS t(v)""")
    item_batches = t_env.to_append_stream(
        t_env.sql_query(window_batches("item_records", item_window_ms(args))),
        Types.ROW([Types.STRING(), BATCH_INPUT]),
    )
    items = (
        keyed_by_first_field(item_batches, BATCH_INPUT)
        .process(
            ItemBatchStage(settings_json, args.bucket_ms, args.state_cache_size),
            output_type=ITEM_BATCH_OUTPUT,
        )
        .name("item-features")
        .uid("item-features-batched")
    )
    (
        keyed_by_first_field(items, Types.PICKLED_BYTE_ARRAY())
        .process(TrendingStage(settings_json, args.bucket_ms, args.flush_ms))
        .name("trending")
        .uid("trending-batched")
        .set_parallelism(1)
    )


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    from streamrec.settings import Settings

    settings = Settings(**json.loads(args.settings_json))
    env = build_env(args, settings)
    build_job(env, args, settings)
    log.info("submitting %s (events=%s)", args.job_name, settings.kafka.events_topic)
    env.execute(args.job_name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
