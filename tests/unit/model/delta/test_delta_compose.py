"""The per-delta composer (``model.delta.served.Composer``): after every delta of a lineage
its artifact is bit for bit the artifact composed from scratch, patched when it can be, and
the artifacts it served before are never written."""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from model.delta import Composer, Delta, ModelState, apply, compose, decode, from_snapshot
from tests.unit.model.delta.test_delta import shared_lineage


def _assert_same(mine: object, full: object) -> None:
    a, b = mine, full
    assert a.manifest == b.manifest  # type: ignore[attr-defined]
    for name in ("item_ids", "item_vectors", "item_hist_keys", "item_hist_rows", "user_keys",
                 "user_rows", "default_user_row"):
        x, y = getattr(a, name), getattr(b, name)
        assert x.dtype == y.dtype and x.shape == y.shape, name
        assert np.array_equal(x, y), name  # bit for bit (no NaN in these)
    assert (a.covisit is None) == (b.covisit is None)  # type: ignore[attr-defined]
    if a.covisit is not None:  # type: ignore[attr-defined]
        for x, y in zip(a.covisit, b.covisit, strict=True):  # type: ignore[attr-defined]
            assert x.dtype == y.dtype and np.array_equal(x, y)
    x, y = a.item_popularity, b.item_popularity  # type: ignore[attr-defined]
    assert (x is None) == (y is None) and (x is None or np.array_equal(x, y))
    assert dict(a.item_index) == dict(b.item_index)  # type: ignore[attr-defined]
    assert not a.item_vectors.flags.writeable  # type: ignore[attr-defined]
    assert (a.sessions is None) == (b.sessions is None)  # type: ignore[attr-defined]
    if a.sessions is not None:  # type: ignore[attr-defined]
        x, y = a.sessions_rows, b.sessions_rows  # type: ignore[attr-defined]
        assert x.dtype == y.dtype and np.array_equal(x, y) and not x.flags.writeable
        mine, theirs = a.sessions.to_arrays(), b.sessions.to_arrays()  # type: ignore[attr-defined]
        assert mine.keys() == theirs.keys()
        assert all(np.array_equal(mine[k], theirs[k]) for k in theirs)


def _new_keys(seq: int) -> np.ndarray:
    """The item keys joining the catalog with delta ``seq`` (known ahead: the session-kNN
    positives of the delta before hold some of them)."""
    return (1 << 52) + 16 * seq + np.arange(4, dtype=np.int64)


def _random_delta(state: ModelState, template: Delta, seq: int, rng: np.random.Generator) -> Delta:
    """The next delta of ``state``: changed history rows (catalog items and others), new
    items, changed users, prior buckets of catalog items, scalars and mix weights that move,
    new and changed co-visitation pairs, each cold start in turn, session-kNN positives (of
    catalog items, of items joining now and of items joining with the next delta) and a
    session-kNN weight that is 0 every fourth delta; nothing removed (the patched path)."""
    d = state.hist_rows.shape[1]
    new_keys = _new_keys(seq)
    moved = rng.choice(state.hist_keys, min(25, state.hist_keys.size), replace=False)
    hist_keys = np.concatenate([moved, new_keys])
    order = np.argsort(hist_keys)
    hist_rows = rng.normal(size=(hist_keys.size, d)).astype(np.float32)
    users = rng.choice(state.user_keys, min(10, state.user_keys.size), replace=False)
    buckets = np.unique(np.mod(rng.choice(state.item_keys, 12), state.constants.prior_buckets))
    shift, floor, log_norm = state.prior_scalars
    first = state.covisit_keys.size
    n_cv = first + new_keys.size
    codes = np.unique(rng.integers(0, n_cv, 30) << 32 | rng.integers(0, n_cv, 30))
    tw, pw, cw, lw = state.weights
    pos_items = rng.choice(np.concatenate([state.item_keys, new_keys, _new_keys(seq + 1)]), 60)
    pos_users = rng.choice(np.concatenate([state.user_keys, [7, 8, 9]]), 60).astype(np.int64)
    return replace(
        template, seq=seq, created_at=f"2026-12-01T12:00:{seq:02d}+00:00", state_checksum="",
        user_keys=np.sort(users), user_rows=rng.normal(size=(users.size, state.user_rows.shape[1]))
        .astype(np.float32), removed_users=np.zeros(0, np.int64),
        hist_keys=hist_keys[order], hist_rows=hist_rows[order], removed_hist=np.zeros(0, np.int64),
        new_item_keys=new_keys, new_item_ids=np.array([f"new-{seq}-{j}" for j in range(4)]),
        removed_items=np.zeros(0, np.int64),
        prior_buckets=buckets, prior_base=rng.normal(size=buckets.size) - 3.0,
        prior_count=rng.integers(1, 50, buckets.size).astype(np.float64),
        cold_start=("mix", "prior", "popular")[seq % 3],
        prior_scalars=(shift + 0.01 * seq, floor, log_norm + 0.02),
        covisit_first_id=first, covisit_new_keys=new_keys, covisit_codes=codes,
        covisit_values=rng.random(codes.size) + 0.5, covisit_removed=np.zeros(0, np.int64),
        covisit_scale=state.covisit_scale * 0.99, weights=(tw * 1.01, pw * 0.98, cw, lw),
        layers=state.layers, default_user_row=state.default_user_row,
        sessions_positives=(pos_users, pos_items, np.array([25, 0, 35], np.int64)),
        sessions_weight=0.0 if seq % 4 == 0 else 1.0 + 0.1 * seq,
    )


