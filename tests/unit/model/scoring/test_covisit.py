"""Co-visitation term: the state against a plain dictionary reference, CSR export,
checkpoint round trip, pruning, and the artifact's served term (numpy only)."""

from __future__ import annotations

import math
from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest

from model.artifact.files import ArtifactError, load_artifact, write_artifact
from model.scoring.covisit import CoVisitation, accumulate, term
from serving.retrieval import rank_with_model
from streamrec.ids import item_keys

WINDOW, DECAY, HALF_LIFE = 3, 0.8, 50.0


def stream(seed: int, batches: int = 12, size: int = 16, items: int = 30, hist: int = 5):
    """Batches of (history [B, hist] keys 0-padded, targets [B], weights [B])."""
    rng = np.random.default_rng(seed)
    keys = np.arange(1, items + 1, dtype=np.int64) * 7919
    out = []
    for _ in range(batches):
        history = rng.choice(keys, size=(size, hist))
        history[rng.random((size, hist)) < 0.2] = 0
        targets = rng.choice(keys, size=size)
        weights = np.where(rng.random(size) < 0.8, rng.choice([1.0, 2.0], size=size), 0.0)
        out.append((history, targets, weights))
    return keys, out


def reference(batches, reverse: float = 0.0) -> dict[tuple[int, int], float]:
    """The documented weights with a dictionary: every positive sample adds
    ``w * decay ** j`` to (history item, target) and ``reverse`` times that to (target,
    history item), all weights decay per sample."""
    weights: dict[tuple[int, int], float] = defaultdict(float)
    rate = math.log(2.0) / HALF_LIFE
    for history, targets, ws in batches:
        n = int((ws > 0).sum())
        for pair in weights:
            weights[pair] *= math.exp(-rate * n)
        for hist, t, w in zip(history, targets, ws, strict=True):
            if w <= 0:
                continue
            # the batch's samples count at the batch's start, then the batch decays as a whole
            for j, h in enumerate(hist[:WINDOW]):
                if h == 0 or h == t:
                    continue
                add = w * DECAY**j * math.exp(-rate * n)
                weights[int(h), int(t)] += add
                if reverse:
                    weights[int(t), int(h)] += reverse * add
    return weights


def ref_sums(ref, history: np.ndarray, candidates: np.ndarray) -> np.ndarray:
    out = np.zeros((len(history), len(candidates)))
    for r, hist in enumerate(history):
        for j, h in enumerate(hist[:WINDOW]):
            for c, cand in enumerate(candidates):
                out[r, c] += DECAY**j * ref.get((int(h), int(cand)), 0.0)
    return out


@pytest.mark.parametrize("merge_every", [1, 64, 1 << 20])
def test_sums_equal_the_reference(merge_every: int) -> None:
    keys, batches = stream(1)
    cv = CoVisitation(WINDOW, DECAY, HALF_LIFE, max_pairs=10_000, merge_every=merge_every)
    for b in batches:
        cv.learn(*b)
    ref = reference(batches)
    queries, _, _ = stream(2, batches=1)[1][0]
    candidates = np.concatenate([keys, [123456789]])  # one key it never saw
    got = cv.sums(queries, candidates)
    np.testing.assert_allclose(got, ref_sums(ref, queries, candidates), rtol=1e-9, atol=1e-12)
    assert (got[:, -1] == 0).all() and got.max() > 0
    assert cv.samples == sum(int((w > 0).sum()) for _, _, w in batches)


@pytest.mark.parametrize("merge_every", [1, 1 << 20])
def test_the_reverse_direction_adds_its_share_to_the_swapped_pair(merge_every: int) -> None:
    keys, batches = stream(3)
    cv = CoVisitation(WINDOW, DECAY, HALF_LIFE, max_pairs=10_000, merge_every=merge_every,
                      reverse=0.5)
    for b in batches:
        cv.learn(*b)
    ref = reference(batches, reverse=0.5)
    queries, _, _ = stream(4, batches=1)[1][0]
    got = cv.sums(queries, keys)
    np.testing.assert_allclose(got, ref_sums(ref, queries, keys), rtol=1e-9, atol=1e-12)
    one_way = CoVisitation(WINDOW, DECAY, HALF_LIFE, max_pairs=10_000)
    for b in batches:
        one_way.learn(*b)
    assert (got >= one_way.sums(queries, keys) - 1e-12).all()
    assert got.sum() > one_way.sums(queries, keys).sum()
    with pytest.raises(ValueError, match="reverse"):
        CoVisitation(WINDOW, DECAY, HALF_LIFE, reverse=-1.0)


