"""The Flink feature job: ``events`` -> user/item/trending features in Redis + ``samples``.

Graph (SQL where it is cheap, Python ``KeyedProcessFunction``s in ``thread`` mode where the
feature definitions run; functions in ``stream/flink_functions.py``)::

    Kafka table source (raw value, partition, offset; JVM: user_id and event-time watermarks
    from SQL JSON functions) -> keyBy(user_id) in the JVM
      -> [Python] user stage: parse/validate, dedupe, user features, point-in-time sample
         -> one output, split by SQL: samples -> Kafka, bad records -> events.dlq,
            positives -> keyBy(item_id) in the JVM
      -> [Python] item stage: decayed score + counts -> one batch per flush
      -> [Python] trending top-N (one key, parallelism 1)

All feature logic is ``feature_store.features``; this module only wires it. Run it three ways:

* submitted to a cluster: ``streamrec features`` (``flink run -py stream/flink_features.py``);
* in-process MiniCluster for debugging or tests: ``python -m stream.flink_features --local``;
* restored from a retained checkpoint: add ``--restore <chk dir>`` (``-s`` for ``flink run``).

Delivery: state and Kafka source offsets are checkpointed together (exactly-once state).
Redis writes are idempotent (only-if-newer ``(as_of, seq)``), so the records re-emitted after a
restart rewrite identical values. The ``samples`` sink is at-least-once: after a restart the
samples of the events since the last checkpoint are produced again with the same
``sample_id`` (= event_id), and consumers drop repeats by ``sample_id``. (An exactly-once
transactional sink would delay every sample by a checkpoint interval and needs
``read_committed`` consumers; the trainer dedupes instead.) Samples carry no Kafka key.

Choice of API, measured with ``bench/features.py`` (MiniCluster, 100k events preloaded, 5,000
users x 20,000 items; the shared 2-core machine had load average 6-12 from other work, so the
CPU-normalised column is the comparable one; medians of 3 runs each, alternating with the
previous job run from a copy of the tree; ``bench/features.py --events 100000``):

=============================================================  ==========  ================
pipeline                                                       events/s    events per CPU-s
=============================================================  ==========  ================
previous job: 4 Python stages, pickled objects, p=1            1.96k       2.10k
previous job, p=2                                              1.87k       1.86k
previous round's job, p=1 [3]                                  3.35k       3.69k
previous round's job, p=2 [3]                                  3.61k       3.16k
process mode, p=2 (one run, 60k events, earlier revision) [1]  0.52k       0.47k
JVM only: Kafka + SQL key/JSON extraction, no Python [2]       --          ~90k
ONE Python keyed stage (json.loads, 1 state get+put) [2]       --          25-33k
same, keyed with PyFlink's ``key_by(lambda)`` [2]              --          ~15k
=============================================================  ==========  ================

[1] with side outputs for samples/DLQ instead of the one output split by SQL (see
``stream/flink_functions.py``: measured equal in thread mode).
[2] one-off experiment jobs on the same MiniCluster (not kept in the repo), bounded 200-400k
events, CPU minus the ~16 CPU-s a job costs to start; ``bench/features.py --sql-events N``
keeps a reproducible JVM-only comparison (SQL parse + counts).
[3] this job's previous revision. Against it, this revision (user records encoded from the
state's parts with orjson, no ``HistoryEntry`` objects; one output row per positive; pruning
only when ``as_of`` enters a newer bucket; cheaper GC; the same features), side by side
(alternating, medians of 3, load average 6-18 from other work on the 2 cores):

===========================================================  ===============  ================
pipeline (100k events)                                       events/s         events per CPU-s
===========================================================  ===============  ================
previous revision, MiniCluster p=1                           2.33k            3.51k
this revision, MiniCluster p=1                               3.94k            3.97k
previous revision, MiniCluster p=2                           3.40k            3.24k
this revision, MiniCluster p=2                               4.05k            4.02k
previous revision, cluster of 2 TaskManagers x 1 slot, p=2   2.23k            2.23k
this revision, cluster of 2 TaskManagers x 1 slot, p=2       3.36k            3.09k
===========================================================  ===============  ================

The stages' own Python, timed in-process with the bench's events (fakes of the runtime, real
Redis; two runs each): 76-88 -> 45-47 us per event (user stage 62-73 -> 34-36, item stage
14-15 -> 11). One more pair at load average 3-8: MiniCluster p=2 3.41k -> 5.15k events/s,
2 TaskManagers p=2 3.69k -> 3.23k (the 2-TaskManager figures vary most).

Freshness (ingest API 2xx -> ``GET /users/{id}/features``) at a steady 2,000 events/s, p=1,
five runs each, alternating (load average 4-13): this job p50/p95/p99 = 0.13/0.54/0.95 s
(medians; p99 per run 0.33-1.66 s, and 5.2 s in the one run at load average 12-13), the
previous job 0.50/1.47/1.76 s (p99 per run 0.91-4.05 s). Target: p99 <= 2 s.

Why this shape, and why not more SQL:

* Parsing stays in Python (``stream/flink_parse.py``, one definition with exact DLQ reasons),
  but everything before it is JVM: the key (``JSON_VALUE(user_id)``) and the watermarks come
  from SQL in the source, and ``keyed_by_first_field`` keys in the JVM. PyFlink's
  ``key_by(lambda)`` adds a Python operator per record: the same one-stage job costs ~40% more
  CPU with it (table). The record then crosses into Python once, as one flat string.
* One ``ValueState`` per key in a compact encoding (``pack_user``; marshal, ~3x cheaper than
  pickling the dataclass); metrics counted locally and the watermark read once per flush
  (each is a Python->Java call); Redis writes as one Lua call per 500 records. The user
  record (one per user per flush: with many users that is one per event) is encoded straight
  from the state (``user_history``/``user_counts`` -> ``encode_user_values``): building 50
  frozen ``HistoryEntry`` objects and ``json.dumps`` cost ~45 us of the ~75 us per event.
* Thread mode runs every Python operator of a JVM under ONE interpreter lock (Flink docs,
  "Python execution mode"): the Python stages of all slots share one core. Process mode
  escapes the lock but costs ~7x more CPU per event (table). Several TaskManager JVMs
  (``flink.taskmanagers``, one slot each) give one interpreter per subtask, but on this
  machine they cost more CPU per event than one JVM (table: 3.09k against 4.02k events per
  CPU-s: two JVMs, half of each shuffle over TCP, the JobManager counted) and were slower in
  wall time; they can only pay off with idle cores to spare.
* Moving item scores and counts into SQL would remove at most the item stage (measured at an
  earlier revision: ``--stages users`` 4.06k events/CPU-s against 3.13k for the whole job,
  1.3x), and the item writes to Redis would still need a Python stage (no JVM Redis sink in
  our jars). It would also split the item definition in two: the decayed score over
  epoch-ms event time needs a moving reference time (``2 ** (ts / half_life)`` overflows a
  double after ~1,000 half-lives), and the windows end at the item's newest event, which SQL
  aggregates cannot express. Not worth it.
* 10,000 events/s is out of reach on 2 cores: the whole job costs ~250 us of CPU per event
  (4.0k events per CPU-s), so 10k/s needs ~2.5 cores for the job alone, before Kafka and
  Redis. Per-thread CPU of the MiniCluster JVM (``/proc/<pid>/task``, 20 s in the middle of a
  300k-event run at p=1, load average 3, 4.2k events/s): the user stage's task thread 41%,
  the item stage's 16%, the JIT compilers 25% (still compiling 40 s in), the Kafka producer
  6%, the source 5%, trending 2%; 1.04 cores used in all, and ``py-spy --gil`` saw the
  interpreter lock held ~2/3 of the time. So past the Python cuts neither the lock nor the
  CPU is saturated at p=1: the task thread also waits, presumably on a flush's Redis round
  trip, which runs in it synchronously so that a checkpoint never precedes a write it covers
  (not measured apart). Left: the
  per-record framework work (Python<->Java crossings, state calls, ``Row`` conversions, ~1/3
  of the lock time per ``py-spy``) and that wait; beyond them the user stage would have to
  become a JVM operator, duplicating the feature definitions that replay evaluation and
  serving use.

Thread mode on a standalone cluster needs ``opt/flink-python-*.jar`` on the cluster's own
classpath (e.g. ``FLINK_LIB_DIR`` = a folder with ``lib/*`` plus that jar) and
``classloader.parent-first-patterns.additional: "pemja."``; loaded from the job's jar, pemja
fails with ``NoSuchFieldException: loadedLibraryNames``. A thread-mode TaskManager keeps the
imported Python modules between jobs: restart it after changing the code. Checkpoints need a
filesystem checkpoint directory (``--checkpoint-dir`` or the cluster's): the default
JobManager storage refuses state over 5 MB, and a failed checkpoint restarts the job.
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
    return Path(__file__).resolve().parent.parent


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
    p.add_argument("--flush-ms", type=int, default=100, help="max delay of a Redis batch")
    p.add_argument("--batch-size", type=int, default=500, help="keys per Redis batch")
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

    from stream.flink_functions import USER_INPUT_SQL

    kafka = settings.kafka
    bounded = "'scan.bounded.mode' = 'latest-offset'," if args.bounded else ""
    out_of_order = _seconds(settings.features.max_out_of_orderness_ms)
    ts = "TRY_CAST(JSON_VALUE(`value`, '$.ts') AS BIGINT)"
    t_env.execute_sql(f"""
        CREATE TEMPORARY TABLE kafka_events (
            `value` STRING,
            `partition` INT METADATA VIRTUAL,
            `offset` BIGINT METADATA VIRTUAL,
            `user_key` AS COALESCE(JSON_VALUE(`value`, '$.user_id'), ''),
            `event_time` AS TO_TIMESTAMP_LTZ(
                CASE WHEN {ts} BETWEEN 0 AND {MAX_TS_MS} THEN {ts} ELSE 0 END, 3),
            WATERMARK FOR `event_time` AS `event_time` - INTERVAL '{out_of_order}' SECOND
        ) WITH (
            'connector' = 'kafka',
            'topic' = '{kafka.events_topic}',
            'properties.bootstrap.servers' = '{kafka.bootstrap}',
            'properties.group.id' = '{args.group_id}',
            'properties.auto.offset.reset' = 'earliest',
            'scan.startup.mode' = 'group-offsets',
            'scan.topic-partition-discovery.interval' = '10 s',
            {bounded}
            'format' = 'raw'
        )""")
    table = t_env.sql_query(f"SELECT `user_key`, {USER_INPUT_SQL} FROM kafka_events")
    return t_env.to_append_stream(table, Types.ROW([Types.STRING(), Types.STRING()]))


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
    return KeyedStream(stream._j_data_stream.keyBy(selector, key_type), value_type, stream)


def build_job(env: Any, args: argparse.Namespace, settings: Any) -> None:
    """Add the feature pipeline to ``env`` (graph in the module docstring)."""
    from pyflink.common import Types
    from pyflink.table import StreamTableEnvironment

    from stream.flink_functions import (
        DLQ,
        ITEM_INPUT,
        SAMPLE,
        USER_INPUT,
        USER_OUTPUT,
        ItemStage,
        TrendingStage,
        UserStage,
    )

    kafka = settings.kafka
    t_env = StreamTableEnvironment.create(env)
    t_env.get_config().set("table.exec.source.idle-timeout", "10 s")
    settings_json = args.settings_json
    knobs = (args.flush_ms, args.batch_size, args.bucket_ms)
    users = (
        keyed_by_first_field(kafka_source(t_env, args, settings), USER_INPUT)
        .process(UserStage(settings_json, *knobs, kafka.events_topic), output_type=USER_OUTPUT)
        .name("user-features")
        .uid("user-features")
    )
    # The user stage's one output, split in the JVM: samples and DLQ records to Kafka (at least
    # once: consumers dedupe samples by sample_id), item updates on to the item stage.
    t_env.create_temporary_view("user_out", t_env.from_data_stream(users))
    kafka_sink_table(t_env, "samples_sink", kafka.samples_topic, kafka.bootstrap)
    kafka_sink_table(t_env, "dlq_sink", kafka.dlq_topic, kafka.bootstrap)
    sinks = t_env.create_statement_set()
    sinks.add_insert_sql(f"INSERT INTO samples_sink SELECT v FROM user_out WHERE kind = '{SAMPLE}'")
    sinks.add_insert_sql(f"INSERT INTO dlq_sink SELECT v FROM user_out WHERE kind = '{DLQ}'")
    sinks.attach_as_datastream()
    if args.stages == "users":
        return
    item_rows = t_env.to_append_stream(
        t_env.sql_query(f"SELECT k, u FROM user_out WHERE kind = '{SAMPLE}'"),
        Types.ROW([Types.STRING(), Types.STRING()]),
    )
    items = (
        keyed_by_first_field(item_rows, ITEM_INPUT)
        .process(ItemStage(settings_json, *knobs), output_type=Types.PICKLED_BYTE_ARRAY())
        .name("item-features")
        .uid("item-features")
    )
    (
        items.key_by(lambda _: 0, key_type=Types.INT())
        .process(TrendingStage(settings_json, *knobs), output_type=Types.PICKLED_BYTE_ARRAY())
        .name("trending")
        .uid("trending")
        .set_parallelism(1)
    )


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    from feature_store.settings import Settings

    settings = Settings(**json.loads(args.settings_json))
    env = build_env(args, settings)
    build_job(env, args, settings)
    log.info("submitting %s (events=%s)", args.job_name, settings.kafka.events_topic)
    env.execute(args.job_name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
