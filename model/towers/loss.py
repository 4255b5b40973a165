"""In-batch sampled softmax with logQ correction and streaming item-frequency estimation.

Reference: X. Yi et al., "Sampling-Bias-Corrected Neural Modeling for Large Corpus Item
Recommendations", RecSys 2019. Logit ``s_ij = <u_i, v_j> / T - log q_j``: the other positives
of the batch are the negatives, and the logQ correction removes their popularity bias; the
loss is the weighted cross-entropy at column i (same-item columns masked). ``num_groups`` > 1
draws each row's negatives from its own block only (what gradient accumulation optimises).
The streaming frequency estimate is Yi et al.'s Algorithm 2 over ``H`` hash buckets
(``q = 1 / B[h]``). The numpy functions (``*_np``) are the references the TF code is tested
against; the formulas in full: docs/internals.md.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from model.towers.tf_env import tf

#: B of a bucket never seen: a large gap, i.e. a small probability (1e-6 per step).
INITIAL_GAP = 1e6
#: Logit given to masked entries (same item as the positive, or outside the row's group).
MASKED_LOGIT = -1e9


class FrequencyEstimator(tf.Module):
    """Yi et al. streaming estimate of each item's per-batch sampling probability."""

    def __init__(self, buckets: int = 1 << 20, alpha: float = 0.01, name: str = "freq") -> None:
        super().__init__(name=name)
        if buckets < 1 or not 0.0 < alpha <= 1.0:
            raise ValueError("buckets must be >= 1 and 0 < alpha <= 1")
        self.buckets = int(buckets)
        self.alpha = float(alpha)
        self.last_step = tf.Variable(tf.zeros([self.buckets], tf.float32), trainable=False, name="A")
        self.gap = tf.Variable(
            tf.fill([self.buckets], tf.constant(INITIAL_GAP, tf.float32)), trainable=False, name="B"
        )
        self.step = tf.Variable(0.0, trainable=False, name="t")

    def _bucket(self, keys: tf.Tensor) -> tf.Tensor:
        return tf.math.floormod(tf.cast(keys, tf.int64), tf.constant(self.buckets, tf.int64))

    def log_q(self, keys: tf.Tensor) -> tf.Tensor:
        """log of the estimated probability of each key, float32, shape of ``keys``."""
        return -tf.math.log(tf.gather(self.gap, self._bucket(keys)))

    def update(self, keys: tf.Tensor) -> tf.Tensor:
        """Record one batch (all of ``keys`` seen at the next step); returns the new step."""
        t = self.step.assign_add(1.0)
        buckets, _ = tf.unique(tf.reshape(self._bucket(keys), [-1]))
        last = tf.gather(self.last_step, buckets)
        gap = tf.gather(self.gap, buckets)
        # First sighting of a bucket (A == 0): take the gap as t, i.e. since the stream began.
        new_gap = (1.0 - self.alpha) * gap + self.alpha * (t - last)
        new_gap = tf.where(last > 0.0, new_gap, tf.broadcast_to(t, tf.shape(new_gap)))
        self.gap.scatter_nd_update(buckets[:, None], new_gap)
        self.last_step.scatter_nd_update(buckets[:, None], tf.fill(tf.shape(last), t))
        return t


def frequency_update_np(
    last_step: np.ndarray, gap: np.ndarray, step: float, keys: np.ndarray, alpha: float
) -> float:
    """Numpy reference of :meth:`FrequencyEstimator.update` (updates arrays in place)."""
    t = step + 1.0
    buckets = np.unique(np.mod(np.asarray(keys, np.int64).reshape(-1), last_step.shape[0]))
    last = last_step[buckets]
    new_gap = (1.0 - alpha) * gap[buckets] + alpha * (t - last)
    gap[buckets] = np.where(last > 0.0, new_gap, t)
    last_step[buckets] = t
    return t