@pytest.mark.parametrize("merge_every", [1, 64, 1 << 20])
def test_reads_between_batches_equal_the_reference_and_merge_nothing(merge_every: int) -> None:
    """A read folds the new pairs beside the merged ones and decays by one factor: every
    read equals the reference at that point, and reads alone never merge (the merged
    arrays are untouched unless ``merge_every`` pairs came in)."""
    keys, batches = stream(3, batches=10)
    queries, _, _ = stream(4, batches=1)[1][0]
    cv = CoVisitation(WINDOW, DECAY, HALF_LIFE, max_pairs=10_000, merge_every=merge_every)
    merges = 0
    for i, b in enumerate(batches):
        before = cv.codes, cv.weights.copy()
        cv.learn(*b)
        merged = cv.codes is not before[0] or not np.array_equal(cv.weights, before[1])
        merges += merged
        state = cv.codes, cv.weights.copy()
        got = cv.sums(queries, keys)
        np.testing.assert_allclose(got, ref_sums(reference(batches[: i + 1]), queries, keys),
                                   rtol=1e-9, atol=1e-12)
        assert cv.codes is state[0] and np.array_equal(cv.weights, state[1])  # no merge
    assert (merges > 0) == (merge_every < 1 << 20)
    whole = CoVisitation(WINDOW, DECAY, HALF_LIFE, max_pairs=10_000, merge_every=1 << 20)
    for b in batches:
        whole.learn(*b)
    cv.merge()
    whole.merge()
    assert cv.codes.tolist() == whole.codes.tolist()
    np.testing.assert_allclose(cv.weights, whole.weights, rtol=1e-12)


@pytest.mark.parametrize("merge_every", [64, 1 << 20])
def test_the_last_items_term_comes_from_the_same_read(merge_every: int) -> None:
    """``row_sums_and_last`` gives ``row_sums`` of the history and of its first column, bit
    for bit (the trainer reads both terms of a head in one gather)."""
    _, batches = stream(5, batches=8)
    queries, _, _ = stream(6, batches=1)[1][0]
    cv = CoVisitation(WINDOW, DECAY, HALF_LIFE, max_pairs=10_000, merge_every=merge_every)
    for b in batches:
        cv.learn(*b)
        full, last = cv.row_sums_and_last(queries)
        assert last is not None
        for got, want in ((full, cv.row_sums(queries)), (last, cv.row_sums(queries[:, :1]))):
            for g, w in zip(got, want, strict=True):
                assert g.tolist() == w.tolist()
    assert last is not None and last[0].size and last[0].size < full[0].size
    assert cv.row_sums_and_last(queries, last=False)[1] is None


def test_csr_holds_the_pairs_among_the_exported_items() -> None:
    keys, batches = stream(3)
    cv = CoVisitation(WINDOW, DECAY, HALF_LIFE)
    for b in batches:
        cv.learn(*b)
    exported = keys[::-1][:20]  # a subset, in another order
    indptr, nbrs, w = cv.csr(exported)
    ref = reference(batches)
    dense = np.zeros((20, 20))
    for r in range(20):
        dense[r, nbrs[indptr[r] : indptr[r + 1]]] = w[indptr[r] : indptr[r + 1]]
        assert np.all(np.diff(nbrs[indptr[r] : indptr[r + 1]]) > 0)
    expected = np.array([[ref.get((int(a), int(b)), 0.0) for b in exported] for a in exported])
    np.testing.assert_allclose(dense, expected, rtol=1e-6)


def test_checkpoint_round_trip_continues_identically() -> None:
    keys, batches = stream(4)
    a = CoVisitation(WINDOW, DECAY, HALF_LIFE)
    for b in batches[:6]:
        a.learn(*b)
    b_ = CoVisitation(WINDOW, DECAY, HALF_LIFE)
    b_.load_arrays({k: v.copy() for k, v in a.to_arrays().items()})
    for b in batches[6:]:
        a.learn(*b)
        b_.learn(*b)
    queries = batches[0][0]
    np.testing.assert_allclose(a.sums(queries, keys), b_.sums(queries, keys), rtol=1e-12)
    empty = CoVisitation(WINDOW, DECAY, HALF_LIFE)
    empty.load_arrays({})
    assert empty.sums(queries, keys).sum() == 0


