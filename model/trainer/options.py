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
* ``ModelConfig.history_len``: the step and the user vectors read the first (most recent)
  ``history_len`` columns of a batch's history.

Why these defaults: ``streamrec evaluate ratings.csv --format movielens`` on MovieLens
latest-small, test-then-train Recall@10 / popularity of the same run (1.04x with the former
defaults: no sampled negatives, no own-user mask, gap estimate, 50-item history, no prior):

* sampled negatives (prior 3, the rest default): 0/10/20/50/100/250/500/1000 ->
  1.13x/1.29x/1.36x/1.42x/1.38x/1.36x/1.34x/1.29x (and 1000 costs ~1.7x step time);
* history window (prior 5, 1000 negatives, dense lr 1): 10 -> 1.40x, 50 -> 1.29x;
* count estimate half-life (samples; prior 5, 1000 negatives, history 10, dense lr 1):
  1000/2000/4000 -> 1.30x/1.40x/1.35x; the gap estimate (prior 3, 1000 negatives,
  history 10) -> 1.12x: its estimate of an item seen a
  few times is set by the step it was first seen, so ranking by it alone is useless
  (Recall@10 0.0003) whereas the count estimate alone equals the popularity baseline;
* prior weight: see ``ModelConfig.prior_weight``.
* ``aux_weight`` (Recall@10 / popularity, seed 7; history decay 0.9, the rest default):
  0/0.1/0.3/1/2/4/8/16 -> 1.45x/1.48x/1.52x/1.55x/1.58x/1.59x/1.61x/1.58x; seeds 1/2:
  0 -> 1.47x/1.46x, 4 -> 1.62x/1.63x, 8 -> 1.62x/1.62x. Tried and left out: the pool's own recency decay for
  this term (0.8 at weight 4: 1.59x, no gain), the user tower on a zeroed user row as the
  query (weight 1: 1.41x), user-row dropout 0.3/0.5 (1.42x/1.37x) and a smaller user-table
  learning rate 0.3/0.1 (1.40x/1.37x): the per-user rows' short-term memory pays; a
  20-item window at weight 8 (1.56x). With the term the pool wants decay 0.8
  (``ModelConfig.history_decay``): 1.63x/1.67x/1.66x on seeds 7/1/2.
  Planted preferences (``tests/unit``, Recall@10 over popularity, bar +0.1): 0/4/8 ->
  +0.113/+0.202/+0.188. Step cost (the ``bench/train.py`` step, batch 512, history 50,
  0 and 8 side by side in one process, 7 alternating rounds, medians; two runs on a
  shared machine): 36.8k -> 33.9k and 39.3k -> 34.2k examples/s (-8%, -13%), per CPU
  second 23.9k -> 21.3k and 25.8k -> 21.2k (-11%, -18%). The term's softmax is
  ``[B, B + S]`` like the main one, so at batch 2048 it costs more (~-25%).
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
    #: popularity prior. 2000 is the best of 1k/2k/4k samples on MovieLens latest-small.
    logq_half_life: float = 2000.0
    eval_k: int = 10
    #: Rows of each batch scored before training (0 = no test-then-train evaluation).
    eval_rows: int = 128
    eval_refresh_steps: int = 20
    #: Score a batch's head on a second thread while the next batch trains (numpy's
    #: scoring matmul and rank count release the GIL); False = inline.
    eval_async: bool = True
    eval_window: int = 10_000
    dedup_lookups: bool = True
    #: Mixed negative sampling: items drawn uniformly per step from the items trained on so
    #: far, shared by every row of the batch, next to the in-batch negatives (0 = none).
    sampled_negatives: int = 50
    #: Mask in-batch columns of the row's own user (its other positives are no negatives).
    mask_same_user: bool = True
    #: Weight of the auxiliary history-pool (item-item) loss; 0 = none.
    aux_weight: float = 8.0

    def __post_init__(self) -> None:
        if self.aux_weight < 0.0:
            raise ValueError("aux_weight must be >= 0")
        if self.grad_accum_steps < 1 or self.loss_groups < 1:
            raise ValueError("grad_accum_steps and loss_groups must be >= 1")
        if self.logq_estimator not in ("gap", "count"):
            raise ValueError("logq_estimator must be 'gap' or 'count'")
        if self.sampled_negatives < 0:
            raise ValueError("sampled_negatives must be >= 0")
        if self.evict_every_steps < 0:
            raise ValueError("evict_every_steps must be >= 0")
