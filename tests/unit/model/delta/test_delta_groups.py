"""The scales per history group (``model.scoring.selector``) from the trainer to serving: a
version and every delta record carry the trainer's leaders, a state that applied them serves
them (checksum, composed artifact, full version alike), and a garbled entry is refused.

The lineage is ``test_delta``'s (one traced trainer per session)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from model.artifact.files import load_artifact, write_artifact
from model.delta import DeltaError, apply, compose, decode, encode, from_snapshot, state_checksum
from model.scoring.selector import GROUP_STARTS
from model.trainer.export import artifact_arrays
from tests.unit.model.delta.test_delta import Run, shared_lineage

GROUPS = {"window": 6, "starts": [1, 5], "scales": [[2.0, 8.0], [4.0, 1.0]]}


@pytest.fixture(scope="module")
def lineage() -> tuple[Run, list[bytes]]:
    return shared_lineage()


def test_the_trainers_leaders_reach_its_records_and_versions(
    lineage: tuple[Run, list[bytes]],
) -> None:
    run, _ = lineage
    selector = run.trainer.selector
    run.trainer.wait_evaluation()  # every scored head counted before the gains are set
    assert selector is not None and selector.rows.sum() > 0  # the live head counted rows
    gains = selector.gains.copy()
    try:
        selector.gains[:] = 0
        # every scale 1: no entry (the weights alone, as a trainer without a selector)
        assert run.builder._common()["history_groups"] is None
        lead = int(np.flatnonzero((selector.variants == (2.0, 8.0)).all(axis=1))[0])
        selector.gains[0, lead] = 1
        entry = run.builder._common()["history_groups"]
        assert entry == {"window": run.trainer.config.window, "starts": list(GROUP_STARTS),
                         "scales": [[2.0, 8.0], [1.0, 1.0]]}
        assert artifact_arrays(run.trainer, run.item_ids)["history_groups"] == entry
    finally:
        selector.gains[:] = gains


def test_a_record_carries_the_groups_to_the_served_score(
    lineage: tuple[Run, list[bytes]], tmp_path: Path,
) -> None:
    _, records = lineage
    plain = from_snapshot(replace(decode(records[0]), history_groups=None))
    snap = decode(encode(replace(decode(records[0]), history_groups=GROUPS)))
    assert snap.history_groups == GROUPS
    state = from_snapshot(snap)
    assert state.history_groups == GROUPS and state_checksum(state) != state_checksum(plain)
    art, base = compose(state), compose(plain)
    assert art.manifest["history_groups"] == GROUPS and "history_groups" not in base.manifest
    ids = [str(i) for i in art.item_ids]
    histories = [[], ids[:2], ids[3:9], ids[10:20]]  # no group, 1-4, 5+ (6 of the window)
    users = ["u-nobody"] * len(histories)
    keys = art.request_keys(users, histories)
    got, plain_parts = art.sparse_scores(histories, keys), base.sparse_scores(histories, keys)
    scales = np.array([[1.0, 1.0], [2.0, 8.0], [4.0, 1.0], [4.0, 1.0]])
    assert len(got) == 2  # co-visitation, session-kNN
    for column, (scaled, unscaled) in enumerate(zip(got, plain_parts, strict=True)):
        for row, ((at, added), (at0, added0)) in enumerate(zip(scaled, unscaled, strict=True)):
            np.testing.assert_array_equal(at, at0)
            np.testing.assert_allclose(added, added0 * scales[row, column], rtol=1e-6)
    assert sum(a.size for a, _ in got[0][1:]) > 0
    whole = art.scores(users, histories)
    vectors = art.user_vectors(users, histories)
    np.testing.assert_allclose(whole, art.assemble(vectors, got, histories, None), rtol=1e-6)
    # the next record sets the groups again (none: the weights alone)
    nxt = apply(state, replace(decode(records[1]), history_groups=None))
    assert nxt.history_groups is None and "history_groups" not in compose(nxt).manifest
    # a full version of the state holds and serves the same entry
    arrays = state.artifact_arrays()
    manifest = write_artifact(tmp_path / "v", version="v", normalize=state.constants.normalize,
                              score_bias=state.constants.score_bias,
                              history_len=state.constants.history_len,
                              history_decay=state.constants.history_decay,
                              covisit_params=art.manifest["covisit"], **arrays)
    assert manifest["format_version"] == 10 and manifest["history_groups"] == GROUPS
    full = load_artifact(tmp_path / "v")
    np.testing.assert_allclose(full.scores(users, histories), whole, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("bad", [
    {"window": 6, "starts": [5, 1], "scales": [[1.0, 1.0], [2.0, 2.0]]},
    {"window": 6, "starts": [1, 5], "scales": [[1.0, 1.0]]},
    {"window": 6, "starts": [1, 5], "scales": [[1.0, -1.0], [2.0, 2.0]]},
    {"starts": [1], "scales": [[1.0, 1.0]]},
])
def test_a_garbled_entry_is_refused(lineage: tuple[Run, list[bytes]], bad: dict) -> None:
    _, records = lineage
    with pytest.raises(DeltaError, match="history_groups"):
        decode(encode(replace(decode(records[1]), history_groups=bad)))