def test_pruning_keeps_the_heaviest_pairs() -> None:
    keys, batches = stream(5)
    full = CoVisitation(WINDOW, DECAY, 0.0)
    small = CoVisitation(WINDOW, DECAY, 0.0, max_pairs=40, merge_every=1 << 20)
    for b in batches:
        full.learn(*b)
        small.learn(*b)
    full.merge()
    small.merge()
    assert small.codes.size == 40 and np.all(np.diff(small.codes) > 0)
    heaviest = np.sort(full.weights)[-40:]
    np.testing.assert_allclose(np.sort(small.weights), heaviest)


def test_accumulate_sums_scaled_slices() -> None:
    targets = np.array([4, 2, 4, 9, 2, 7])
    weights = np.array([1.0, 2.0, 3.0, 4.0, 5.0, 6.0])
    cols, s = accumulate(np.array([0, 3, 1]), np.array([3, 5, 2]), np.array([1.0, 0.5, 10.0]),
                         targets, weights)
    # slice 0: 4:1 2:2 4:3; slice 1 (x0.5): 9:4 2:5; slice 2 (x10): 2:2
    assert cols.tolist() == [2, 4, 9]
    np.testing.assert_allclose(s, [2 + 2.5 + 20, 4.0, 2.0])
    empty = accumulate(np.array([1]), np.array([1]), np.array([1.0]), targets, weights)
    assert empty[0].size == 0


def _artifact(tmp_path: Path, cv: CoVisitation | None, n: int = 6, **kw) -> Path:
    ids = [f"i{k}" for k in range(n)]
    rng = np.random.default_rng(0)
    args: dict = dict(
        version="v1", item_ids=ids, item_vectors=np.zeros((n, 4)),
        item_hist_keys=item_keys(ids), item_hist_rows=rng.normal(size=(n, 2)),
        user_keys=np.zeros(0, np.int64), user_rows=np.zeros((0, 2)),
        default_user_row=np.zeros(2), normalize=False,
    )
    if cv is not None:
        args.update(covisit=cv.csr(item_keys(ids)),
                    covisit_params={"weight": 2.0, "window": WINDOW, "decay": DECAY})
    args.update(kw)
    write_artifact(tmp_path / "v", **args)
    return tmp_path / "v"


def test_artifact_serves_the_trainers_term(tmp_path: Path) -> None:
    ids = [f"i{k}" for k in range(6)]
    keys = item_keys(ids)
    cv = CoVisitation(WINDOW, DECAY, 0.0)
    # i0 is followed by i1 (twice) and by i2 (once); i3 by i4
    hist = np.array([[keys[0], 0], [keys[0], 0], [keys[5], keys[0]], [keys[3], 0]])
    cv.learn(hist, np.array([keys[1], keys[1], keys[2], keys[4]]), np.ones(4))
    art = load_artifact(_artifact(tmp_path, cv))
    assert art.manifest["format_version"] == 4
    histories = [["i0"], ["unknown", "i3", "i0"], []]
    served = art.covisit_scores(histories)
    expected = term(cv.sums(np.array([[keys[0], 0, 0], [9, keys[3], keys[0]], [0, 0, 0]]), keys), 2.0)
    for (rows, added), want in zip(served, expected, strict=True):
        got = np.zeros(6, np.float32)
        got[rows] = added
        np.testing.assert_allclose(got, want, rtol=1e-6)
    # the ranking: the towers score every item 0, so the term decides
    ranked = rank_with_model(art, ["u", "u"], [["i0"], ["i3"]], [2, 1], [True, True])
    assert [s.item_id for s in ranked[0]] == ["i1", "i2"]
    assert [s.item_id for s in ranked[1]] == ["i4"]
    assert ranked[0][0].score == pytest.approx(2.0 * math.log1p(2.0), rel=1e-6)


