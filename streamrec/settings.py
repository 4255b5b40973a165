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

from streamrec.trainer_settings import TrainerSettings, trainer_default

__all__ = ["Settings", "TrainerSettings", "load_settings", "to_env", "trainer_default",
           "with_trainer"]

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
    items_topic: str = Field(
        "items", description="Item catalogue upserts (ingest, replay --items; stream/items.py)."
    )
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
    spec_file: Path | None = Field(
        None,
        description="JSON feature spec: the slots items, event context and time are described "
        "by (feature_store/catalogue.py); unset = the default slots.",
    )


class IngestSettings(BaseModel):
    """The ingest API (``POST /events``)."""

    model_config = _SECTION
    host: str = Field("127.0.0.1", description="Bind address of the ingest API.")
    port: int = Field(8001, description="Port of the ingest API.")
    max_batch: int = Field(10_000, description="Most events in one POST /events (413 beyond).")
    max_item_batch: int = Field(1_000, description="Most items in one POST /items (413 beyond).")
    max_body_bytes: int = Field(10 * 1024 * 1024, description="Largest request body (413 beyond).")
    produce_timeout_s: float = Field(
        10.0, description="Deadline for Kafka to acknowledge a request's events (503 after it)."
    )
    api_key: SecretStr | None = Field(
        None, description="If set, POST /events and POST /items need X-API-Key."
    )
    rate_limit_per_s: float = Field(
        0.0, ge=0, description="POST /events and /items per second, together (0 = off)."
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
    ann_min_items: int | None = Field(
        500_000, ge=1,
        description="Catalogues of at least this many items are ranked in two stages: an "
        "approximate nearest-neighbour index (faiss IVF-Flat, model/scoring/ann.py) proposes "
        "candidates, which the exact served score ranks; smaller ones are scored whole. "
        "None: always exact.",
    )
    ann_candidates: int = Field(
        256, ge=1, description="Items the ANN index proposes per request (more: closer to the "
        "exact top-k, slower).")
    ann_nprobe: int = Field(
        16, ge=1, description="Lists of the ANN index searched per request (more: closer to "
        "the exact top-k, slower).")
    ann_lists: int | None = Field(
        None, ge=1, description="Lists of the ANN index (None: 4 * sqrt(items)); more lists "
        "build slower and search faster at the same nprobe.")
    ann_rebuild_share: float = Field(
        0.2, gt=0, le=1,
        description="Share of the catalogue that deltas may change before a worker builds a "
        "new ANN index; until then the changed items are scored exactly on every request.",
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
