"""The towers' scales on rarely chosen items (``model.scoring.rarity``): exact ranks per
variant against scoring every column, the groups of item counts, the leader, the entry the
delta stream carries and the checkpointed state."""

from __future__ import annotations

import numpy as np
import pytest

from model.scoring.rarity import (
    RARE_SCALES,
    RareSelector,
    check_item_groups,
    item_groups,
    item_groups_entry,
    item_scales,
    scales_of,
    variant_ranks,
)


def _brute(rest: np.ndarray, tower: np.ndarray, groups: np.ndarray, target: np.ndarray,
           variants: np.ndarray, k: int) -> np.ndarray:
    table = np.concatenate([variants, np.ones((len(variants), 1))], axis=1)
    out = np.full((len(rest), len(variants)), k, np.int64)
    for b in range(len(rest)):
        for j in range(len(variants)):
            score = rest[b] + table[j][groups] * tower[b]
            t = target[b]
            if t >= 0 and np.isfinite(score[t]):
                out[b, j] = min(int((score > score[t]).sum()), k)
    return out


@pytest.mark.parametrize("seed", range(40))
def test_variant_ranks_equal_scoring_every_column(seed: int) -> None:
    rng = np.random.default_rng(seed)
    b, n = int(rng.integers(1, 9)), int(rng.integers(1, 80))
    rest, tower = rng.normal(size=(b, n)), rng.normal(size=(b, n))
    if seed % 3 == 0:  # ties
        rest, tower = np.round(rest, 1), np.round(tower, 1)
    rest[rng.random((b, n)) < 0.1] = -np.inf  # not candidates
    groups = rng.integers(-1, 2, n)
    target = rng.integers(-1, n, b)
    selector = RareSelector(k=int(rng.integers(1, 12)))
    got = variant_ranks(rest, tower, groups, target, selector.variants, selector.k)
    np.testing.assert_array_equal(
        got, _brute(rest, tower, groups, target, selector.variants, selector.k))


def test_items_are_grouped_by_their_positives_so_far() -> None:
    counts = np.array([0, 1, 4, 4.5, 5, 80])
    assert item_groups(counts).tolist() == [0, 1, 1, 1, -1, -1]
    np.testing.assert_array_equal(item_scales([3.0, 1.5], counts),
                                  np.array([3, 1.5, 1.5, 1.5, 1, 1], np.float32))
    assert item_scales([3.0, 1.5], counts).dtype == np.float32


def test_the_selector_serves_the_scale_that_ranked_best() -> None:
    # two candidates with 5+ positives lead by rest; the targets are rare items whose
    # towers' part reaches the top only at a scale of 2 or more
    k = 1
    rest = np.array([[1.0, 0.9, 0.0, 0.0]] * 4)
    tower = np.array([[0.0, 0.0, 0.6, 0.1],
                      [0.0, 0.0, 0.1, 0.6],
                      [0.0, 0.0, 0.6, 0.1],
                      [0.0, 0.0, 0.0, 0.6]])
    counts = np.array([50, 9, 0, 3])  # columns 2 never chosen, 3 once to four times
    selector = RareSelector(k=k)
    assert selector.entry() is None  # nothing counted: the learnt mix (scale 1)
    selector.observe(rest, tower, counts, np.array([2, 3, 2, 3]))
    scales = selector.scales()
    assert scales[0] * 0.6 > 1.0 and scales[1] * 0.6 > 1.0
    assert selector.rows == 4
    assert selector.gains.max() == pytest.approx(4.0)
    entry = selector.entry()
    assert entry == {"starts": [0, 1], "below": 5, "scales": [float(s) for s in scales]}
    check_item_groups(entry)
    np.testing.assert_array_equal(scales_of(entry, counts),
                                  selector.item_scales(counts))
    # a row whose target has no positives to gain from scales stays at the earliest leader
    other = RareSelector(k=k)
    other.observe(rest, tower, counts, np.array([0, 0, -1, 0]))
    assert other.scales().tolist() == [1.0, 1.0] and other.entry() is None
    assert other.rows == 3


def test_state_round_trips_and_other_scales_are_refused() -> None:
    selector = RareSelector()
    selector.gains[5] = 2.5
    selector.rows = 7
    again = RareSelector()
    again.load_state(selector.state())
    assert again.scales().tolist() == selector.scales().tolist() and again.rows == 7
    with pytest.raises(ValueError, match="sums"):
        RareSelector(scales=RARE_SCALES[:3]).load_state(selector.state())


@pytest.mark.parametrize("bad", [
    [], {"starts": [1, 0], "below": 5, "scales": [1.0, 2.0]},
    {"starts": [0, 1], "below": 1, "scales": [1.0, 2.0]},
    {"starts": [0, 1], "below": 5, "scales": [1.0]},
    {"starts": [0, 1], "below": 5, "scales": [1.0, 0.0]},
    {"starts": [0, 1], "below": 5, "scales": [1.0, True]},
    {"starts": [0, 1], "scales": [1.0, 2.0]},
])
def test_a_garbled_entry_is_refused(bad: object) -> None:
    with pytest.raises(ValueError, match="item_groups"):
        check_item_groups(bad)


def test_every_scale_one_is_no_entry() -> None:
    assert item_groups_entry((0, 1), 5, (1.0, 1.0)) is None
    assert scales_of(None, np.zeros(3)) is None

