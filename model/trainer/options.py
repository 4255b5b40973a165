"""Options of the incremental trainer (:class:`model.trainer.core.Trainer`); imports no TensorFlow.

Options (each changes the computation as stated; ``tests/unit/test_trainer_options.py``):

* ``grad_accum_steps=N``: the batch is split into N near-equal consecutive micro-batches;
  each micro-batch's loss (in-batch negatives from its own micro-batch) is differentiated
  separately, gradients are summed (sparse ones per key) and applied once. This equals one
  step on the whole batch with ``loss_groups=N`` (the same loss in one pass).
* ``mixed_precision=True``: tower math and logits in bfloat16, tables, dense weights and
  optimizer state stay float32 (master weights); softmax/loss in float32.
* ``user_lr`` / ``item_lr`` / ``dense_lr``: one Adagrad optimizer per table and one for the
  dense layers, each with its own learning rate.
* ``evict_every_steps=E``: every E steps each table keeps its ``max_*_rows`` most recently
  trained rows (0 = never evict).
* ``dedup_lookups`` (default True): the single step reads each table once for the batch's
  distinct keys and pools the history with a sparse matmul over its known entries
  (``TwoTower.plan``); the gradient reaches each table already summed per key, so the
  optimizer updates every row once. False runs the reference step (per-position lookups
  through the Keras layer, dense ``[B, L, d]`` history pooling); both compute the same
  update (``tests/unit/test_trainer_options.py``), the first faster (``bench/train.py``).
* ``sampled_negatives=S`` (default 50): mixed negative sampling (``model.trainer.negatives``):
  each step also contrasts every row with S items drawn uniformly from the items trained on
  so far, logQ-corrected by their sampling probability and trained as negatives.
* ``mask_same_user`` (default True): the in-batch columns of the row's own user are not
  negatives (a micro-batch of a bursty stream holds a few users, each with many positives).
* ``logq_estimator`` (default "count", ``model.towers.frequency``, half-life ``logq_half_life``
  samples) or "gap" (Yi et al., ``model.towers.loss.FrequencyEstimator``): the item-frequency
  estimate of the logQ correction and of the popularity prior (``model.scoring.prior``). It counts
  each batch once (``train_step(count=False)`` for further passes over the same batch).
* ``aux_weight`` (default 8): adds ``aux_weight`` times an auxiliary item-item term to the
  loss (``model.towers.loss.history_pool_query``): the same sampled softmax (in-batch and sampled
  negatives, logQ, own-user mask) with each row's normalised history pool as the query in
  place of the user vector, so the shared item table learns which items follow which. It
  only shapes training: the served user tower is unchanged.
* ``fused_loss`` (default True): a full batch's loss and its gradient compiled together by
  XLA (``model.towers.loss.fused_softmax_loss``: the same loss to float rounding, fewer
  passes over the ``[rows, columns]`` logits; ~10% more examples/s end to end, at a
  1-1.5 s compile once per process); partial batches keep the op-by-op loss, since XLA
  compiles once per shape.
* ``ModelConfig.history_len``: the step and the user vectors read the first (most recent)
  ``history_len`` columns of a batch's history.

Why these defaults (``streamrec evaluate`` on MovieLens latest-small, the sweeps and the step
cost of ``aux_weight``): ``docs/decisions.md#train-options``.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class TrainOptions:
    batch_size: int = 512
    learning_rate: float = 0.05
    user_lr: float | None = None
    item_lr: float | None = None
    dense_lr: float | None = None
    grad_accum_steps: int = 1
    #: Negatives drawn per block of the batch (reference for accumulation); 1 = whole batch.
    loss_groups: int = 1
    mixed_precision: bool = False
    evict_every_steps: int = 0
    max_user_rows: int = 2_000_000
    max_item_rows: int = 1_000_000
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
    eval_rows: int = 32
    #: Score the head of every this-many-th full batch only (1 = each batch; partial
    #: batches, a stream slower than the trainer, are all scored): the figures are a sample
    #: of the stream either way, and a scored head costs about as much evaluation CPU as a
    #: quarter of a 512-sample train step (why 4: docs/decisions.md#live-figures).
    eval_every: int = 4
    eval_refresh_steps: int = 20
    #: Optimizer steps on a partial batch (a stream slower than the trainer: the batch
    #: timeout cut it short, so the trainer has time to spare); the further passes count
    #: no frequency and teach no co-visitation again. A full batch gets one step (why 3:
    #: docs/decisions.md#spare-epochs).
    spare_epochs: int = 1
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
    aux_weight: float = 8.0
    #: The loss of a full batch with its forward and backward pass compiled by XLA
    #: (``model.towers.loss.fused_softmax_loss``); partial batches and accumulation run op by
    #: op. On by default (why: docs/decisions.md#fused-loss).
    fused_loss: bool = True

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
