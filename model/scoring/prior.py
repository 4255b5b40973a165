"""Popularity prior in the retrieval score, exported through the plain dot product.

The logQ-corrected in-batch softmax (``model.towers.loss``; Yi et al. 2019) makes the towers
learn a score without the popularity prior, so ranking by ``<u, v>`` alone under-ranks popular
items. The served score is ``<u, v_i> / T + prior_weight * log q_i``, ``log q_i`` being the
trainer's streaming frequency estimate (``TrainOptions.logq_estimator``). Serving keeps one
``item_vectors @ x``: the prior rides on one extra dimension, item ``[v_i / T, prior_weight *
log q_i]`` and user ``[u, 1]`` (the artifact's ``score_bias`` flag, format 2;
:func:`export_fields`). Format 1 (:func:`exported_layers`) carries the constant in the last
layer, exact only without normalisation (:func:`check_exportable`).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

Layer = tuple[np.ndarray, np.ndarray, str]


def user_scoring_vectors(vectors: np.ndarray, prior_weight: float) -> np.ndarray:
    """User tower output ``[B, d]`` -> scoring vectors (``[B, d + 1]`` with the prior)."""
    vectors = np.asarray(vectors, np.float32)
    if not prior_weight:
        return vectors
    ones = np.ones((vectors.shape[0], 1), np.float32)
    return np.concatenate([vectors, ones], axis=1)


def item_scoring_vectors(
    vectors: np.ndarray, log_q: np.ndarray, temperature: float, prior_weight: float,
    tower_weight: float = 1.0,
) -> np.ndarray:
    """Item tower output ``[N, d]`` -> scoring vectors (``[N, d + 1]`` with the prior);
    ``tower_weight``: the mix's weight of the towers, multiplied in first (as
    ``vectors * tower_weight`` would, in the vectors' dtype, then float32)."""
    if not prior_weight:
        scaled = vectors if tower_weight == 1.0 else vectors * tower_weight
        return np.asarray(scaled, np.float32)
    # contiguous passes, then one copy into the result: ufuncs writing straight into its
    # first d columns (rows of d + 1) took ~1.5x as long (serving recomputes it per delta)
    scaled = np.asarray(vectors * tower_weight if tower_weight != 1.0 else vectors, np.float32)
    if np.may_share_memory(scaled, vectors):
        scaled = scaled / np.float32(temperature)
    else:
        np.divide(scaled, np.float32(temperature), out=scaled)
    column = prior_weight * np.asarray(log_q, np.float32)
    return np.concatenate([scaled, column.reshape(-1, 1)], axis=1)


def normalized_rows(rows: np.ndarray) -> np.ndarray:
    """``rows`` L2-normalised, row by row (a row's result does not depend on the others)."""
    return rows / np.maximum(np.linalg.norm(rows, axis=1, keepdims=True), 1e-12)


def served_item_vectors(
    rows: np.ndarray, log_q: np.ndarray | None, *, normalize: bool, tower_weight: float,
    prior_weight: float, temperature: float, item_scale: np.ndarray | None = None,
) -> np.ndarray:
    """The served scoring vectors of items from their table ``rows``: L2-normalised (with
    ``normalize``), times each item's towers' scale (``item_scale`` ``[N]`` float32, the
    rare items' of ``model.scoring.rarity``; None: 1), times the towers' weight of the mix,
    then the prior's dimension when the model has one (``log_q`` not None; a mix that
    switched the prior off keeps the dimension, at 0). One rule for a full version
    (``Trainer.item_vectors``) and the state deltas build (``model.delta``)."""
    if normalize and rows.size:
        rows = normalized_rows(rows)
    if item_scale is not None:
        rows = np.asarray(rows, np.float32) * np.asarray(item_scale, np.float32)[:, None]
    if log_q is None:
        if tower_weight != 1.0:
            rows = rows * tower_weight
        return np.ascontiguousarray(rows, np.float32)
    if not prior_weight:
        log_q, prior_weight = np.zeros_like(log_q), 1.0
    return item_scoring_vectors(rows, log_q, temperature, prior_weight, tower_weight)


def export_fields(
    layers: Sequence[Layer],
    prior_weight: float,
    normalize_user_vector: bool,
    history_len: int | None = None,
    history_decay: float = 1.0,
) -> dict[str, object]:
    """``layers``/``normalize``/``score_bias``/``history_len``/``history_decay`` arguments of ``model.artifact.files.write_artifact`` for the user tower (its dense ``layers``):
    with the prior, the constant 1 is appended after the (optional) normalisation by the
    artifact's ``score_bias``; ``history_len`` is the model's history window,
    ``history_decay`` its history pooling (``ModelConfig``)."""
    out = [(np.asarray(w, np.float32), np.asarray(b, np.float32), act) for w, b, act in layers]
    return {
        "layers": out,
        "normalize": bool(normalize_user_vector),
        "score_bias": bool(prior_weight),
        "history_len": history_len,
        "history_decay": float(history_decay),
    }


def check_exportable(prior_weight: float, normalized_user: bool) -> None:
    """Raise ``ValueError`` if the artifact format cannot express the scoring vectors: the
    user side's constant 1 would have to follow the L2 normalisation, which format 1
    applies last (``model.artifact.files``)."""
    if prior_weight and normalized_user:
        raise ValueError(
            "prior_weight with an L2-normalised user vector is not exportable in artifact "
            "format 1; export through model.scoring.prior.export_fields (format 2 score_bias)"
        )


def exported_layers(layers: Sequence[Layer], prior_weight: float) -> list[Layer]:
    """The user tower's dense layers as exported: with the prior, the last (linear) layer
    gets one more output, constant 1 (zero weights, bias 1)."""
    out = [(np.asarray(w, np.float32), np.asarray(b, np.float32), act) for w, b, act in layers]
    if not prior_weight:
        return out
    if not out or out[-1][2] != "linear":
        raise ValueError("the prior needs a last linear dense layer to carry its constant")
    w, b, act = out[-1]
    w1 = np.concatenate([w, np.zeros((w.shape[0], 1), np.float32)], axis=1)
    b1 = np.concatenate([b, np.ones(1, np.float32)])
    out[-1] = (w1, b1, act)
    return out
