"""Popularity prior in the score (``model.scoring.prior``): the extra dimension adds exactly the prior."""

from __future__ import annotations

import numpy as np
import pytest

from model.scoring.prior import (
    check_exportable,
    export_fields,
    exported_layers,
    item_scoring_vectors,
    served_item_vectors,
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


def test_export_fields_append_the_constant_after_normalisation(tmp_path) -> None:
    """Served score of the exported artifact == tower/T . item + W * log q (normalised user)."""
    from model.artifact.files import load_artifact, write_artifact
    from streamrec.ids import item_keys

    rng = np.random.default_rng(5)
    layers = [
        (rng.normal(size=(6, 5)).astype(np.float32), rng.normal(size=5).astype(np.float32), "relu"),
        (rng.normal(size=(5, 3)).astype(np.float32), rng.normal(size=3).astype(np.float32), "linear"),
    ]
    items = [f"i{i}" for i in range(7)]
    tower_items = rng.normal(size=(7, 3)).astype(np.float32)
    log_q = np.log(rng.uniform(1e-4, 0.5, size=7)).astype(np.float32)
    default = rng.normal(size=3).astype(np.float32)
    write_artifact(
        tmp_path,
        version="v1",
        item_ids=items,
        item_vectors=item_scoring_vectors(tower_items, log_q, 0.05, 5.0),
        item_hist_keys=item_keys(items),
        item_hist_rows=rng.normal(size=(7, 3)),
        user_keys=np.zeros(0, np.int64),
        user_rows=np.zeros((0, 3)),
        default_user_row=default,
        **export_fields(layers, 5.0, normalize_user_vector=True),
    )
    art = load_artifact(tmp_path)
    assert art.manifest["format_version"] == 2 and art.score_bias
    served = art.item_vectors @ art.user_vectors(["u"], [["i1", "i2"]])[0]
    x = np.concatenate([default, art.item_hist_rows[np.searchsorted(art.item_hist_keys, item_keys(["i1", "i2"]))].mean(0)])
    for w, b, act in layers:
        x = x @ w + b
        x = np.maximum(x, 0.0) if act == "relu" else x
    x = x / np.linalg.norm(x)
    np.testing.assert_allclose(served, tower_items @ x / 0.05 + 5.0 * log_q, rtol=1e-4, atol=1e-3)


def test_export_fields_without_prior_write_format_1() -> None:
    fields = export_fields([], 0.0, normalize_user_vector=True)
    assert fields["score_bias"] is False and fields["normalize"] is True
    assert fields["history_len"] is None


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("tower_weight", [1.0, 0.73])
@pytest.mark.parametrize("prior_weight", [0.0, 1.3])
def test_served_item_vectors_are_the_plain_formula_bit_for_bit(
    dtype: type, tower_weight: float, prior_weight: float
) -> None:
    rng = np.random.default_rng(3)
    rows = rng.standard_normal((50, 8)).astype(dtype)
    log_q = rng.standard_normal(50)
    got = served_item_vectors(rows, log_q, normalize=True, tower_weight=tower_weight,
                              prior_weight=prior_weight, temperature=0.07)
    # the rule written out: normalise, weigh (in the rows' dtype), float32, divide by T,
    # then the prior's column (0 when the mix switched it off)
    r = rows / np.maximum(np.linalg.norm(rows, axis=1, keepdims=True), 1e-12)
    r = np.asarray(r * tower_weight if tower_weight != 1.0 else r, np.float32)
    want = np.concatenate([
        r / np.float32(0.07),
        ((prior_weight or 1.0) * (log_q.astype(np.float32) if prior_weight
                                  else np.zeros(50, np.float32)))[:, None],
    ], axis=1).astype(np.float32)
    np.testing.assert_array_equal(got, want)
    assert got.dtype == np.float32 and got.flags.c_contiguous