def group_ids(batch: tf.Tensor, num_groups: int) -> tf.Tensor:
    """Block index of each of ``batch`` rows: ``num_groups`` consecutive, near-equal blocks
    (the split of ``numpy.array_split``)."""
    return (tf.range(batch) * num_groups) // tf.maximum(batch, 1)


def block_mask(batch: tf.Tensor, num_groups: int) -> tf.Tensor:
    """[B, B] bool: True where row and column fall in the same of ``num_groups`` blocks."""
    group = group_ids(batch, num_groups)
    return tf.equal(group[:, None], group[None, :])


def in_batch_softmax_loss(
    user_vecs: tf.Tensor,
    item_vecs: tf.Tensor,
    item_keys: tf.Tensor,
    log_q: tf.Tensor,
    weights: tf.Tensor,
    temperature: float = 1.0,
    num_groups: int = 1,
    reduce: str = "mean",
    *,
    user_keys: tf.Tensor | None = None,
    neg_vecs: tf.Tensor | None = None,
    neg_keys: tf.Tensor | None = None,
    neg_log_q: tf.Tensor | None = None,
    neg_valid: tf.Tensor | None = None,
) -> tf.Tensor:
    """Weighted in-batch softmax loss with logQ correction (see the module doc).

    ``reduce="mean"`` returns ``sum(w*ce)/sum(w)``; ``"sum"`` returns ``sum(w*ce)`` (for
    accumulation, where the caller divides by the total weight of all micro-batches).
    Logits are computed in the dtype of the vectors and the softmax in float32.

    ``user_keys`` (``[B]``): also mask the columns of the row's own user (the user's other
    positives of the batch are not negatives). ``neg_vecs``/``neg_keys``/``neg_log_q``
    (``[S, d]``/``[S]``/``[S]``): sampled negatives shared by every row (mixed negative
    sampling), corrected by their own log sampling probability; a sampled key equal to the
    row's positive, or with ``neg_valid`` False, is masked.

    ``user_vecs`` may stack R query sets for the same B positives (``[R * B, d]``, weights
    ``[R * B]``): row ``r * B + i`` targets item i with row i's masks; the sum is over all
    rows (one matmul and one softmax for what would be R calls).
    """
    batch = tf.shape(item_vecs)[0]
    # Row r * batch + i of ``user_vecs`` (the r-th stacked query set) targets column i.
    repeats = tf.shape(user_vecs)[0] // tf.maximum(batch, 1)
    # Masked entries get MASKED_LOGIT added: a constant bias (no select in the forward or
    # the backward pass); their softmax weight, hence their gradient, is exactly 0.
    masked = tf.equal(item_keys[:, None], item_keys[None, :])
    if user_keys is not None:
        masked = tf.logical_or(masked, tf.equal(user_keys[:, None], user_keys[None, :]))
    if num_groups > 1:
        masked = tf.logical_or(masked, tf.logical_not(block_mask(batch, num_groups)))
    masked = tf.linalg.set_diag(masked, tf.zeros([batch], tf.bool))
    columns, col_log_q = item_vecs, log_q
    if neg_vecs is not None:
        if neg_keys is None or neg_log_q is None:
            raise ValueError("neg_vecs needs neg_keys and neg_log_q")
        hit = tf.equal(item_keys[:, None], neg_keys[None, :])
        if neg_valid is not None:
            hit = tf.logical_or(hit, tf.logical_not(neg_valid)[None, :])
        masked = tf.concat([masked, hit], axis=1)
        columns = tf.concat([item_vecs, neg_vecs], axis=0)
        col_log_q = tf.concat([log_q, neg_log_q], axis=0)
    # One matmul against [positives; sampled negatives]; the softmax as logsumexp minus the
    # positive's logit, taken as a row-wise dot product (cheaper forward and backward than
    # sparse_softmax_cross_entropy_with_logits here; the diagonal is never masked).
    logits = tf.matmul(user_vecs, columns, transpose_b=True)
    logits = tf.cast(logits, tf.float32) / temperature - col_log_q[None, :]
    bias = tf.cast(masked, tf.float32) * MASKED_LOGIT  # [B, C], the same for each query set
    cols = tf.shape(logits)[1]
    logits = tf.reshape(tf.reshape(logits, [repeats, batch, cols]) + bias[None], [-1, cols])
    positive = tf.reduce_sum(user_vecs * tf.tile(item_vecs, [repeats, 1]), axis=1)
    positive = tf.cast(positive, tf.float32) / temperature - tf.tile(log_q, [repeats])
    ce = tf.reduce_logsumexp(logits, axis=1) - positive
    weights = tf.cast(weights, tf.float32)
    total = tf.reduce_sum(weights * ce)
    if reduce == "sum":
        return total
    return total / tf.maximum(tf.reduce_sum(weights), 1e-12)


