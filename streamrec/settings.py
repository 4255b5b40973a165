"""One frozen settings object per process, read from the environment at the edge.

Every field can be set with an environment variable: the prefix ``STREAMREC_``, then the
section and the field joined by ``__``, e.g. ``STREAMREC_KAFKA__PORT=19092`` or
``STREAMREC_TRAINER__EXPORT_EVERY_S=10``. Process entry points (the CLI) call
:func:`load_settings` once and pass the object down; library code never reads the
environment itself.

It is part of the kernel, ``streamrec``, the bottom rung every other package may import
(docs/design.md, "Layout and the import ladder").
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

_SECTION = ConfigDict(frozen=True, extra="forbid")

#: Default weight of each event type; a sample is emitted for every event whose weight > 0.
DEFAULT_EVENT_WEIGHTS: dict[str, float] = {
    "impression": 0.0,
    "click": 1.0,
    "like": 2.0,
    "add_to_cart": 3.0,
    "purchase": 5.0,
    "rating": 1.0,
}


class StackSettings(BaseModel):
    """Where the local stack keeps its pid files, logs and data."""

    model_config = _SECTION
    run_dir: Path = Field(Path(".streamrec"), description="Run folder: pids, logs, data.")
    ready_timeout_s: float = Field(90.0, description="Deadline for each readiness check.")
    stop_timeout_s: float = Field(20.0, description="Grace period before SIGKILL on `down`.")
    bind_host: str = Field("127.0.0.1", description="Interface local services bind to.")


class KafkaSettings(BaseModel):
    """The Kafka broker and the topics of the pipeline."""

    model_config = _SECTION
    host: str = Field("127.0.0.1", description="Broker host (clients and the local listeners).")
    port: int = Field(9092, description="Broker (client) port.")
    controller_port: int = Field(9093, description="KRaft controller port.")
    events_topic: str = Field("events", description="Topic of validated events (ingest, replay).")
    dlq_topic: str = Field(
        "events.dlq", description="Dead-letter topic: records that failed downstream, with why."
    )
    samples_topic: str = Field("samples", description="Training samples (feature job -> trainer).")
    updates_topic: str = Field(
        "model.updates",
        description="The trainer's deltas between full versions (one partition; model/delta/FORMAT.md).",
    )
    partitions: int = Field(2, ge=1, description="Partitions of each topic created by `up`.")
    replication_factor: int = Field(1, ge=1, description="Replicas of each topic we create.")
    min_insync_replicas: int = Field(1, ge=1, description="min.insync.replicas of our topics.")
    heap: str = Field("768m", description="Broker JVM heap (-Xmx).")
    java_opts: str = Field("", description="More JVM options of the local broker (after G1).")

    @property
    def bootstrap(self) -> str:
        return f"{self.host}:{self.port}"


class RedisSettings(BaseModel):
    """The Redis online store (and the model pointer's Redis copy)."""

    model_config = _SECTION
    host: str = Field("127.0.0.1", description="Redis host.")
    port: int = Field(6379, description="Redis port (the local stack's server listens on it).")
    db: int = Field(0, description="Redis database number.")
    key_prefix: str = Field("sr:", description="Prefix of every key we write (FORMAT.md).")
    appendonly: bool = Field(
        True,
        description="AOF persistence (appendfsync everysec) for the local Redis; false keeps "
        "everything in memory only (the feature job then rebuilds the store after a restart).",
    )
    password: SecretStr | None = Field(None, description="Redis password (AUTH); unset = none.")

    @property
    def url(self) -> str:
        return f"redis://{self.host}:{self.port}/{self.db}"


class StoreSettings(BaseModel):
    model_config = _SECTION
    backend: Literal["redis"] = Field(
        "redis",
        description="Online store backend every writer and reader opens "
        "(feature_store.open_store); Redis is the one for now, configured by `redis`.",
    )


class FlinkSettings(BaseModel):
    """The Flink cluster and the feature job's defaults."""

    model_config = _SECTION
    host: str = Field("127.0.0.1", description="JobManager host (REST and job submission).")
    rest_port: int = Field(8081, description="JobManager REST/web UI port.")
    rpc_port: int = Field(6123, description="JobManager RPC port.")
    taskmanager_slots: int = Field(2, description="Task slots of each TaskManager.")
    taskmanagers: int = Field(
        1,
        ge=1,
        description="TaskManager JVMs the local stack starts. Python operators in thread mode "
        "share one interpreter lock per JVM, so with cores to spare one TaskManager per slot "
        "lets parallel Python subtasks run at once; on busy cores one JVM is cheaper "
        "(docs/decisions.md#feature-job-shape).",
    )
    parallelism: int = Field(
        1, description="Parallelism of the feature job (`streamrec features --parallelism N` wins)."
    )
    jobmanager_java_opts: str = Field(
        "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC",
        description="JVM options of the local JobManager (env.java.opts.jobmanager): it only "
        "coordinates, so the quick compiler and the serial collector cost it least CPU "
        "(docs/decisions.md#feature-job-jvms).",
    )
    taskmanager_java_opts: str = Field(
        "-XX:+UseParallelGC",
        description="JVM options of each local TaskManager (env.java.opts.taskmanager): the "
        "throughput collector costs the feature job less CPU than G1 (docs/decisions.md"
        "#feature-job-jvms).",
    )
    jobmanager_memory: str = Field("1024m", description="jobmanager.memory.process.size.")
    taskmanager_memory: str = Field("1728m", description="taskmanager.memory.process.size.")
    checkpoint_interval_ms: int = Field(
        5000, description="Checkpoint interval of the feature job (state and Kafka offsets)."
    )


class FeatureSettings(BaseModel):
    """Knobs of the feature definitions (``feature_store.features``) and their Redis records."""

    model_config = _SECTION
    event_weights: dict[str, float] = Field(
        default_factory=lambda: dict(DEFAULT_EVENT_WEIGHTS),
        description="Accepted event types and their weights; an event of weight > 0 is a "
        "positive and yields a training sample.",
    )
    history_len: int = Field(50, description="Items kept in a user's recent history.")
    history_event_types: list[str] = Field(
        default_factory=lambda: ["rating"],
        description="Event types a user's history keeps whatever their weight (positive events "
        "always enter it): an explicit rating is an interaction even below a like threshold.",
    )
    item_half_life_s: float = Field(3600.0, description="Half-life of the decayed item score.")
    trending_n: int = Field(100, description="Items kept in the global trending list.")
    max_out_of_orderness_ms: int = Field(
        2000, description="Watermark bound of the feature job (events behind it count as late)."
    )
    user_ttl_s: int = Field(30 * 86400, description="TTL of user feature keys (0 = none).")
    item_ttl_s: int = Field(30 * 86400, description="TTL of item feature keys (0 = none).")


class IngestSettings(BaseModel):
    """The ingest API (``POST /events``)."""

    model_config = _SECTION
    host: str = Field("127.0.0.1", description="Bind address of the ingest API.")
    port: int = Field(8001, description="Port of the ingest API.")
    max_batch: int = Field(10_000, description="Most events in one POST /events (413 beyond).")
    max_body_bytes: int = Field(10 * 1024 * 1024, description="Largest request body (413 beyond).")
    produce_timeout_s: float = Field(
        10.0, description="Deadline for Kafka to acknowledge a request's events (503 after it)."
    )
    api_key: SecretStr | None = Field(None, description="If set, POST /events needs X-API-Key.")
    rate_limit_per_s: float = Field(0.0, ge=0, description="POST /events per second (0 = off).")


class TrainerSettings(BaseModel):
    """The incremental trainer, its model and its registry."""

    model_config = _SECTION
    model_name: str = Field(
        "two_tower", description="Model name: its registry folder and Redis pointer key."
    )
    registry_dir: Path = Field(
        Path(".streamrec/models"), description="Model registry root (default <run_dir>/models)."
    )
    checkpoint_dir: Path = Field(
        Path(".streamrec/trainer"), description="Checkpoints+offsets (default <run_dir>/trainer)."
    )
    group_id: str = Field(
        "streamrec-trainer",
        description="Kafka group id of the samples consumer (client id prefix; it never commits: "
        "offsets live in the checkpoints).",
    )
    embedding_dim: int = Field(32, description="Embedding size d (user tower layers 2d, d).")
    batch_size: int = Field(512, description="Samples per training step.")
    learning_rate: float = Field(0.05, description="Adagrad learning rate (tables and layers).")
    spare_epochs: int = Field(
        3, ge=1,
        description="Optimizer steps on each partial batch (a stream slower than the trainer "
        "leaves it time to spare); a full batch always gets one.",
    )
    export_every_s: float = Field(
        300.0,
        description="Seconds between full model versions (bases for restart, pinning and "
        "rollback; between them deltas keep serving fresh: delta_every_s).",
    )
    export_every_samples: int = Field(
        200_000, description="Samples between model versions (whichever of the two comes first)."
    )
    keep_versions: int = Field(
        5, description="Newest versions the registry keeps (plus the pinned and current ones)."
    )
    delta_every_s: float = Field(
        1.0, ge=0.0,
        description="Seconds between deltas on kafka.updates_topic (0 = no deltas; model/delta).",
    )
    delta_catchup_every_s: float = Field(
        10.0, ge=0.0,
        description="Seconds between deltas while the trainer catches up (a backlog, a "
        "backfill: no wait for samples since the last delta, or only history: "
        "delta_history_lag_s); 0 = delta_every_s throughout.",
    )
    delta_history_lag_s: float = Field(
        300.0, ge=0.0,
        description="Samples whose event time lags the wall clock by more than this many "
        "seconds are history (a backfill of an old log): while the trainer trains only "
        "history, deltas go every delta_catchup_every_s; 0 = never history.",
    )
    delta_codec: str = Field(
        "int8", description="Row codec of the deltas: float32, float16, bfloat16 or int8 (the "
        "default: the smallest whose Recall@10 stays within 0.5% of float32's by `streamrec "
        "evaluate --row-codec`; float32 makes serving's rows the trainer's bit for bit).",
    )
    delta_compress: bool = Field(False, description="Deflate each delta record (zlib level 1).")
    guard_margin: float = Field(
        0.2, ge=0.0, lt=1.0,
        description="Quality guard: hold deltas and versions when the rolling test-then-train "
        "Recall@10 falls this far (relative) below the last healthy publication's (0 = off; "
        "model/trainer/guard_rule.py).",
    )
    guard_min_scored: int = Field(
        500, ge=1, description="Scored rows the guard's current figure covers (and needs)."
    )
    guard_hold_alarm_s: float = Field(
        60.0, ge=0.0,
        description="A quality guard hold lasting longer than this many seconds degrades the "
        "trainer's and serving's /health (the QualityGuardHoldsPublication alert fires on "
        "streamrec_trainer_guard_held_seconds > 60 for 1m).",
    )
    metrics_host: str = Field("127.0.0.1", description="Host of the trainer's /metrics.")
    metrics_port: int = Field(8002, description="Port of the trainer's /health and /metrics.")
    seed: int = Field(7, description="Seed of the model's initialisers and samplers.")
    batch_timeout_s: float = Field(
        0.2, gt=0.0, description="Seconds the trainer waits to fill a batch before it trains a "
        "partial one."
    )
    admit_after: int = Field(
        1, ge=1, description="Sightings before an id gets its own embedding row (before that it "
        "shares the default row)."
    )
    max_user_rows: int = Field(2_000_000, ge=1, description="Eviction cap of the user table.")
    max_item_rows: int = Field(1_000_000, ge=1, description="Eviction cap of the item table.")
    evict_every_steps: int = Field(
        1000, ge=0, description="Steps between evictions of the rows over the caps (0 = never)."
    )
    grad_accum_steps: int = Field(
        1, ge=1, description="Micro-batches whose gradients one optimizer step accumulates."
    )
    mixed_precision: bool = Field(
        False, description="bfloat16 compute with float32 master weights."
    )
    user_lr: float | None = Field(
        None, gt=0.0, description="Learning rate of the user table (None = learning_rate)."
    )
    item_lr: float | None = Field(
        None, gt=0.0, description="Learning rate of the item table (None = learning_rate)."
    )
    dense_lr: float | None = Field(
        None, gt=0.0, description="Learning rate of the dense layers (None = learning_rate)."
    )
    train_history: bool = Field(
        True, description="History rows learn from the history pool too (False: only as "
        "targets; faster steps)."
    )
    aux_weight: float = Field(
        8.0, ge=0.0, description="Weight of the item-to-item history-pool term of the loss "
        "(0 = off, faster steps)."
    )
    fused_loss: bool = Field(
        True, description="The loss of a full batch compiled by XLA (False: op by op, the same "
        "loss, no compile at start-up, slower steps)."
    )
    eval_rows: int = Field(
        32, ge=0, description="Rows of a batch's head scored test-then-train (0 = no live "
        "figures and no quality guard)."
    )
    eval_every: int = Field(
        4, ge=1, description="Score the head of every n-th full batch only (partial batches "
        "are all scored)."
    )
    ps: int = Field(
        0, ge=0, description="Parameter servers of the trainer cluster (0 with workers 0 = one "
        "process, the default; model/cluster)."
    )
    workers: int = Field(0, ge=0, description="Workers of the trainer cluster (see ps).")
    cluster_port: int = Field(
        0, ge=0, description="First gRPC port of the cluster on trainer.metrics_host: chief, "
        "then each PS, then each worker; 0 = the chief picks free ports and starts the PS and "
        "worker processes itself."
    )
    cluster_spec: str | None = Field(
        None, description='The whole cluster as ClusterSpec JSON ({"chief": [..], "ps": [..], '
        '"worker": [..]}), e.g. one host per role in docker-compose; overrides cluster_port.'
    )
    cluster_metrics_every_s: float = Field(
        5.0, gt=0, description="Seconds between the chief's reads of the cluster's per-role "
        "figures (shard rows, bytes, worker step times: model/cluster/metrics.py)."
    )
    wire_dtype: Literal["float32", "bfloat16"] = Field(
        "bfloat16", description="Rows and updates on the cluster's wire (tables stay float32; "
        "bfloat16 evaluates within noise of float32 and of one process: docs/cluster.md)."
    )


class ServingSettings(BaseModel):
    """The serving API (``GET /recommend``)."""

    model_config = _SECTION
    host: str = Field("127.0.0.1", description="Bind address of the serving API.")
    port: int = Field(8000, description="Port of the serving API.")
    default_k: int = Field(20, description="Items returned by GET /recommend without k.")
    poll_interval_s: float = Field(5.0, description="Backup check of the CURRENT pointer.")
    admin_token: SecretStr | None = Field(None, description="Token for pin/rollback.")
    max_body_bytes: int = Field(64 * 1024, description="Largest request body (413 beyond).")
    workers: int = Field(
        default_factory=lambda: os.cpu_count() or 1,
        ge=1,
        description="Worker processes of `streamrec serve` (default: one per core, for the "
        "lowest tail latency; each loads and swaps versions itself; /metrics sums them all).",
    )
    balance_connections: bool = Field(
        True, description="With several workers, a worker holding more than its share of "
        "the port's keep-alive connections closes the excess after their next answer "
        "(Connection: close), so the kernel's random split evens out (serving/balance.py).",
    )
    delta_apply_share: float = Field(
        0.25, gt=0, le=1,
        description="Share of a core a worker's delta follower may take while it applies a "
        "delta: it sleeps between the apply's steps, so a delta's CPU ms spread over about "
        "ms / share of wall time and the requests in flight keep the rest of the worker "
        "(1 = no pauses).",
    )
    shared_deltas: bool = Field(
        True, description="With several workers, one composer process per server applies "
        "each delta and the workers map the state it writes (serving/shared_state.py), "
        "instead of every worker applying every delta itself.",
    )
    delta_composer_nice: int = Field(
        10, ge=0, le=19, description="Niceness added to that composer process: it takes "
        "CPU the requests leave (a delta is later by a few tens of ms under full load).",
    )
    gil_switch_interval_s: float | None = Field(
        0.0005, gt=0,
        description="Python's GIL switch interval in each worker (`sys.setswitchinterval`; "
        "None = Python's 5 ms). A thread that holds the GIL (the delta follower's apply, the "
        "event loop parsing requests) hands it to a waiting one after this long.",
    )


class PrometheusSettings(BaseModel):
    """Monitoring on the local stack: Prometheus and the pipeline exporter it scrapes."""

    model_config = _SECTION
    port: int = Field(9090, description="Port of Prometheus (`streamrec up` starts it).")
    exporter_port: int = Field(8003, description="Port of `streamrec exporter` (/metrics).")
    flink_reporter_port: int = Field(
        9249, description="First port of Flink's Prometheus reporters (the JobManager, then "
        "one per TaskManager).")
    scrape_interval_s: float = Field(15.0, gt=0, description="Prometheus scrape interval.")
    evaluation_interval_s: float = Field(15.0, gt=0, description="Rule evaluation interval.")
    rules_file: Path | None = Field(
        None, description="Alert rules (default: deploy/prometheus/rules.yml of the checkout).")


class Settings(BaseSettings):
    """Everything a streamrec process can be configured with."""

    model_config = SettingsConfigDict(
        env_prefix="STREAMREC_",
        env_nested_delimiter="__",
        frozen=True,
        extra="forbid",
    )

    stack: StackSettings = StackSettings()
    kafka: KafkaSettings = KafkaSettings()
    redis: RedisSettings = RedisSettings()
    store: StoreSettings = StoreSettings()
    flink: FlinkSettings = FlinkSettings()
    features: FeatureSettings = FeatureSettings()
    ingest: IngestSettings = IngestSettings()
    trainer: TrainerSettings = TrainerSettings()
    serving: ServingSettings = ServingSettings()
    prometheus: PrometheusSettings = PrometheusSettings()

    @model_validator(mode="before")
    @classmethod
    def _trainer_dirs_in_run_dir(cls, data: Any) -> Any:
        """The trainer's registry and checkpoints live in the run folder unless set: a stack
        started with another ``run_dir`` must not resume a checkpoint of an older one.
        Filled in before validation, so the frozen sections are never changed afterwards."""
        if not isinstance(data, dict):
            return data
        stack = data.get("stack")
        if isinstance(stack, StackSettings):
            run_dir = stack.run_dir
        else:
            run_dir = Path((stack or {}).get("run_dir", StackSettings().run_dir))
        trainer = data.get("trainer")
        given = (trainer.model_fields_set if isinstance(trainer, TrainerSettings)
                 else set(trainer or {}))
        update = {name: run_dir / sub
                  for name, sub in (("registry_dir", "models"), ("checkpoint_dir", "trainer"))
                  if name not in given}
        if not update:
            return data
        if isinstance(trainer, TrainerSettings):
            return {**data, "trainer": trainer.model_copy(update=update)}
        return {**data, "trainer": {**(trainer or {}), **update}}


def to_env(settings: Settings) -> dict[str, str]:
    """The ``STREAMREC_*`` variables that reproduce ``settings`` in a child process."""
    env: dict[str, str] = {}
    for section_name, section in settings:
        for field_name, value in section:
            if value is None:
                continue
            if isinstance(value, SecretStr):
                value = value.get_secret_value()
            key = f"STREAMREC_{section_name.upper()}__{field_name.upper()}"
            env[key] = json.dumps(value) if isinstance(value, dict | list) else str(value)
    return env


def trainer_default(name: str) -> Any:
    """The default of the trainer knob ``name``: the one source of the option dataclasses'
    defaults (``TrainOptions``, ``LoopOptions``, ``ModelConfig``), so a knob has one default."""
    return TrainerSettings.model_fields[name].default


def with_trainer(settings: Settings, **knobs: Any) -> Settings:
    """``settings`` with ``trainer.*`` knobs replaced (None values are left as they are): the
    one path by which command-line flags override settings, validated like the settings."""
    given = {k: v for k, v in knobs.items() if v is not None}
    if not given:
        return settings
    trainer = TrainerSettings.model_validate({**settings.trainer.model_dump(), **given})
    return settings.model_copy(update={"trainer": trainer})


def load_settings(**overrides: object) -> Settings:
    """Read settings from the environment; keyword overrides win (used by the CLI and tests)."""
    return Settings(**overrides)  # type: ignore[arg-type]
