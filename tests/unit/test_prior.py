"""Popularity prior in the score (``model.prior``): the extra dimension adds exactly the prior."""

from __future__ import annotations

import numpy as np
import pytest

from model.prior import (
    check_exportable,
    exported_layers,
    item_scoring_vectors,
    user_scoring_vectors,
)


def test_scoring_vectors_add_the_weighted_prior_to_the_tempered_dot_product() -> None:
    rng = np.random.default_rng(3)
    users = rng.normal(size=(5, 4)).astype(np.float32)
    items = rng.normal(size=(7, 4)).astype(np.float32)
    log_q = np.log(rng.uniform(1e-4, 0.5, size=7)).astype(np.float32)
    scores = user_scoring_vectors(users, 1.5) @ item_scoring_vectors(items, log_q, 0.1, 1.5).T
    expected = users @ items.T / 0.1 + 1.5 * log_q[None, :]
    np.testing.assert_allclose(scores, expected, rtol=1e-5, atol=1e-4)


def test_no_prior_leaves_the_vectors_alone() -> None:
    users = np.ones((2, 3), np.float32)
    items = np.full((4, 3), 2.0, np.float32)
    assert user_scoring_vectors(users, 0.0).shape == (2, 3)
    np.testing.assert_array_equal(item_scoring_vectors(items, np.zeros(4), 0.1, 0.0), items)


def test_exported_last_layer_emits_a_constant_one() -> None:
    rng = np.random.default_rng(4)
    layers = [
        (rng.normal(size=(6, 5)).astype(np.float32), rng.normal(size=5).astype(np.float32), "relu"),
        (rng.normal(size=(5, 3)).astype(np.float32), rng.normal(size=3).astype(np.float32), "linear"),
    ]
    x = rng.normal(size=(8, 6)).astype(np.float32)

    def tower(ls: list[tuple[np.ndarray, np.ndarray, str]]) -> np.ndarray:
        out = x
        for w, b, act in ls:
            out = out @ w + b
            if act == "relu":
                out = np.maximum(out, 0.0)
        return out

    plain, with_prior = tower(exported_layers(layers, 0.0)), tower(exported_layers(layers, 2.0))
    np.testing.assert_allclose(with_prior, user_scoring_vectors(plain, 2.0), atol=1e-6)
    with pytest.raises(ValueError):
        exported_layers([layers[0]], 2.0)


def test_export_of_the_prior_needs_an_unnormalised_user_vector() -> None:
    with pytest.raises(ValueError):
        check_exportable(1.0, normalized_user=True)
    check_exportable(1.0, normalized_user=False)
    check_exportable(0.0, normalized_user=True)
