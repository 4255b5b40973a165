"""The trainer's section of the settings (``STREAMREC_TRAINER__*``): every trainer knob and
its one default.

:class:`TrainerSettings` is a section of :class:`streamrec.settings.Settings` (re-exported
there); :func:`trainer_default` gives the option classes of the trainer (``TrainOptions``,
``LoopOptions``, ``ModelConfig``) their defaults from here, so a knob has one default.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

_SECTION = ConfigDict(frozen=True, extra="forbid")


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
        0.5, ge=0.0,
        description="Seconds between deltas on kafka.updates_topic (0 = no deltas; model/delta).",
    )
    delta_attr_every: int = Field(
        10, ge=1, description="With attribute slots (attr_tokens): the attribute rows the "
        "steps moved travel with every this-many-th delta, when serving recomposes every "
        "catalogued item's row (1 = every delta: exact at each, costlier; a new item and its "
        "new attribute keys travel at once)."
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
        description="Quality guard: hold deltas and versions when a guarded rate of the scored "
        "rows (the served state beating the trained one, unexplained targets, lost histories, "
        "repeating users or items) rises by this much over its rate at the last healthy "
        "publication, by a CUSUM test (0 = off; model/trainer/guard_rule.py).",
    )
    guard_min_scored: int = Field(
        500, ge=1, description="Scored rows without a trip before a hold ends (and the "
        "rows the current Recall@10 the guard shows covers)."
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
        1000, ge=0, description="Steps between evictions of the rows over the caps, and of the "
        "attribute rows no catalogued item names (0 = never)."
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
    attr_tokens: int = Field(
        0, ge=0, le=256, description="Attribute tokens per item in the towers (the catalogue's "
        "item slots, features.spec_file; 0 = ids only). With slots the trainer reads the items "
        "topic and a catalogued item is a candidate before its first click."
    )
    attr_admit_after: int = Field(
        1, ge=1, description="With attribute slots: the fewest catalogued items that name an "
        "attribute key (a genre, a title word) before it gets a row; a key below it adds "
        "nothing to an item's row (1 = every key: a key of one item learns as a second row of "
        "it, which the real-log panel found worth its memory; raise it to bound the table)."
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


def trainer_default(name: str) -> Any:
    """The default of the trainer knob ``name``: the one source of the option dataclasses'
    defaults (``TrainOptions``, ``LoopOptions``, ``ModelConfig``), so a knob has one default."""
    return TrainerSettings.model_fields[name].default
