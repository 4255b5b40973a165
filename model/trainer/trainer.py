"""The incremental trainer: :class:`Trainer` builds the model, optimizers and evaluation state.

Kafka, checkpoints and exports live in ``model.trainer.service``; this module trains on
in-memory :class:`Batch` objects, so tests and benchmarks drive it directly. The trainer is
built in layers, each using only those beneath it: ``tables`` (reads, the user tower,
eviction) <- ``step`` (the train-step variants) <- ``scoring_head`` (the served score's
parts, the learned mix, live evaluation) <- this module (construction, checkpointed state).

Options: :class:`model.trainer.options.TrainOptions` (each documented there).
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import replace
from typing import Any

import numpy as np

from model.scoring.cold import ColdStart
from model.scoring.covisit import CoVisitation
from model.scoring.mixer import ScoreMixer
from model.scoring.rarity import RareSelector
from model.scoring.selector import ITEM_SCALES, SKNN_SCALES, MixSelector
from model.scoring.sessions import SessionIndex
from model.towers.frequency import CountFrequencyEstimator
from model.towers.loss import FrequencyEstimator
from model.towers.tf_env import de, tf, tf_keras
from model.towers.two_tower import ModelConfig, TwoTower
from model.trainer.negatives import NegativeSampler
from model.trainer.options import ATTR_LR_SCALE, TrainOptions
from model.trainer.rolling import Evaluator
from model.trainer.samples import Batch
from model.trainer.scoring_head import ScoringHead
from model.trainer.step import STEP_SIGNATURE, HeadVectors, Prepared

log = logging.getLogger(__name__)

__all__ = ["Batch", "HeadVectors", "Prepared", "Trainer", "TrainOptions"]


def _pick(value: float | None, default: float) -> float:
    return default if value is None else value


def _mixer(config: ModelConfig, covisit: bool) -> ScoreMixer:
    """The score's parts (towers, then the prior, co-visitation and session-kNN where the
    model has them) with their initial weights; the weights learn only with ``config.mix``
    learned."""
    names, initial = ["tower"], [1.0]
    if config.prior_weight:
        names.append("prior")
        initial.append(config.prior_weight)
    if covisit:
        names.append("covisit")
        initial.append(config.covisit_weight)
        if config.mix == "learned":  # the most recent item's own term, learnt from 0
            names.append("covisit_last")
            initial.append(0.0)
    if config.sknn_weight:
        names.append("sknn")
        initial.append(config.sknn_weight)
    return ScoreMixer(names, initial, lr=config.mix_lr)


def _selector(config: ModelConfig, covisit: bool, sessions: bool) -> MixSelector | None:
    """The mix selector over the neighbour parts the model has (None: a fixed mix, no
    neighbour part, or ``config.mix_select`` off)."""
    if config.mix != "learned" or not config.mix_select or not (covisit or sessions):
        return None
    return MixSelector(item_scales=ITEM_SCALES if covisit else (1.0,),
                       sknn_scales=SKNN_SCALES if sessions else (1.0,))


def _rarity(config: ModelConfig) -> RareSelector | None:
    """The towers' scales on rarely chosen items (None: a fixed mix, or
    ``config.rare_select`` off; unset: on with attribute slots)."""
    on = config.attr_tokens > 0 if config.rare_select is None else config.rare_select
    if config.mix != "learned" or not on:
        return None
    return RareSelector()


def _adagrad(lr: float) -> Any:
    return tf_keras.optimizers.legacy.Adagrad(learning_rate=lr)


class Trainer(ScoringHead):
    """A TwoTower model with its optimizers, logQ estimator and evaluation state."""

    def __init__(
        self, config: ModelConfig, options: TrainOptions | None = None, tag: str = ""
    ) -> None:
        """``tag`` names the TFRA tables (distinct per trainer in one process; see TwoTower)."""
        self.options = options or TrainOptions()
        opts = self.options
        if opts.mixed_precision and config.compute_dtype != "bfloat16":
            config = replace(config, compute_dtype="bfloat16")
        self.config = config
        self.model = TwoTower(config, tag=tag)
        self.freq: FrequencyEstimator | CountFrequencyEstimator
        if opts.logq_estimator == "count":
            self.freq = CountFrequencyEstimator(opts.logq_buckets, opts.logq_half_life)
        else:
            self.freq = FrequencyEstimator(opts.logq_buckets, opts.logq_alpha)
        lr = opts.learning_rate
        self.opt_user = de.DynamicEmbeddingOptimizer(_adagrad(_pick(opts.user_lr, lr)))
        self.opt_item = de.DynamicEmbeddingOptimizer(_adagrad(_pick(opts.item_lr, lr)))
        self.opt_dense = _adagrad(_pick(opts.dense_lr, lr))
        #: The attribute table's optimizer (``ModelConfig.attr_tokens``; its step:
        #: ``TrainOptions.attr_lr``).
        attr_lr = _pick(opts.attr_lr, ATTR_LR_SCALE * _pick(opts.item_lr, lr))
        self.opt_attr = (de.DynamicEmbeddingOptimizer(_adagrad(attr_lr))
                         if self.model.attrs is not None else None)
        if self.model.attrs is not None and (not opts.dedup_lookups or opts.grad_accum_steps > 1):
            raise ValueError("item attributes (attr_tokens) train with one read per distinct "
                             "key (dedup_lookups) and no gradient accumulation")
        self.step = tf.Variable(0, dtype=tf.int64, trainable=False, name="global_step")
        self.model.init_default_rows()
        self.evaluator = Evaluator(opts.eval_k, opts.eval_window)
        self._eval_pool: ThreadPoolExecutor | None = None
        self._evict_in: int | None = None
        self._eval_pending: deque[Future[None]] = deque()
        self._since_refresh = opts.eval_refresh_steps
        self._full_batches = 0
        self._heads_scored = 0
        self._columns: dict[str, tuple[np.ndarray, int, np.ndarray]] = {}
        #: The last step's head vectors (test-then-train), or a callable that returns them
        #: once the step ran (a cluster step in flight; called on the evaluation thread).
        self._head_vectors: HeadVectors | None = None
        self.negatives = NegativeSampler(opts.sampled_negatives, config.seed)
        self.covisit = (
            CoVisitation(
                config.covisit_window,
                config.covisit_decay,
                config.covisit_half_life,
                config.covisit_max_pairs,
                reverse=config.covisit_reverse,
            )
            if config.covisit_weight
            else None
        )
        #: The session-kNN index of the score's ``sknn`` part (``model.scoring.sessions``).
        self.sessions = (
            SessionIndex(config.sknn_sample, config.sknn_window, config.sknn_k or None,
                         config.sknn_max_sessions)
            if config.sknn_weight
            else None
        )
        self.mixer = _mixer(config, self.covisit is not None)
        #: What a row with no history is ranked by (``model.scoring.cold``; learned mix only).
        self.cold = ColdStart(buckets=int(self.freq.buckets))
        #: Per history size, the scales of the neighbour parts' weights served
        #: (``model.scoring.selector``); None: the learnt weights for every row.
        self.selector = _selector(config, self.covisit is not None, self.sessions is not None)
        #: The towers' scales on rarely chosen items (``model.scoring.rarity``); None: 1.
        self.rarity = _rarity(config)
        self._mix_rng = np.random.default_rng(config.seed)
        single = self._dedup_step if opts.dedup_lookups else self._single_step
        self._step_fn = tf.function(single, input_signature=STEP_SIGNATURE)
        self._step_call: Any = None
        self._accum_fn = tf.function(self._accum_step, input_signature=STEP_SIGNATURE)
        #: Called with (batch, sampled negatives) before each optimizer update: the keys
        #: whose rows it moves (``model.trainer.deltas``); None = nobody listens.
        self.on_step: Callable[[Batch, np.ndarray], None] | None = None
        #: The model's tables hold the trained rows at every step (False: they are copied in
        #: only by :meth:`sync`, e.g. from parameter servers), which deltas read.
        self.rows_local = True
        #: Rows removed by eviction so far (a delta rescans its tables when this moves).
        self.evicted_rows = 0
        self.evicted_attr_rows = 0
        self._user_vec_fn = tf.function(
            self.model.user_vectors,
            input_signature=[tf.TensorSpec([None], tf.int64), tf.TensorSpec([None, None], tf.int64)],
        )

    # -- checkpointable state ---------------------------------------------------------------
    def trackables(self) -> dict[str, object]:
        """Objects a tf.train.Checkpoint must hold to resume exactly (slots included)."""
        return {
            "model": self.model,
            "freq": self.freq,
            "opt_user": self.opt_user,
            "opt_item": self.opt_item,
            "opt_dense": self.opt_dense,
            "step": self.step,
            **({"opt_attr": self.opt_attr} if self.opt_attr is not None else {}),
        }

    def restored(self, prefix: str) -> None:
        """Called once the trackables are read from the checkpoint at ``prefix`` (a
        ``tf.train.Checkpoint`` path), before training: state saved in an earlier layout is
        brought forward here: the attribute keys' counts are derived again."""
        self.model.attributes_restored()

    def sync(self) -> None:
        """Block until every step handed out is applied to the state a checkpoint saves
        (a no-op in one process; the cluster trainer waits for its workers)."""

