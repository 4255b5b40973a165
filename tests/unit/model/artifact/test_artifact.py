"""Artifact format and registry: round trip, tower maths, checksums, pointers, pruning."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pytest

from model.artifact.files import ArtifactError, load_artifact, write_artifact
from model.artifact.registry import Registry, RegistryError, natural_key
from streamrec.ids import item_keys, user_key


def make(directory: Path, version: str = "v1", n: int = 50, seed: int = 0, **kw: object) -> dict:
    rng = np.random.default_rng(seed)
    items = [f"i{i}" for i in range(n)]
    users = ["u0", "u1", "u2"]
    args: dict = dict(
        version=version,
        item_ids=items,
        item_vectors=rng.normal(size=(n, 8)),
        item_hist_keys=item_keys(items),
        item_hist_rows=rng.normal(size=(n, 4)),
        user_keys=np.array([user_key(u) for u in users]),
        user_rows=rng.normal(size=(3, 6)),
        default_user_row=rng.normal(size=6),
        layers=[(rng.normal(size=(10, 16)), rng.normal(size=16), "relu"),
                (rng.normal(size=(16, 8)), rng.normal(size=8), "linear")],
        normalize=True,
        manifest_extra={"trained_through_ms": 1_700_000_000_000},
        created_at=datetime(2026, 1, 1, tzinfo=UTC),
    )
    args.update(kw)
    write_artifact(directory, **args)
    return args


def reference_tower(args: dict, user: str, history: list[str]) -> np.ndarray:
    """The documented tower, written independently with Python loops over ids."""
    keys = [int(k) for k in args["user_keys"]]
    key = user_key(user)
    urow = args["user_rows"][keys.index(key)] if key in keys else args["default_user_row"]
    hist_keys = [int(k) for k in args["item_hist_keys"]]
    decay = args.get("history_decay", 1.0)
    known = [(pos, args["item_hist_rows"][hist_keys.index(int(item_keys([h])[0]))])
             for pos, h in enumerate(history) if int(item_keys([h])[0]) in hist_keys]
    zeros = np.zeros(args["item_hist_rows"].shape[1])
    total = sum(decay**pos for pos, _ in known)
    hrow = sum((decay**pos / total) * row for pos, row in known) if known else zeros
    x = np.concatenate([urow, hrow])
    for w, b, act in args["layers"]:
        x = x @ w + b
        if act == "relu":
            x = np.maximum(x, 0)
    return x / np.linalg.norm(x) if args["normalize"] else x


def test_round_trip_and_tower(tmp_path: Path) -> None:
    args = make(tmp_path / "a")
    art = load_artifact(tmp_path / "a")
    assert art.version == "v1" and art.dim == 8
    assert art.item_ids.tolist() == args["item_ids"]
    np.testing.assert_allclose(art.item_vectors, args["item_vectors"].astype(np.float32))
    cases = [("u1", ["i3", "i7"]), ("stranger", ["i2", "not-an-item"]), ("u2", []),
             ("nobody", ["unknown"])]
    got = art.user_vectors([u for u, _ in cases], [h for _, h in cases])
    assert got.dtype == np.float32 and got.shape == (4, 8)
    for row, (user, hist) in zip(got, cases, strict=True):
        np.testing.assert_allclose(row, reference_tower(args, user, hist), rtol=1e-4, atol=1e-5)
    assert art.known_users(["u0", "stranger"]).tolist() == [True, False]
    manifest = json.loads((tmp_path / "a" / "manifest.json").read_text())
    assert manifest["trained_through_ms"] == 1_700_000_000_000
    assert manifest["created_at"] == "2026-01-01T00:00:00+00:00"


def test_arrays_are_mapped_from_their_files_read_only(tmp_path: Path) -> None:
    """A loaded version's arrays are read-only views of its files (the processes that load
    one version share its pages), but for the item vectors; an empty array (no users yet)
    loads too."""
    make(tmp_path / "a")
    art = load_artifact(tmp_path / "a")
    for arr in (art.item_ids, art.item_hist_rows, art.user_rows, art.layers[0][0]):
        assert isinstance(arr, np.memmap) and not arr.flags.writeable
        assert Path(arr.filename).parent == tmp_path / "a"
    # the table every request scans is the process's own (huge pages), read-only too
    assert not isinstance(art.item_vectors, np.memmap) and not art.item_vectors.flags.writeable
    with pytest.raises(ValueError):
        art.item_vectors[0, 0] = 1.0
    # a catalogue ranked through an ANN index scans no table whole: its vectors stay shared
    n = art.item_ids.shape[0]
    for threshold, mapped in ((n, True), (n + 1, False), (None, False)):
        vectors = load_artifact(tmp_path / "a", map_vectors_from=threshold).item_vectors
        assert isinstance(vectors, np.memmap) == mapped and not vectors.flags.writeable
        np.testing.assert_array_equal(vectors, art.item_vectors)
    make(tmp_path / "b", user_keys=np.zeros(0, np.int64), user_rows=np.zeros((0, 6)))
    empty = load_artifact(tmp_path / "b")
    assert empty.user_keys.size == 0 and empty.known_users(["u0"]).tolist() == [False]


def test_corrupt_file_is_refused(tmp_path: Path) -> None:
    make(tmp_path / "a")
    path = tmp_path / "a" / "item_vectors.npy"
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(ArtifactError, match="sha256"):
        load_artifact(tmp_path / "a")


def test_missing_file_and_manifest_are_refused(tmp_path: Path) -> None:
    make(tmp_path / "a")
    (tmp_path / "a" / "user_rows.npy").unlink()
    with pytest.raises(ArtifactError, match="missing"):
        load_artifact(tmp_path / "a")
    (tmp_path / "b").mkdir()
    with pytest.raises(ArtifactError):
        load_artifact(tmp_path / "b")


def test_writer_rejects_inconsistent_input(tmp_path: Path) -> None:
    with pytest.raises(ArtifactError, match="tower outputs"):
        make(tmp_path / "a", layers=[(np.ones((10, 5)), np.ones(5), "relu")])
    with pytest.raises(ArtifactError, match="activation"):
        make(tmp_path / "b", layers=[(np.ones((10, 8)), np.ones(8), "tanh")])
    with pytest.raises(ArtifactError, match="manifest_extra"):
        make(tmp_path / "c", manifest_extra={"version": "x"})


def test_score_bias_appends_one_after_normalisation_format_2(tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    args = make(tmp_path / "a", item_vectors=rng.normal(size=(50, 9)), score_bias=True)
    art = load_artifact(tmp_path / "a")
    assert art.manifest["format_version"] == 2 and art.score_bias and art.dim == 9
    got = art.user_vectors(["u1", "stranger"], [["i3"], []])
    for row, (user, hist) in zip(got, [("u1", ["i3"]), ("stranger", [])], strict=True):
        want = np.append(reference_tower(args, user, hist), 1.0)
        np.testing.assert_allclose(row, want, rtol=1e-4, atol=1e-5)
    scores = art.item_vectors @ got[0]
    np.testing.assert_allclose(
        scores, art.item_vectors[:, :8] @ got[0, :8] + art.item_vectors[:, 8], rtol=1e-5, atol=1e-5
    )
    with pytest.raises(ArtifactError, match="tower outputs"):
        make(tmp_path / "b", score_bias=True)  # 8 tower dims + 1 != 8 item dims


def test_cold_start_prior_ranks_empty_histories_by_the_prior_format_7(tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    vectors = rng.normal(size=(50, 9))
    make(tmp_path / "mix", item_vectors=vectors, score_bias=True)
    make(tmp_path / "cold", item_vectors=vectors, score_bias=True, cold_start="prior")
    mix, cold = load_artifact(tmp_path / "mix"), load_artifact(tmp_path / "cold")
    assert cold.manifest["format_version"] == 7 and cold.cold_start == "prior" and mix.cold_start == "mix"
    assert mix.manifest["format_version"] == 2
    users, hists = ["u1", "stranger", "u2"], [["i3"], [], []]
    got, want = cold.scores(users, hists), mix.scores(users, hists)
    np.testing.assert_array_equal(got[:, 0], want[:, 0])  # a history: the mix, as before
    for col in (1, 2):  # none: the prior's column alone, whoever the user is
        np.testing.assert_array_equal(got[:, col], cold.item_vectors[:, -1])
    assert not np.allclose(want[:, 1], cold.item_vectors[:, -1])
    by_keys = cold.scores_of_keys(np.array([user_key(u) for u in users]),
                                  [item_keys(h) for h in hists],
                                  [np.array([3]), np.zeros(0, np.int64), np.zeros(0, np.int64)])
    np.testing.assert_array_equal(by_keys, got)
    with pytest.raises(ArtifactError, match="cold_start"):
        make(tmp_path / "bad", cold_start="prior")  # no prior column without score_bias
    with pytest.raises(ArtifactError, match="cold_start"):
        make(tmp_path / "bad2", item_vectors=vectors, score_bias=True, cold_start="trending")


def test_cold_start_popular_ranks_empty_histories_by_all_time_popularity_format_8(
    tmp_path: Path,
) -> None:
    rng = np.random.default_rng(2)
    vectors = rng.normal(size=(50, 9))
    popularity = np.log1p(rng.integers(0, 30, 50)).astype(np.float32)
    make(tmp_path / "mix", item_vectors=vectors, score_bias=True)
    make(tmp_path / "pop", item_vectors=vectors, score_bias=True, cold_start="popular",
         item_popularity=popularity)
    mix, pop = load_artifact(tmp_path / "mix"), load_artifact(tmp_path / "pop")
    assert pop.manifest["format_version"] == 8 and pop.cold_start == "popular"
    assert mix.item_popularity is None
    np.testing.assert_array_equal(pop.item_popularity, popularity)
    users, hists = ["u1", "stranger"], [["i3"], []]
    got, want = pop.scores(users, hists), mix.scores(users, hists)
    np.testing.assert_array_equal(got[:, 0], want[:, 0])  # a history: the mix, as before
    np.testing.assert_array_equal(got[:, 1], popularity)  # none: the counts alone
    # without a prior column too (popularity needs none)
    make(tmp_path / "plain", cold_start="popular", item_popularity=popularity)
    assert load_artifact(tmp_path / "plain").cold_start == "popular"
    with pytest.raises(ArtifactError, match="item_popularity"):
        make(tmp_path / "b1", item_vectors=vectors, score_bias=True, cold_start="popular")
    with pytest.raises(ArtifactError, match="item_popularity"):
        make(tmp_path / "b2", item_vectors=vectors, score_bias=True, item_popularity=popularity)
    with pytest.raises(ArtifactError, match="item_popularity"):
        make(tmp_path / "b3", item_vectors=vectors, score_bias=True, cold_start="popular",
             item_popularity=popularity[:-1])
    # a reader refuses "popular" in an older format and a version without its file
    manifest = json.loads((tmp_path / "pop" / "manifest.json").read_text())
    (tmp_path / "pop" / "manifest.json").write_text(json.dumps({**manifest, "format_version": 7}))
    with pytest.raises(ArtifactError, match="cold_start"):
        load_artifact(tmp_path / "pop")
    manifest["files"].pop("item_popularity.npy")
    (tmp_path / "pop" / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ArtifactError, match="item_popularity"):
        load_artifact(tmp_path / "pop")


def test_history_window_pools_only_the_most_recent_items(tmp_path: Path) -> None:
    args = make(tmp_path / "a", history_len=2)
    art = load_artifact(tmp_path / "a")
    assert art.manifest["format_version"] == 2 and art.history_len == 2
    hist = ["i3", "unknown", "i7", "i9"]  # most recent first: the window is i3, unknown
    got = art.user_vectors(["u1"], [hist])[0]
    np.testing.assert_allclose(got, reference_tower(args, "u1", hist[:2]), rtol=1e-4, atol=1e-5)
    assert not np.allclose(got, reference_tower(args, "u1", hist), atol=1e-3)
    with pytest.raises(ArtifactError, match="history_len"):
        make(tmp_path / "b", history_len=0)


def test_format_versions(tmp_path: Path) -> None:
    make(tmp_path / "a")
    manifest = json.loads((tmp_path / "a" / "manifest.json").read_text())
    assert manifest["format_version"] == 1 and "score_bias" not in manifest
    assert not load_artifact(tmp_path / "a").score_bias
    cv = {"weight": 1.0, "window": 3, "decay": 0.9}
    att = {"blocks": 1, "heads": 2, "len": 4, "pool": True}
    sk = {"weight": 1.0, "sample_size": 5, "window": 3, "k": 0, "max_sessions": 10}
    hg = {"window": 10, "starts": [1, 5], "scales": [[2.0, 4.0], [1.0, 8.0]]}
    bad_cases = [(1, {"score_bias": True}), (11, {}), (2, {"score_bias": "yes"}),
                 (9, {"history_groups": hg}),  # history_groups is format 10
                 (10, {"history_groups": {**hg, "starts": [5, 1]}}),
                 (10, {"history_groups": {**hg, "scales": [[2.0, 0.0], [1.0, 8.0]]}}),
                 (10, {"history_groups": {**hg, "scales": [[2.0, 4.0]]}}),
                 (10, {"history_groups": {**hg, "window": 0}}),
                 (10, {"history_groups": {"starts": [1]}}),
                 (8, {"sessions": sk}),  # sessions is format 9
                 (9, {"sessions": sk}),  # without its files
                 (9, {"sessions": {**sk, "k": -1}}), (9, {"sessions": {"weight": 1.0}}),
                 (6, {"cold_start": "prior", "score_bias": True}),  # cold_start is format 7
                 (7, {"cold_start": "popular"}),  # "popular" is format 8
                 (8, {"cold_start": "popular"}),  # without its item_popularity.npy
                 (7, {"cold_start": "prior"}), (7, {"cold_start": "new", "score_bias": True}),
                 (4, {"covisit": {**cv, "last_weight": 1.0}}),  # last_weight is format 6
                 (6, {"covisit": {**cv, "last_weight": -1.0}}),
                 (4, {"attention": att}), (5, {"attention": att}),  # no attention files
                 (5, {"attention": {**att, "blocks": 3}}), (5, {"attention": {"blocks": 1}}),
                 (3, {"covisit": cv}), (4, {"covisit": {**cv, "window": 0}}),
                 (4, {"covisit": {"weight": 1.0}}), (4, {"covisit": cv}),
                 (1, {"history_len": 5}), (2, {"history_len": 0}), (2, {"history_len": 2.5}),
                 (2, {"history_decay": 0.5}), (3, {"history_decay": 0}),
                 (3, {"history_decay": 1.5}), (3, {"history_decay": True})]
    for version, fields in bad_cases:
        bad = dict(manifest, format_version=version, **fields)
        (tmp_path / "a" / "manifest.json").write_text(json.dumps(bad))
        with pytest.raises(ArtifactError):
            load_artifact(tmp_path / "a")


def test_natural_order() -> None:
    assert sorted(["v10", "v2", "v1"], key=natural_key) == ["v1", "v2", "v10"]


def test_registry_publish_pin_rollback_prune(tmp_path: Path) -> None:
    reg = Registry(tmp_path, "tt", keep=2)
    assert reg.current() is None and reg.versions() == []
    for i in range(1, 5):
        reg.publish(f"v{i}", lambda d, i=i: make(d, version=f"v{i}", seed=i))
    assert reg.versions() == ["v3", "v4"] and reg.current() == "v4"
    assert not list((tmp_path / "tt" / ".staging").glob("v*"))
    assert reg.rollback() == "v3"
    assert reg.current() == "v3" and reg.pinned() == "v3"
    reg.publish("v5", lambda d: make(d, version="v5"))
    reg.publish("v6", lambda d: make(d, version="v6"))
    # pinned v3 stays current and is never pruned
    assert reg.current() == "v3" and reg.versions() == ["v3", "v5", "v6"]
    assert reg.unpin() == "v6" and reg.current() == "v6" and reg.pinned() is None
    with pytest.raises(RegistryError):
        reg.pin("v1")
    with pytest.raises(RegistryError, match="immutable"):
        reg.publish("v6", lambda d: make(d, version="v6"))
    assert reg.show("v6")["version"] == "v6"


def test_registry_refuses_bad_staged_version(tmp_path: Path) -> None:
    reg = Registry(tmp_path, "tt")
    reg.publish("v1", lambda d: make(d, version="v1"))

    def corrupt(d: Path) -> None:
        make(d, version="v2")
        (d / "item_ids.npy").write_bytes(b"garbage")

    with pytest.raises(ArtifactError):
        reg.publish("v2", corrupt)
    assert reg.versions() == ["v1"] and reg.current() == "v1"


class FakeRedis:
    def __init__(self) -> None:
        self.kv: dict[str, str] = {}
        self.messages: list[tuple[str, str]] = []

    def set(self, key: str, value: str) -> None:
        self.kv[key] = value

    def publish(self, channel: str, message: str) -> None:
        self.messages.append((channel, message))


def test_registry_announces_on_redis(tmp_path: Path) -> None:
    fake = FakeRedis()
    reg = Registry(tmp_path, "tt", redis_client=fake, key_prefix="p:")
    reg.publish("v1", lambda d: make(d, version="v1"))
    reg.publish("v2", lambda d: make(d, version="v2"))
    reg.rollback()
    assert fake.kv == {"p:model:tt:current": "v1"}
    assert fake.messages == [("p:model:tt:published", v) for v in ("v1", "v2", "v1")]


def test_models_cli(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    from deploy.cli import main
    from tests.support import free_port

    monkeypatch.setenv("STREAMREC_TRAINER__REGISTRY_DIR", str(tmp_path))
    monkeypatch.setenv("STREAMREC_TRAINER__MODEL_NAME", "tt")
    monkeypatch.setenv("STREAMREC_REDIS__PORT", str(free_port()))  # nothing listens: no announce
    reg = Registry(tmp_path, "tt")
    for v in ("v1", "v2"):
        reg.publish(v, lambda d, v=v: make(d, version=v))
    assert main(["models", "list"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("   v1") and out[1].startswith("*  v2")
    assert main(["models", "rollback"]) == 0 and reg.current() == "v1" and reg.pinned() == "v1"
    assert main(["models", "show"]) == 0
    assert '"version": "v1"' in capsys.readouterr().out
    assert main(["models", "pin", "v9"]) == 1
    assert main(["models", "unpin"]) == 0 and reg.current() == "v2"
    assert main(["models", "pin", "v2"]) == 0 and reg.pinned() == "v2"


def test_recency_pooling_format_3(tmp_path: Path) -> None:
    rng = np.random.default_rng(2)
    layers = [(rng.normal(size=(10, 16)), rng.normal(size=16), "relu"),
              (rng.normal(size=(16, 8)), rng.normal(size=8), "linear")]
    args = make(tmp_path / "a", history_len=4, history_decay=0.5, layers=layers)
    art = load_artifact(tmp_path / "a")
    assert art.manifest["format_version"] == 3
    assert art.history_decay == 0.5
    cases = [("u1", ["unknown", "i3", "i7", "i9", "i11"]), ("stranger", ["i2"]),
             ("u2", []), ("u0", ["unknown"]), ("u0", ["i5", "i5", "i1"])]
    got = art.user_vectors([u for u, _ in cases], [h for _, h in cases])
    for row, (user, hist) in zip(got, cases, strict=True):
        want = reference_tower(args, user, hist[:4])
        np.testing.assert_allclose(row, want, rtol=1e-4, atol=1e-5)
    # The most recent item moves the vector more than an older one (decay < 1).
    base = ["i3", "i7", "i9"]
    new_first = art.user_vectors(["u1"], [["i20", *base]])[0]
    new_last = art.user_vectors(["u1"], [[*base, "i20"]])[0]
    now = art.user_vectors(["u1"], [base])[0]
    assert np.linalg.norm(new_first - now) > np.linalg.norm(new_last - now)
    with pytest.raises(ArtifactError, match="history_decay"):
        make(tmp_path / "b", history_decay=0.0, layers=layers)


def test_default_pooling_keeps_the_older_formats(tmp_path: Path) -> None:
    make(tmp_path / "a", history_len=3, history_decay=1.0)
    manifest = json.loads((tmp_path / "a" / "manifest.json").read_text())
    assert manifest["format_version"] == 2
    assert "history_decay" not in manifest


def _mlp(layers: list, x: np.ndarray) -> np.ndarray:
    for w, b, act in layers:
        x = x @ w + b
        if act == "relu":
            x = np.maximum(x, 0)
    return x


@pytest.mark.parametrize("widths", [[], [16], [16, 12]])
def test_folded_pool_residual_equals_mlp_plus_pool(widths: list[int]) -> None:
    from model.scoring.pooling import fold_pool_residual

    rng = np.random.default_rng(3)
    user_dim, pool_dim = 6, 8
    sizes = [user_dim + pool_dim, *widths, pool_dim]
    layers = [
        (rng.normal(size=(a, b)).astype(np.float32), rng.normal(size=b).astype(np.float32),
         "relu" if i < len(sizes) - 2 else "linear")
        for i, (a, b) in enumerate(zip(sizes[:-1], sizes[1:], strict=True))
    ]
    x = rng.normal(size=(20, user_dim + pool_dim)).astype(np.float32)
    folded = fold_pool_residual(layers, user_dim, 2.5)
    expected = _mlp(layers, x) + 2.5 * x[:, user_dim:]
    np.testing.assert_allclose(_mlp(folded, x), expected, rtol=1e-5, atol=1e-5)
    assert [act for _, _, act in folded] == [act for _, _, act in layers]
    unchanged = fold_pool_residual(layers, user_dim, 0.0)
    np.testing.assert_array_equal(_mlp(unchanged, x), _mlp(layers, x))


def test_folded_pool_residual_refuses_a_pool_of_another_width() -> None:
    from model.scoring.pooling import fold_pool_residual

    layers = [(np.zeros((10, 16), np.float32), np.zeros(16, np.float32), "relu"),
              (np.zeros((16, 8), np.float32), np.zeros(8, np.float32), "linear")]
    with pytest.raises(ValueError, match="pool width"):
        fold_pool_residual(layers, 6, 1.0)