def test_patched_artifacts_equal_compose_from_scratch_after_every_delta() -> None:
    _, records = shared_lineage()
    template = decode(records[1])
    state = from_snapshot(decode(records[0]))
    assert state.constants.score_bias and state.constants.covisit_window is not None
    composer = Composer()
    composer.compose(state)
    assert composer.last == "full"
    rng = np.random.default_rng(7)
    served = []
    for seq in range(1, 13):
        delta = _random_delta(state, template, seq, rng)
        state = apply(state, delta)
        art = composer.compose(state, delta)
        assert composer.last == "patched", seq
        _assert_same(art, compose(state))
        assert art.cold_start == delta.cold_start
        assert (art.item_popularity is not None) == (delta.cold_start == "popular")
        assert (art.sessions is None) == (seq % 4 == 0)  # served while its weight is > 0
        served.append((art, art.item_vectors.copy(), art.covisit[2].copy()))
    assert served[-1][0].item_ids.size == served[0][0].item_ids.size + 4 * 11
    for art, vectors, weights in served:  # in-flight requests keep what they started with
        assert np.array_equal(art.item_vectors, vectors)
        assert np.array_equal(art.covisit[2], weights)


def test_a_real_lineage_composes_equal_and_eviction_starts_afresh() -> None:
    _, records = shared_lineage()
    deltas = [decode(r) for r in records]
    state = from_snapshot(deltas[0])
    composer = Composer()
    composer.compose(state)
    pauses = [0]

    def pause() -> None:  # a paced caller's hook: called between steps, changes nothing
        pauses[0] += 1

    for delta in deltas[1:]:
        state = apply(state, delta, pause)
        art = composer.compose(state, delta, pause)
        assert composer.last == ("full" if delta.removed_items.size else "patched")
        _assert_same(art, compose(state))
        if composer.last == "patched":
            assert pauses[0] >= 3 + 5  # apply's steps, then the patch's
        pauses[0] = 0
    assert any(d.removed_items.size for d in deltas[1:]), "no eviction: the fallback is untested"


def test_a_state_that_does_not_follow_the_last_is_composed_afresh() -> None:
    _, records = shared_lineage()
    template = decode(records[1])
    s0 = from_snapshot(decode(records[0]))
    rng = np.random.default_rng(3)
    d1 = _random_delta(s0, template, 1, rng)
    s1 = apply(s0, d1)
    d2 = _random_delta(s1, template, 2, rng)
    s2 = apply(s1, d2)
    composer = Composer()
    composer.compose(s0)
    _assert_same(composer.compose(s2, d2), compose(s2))  # skipped s1: not patched onto s0
    assert composer.last == "full"
    composer.compose(s1, d1)  # back to an earlier state of the lineage
    assert composer.last == "full"
    _assert_same(composer.compose(s2, d2), compose(s2))
    assert composer.last == "patched"


def _with_late_items(state: ModelState, delta: Delta, rng: np.random.Generator,
                     pending: dict[int, np.ndarray]) -> Delta:
    """``delta`` with pairs of two items that join the catalog two deltas later (stored
    while they are not catalog items), the items of such pairs from two deltas ago joining
    now, and some stored pairs removed."""
    seq = delta.seq
    later = np.sort(rng.integers(1 << 50, 1 << 60, 2, dtype=np.int64))
    pending[seq + 2] = later
    joining = pending.pop(seq, np.zeros(0, np.int64))
    first = state.covisit_keys.size
    cv_new = np.concatenate([delta.covisit_new_keys, later])
    ids_later = first + delta.covisit_new_keys.size + np.arange(2, dtype=np.int64)
    partners = rng.integers(0, first + cv_new.size, 6)
    codes = np.unique(np.concatenate([delta.covisit_codes,
                                      partners << 32 | np.repeat(ids_later, 3)]))
    stored = state.covisit_codes
    removed = np.setdiff1d(rng.choice(stored, min(5, stored.size), replace=False), codes)
    hist_keys = np.concatenate([delta.hist_keys, joining])
    hist_rows = np.concatenate([delta.hist_rows, rng.normal(
        size=(joining.size, delta.hist_rows.shape[1])).astype(np.float32)])
    order = np.argsort(hist_keys)
    return replace(
        delta, covisit_new_keys=cv_new, covisit_codes=codes,
        covisit_values=rng.random(codes.size) + 0.5, covisit_removed=np.sort(removed),
        hist_keys=hist_keys[order], hist_rows=hist_rows[order],
        new_item_keys=np.concatenate([delta.new_item_keys, joining]),
        new_item_ids=np.concatenate([delta.new_item_ids,
                                     np.array([f"late-{k}" for k in joining.tolist()])]),
    )


def test_pairs_stored_before_their_items_joined_and_removed_pairs_are_patched() -> None:
    _, records = shared_lineage()
    template = decode(records[1])
    state = from_snapshot(decode(records[0]))
    composer = Composer()
    composer.compose(state)
    rng = np.random.default_rng(11)
    pending: dict[int, np.ndarray] = {}
    late = removed = 0
    for seq in range(1, 13):
        delta = _with_late_items(state, _random_delta(state, template, seq, rng), rng, pending)
        before = state
        state = apply(state, delta)
        art = composer.compose(state, delta)
        assert composer.last == "patched", seq
        _assert_same(art, compose(state))
        late += sum(str(i).startswith("late-") for i in delta.new_item_ids.tolist())
        removed += int(np.isin(delta.covisit_removed, before.covisit_codes).sum())
    assert late == 2 * 10 and removed > 0  # late items joined (from the third delta), pairs went