def test_artifact_serves_the_last_items_own_term(tmp_path: Path) -> None:
    """Format 6: ``last_weight * log1p(C[h_0, i])`` on top of the windowed term."""
    ids = [f"i{k}" for k in range(6)]
    keys = item_keys(ids)
    cv = CoVisitation(WINDOW, DECAY, 0.0)
    hist = np.array([[keys[0], 0], [keys[3], keys[0]], [keys[5], keys[3]], [keys[3], 0]])
    cv.learn(hist, np.array([keys[1], keys[2], keys[4], keys[4]]), np.ones(4))
    params = {"weight": 2.0, "last_weight": 0.7, "window": WINDOW, "decay": DECAY}
    art = load_artifact(_artifact(tmp_path, cv, covisit_params=params))
    assert art.manifest["format_version"] == 6
    assert art.manifest["covisit"]["last_weight"] == 0.7
    histories = [["i3", "i0"], ["unknown", "i3", "i0"], ["i0"]]
    served = art.covisit_scores(histories)
    padded = np.array([[keys[3], keys[0], 0], [9, keys[3], keys[0]], [keys[0], 0, 0]])
    expected = term(cv.sums(padded, keys), 2.0) + term(cv.sums(padded[:, :1], keys), 0.7)
    for (rows, added), want in zip(served, expected, strict=True):
        got = np.zeros(6, np.float32)
        got[rows] = added
        np.testing.assert_allclose(got, want, rtol=1e-6)


def test_histories_scored_together_as_one_at_a_time(tmp_path: Path) -> None:
    """A batch of histories gets, bit for bit, what each history gets alone (one sum kept
    apart by history, and the sort path where the dense count does not pay)."""
    rng = np.random.default_rng(3)
    n = 40
    ids = [f"i{k}" for k in range(n)]
    keys = item_keys(ids)
    cv = CoVisitation(WINDOW, DECAY, 0.0)
    hist = keys[rng.integers(0, n, (400, 2))]
    hist[rng.random(400) < 0.2, 1] = 0
    cv.learn(hist, keys[rng.integers(0, n, 400)], rng.random(400) + 0.5)
    params = {"weight": 1.5, "last_weight": 0.4, "window": WINDOW, "decay": DECAY}
    art = load_artifact(_artifact(tmp_path, cv, n=n, covisit_params=params))
    histories = [[ids[j] for j in rng.integers(0, n, rng.integers(0, 5))] for _ in range(60)]
    histories[3] = ["unknown", ids[1]]
    together = art.covisit_scores(histories)
    assert sum(r.size for r, _ in together) > 0
    for h, (rows, added) in zip(histories, together, strict=True):
        alone_rows, alone = art.covisit_scores([h])[0]
        assert rows.tolist() == alone_rows.tolist()
        assert added.tobytes() == alone.tobytes()


def test_artifacts_without_the_term_keep_their_format(tmp_path: Path) -> None:
    art = load_artifact(_artifact(tmp_path, None))
    assert art.manifest["format_version"] == 1 and art.covisit is None
    assert [r.size for r, _ in art.covisit_scores([["i0"]])] == [0]


def test_bad_covisit_input_is_refused(tmp_path: Path) -> None:
    cv = CoVisitation(WINDOW, DECAY, 0.0)
    bad_params = {"weight": 0.0, "window": 3, "decay": 0.8}
    csr = (np.array([0, 0, 0, 0, 0, 0, 0]), np.zeros(0, np.int32), np.zeros(0, np.float32))
    with pytest.raises(ArtifactError, match="weight"):
        _artifact(tmp_path, None, covisit=csr, covisit_params=bad_params)
    with pytest.raises(ArtifactError, match="go together"):
        _artifact(tmp_path, None, covisit=csr)
    out_of_range = (np.array([0, 1, 1, 1, 1, 1, 1]), np.array([6], np.int32), np.ones(1, np.float32))
    with pytest.raises(ArtifactError, match="outside"):
        _artifact(tmp_path, None, covisit=out_of_range,
                  covisit_params={"weight": 1.0, "window": 3, "decay": 0.8})
    assert cv.csr(np.zeros(0, np.int64))[0].tolist() == [0]


def test_accumulate_dense_path_equals_sorted_path() -> None:
    rng = np.random.default_rng(3)
    targets = rng.integers(0, 50, 400)
    weights = rng.random(400)
    starts = rng.integers(0, 300, 30)
    ends = starts + rng.integers(0, 100, 30)
    scale = rng.random(30)
    groups = np.sort(rng.integers(0, 8, 30))
    for g in (None, groups):
        t_sorted, s_sorted = accumulate(starts, ends, scale, targets, weights, g)
        t_dense, s_dense = accumulate(starts, ends, scale, targets, weights, g, n_targets=50)
        assert t_dense.tolist() == t_sorted.tolist()
        assert s_dense.tolist() == s_sorted.tolist()  # same order of additions: equal bits
