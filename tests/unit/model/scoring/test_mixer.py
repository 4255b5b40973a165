"""The learned score mixer: its gradient is the cross-entropy's, and it finds the useful part."""

from __future__ import annotations

import numpy as np
import pytest

from model.scoring.mixer import ScoreMixer


def _loss(weights: np.ndarray, parts: list[np.ndarray], target: np.ndarray) -> float:
    logits = sum(w * f for w, f in zip(weights, parts, strict=True))
    logits = np.where(np.isfinite(parts[0]), logits, -np.inf)
    rows = np.arange(target.size)
    top = logits.max(axis=1)
    lse = np.log(np.exp(logits - top[:, None]).sum(axis=1)) + top
    return float(np.mean(lse - logits[rows, target]))


def test_the_step_follows_the_cross_entropy_gradient() -> None:
    rng = np.random.default_rng(3)
    parts = [rng.normal(size=(6, 9)) for _ in range(3)]
    parts[0][0, 4] = -np.inf  # not a candidate for row 0
    target = np.array([1, 2, 3, 0, 8, 5])
    mixer = ScoreMixer(["a", "b", "c"], [1.0, 0.5, 2.0], lr=1e-3)
    before = mixer.weights.copy()
    loss = mixer.update(parts, target)
    assert loss == pytest.approx(_loss(before, parts, target))
    eps = 1e-6
    numeric = np.array([
        (_loss(before + eps * np.eye(3)[k], parts, target)
         - _loss(before - eps * np.eye(3)[k], parts, target)) / (2 * eps)
        for k in range(3)
    ])
    # Adagrad's first step moves each weight by lr * sign(gradient).
    step = before - mixer.weights
    assert np.allclose(step, 1e-3 * np.sign(numeric), atol=1e-9)


def test_rows_without_a_candidate_target_are_skipped() -> None:
    parts = [np.zeros((2, 3)), np.ones((2, 3))]
    parts[0][1, 2] = -np.inf
    mixer = ScoreMixer(["a", "b"], [1.0, 1.0])
    assert mixer.update(parts, np.array([-1, 2])) is None
    assert mixer.updates == 0


def test_it_learns_to_trust_the_informative_part_and_drop_the_noise() -> None:
    rng = np.random.default_rng(5)
    mixer = ScoreMixer(["signal", "noise"], [0.2, 2.0], lr=0.1)
    for _ in range(300):
        target = rng.integers(50, size=32)
        signal = rng.normal(size=(32, 50))
        signal[np.arange(32), target] += 2.0
        noise = rng.normal(size=(32, 50))
        mixer.update([signal, noise], target)
    assert mixer.weights[0] > 1.0
    assert mixer.weights[1] < 0.2
    assert mixer.weights.min() >= 0.0


def test_score_and_state_round_trip() -> None:
    mixer = ScoreMixer(["a", "b"], [2.0, 0.5], learn=[False, True])
    parts = [np.array([[1.0, -np.inf]]), np.array([[4.0, 4.0]])]
    assert mixer.score(parts).tolist() == [[4.0, -np.inf]]
    mixer.update([np.array([[1.0, 0.0]]), np.array([[0.0, 1.0]])], np.array([0]))
    assert mixer.weights[0] == 2.0  # not learnt
    other = ScoreMixer(["a", "b"], [0.0, 0.0])
    other.load_state(mixer.state())
    assert other.as_dict() == mixer.as_dict() and other.updates == 1
    with pytest.raises(ValueError):
        ScoreMixer(["a"], [1.0]).load_state(mixer.state())
