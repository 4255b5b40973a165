"""Options of the incremental trainer (:class:`model.trainer.trainer.Trainer`); imports no TensorFlow.

Each option changes the computation as its field says (``tests/unit/model/trainer/test_trainer_options.py``
checks them): gradient accumulation, bfloat16 compute, per-table learning rates, eviction,
deduplicated lookups, sampled negatives, the same-user mask, the frequency estimator, the
auxiliary item-item loss term and the fused (XLA) loss. Each option's meaning in full:
docs/internals.md; why these defaults, with the sweeps: ``docs/decisions.md#train-options``
and ``#fused-loss``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from streamrec.trainer_settings import trainer_default

if TYPE_CHECKING:
    from streamrec.settings import Settings


#: Fields of :class:`TrainOptions` that ``trainer.*`` settings own (same names).
SETTINGS_KNOBS = (
    "batch_size", "learning_rate", "user_lr", "item_lr", "dense_lr", "grad_accum_steps",
    "mixed_precision", "evict_every_steps", "max_user_rows", "max_item_rows", "eval_rows",
    "eval_every", "spare_epochs", "aux_weight", "fused_loss",
)


#: The attribute table's step over the item table's when ``TrainOptions.attr_lr`` is None.
ATTR_LR_SCALE = 3.0


@dataclass(frozen=True)
class TrainOptions:
    batch_size: int = trainer_default("batch_size")
    learning_rate: float = trainer_default("learning_rate")
    user_lr: float | None = trainer_default("user_lr")
    item_lr: float | None = trainer_default("item_lr")
    dense_lr: float | None = trainer_default("dense_lr")
    #: Adagrad step of the item attribute table (``ModelConfig.attr_tokens``; None:
    #: ``ATTR_LR_SCALE`` times the item table's; why: docs/decisions.md#item-attributes).
    attr_lr: float | None = None
    grad_accum_steps: int = trainer_default("grad_accum_steps")
    #: Negatives drawn per block of the batch (reference for accumulation); 1 = whole batch.
    loss_groups: int = 1
    mixed_precision: bool = trainer_default("mixed_precision")
    evict_every_steps: int = trainer_default("evict_every_steps")
    max_user_rows: int = trainer_default("max_user_rows")
    max_item_rows: int = trainer_default("max_item_rows")
    logq_buckets: int = 1 << 20
    logq_alpha: float = 0.01
    #: Item-frequency estimate of the logQ correction and the prior: "gap" (Yi et al.,
    #: ``model.towers.loss.FrequencyEstimator``) or "count" (``model.towers.frequency``).
    logq_estimator: str = "count"
    #: Half-life of the "count" estimate in samples (0 = no decay); also the horizon of the
    #: popularity prior (why 2000: docs/decisions.md#train-options).
    logq_half_life: float = 2000.0
    eval_k: int = 10
    #: Rows of each batch scored before training (0 = no test-then-train evaluation), with the
    #: whole served score over every candidate and a step of the learnt mix: ~0.5 ms a row at
    #: 20k candidates on the evaluation thread, which must keep pace with the train step.
    eval_rows: int = trainer_default("eval_rows")
    #: Score the head of every this-many-th full batch only (1 = each batch; partial
    #: batches, a stream slower than the trainer, are all scored): the figures are a sample
    #: of the stream either way, and a scored head costs about as much evaluation CPU as a
    #: quarter of a 512-sample train step (why 4: docs/decisions.md#live-figures).
    eval_every: int = trainer_default("eval_every")
    eval_refresh_steps: int = 20
    #: Optimizer steps on a partial batch (a stream slower than the trainer: the batch
    #: timeout cut it short, so the trainer has time to spare); the further passes count
    #: no frequency and teach no co-visitation again. A full batch gets one step (why 3:
    #: docs/decisions.md#spare-epochs).
    spare_epochs: int = trainer_default("spare_epochs")
    #: Score a batch's head on a second thread while the next batch trains (numpy's
    #: scoring matmul and rank count release the GIL); False = inline.
    eval_async: bool = True
    #: Pieces of evaluation work handed to the evaluation thread before the training waits
    #: for the oldest: a scored head or a candidate refresh takes longer than a train step,
    #: the pieces between them far less, so a short queue lets the two threads even out
    #: (why 4: docs/decisions.md#live-figures).
    eval_queue: int = 4
    eval_window: int = 10_000
    dedup_lookups: bool = True
    #: Mixed negative sampling: items drawn uniformly per step from the items trained on so
    #: far, shared by every row of the batch, next to the in-batch negatives (0 = none).
    sampled_negatives: int = 50
    #: Mask in-batch columns of the row's own user (its other positives are no negatives).
    mask_same_user: bool = True
    #: Weight of the auxiliary history-pool (item-item) loss; 0 = none.
    aux_weight: float = trainer_default("aux_weight")
    #: The loss of a full batch with its forward and backward pass compiled by XLA
    #: (``model.towers.loss.fused_softmax_loss``); partial batches and accumulation run op by
    #: op. On by default (why: docs/decisions.md#fused-loss).
    fused_loss: bool = trainer_default("fused_loss")

    @classmethod
    def from_settings(cls, settings: Settings) -> TrainOptions:
        """The options ``settings.trainer`` names (every knob of this class it owns)."""
        t = settings.trainer
        return cls(**{name: getattr(t, name) for name in SETTINGS_KNOBS})

    def __post_init__(self) -> None:
        if self.aux_weight < 0.0:
            raise ValueError("aux_weight must be >= 0")
        if self.spare_epochs < 1:
            raise ValueError("spare_epochs must be >= 1")
        if self.eval_queue < 1:
            raise ValueError("eval_queue must be >= 1")
        if self.eval_every < 1:
            raise ValueError("eval_every must be >= 1")
        if self.grad_accum_steps < 1 or self.loss_groups < 1:
            raise ValueError("grad_accum_steps and loss_groups must be >= 1")
        if self.logq_estimator not in ("gap", "count"):
            raise ValueError("logq_estimator must be 'gap' or 'count'")
        if self.sampled_negatives < 0:
            raise ValueError("sampled_negatives must be >= 0")
        if self.evict_every_steps < 0:
            raise ValueError("evict_every_steps must be >= 0")
