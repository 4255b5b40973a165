"""Two-stage retrieval (``model.scoring.ann``): the sphere transform, an index's candidates,
following an index through rescaled and rewritten rows, and serving's ranking through it
against the exact one on a version with co-visitation, seen items and a cold start."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from model.artifact.files import load_artifact, write_artifact
from model.scoring.ann import (
    PRIOR_TOP,
    AnnIndex,
    AnnParams,
    AnnView,
    allowed,
    build,
    candidate_rows,
    follow,
    sphere_queries,
    sphere_rows,
)
from serving.retrieval import rank_with_model
from streamrec.ids import item_keys, user_key

D = 8


def _vectors(n: int, seed: int = 0, prior: bool = True) -> np.ndarray:
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(20, D))
    v = centres[rng.integers(0, 20, n)] + 0.3 * rng.normal(size=(n, D))
    if not prior:
        return v.astype(np.float32)
    return np.concatenate([v, rng.normal(-8, 0.5, size=(n, 1))], axis=1).astype(np.float32)


def test_angles_on_the_sphere_order_rows_as_inner_products() -> None:
    v = _vectors(500)
    q = np.random.default_rng(1).normal(size=(7, D + 1)).astype(np.float32)
    rows, queries = sphere_rows(v), sphere_queries(q)
    np.testing.assert_allclose(np.linalg.norm(rows, axis=1), 1.0, rtol=1e-5)
    for j in range(7):
        by_angle = np.argsort(-(rows @ queries[j]))[:20]
        by_product = np.argsort(-(v @ q[j]))[:20]
        assert by_angle.tolist() == by_product.tolist()
    assert not np.any(sphere_queries(np.zeros((1, 3))))


def test_an_exhaustive_search_proposes_the_exact_top() -> None:
    v = _vectors(2_000)
    index = AnnIndex(v, AnnParams(nlist=16, nprobe=16))
    q = np.random.default_rng(2).normal(size=(5, D + 1)).astype(np.float32)
    got = index.search(q, 10)
    want = np.argsort(-(v @ q.T), axis=0)[:10].T
    assert [sorted(g) for g in got.tolist()] == [sorted(w) for w in want.tolist()]
    narrow = AnnIndex(v, AnnParams(nlist=40, nprobe=1))
    assert narrow.nlist == 40 and narrow.search(q, 10).shape == (5, 10)


def test_a_view_follows_rescaled_columns_and_scores_changed_rows_exactly() -> None:
    v = _vectors(3_000)
    index = AnnIndex(v, AnnParams(nlist=20, nprobe=20, rebuild_share=0.05))
    later = v.copy()
    later[:, :-1] *= 0.7                  # the mix's tower weight moved
    later[:, -1] = 1.3 * later[:, -1] + 2.0  # the prior's weight and normaliser moved
    later[[5, 17, 99]] = _vectors(3, seed=9)  # rows a delta trained
    later = np.concatenate([later, _vectors(4, seed=8)])  # items that joined
    view = follow(index, later, has_prior=True)
    assert view is not None
    assert view.tower_scale == pytest.approx(0.7, rel=1e-5)
    assert view.prior_scale == pytest.approx(1.3, rel=1e-4)
    assert view.stale == 3 + 4
    assert {5, 17, 99, 3000, 3001, 3002, 3003} <= set(view.exact_rows.tolist())
    top_prior = np.argsort(-later[:, -1])[:PRIOR_TOP]
    assert set(top_prior.tolist()) <= set(view.exact_rows.tolist())
    # the base index searched with the scaled query ranks unchanged rows as ``later`` does
    q = np.random.default_rng(3).normal(size=(4, D + 1)).astype(np.float32)
    rows = candidate_rows(view, q, 50, [])
    exact = np.argsort(-(later @ q.T), axis=0)[:10].T
    for j in range(4):
        assert set(exact[j].tolist()) <= set(rows.tolist())
    # too much changed, or rows gone: a new index
    assert follow(index, _vectors(3_000, seed=5), has_prior=True) is None
    assert follow(index, v[:-1], has_prior=True) is None
    tower_only = _vectors(1_000, prior=False)
    view = follow(AnnIndex(tower_only, AnnParams(nlist=8)), 2.0 * tower_only, has_prior=False)
    assert view is not None and view.tower_scale == pytest.approx(2.0) and view.stale == 0


def _artifact(tmp_path: Path, n: int, cold_start: str = "mix") -> Path:
    rng = np.random.default_rng(4)
    ids = [f"i{k}" for k in range(n)]
    users = [f"u{k}" for k in range(30)]
    nbrs = np.sort(rng.integers(0, n, size=(n, 6)), axis=1)
    kw: dict = {}
    if cold_start == "popular":
        kw["item_popularity"] = rng.exponential(size=n).astype(np.float32)
    write_artifact(
        tmp_path / "v", version="v1", item_ids=ids, item_vectors=_vectors(n),
        item_hist_keys=item_keys(ids), item_hist_rows=rng.normal(size=(n, D)),
        user_keys=np.array([user_key(u) for u in users]), user_rows=rng.normal(size=(30, D)),
        default_user_row=np.zeros(D),
        layers=[(rng.normal(size=(2 * D, D)) / 4, np.zeros(D), "linear")],
        normalize=True, score_bias=True,
        covisit=(np.arange(n + 1, dtype=np.int64) * 6, nbrs.reshape(-1).astype(np.int32),
                 rng.exponential(size=n * 6).astype(np.float32)),
        covisit_params={"weight": 2.0, "window": 5, "decay": 0.8, "last_weight": 1.0},
        cold_start=cold_start, **kw)
    return tmp_path / "v"


@pytest.mark.parametrize("cold_start", ["mix", "popular"])
def test_serving_through_an_exhaustive_index_ranks_as_exact_search(
    tmp_path: Path, cold_start: str
) -> None:
    art = load_artifact(_artifact(tmp_path, 4_000, cold_start))
    rng = np.random.default_rng(5)
    users = [f"u{k}" for k in range(30)] + ["stranger", "new"]
    histories = [[f"i{j}" for j in rng.integers(0, 4_000, 8)] for _ in range(30)] + [[], ["i3"]]
    ks = [10] * 20 + [50] * 12
    seen = [bool(k % 2) for k in range(32)]
    exact = rank_with_model(art, users, histories, ks, seen)
    view = build(art.item_vectors, True, AnnParams(nlist=16, nprobe=16, candidates=64),
                 art.cold_column())
    two_stage = rank_with_model(art, users, histories, ks, seen, view)
    for e, t in zip(exact, two_stage, strict=True):
        assert [s.item_id for s in t] == [s.item_id for s in e]
        np.testing.assert_allclose([s.score for s in t], [s.score for s in e], rtol=1e-5)
    for hist, excl, got in zip(histories, seen, two_stage, strict=True):
        if excl:
            assert not {s.item_id for s in got} & set(hist)


def test_rows_the_index_does_not_propose_are_still_ranked(tmp_path: Path) -> None:
    art = load_artifact(_artifact(tmp_path, 4_000))
    # one list probed of 40: most of the catalogue unseen by the index; the co-visitation
    # rows of the history and the prior's top are scored all the same
    view = build(art.item_vectors, True, AnnParams(nlist=40, nprobe=1, candidates=10))
    hist = ["i7", "i8"]
    queries = art.user_vectors(["u1"], [hist])
    covisit = art.covisit_scores([hist])
    rows = candidate_rows(view, queries, 10, [covisit[0][0]])
    assert set(covisit[0][0].tolist()) <= set(rows.tolist())
    assert set(view.exact_rows.tolist()) <= set(rows.tolist())
    got = rank_with_model(art, ["u1"], [hist], [5], [True], view)[0]
    full = art.scores(["u1"], [hist])[:, 0]
    by_row = {art.item_ids[r]: full[r] for r in rows.tolist()}
    for s in got:  # each answer carries its exact served score
        assert s.score == pytest.approx(float(by_row[s.item_id]), rel=1e-5)


def test_a_cached_index_is_built_once_and_mapped_by_every_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import threading

    import model.scoring.ann as ann

    builds: list[int] = []
    real_init = AnnIndex.__init__

    def counting_init(self: AnnIndex, vectors: np.ndarray, params: AnnParams) -> None:
        builds.append(1)
        real_init(self, vectors, params)

    monkeypatch.setattr(AnnIndex, "__init__", counting_init)
    v = _vectors(3_000)
    params = AnnParams(nlist=20, nprobe=20)
    got: list[AnnView] = []
    threads = [threading.Thread(target=lambda: got.append(
        build(v, True, params, cache=tmp_path / "ann", name="v1"))) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(builds) == 1 and len(got) == 3
    assert {g.index.path for g in got} == {got[0].index.path}
    assert isinstance(got[0].index.base, np.memmap)
    q = np.random.default_rng(6).normal(size=(3, D + 1)).astype(np.float32)
    private = AnnIndex(v, params)
    for g in got:
        np.testing.assert_array_equal(g.index.search(q, 10), private.search(q, 10))
    # other versions' indexes: the newest CACHE_KEEP stay
    for k in range(ann.CACHE_KEEP + 1):
        build(_vectors(1_000, seed=k), True, AnnParams(nlist=8), cache=tmp_path / "ann",
              name=f"v{k + 2}")
    left = sorted(p.name.split("-")[0] for p in (tmp_path / "ann").glob("*.faiss"))
    assert len(left) == ann.CACHE_KEEP and "v1" not in left
    assert len(list((tmp_path / "ann").glob("*.npy"))) == ann.CACHE_KEEP


def test_rows_without_a_vector_are_not_changes_until_they_get_one() -> None:
    v = _vectors(2_000)
    v[100:600] = 0.0  # candidates the model has no row for yet
    index = AnnIndex(v, AnnParams(nlist=10, rebuild_share=0.1))
    later = v * np.float32(0.5)
    view = follow(index, later, has_prior=True)
    assert view is not None and view.stale == 0 and view.tower_scale == pytest.approx(0.5)
    later[100:110] = _vectors(10, seed=3)  # ten of them got a row
    view = follow(index, later, has_prior=True)
    assert view is not None and view.stale == 10
    assert set(range(100, 110)) <= set(view.exact_rows.tolist())
    ok = allowed(view, np.ones((2, D + 1), np.float32), 5, 2_000)
    assert ok.shape == (2, 2_000) and ok[:, 100:110].all() and (ok.sum(axis=1) >= 10 + 5).all()
