"""Causal self-attention over the user's last items: the attention part of the user tower.

The math is ``model.scoring.attention`` (its numpy twin, which serving runs): pre-norm blocks
of multi-head attention and a feed-forward layer over ``item rows + position embeddings``;
the output is the residual stream at the newest known entry, which attends to every known
entry of the window. The newest position, not a masked mean: it is the query a next-item
model needs (the latest click), the older items enter through its attention, and on the
last block only that one query is computed (``[B, 1, N]`` scores, not ``[B, N, N]``).

Plain TF ops (matmul, softmax), float32, every initializer seeded; the variables are
attributes of :class:`AttentionTower`, a ``tf.Module`` the model's checkpoint holds.
"""

from __future__ import annotations

import numpy as np

from model.scoring.attention import BLOCK_PARAMS, LN_EPS, MASKED
from model.towers.tf_env import tf, tf_keras


def layer_norm(x: tf.Tensor, gamma: tf.Variable, beta: tf.Variable) -> tf.Tensor:
    mean = tf.reduce_mean(x, axis=-1, keepdims=True)
    var = tf.reduce_mean(tf.square(x - mean), axis=-1, keepdims=True)
    return (x - mean) * tf.math.rsqrt(var + LN_EPS) * gamma + beta


class AttentionTower(tf.Module):
    """``blocks`` pre-norm Transformer blocks over ``length`` positions of ``dim``-wide rows."""

    def __init__(
        self, dim: int, length: int, blocks: int, heads: int, ffn: int, seed: int,
        name: str = "attention",
    ) -> None:
        super().__init__(name=name)
        self.dim, self.heads = dim, heads
        pos_init = tf_keras.initializers.TruncatedNormal(stddev=0.02, seed=seed)
        self.pos = tf.Variable(pos_init([length, dim]), name="attn_pos")
        self.blocks: list[dict[str, tf.Variable]] = []
        for i in range(blocks):
            s = seed + 1 + 8 * i
            glorot = [tf_keras.initializers.GlorotUniform(seed=s + j) for j in range(6)]
            shapes = {
                "wq": [dim, dim], "wk": [dim, dim], "wv": [dim, dim], "wo": [dim, dim],
                "w1": [dim, ffn], "w2": [ffn, dim],
            }
            params: dict[str, tf.Variable] = {}
            for name_ in BLOCK_PARAMS:
                if name_ in shapes:
                    value = glorot[list(shapes).index(name_)](shapes[name_])
                elif name_.endswith("_g"):
                    value = tf.ones([dim])
                else:
                    value = tf.zeros([ffn if name_ == "b1" else dim])
                params[name_] = tf.Variable(value, name=f"attn{i}_{name_}")
            self.blocks.append(params)

    @property
    def variables_list(self) -> list[tf.Variable]:
        """Every trainable variable, in a fixed order (position embeddings, then blocks)."""
        return [self.pos] + [p[n] for p in self.blocks for n in BLOCK_PARAMS]

    def _split(self, x: tf.Tensor) -> tf.Tensor:
        """``[B, L, e]`` -> ``[B, heads, L, e / heads]``."""
        shape = tf.shape(x)
        x = tf.reshape(x, [shape[0], shape[1], self.heads, self.dim // self.heads])
        return tf.transpose(x, [0, 2, 1, 3])

    def _block(self, q_in: tf.Tensor, x: tf.Tensor, mask: tf.Tensor, p: dict[str, tf.Variable]) -> tf.Tensor:
        hq = layer_norm(q_in, p["ln1_g"], p["ln1_b"])
        hk = layer_norm(x, p["ln1_g"], p["ln1_b"])
        q = self._split(tf.matmul(hq, p["wq"]))
        k = self._split(tf.matmul(hk, p["wk"]))
        v = self._split(tf.matmul(hk, p["wv"]))
        scale = 1.0 / float(np.sqrt(self.dim // self.heads))
        scores = tf.matmul(q, k, transpose_b=True) * scale
        scores = tf.where(mask[:, None], scores, tf.constant(MASKED, tf.float32))
        o = tf.transpose(tf.matmul(tf.nn.softmax(scores, axis=-1), v), [0, 2, 1, 3])
        o = tf.reshape(o, tf.shape(q_in))
        y = q_in + tf.matmul(o, p["wo"]) + p["bo"]
        h = tf.nn.relu(tf.matmul(layer_norm(y, p["ln2_g"], p["ln2_b"]), p["w1"]) + p["b1"])
        return y + tf.matmul(h, p["w2"]) + p["b2"]

    def __call__(self, rows: tf.Tensor, known: tf.Tensor) -> tf.Tensor:
        """``rows`` ``[B, N, e]`` (most recent first), ``known`` ``[B, N]`` -> ``[B, e]``."""
        rows = tf.cast(rows, tf.float32)
        n = tf.shape(rows)[1]
        x = tf.where(known[..., None], rows, 0.0) + self.pos[None, :n]
        first = tf.argmax(tf.cast(known, tf.int32), axis=1, output_type=tf.int32)
        key_mask = known[:, None, :]
        idx = tf.range(n)
        causal = idx[None, :] >= idx[:, None]
        for i, p in enumerate(self.blocks):
            if i == len(self.blocks) - 1:
                q_in = tf.gather(x, first, batch_dims=1)[:, None, :]
                mask = key_mask
            else:
                q_in = x
                mask = tf.logical_and(causal[None], key_mask)
            x = self._block(q_in, x, mask, p)
        return tf.where(tf.reduce_any(known, axis=1)[:, None], x[:, 0, :], 0.0)

    def export(self) -> tuple[np.ndarray, list[dict[str, np.ndarray]]]:
        """(position embeddings, per-block parameters) as float32 arrays."""
        return self.pos.numpy(), [{n: p[n].numpy() for n in BLOCK_PARAMS} for p in self.blocks]
