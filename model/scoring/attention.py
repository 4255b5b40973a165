"""The attention user tower in numpy (no TensorFlow): the served twin of
``model.towers.attention.AttentionTower``.

Input: the item rows of a user's last ``N`` history entries ``[B, N, e]`` (most recent
first) and their ``known`` mask ``[B, N]``. ``x = rows + pos[:N]``; each pre-norm block
computes ``x = q_in + MHA(LN1(q_in), LN1(x))`` (causal over known entries; on the last block
the query is only the newest known position) then ``x = x + W2 relu(W1 LN2(x) + b1) + b2``;
the output is ``x`` at the newest known position (zeros without known entries). ``MHA``:
``softmax(q k^T / sqrt(e / heads)) v`` per head (no Q/K/V biases), concatenated, then
``@ wo + bo``. Layer norms use :data:`LN_EPS`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

#: Parameters of one block, in the order the artifact lists them (``attention_<i>_<name>.npy``).
BLOCK_PARAMS = (
    "ln1_g", "ln1_b", "wq", "wk", "wv", "wo", "bo", "ln2_g", "ln2_b", "w1", "b1", "w2", "b2",
)
LN_EPS = 1e-5
#: Score of a masked key (exp underflows to exactly 0 next to any unmasked key).
MASKED = -1e9

Block = Mapping[str, np.ndarray]


def layer_norm(x: np.ndarray, gamma: np.ndarray, beta: np.ndarray) -> np.ndarray:
    mean = x.mean(axis=-1, keepdims=True)
    var = np.square(x - mean).mean(axis=-1, keepdims=True)
    return ((x - mean) / np.sqrt(var + np.float32(LN_EPS)) * gamma + beta).astype(np.float32)


def _heads(x: np.ndarray, heads: int) -> np.ndarray:
    """``[B, L, e]`` -> ``[B, heads, L, e / heads]``."""
    b, n, e = x.shape
    return x.reshape(b, n, heads, e // heads).transpose(0, 2, 1, 3)


def block(q_in: np.ndarray, x: np.ndarray, mask: np.ndarray, p: Block, heads: int) -> np.ndarray:
    """One pre-norm block: queries ``q_in`` ``[B, Lq, e]`` over keys ``x`` ``[B, N, e]``,
    ``mask`` ``[B, Lq, N]`` (True = may attend)."""
    hq = layer_norm(q_in, p["ln1_g"], p["ln1_b"])
    hk = layer_norm(x, p["ln1_g"], p["ln1_b"])
    q, k, v = (_heads(h @ p[w], heads) for h, w in ((hq, "wq"), (hk, "wk"), (hk, "wv")))
    scale = np.float32(1.0 / np.sqrt(q.shape[-1]))
    scores = np.where(mask[:, None], (q @ k.transpose(0, 1, 3, 2)) * scale, np.float32(MASKED))
    scores = np.exp(scores - scores.max(axis=-1, keepdims=True))
    probs = scores / scores.sum(axis=-1, keepdims=True)
    o = (probs @ v).transpose(0, 2, 1, 3).reshape(q_in.shape)
    y = q_in + o @ p["wo"] + p["bo"]
    h = np.maximum(layer_norm(y, p["ln2_g"], p["ln2_b"]) @ p["w1"] + p["b1"], 0.0)
    return (y + h @ p["w2"] + p["b2"]).astype(np.float32)


def attend(
    rows: np.ndarray, known: np.ndarray, pos: np.ndarray, blocks: Sequence[Block], heads: int
) -> np.ndarray:
    """The tower's output ``[B, e]`` float32 (see the module doc)."""
    rows = np.asarray(rows, np.float32)
    known = np.asarray(known, bool)
    b, n, e = rows.shape
    if b == 0 or n == 0:
        return np.zeros((b, e), np.float32)
    x = np.where(known[..., None], rows, np.float32(0.0)) + pos[:n]
    first = np.argmax(known, axis=1)
    causal = np.arange(n)[None, :] >= np.arange(n)[:, None]  # key at the query or older
    for i, p in enumerate(blocks):
        if i == len(blocks) - 1:
            q_in = x[np.arange(b), first][:, None, :]
            mask = known[:, None, :]
        else:
            q_in = x
            mask = causal[None] & known[:, None, :]
        x = block(q_in, x, mask, p, heads)
    return np.where(known.any(axis=1)[:, None], x[:, 0, :], np.float32(0.0)).astype(np.float32)


def check_weights(pos: np.ndarray, blocks: Sequence[Block], heads: int, dim: int) -> None:
    """Raise ``ValueError`` unless the weights form a tower over ``dim``-wide rows."""
    if pos.ndim != 2 or pos.shape[1] != dim or not blocks or heads < 1 or dim % heads:
        raise ValueError(f"attention: pos {pos.shape}, {len(blocks)} blocks, {heads} heads, dim {dim}")
    for i, p in enumerate(blocks):
        ffn = p["w1"].shape[1] if p["w1"].ndim == 2 else -1
        want = {
            "ln1_g": (dim,), "ln1_b": (dim,), "wq": (dim, dim), "wk": (dim, dim),
            "wv": (dim, dim), "wo": (dim, dim), "bo": (dim,), "ln2_g": (dim,), "ln2_b": (dim,),
            "w1": (dim, ffn), "b1": (ffn,), "w2": (ffn, dim), "b2": (dim,),
        }
        for name, shape in want.items():
            if p[name].shape != shape:
                raise ValueError(f"attention block {i}: {name} {p[name].shape}, want {shape}")
