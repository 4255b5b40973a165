"""The towers' scales on rarely chosen items (``model.scoring.rarity``) from the trainer to
serving: a version and every delta record carry the trainer's leaders, a state that applied
them scales exactly the towers' block of those items' vectors (a patched composition equal
to one from scratch), and a garbled entry is refused.

The lineage is ``test_delta``'s (one traced trainer per session)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from model.delta import (
    Composer,
    DeltaError,
    apply,
    compose,
    decode,
    encode,
    from_snapshot,
    state_checksum,
)
from model.scoring.rarity import item_scales
from model.trainer.export import artifact_arrays
from tests.unit.model.delta.test_delta import Run, shared_lineage
from tests.unit.model.delta.test_delta_compose import _assert_same

ITEMS = {"starts": [0, 1], "below": 5, "scales": [3.0, 1.5]}


@pytest.fixture(scope="module")
def lineage() -> tuple[Run, list[bytes]]:
    return shared_lineage()


def test_the_trainers_leaders_reach_its_records_and_versions(
    lineage: tuple[Run, list[bytes]],
) -> None:
    run, _ = lineage
    rarity = run.trainer.rarity
    run.trainer.wait_evaluation()
    assert rarity is not None and rarity.rows > 0  # the live head counted rows
    gains = rarity.gains.copy()
    try:
        rarity.gains[:] = 0
        assert run.builder._common()["item_groups"] is None  # every scale 1: no entry
        plain = artifact_arrays(run.trainer, run.item_ids)
        lead = int(np.flatnonzero((rarity.variants == (3.0, 1.5)).all(axis=1))[0])
        rarity.gains[lead] = 1
        assert run.builder._common()["item_groups"] == ITEMS
        scaled = artifact_arrays(run.trainer, run.item_ids)
    finally:
        rarity.gains[:] = gains
    counts = run.trainer.cold.counts
    by_id = dict(zip(run.item_ids.values(), run.item_ids.keys(), strict=True))
    ids = list(plain["item_ids"])
    s = item_scales(ITEMS["scales"],
                    counts.of_buckets(counts.bucket(np.array([by_id[i] for i in ids]))))
    assert (s != 1).any() and (s == 1).any()  # rare and frequent items both in the catalog
    d = plain["item_vectors"].shape[1] - 1  # the towers' block; the last: the prior's
    np.testing.assert_allclose(scaled["item_vectors"][:, :d],
                               plain["item_vectors"][:, :d] * s[:, None], rtol=1e-6)
    np.testing.assert_array_equal(scaled["item_vectors"][:, d:], plain["item_vectors"][:, d:])


def test_a_record_carries_the_scales_to_the_served_vectors(
    lineage: tuple[Run, list[bytes]],
) -> None:
    _, records = lineage
    plain = from_snapshot(replace(decode(records[0]), item_groups=None))
    snap = decode(encode(replace(decode(records[0]), item_groups=ITEMS)))
    assert snap.item_groups == ITEMS
    state = from_snapshot(snap)
    assert state.item_groups == ITEMS and state_checksum(state) != state_checksum(plain)
    s = item_scales(ITEMS["scales"], state.prior_count_of(state.item_keys))
    assert (s != 1).any() and (s == 1).any()
    mine, theirs = state.item_vectors(), plain.item_vectors()
    d = mine.shape[1] - 1
    np.testing.assert_array_equal(mine[:, d:], theirs[:, d:])
    np.testing.assert_allclose(mine[:, :d], theirs[:, :d] * s[:, None], rtol=1e-6)
    # patched per delta (the counts move items between groups) equals composed afresh
    composer = Composer()
    composer.compose(state)
    for n, record in enumerate(records[1:]):
        delta = replace(decode(record), item_groups=ITEMS if n % 2 == 0 else None)
        state = apply(state, delta)
        art = composer.compose(state, delta)
        _assert_same(art, compose(state))
        assert state.item_groups == delta.item_groups


@pytest.mark.parametrize("bad", [
    {"starts": [1, 0], "below": 5, "scales": [1.0, 2.0]},
    {"starts": [0, 1], "below": 5, "scales": [1.0]},
    {"starts": [0, 1], "below": 5, "scales": [-1.0, 2.0]},
    {"starts": [0, 1], "scales": [1.0, 2.0]},
])
def test_a_garbled_entry_is_refused(lineage: tuple[Run, list[bytes]], bad: dict) -> None:
    _, records = lineage
    with pytest.raises(DeltaError, match="item_groups"):
        decode(encode(replace(decode(records[1]), item_groups=bad)))