#: XLA-compiled forward and backward passes of :func:`in_batch_softmax_loss`, one per
#: (temperature, num_groups, reduce, own-user mask, sampled negatives) (see
#: :func:`fused_softmax_loss`).
_FUSED: dict[tuple[float, int, str, bool, bool], Any] = {}


def _fused_fn(temperature: float, num_groups: int, reduce: str, same_user: bool,
              negatives: bool) -> Any:
    key = (temperature, num_groups, reduce, same_user, negatives)
    if key not in _FUSED:

        def loss_and_grads(uv: tf.Tensor, iv: tf.Tensor, nv: tf.Tensor,
                           consts: tuple[tf.Tensor, ...]) -> tuple[tf.Tensor, ...]:
            item_keys, log_q, weights, user_keys, neg_keys, neg_log_q, neg_valid = consts
            with tf.GradientTape() as tape:
                tape.watch([uv, iv, nv])
                extra = {"user_keys": user_keys} if same_user else {}
                if negatives:
                    extra.update(neg_vecs=nv, neg_keys=neg_keys, neg_log_q=neg_log_q,
                                 neg_valid=neg_valid)
                loss = in_batch_softmax_loss(uv, iv, item_keys, log_q, weights, temperature,
                                             num_groups, reduce, **extra)
            gu, gi, gn = tape.gradient(loss, [uv, iv, nv],
                                       unconnected_gradients=tf.UnconnectedGradients.ZERO)
            return loss, gu, gi, gn

        _FUSED[key] = tf.function(loss_and_grads, jit_compile=True, autograph=False)
    return _FUSED[key]


