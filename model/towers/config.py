"""Configuration of the two-tower model (:class:`model.towers.two_tower.TwoTower`); no TensorFlow.

Re-exported by ``model.towers.two_tower``; every field is part of the model the live trainer and
``streamrec evaluate`` run, and the served fields go into the artifact (``model.trainer.export``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from streamrec.trainer_settings import trainer_default

if TYPE_CHECKING:
    from streamrec.settings import Settings

COMPUTE_DTYPES = ("float32", "bfloat16")
USER_TOWERS = ("pool", "attention")


@dataclass(frozen=True)
class ModelConfig:
    embedding_dim: int = trainer_default("embedding_dim")
    #: Dense layers of the user tower; the last one must equal ``embedding_dim``.
    user_layers: tuple[int, ...] = (64, 32)
    #: Most recent history items the user tower pools (a prefix of the feature store's
    #: history). Why 10, and the sweeps behind every default below:
    #: docs/decisions.md#model-config.
    history_len: int = 10
    #: Softmax temperature of the loss; the served score is ``<u, v> / temperature`` plus the
    #: prior.
    temperature: float = 0.07
    normalize: bool = True
    #: Whether ``normalize`` also applies to the user tower (False: items only; the user
    #: vector's norm then scales that user's logits, a learned per-user temperature).
    normalize_user: bool = True
    #: Weight of the popularity prior in the score (``model.scoring.prior``); 0 = none. Exported
    #: through the artifact's ``score_bias`` (format 2). Its strength is relative to
    #: ``1 / temperature``; data without a popularity signal wants it weak.
    prior_weight: float = 1.5
    admit_after: int = trainer_default("admit_after")
    #: Admission threshold of the user table (None: ``admit_after``). Users below it share
    #: the default row, so the user tower rests on their history alone.
    user_admit_after: int | None = None
    #: Standard deviation of a new row (uniform: ``model.towers.tables``).
    init_stddev: float = 0.05
    seed: int = trainer_default("seed")
    #: "bfloat16": tower math and logits in bfloat16, variables stay float32 (master weights).
    compute_dtype: str = "float32"
    init_capacity: int = 16384
    #: Recency weighting of the history pool: the known entry at position p of the window
    #: (0 = most recent) weighs ``history_decay ** p``; the pool is the weighted mean of
    #: the known rows (1.0 = plain mean; ``model.towers.two_tower.pool_weights``). 0.8 with 10
    #: items: the newest click weighs 0.22, not 0.1, so one click moves the served vector
    #: more.
    history_decay: float = 0.8
    #: Residual of the history pool in the user tower: the tower's output (before the L2
    #: normalisation) is ``MLP(concat(user row, pool)) + pool_residual * pool``, so the
    #: pool — the query the auxiliary item-item term trains (``TrainOptions.aux_weight``) —
    #: reaches the served vector directly, not only through the MLP (0 = none). Exported
    #: folded into the dense layers (``model.scoring.pooling.fold_pool_residual``: the artifact
    #: format is unchanged).
    pool_residual: float = 2.0
    #: Weight of the item co-visitation term in the score (``model.scoring.covisit``: ``weight *
    #: log1p(s)``, ``s`` the decayed co-visitation weights of the item with the user's last
    #: ``covisit_window`` history items); 0 = the towers alone. Exported as artifact
    #: format 4. The towers generalise, the pairs remember (docs/decisions.md#co-visitation).
    covisit_weight: float = 2.0
    #: Most recent history items whose co-visitations count, each ``covisit_decay ** j``.
    #: Why 7 and 0.8 (5 and 0.9 before): the real-log panel, docs/decisions.md#co-visitation.
    covisit_window: int = 7
    covisit_decay: float = 0.8
    #: Half-life of the co-visitation weights in positive samples (0 = never decay): pairs of
    #: a past season mislead.
    covisit_half_life: float = 20_000.0
    #: Weight of the reverse direction of a co-visitation: a target ``t`` after history item
    #: ``h`` also adds ``covisit_reverse`` times its weight to ``C[t, h]`` (0 = ``h -> t``
    #: only; ``model.scoring.covisit``). Learning only: serving reads the same pairs. Why 1:
    #: docs/decisions.md#co-visitation (the real-log panel, session logs above all).
    covisit_reverse: float = 1.0
    #: Most item pairs the co-visitation keeps (the lightest go first).
    covisit_max_pairs: int = 4_000_000
    #: Initial weight of the session-kNN part of the score (``model.scoring.sessions``:
    #: ``weight * log1p(20 s)``, ``s`` the recency-weighted similarity of the recent histories
    #: that hold the item to the user's last ``window`` items); 0 = no such part. Learnt by
    #: the mix like the others; exported as artifact format 9. Why: the real-log panel,
    #: docs/decisions.md#session-knn-part.
    sknn_weight: float = 1.0
    #: Most recent neighbouring histories read per row, and how many of the most similar
    #: of them count (V-SKNN's sample and k, 0 = all; the panel's ``sknn`` baseline's).
    sknn_sample: int = 300
    sknn_k: int = 75
    #: Most recent history items of the row the session-kNN part compares (V-SKNN's window).
    sknn_window: int = 10
    #: Most recent histories the session-kNN index keeps (the least recent go first).
    sknn_max_sessions: int = 200_000
    #: Whether history rows get gradients through the user tower. False: they learn only as
    #: targets (and sampled negatives), and the item optimizer touches ~B rows per step,
    #: not every distinct history item of the batch (bench/train.py times both steps).
    train_history: bool = trainer_default("train_history")
    #: Most attribute keys an item's row composes (``TwoTower.set_attributes``: the tokens of
    #: its catalogue slots, ``feature_store.catalogue``); 0: ids only. With them an item's row
    #: is its id row plus, per slot, the mean of the slot's token rows (a TFRA table of its
    #: own), so an item nobody chose yet has a vector from what the catalogue says of it.
    attr_tokens: int = trainer_default("attr_tokens")
    #: Fewest catalogued items that name an attribute key before it gets a row (1: every
    #: key). A key below it adds nothing to an item's row (``TwoTower.set_attributes``). A
    #: title word of one item is a second row of it that learns at the attribute step; on
    #: ml-latest-small those rows earn their memory (docs/decisions.md#item-attributes).
    attr_admit_after: int = trainer_default("attr_admit_after")
    #: How the parts of the score (towers, prior, co-visitation, session-kNN) are weighted:
    #: "learned" — weights start at 1, ``prior_weight``, ``covisit_weight`` and
    #: ``sknn_weight`` and are learnt from the stream by softmax cross-entropy on
    #: test-then-train scores (``model.scoring.mixer``); "fixed" — those constants as they are.
    mix: str = "learned"
    #: Adagrad step of the learned mix (why 0.15: docs/decisions.md#score-mix — at 0.05 the
    #: weights were still on their way from the constants after 100k samples).
    mix_lr: float = 0.15
    #: Per history size (1-4, 5+ items in the window), serve the scales of the neighbour
    #: parts' learnt weights that have ranked best (``model.scoring.selector``; learned mix
    #: only). Why: the real-log panel, docs/decisions.md#mix-selector.
    mix_select: bool = True
    #: Serve the scales of the towers' part on rarely chosen items (never chosen; 1-4
    #: positives so far) that have ranked best (``model.scoring.rarity``; learned mix only).
    #: None: on with attribute slots (``attr_tokens`` > 0), off with ids only. Why (the
    #: catalogue's rare items gain, the real-log panel of ids-only logs does not):
    #: docs/decisions.md#item-attributes.
    rare_select: bool | None = None
    #: "pool": the user tower reads the history through its recency pool alone. "attention":
    #: it also reads the output of a small causal Transformer over the last ``attention_len``
    #: items (``model.towers.attention``; MLP input ``concat(user row, attention, pool)``, the
    #: pool keeping its residual; artifact format 5). Not the default: on MovieLens
    #: latest-small (``streamrec evaluate``) it trails the pool tower on every seed and costs
    #: about half of the step's examples/s (figures: the commit message of this line).
    user_tower: str = "pool"
    #: Pre-norm blocks (multi-head attention + feed-forward) of the attention tower (1-2).
    attention_blocks: int = 1
    attention_heads: int = 2
    #: Most recent history items the attention reads (the pool still reads ``history_len``).
    attention_len: int = 20
    #: Hidden width of each block's feed-forward layer.
    attention_ffn: int = 64
    #: Whether the attention tower also feeds the recency pool to the MLP and its residual
    #: (False: ``concat(user row, attention)``, the residual on the attention output).
    attention_pool: bool = True

    @classmethod
    def from_settings(cls, settings: Settings) -> ModelConfig:
        """The live trainer's model: ``trainer.*`` knobs, user tower layers ``(2d, d)``, and
        the model's own window of the (longer) point-in-time history it is sent."""
        t = settings.trainer
        return cls(
            embedding_dim=t.embedding_dim,
            user_layers=(2 * t.embedding_dim, t.embedding_dim),
            history_len=min(cls.history_len, settings.features.history_len),
            seed=t.seed,
            admit_after=t.admit_after,
            compute_dtype="bfloat16" if t.mixed_precision else "float32",
            train_history=t.train_history,
            attr_tokens=t.attr_tokens,
            attr_admit_after=t.attr_admit_after,
        )

    @property
    def attention(self) -> bool:
        return self.user_tower == "attention"

    @property
    def tower_window(self) -> int:
        """Most recent history items the user tower reads (the pool's and the attention's)."""
        return max(self.history_len, self.attention_len) if self.attention else self.history_len

    @property
    def window(self) -> int:
        """Most recent history items the model reads: the tower's, and the session-kNN
        part's (``sknn_window``) when the score has it."""
        return max(self.tower_window, self.sknn_window if self.sknn_weight else 0)

    def __post_init__(self) -> None:
        if self.mix not in ("learned", "fixed") or self.mix_lr <= 0.0:
            raise ValueError("mix must be 'learned' or 'fixed', mix_lr > 0")
        if not self.user_layers or self.user_layers[-1] != self.embedding_dim:
            raise ValueError("user_layers must end with embedding_dim (the item vector size)")
        if self.compute_dtype not in COMPUTE_DTYPES:
            raise ValueError(f"compute_dtype must be one of {COMPUTE_DTYPES}")
        if self.admit_after < 1 or (self.user_admit_after or 1) < 1 or self.attr_admit_after < 1:
            raise ValueError("admit_after, user_admit_after and attr_admit_after must be >= 1")
        if self.covisit_weight < 0.0 or self.covisit_window < 1 or self.covisit_max_pairs < 1:
            raise ValueError("covisit_weight >= 0, covisit_window and covisit_max_pairs >= 1")
        if self.sknn_weight < 0.0 or self.sknn_k < 0 or min(
                self.sknn_sample, self.sknn_max_sessions, self.sknn_window) < 1:
            raise ValueError("sknn_weight, sknn_k >= 0; sknn_sample, sknn_max_sessions, "
                             "sknn_window >= 1")
        if self.covisit_reverse < 0.0:
            raise ValueError("covisit_reverse must be >= 0")
        if not 0.0 < self.covisit_decay <= 1.0 or self.covisit_half_life < 0.0:
            raise ValueError("covisit_decay must be in (0, 1], covisit_half_life >= 0")
        if self.pool_residual < 0.0:
            raise ValueError("pool_residual must be >= 0")
        if not 0.0 < self.history_decay <= 1.0:
            raise ValueError("history_decay must be in (0, 1]")
        if self.user_tower not in USER_TOWERS:
            raise ValueError(f"user_tower must be one of {USER_TOWERS}")
        if not 1 <= self.attention_blocks <= 2 or not 1 <= self.attention_len <= 50:
            raise ValueError("attention_blocks must be 1-2, attention_len 1-50")
        if self.attention_heads < 1 or (self.attention and self.embedding_dim % self.attention_heads):
            raise ValueError("attention_heads must divide embedding_dim")
        if self.attention_ffn < 1:
            raise ValueError("attention_ffn must be >= 1")
        if not 0 <= self.attr_tokens <= 256:
            raise ValueError("attr_tokens must be in 0-256")