def fused_softmax_loss(
    user_vecs: tf.Tensor, item_vecs: tf.Tensor, item_keys: tf.Tensor, log_q: tf.Tensor,
    weights: tf.Tensor, temperature: float = 1.0, num_groups: int = 1, reduce: str = "mean",
    *, user_keys: tf.Tensor | None = None, neg_vecs: tf.Tensor | None = None,
    neg_keys: tf.Tensor | None = None, neg_log_q: tf.Tensor | None = None,
    neg_valid: tf.Tensor | None = None,
) -> tf.Tensor:
    """:func:`in_batch_softmax_loss` (same arguments, the same loss to float rounding) with
    its forward and backward pass compiled together by XLA: the elementwise passes over the
    ``[rows, columns]`` logits (bias, logsumexp, its gradient) run fused instead of one op
    and one temporary each. Gradients reach the vectors only (``user_vecs``, ``item_vecs``,
    ``neg_vecs``); keys, log q and weights are constants of the loss (none of them is
    trained). XLA compiles once per distinct input shape, so callers use it on batches of
    one fixed size (``model.trainer.trainer``: full batches) and
    :func:`in_batch_softmax_loss` on the others."""
    negatives = neg_vecs is not None
    if negatives and (neg_keys is None or neg_log_q is None):
        raise ValueError("neg_vecs needs neg_keys and neg_log_q")
    fn = _fused_fn(float(temperature), int(num_groups), reduce, user_keys is not None,
                   negatives)
    nv = neg_vecs if negatives else tf.zeros([0, 1], user_vecs.dtype)
    zeros_i64, zeros_f32 = tf.zeros([0], tf.int64), tf.zeros([0], tf.float32)
    consts = (item_keys, log_q, weights,
              user_keys if user_keys is not None else zeros_i64,
              neg_keys if negatives else zeros_i64,
              neg_log_q if negatives else zeros_f32,
              neg_valid if neg_valid is not None else tf.ones(tf.shape(nv)[:1], tf.bool))

    @tf.custom_gradient
    def fused(uv: tf.Tensor, iv: tf.Tensor, nv_: tf.Tensor) -> Any:
        loss, gu, gi, gn = fn(uv, iv, nv_, consts)

        def grad(dy: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
            return (tf.cast(dy, gu.dtype) * gu, tf.cast(dy, gi.dtype) * gi,
                    tf.cast(dy, gn.dtype) * gn)

        return loss, grad

    return fused(user_vecs, item_vecs, nv)


def history_pool_query(
    pooled: tf.Tensor, known: tf.Tensor, weights: tf.Tensor, dtype: tf.DType
) -> tuple[tf.Tensor, tf.Tensor]:
    """Queries and row weights of the auxiliary item-item term (``TrainOptions.aux_weight``).

    The query of a row is its L2-normalised history pool ``pooled`` (``[B, d]``, the user
    tower's recency-weighted mean of the known history rows) in place of the user vector; its
    weight is the event weight on rows with a known history (``known``: ``[B, L]``), else 0.
    Stacked below the user vectors in one :func:`in_batch_softmax_loss` call (same positives,
    negatives and masks), it ranks the target against the history items' own rows
    (item2vec-like), so the shared item table learns which items follow which, beyond what the
    per-user rows memorise."""
    has = tf.cast(tf.reduce_any(known, axis=1), tf.float32)
    query = tf.cast(pooled, tf.float32)
    query = query / tf.maximum(tf.norm(query, axis=-1, keepdims=True), 1e-12)
    return tf.cast(query, dtype), tf.cast(weights, tf.float32) * has


def in_batch_softmax_loss_np(
    user_vecs: np.ndarray,
    item_vecs: np.ndarray,
    item_keys: np.ndarray,
    log_q: np.ndarray,
    weights: np.ndarray,
    temperature: float = 1.0,
    num_groups: int = 1,
    *,
    user_keys: np.ndarray | None = None,
    neg_vecs: np.ndarray | None = None,
    neg_keys: np.ndarray | None = None,
    neg_log_q: np.ndarray | None = None,
    neg_valid: np.ndarray | None = None,
) -> float:
    """Numpy reference of :func:`in_batch_softmax_loss` (mean reduction), float64."""
    u = np.asarray(user_vecs, np.float64)
    v = np.asarray(item_vecs, np.float64)
    b = u.shape[0]
    logits = u @ v.T / temperature - np.asarray(log_q, np.float64)[None, :]
    keys = np.asarray(item_keys)
    keep = keys[:, None] != keys[None, :]
    if user_keys is not None:
        users = np.asarray(user_keys)
        keep &= users[:, None] != users[None, :]
    keep |= np.eye(b, dtype=bool)
    if num_groups > 1:
        group = (np.arange(b) * num_groups) // b
        keep &= group[:, None] == group[None, :]
    logits = np.where(keep, logits, MASKED_LOGIT)
    if neg_vecs is not None:
        nv = np.asarray(neg_vecs, np.float64)
        extra = u @ nv.T / temperature - np.asarray(neg_log_q, np.float64)[None, :]
        nkeep = keys[:, None] != np.asarray(neg_keys)[None, :]
        if neg_valid is not None:
            nkeep &= np.asarray(neg_valid, bool)[None, :]
        logits = np.concatenate([logits, np.where(nkeep, extra, MASKED_LOGIT)], axis=1)
    m = logits.max(axis=1, keepdims=True)
    log_softmax = logits - m - np.log(np.exp(logits - m).sum(axis=1, keepdims=True))
    ce = -log_softmax[np.arange(b), np.arange(b)]
    w = np.asarray(weights, np.float64)
    return float((w * ce).sum() / max(w.sum(), 1e-12))
