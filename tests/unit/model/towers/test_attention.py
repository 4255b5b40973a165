"""Attention user tower: the numpy twin equals the TF tower; a trained model serves exactly."""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path

import numpy as np
import pytest

from model.artifact.files import ArtifactError, load_artifact
from model.evaluation.synthetic import SyntheticConfig, SyntheticStream
from model.scoring.attention import BLOCK_PARAMS, attend
from model.towers.attention import AttentionTower
from model.towers.tf_env import tf
from model.towers.two_tower import ModelConfig
from model.trainer.export import write_version
from model.trainer.samples import KeyCache, Sample, to_batch
from model.trainer.trainer import Trainer, TrainOptions
from streamrec.ids import item_key, user_key

BATCH = 128


def _perturbed_tower(blocks: int, seed: int) -> AttentionTower:
    """A tower whose every weight is moved off its init (layer norms and biases too)."""
    tower = AttentionTower(8, 6, blocks, 2, 12, seed)
    rng = np.random.default_rng(seed)
    for v in tower.variables_list:
        v.assign(v.numpy() + rng.normal(0, 0.3, v.shape).astype(np.float32))
    return tower


@pytest.mark.parametrize("blocks", [1, 2])
def test_numpy_twin_equals_the_tf_tower(blocks: int) -> None:
    tower = _perturbed_tower(blocks, 3 + blocks)
    rng = np.random.default_rng(0)
    rows = rng.normal(0, 1, (5, 6, 8)).astype(np.float32)
    known = np.array(
        [
            [1, 1, 1, 1, 1, 1],  # full
            [1, 1, 0, 0, 0, 0],  # padded
            [0, 1, 0, 1, 1, 0],  # newest unknown, gaps
            [0, 0, 0, 0, 0, 0],  # empty
            [0, 0, 0, 0, 0, 1],  # only the oldest known
        ],
        bool,
    )
    got_tf = tower(tf.constant(rows), tf.constant(known)).numpy()
    pos, params = tower.export()
    got_np = attend(rows, known, pos, params, 2)
    np.testing.assert_allclose(got_np, got_tf, atol=1e-5)
    np.testing.assert_array_equal(got_np[3], 0.0)
    # rows of entries that are not known do not matter
    noisy = np.where(known[..., None], rows, 99.0).astype(np.float32)
    np.testing.assert_allclose(attend(noisy, known, pos, params, 2), got_np, atol=1e-6)
    # a shorter window (padding the served one to N adds nothing)
    np.testing.assert_allclose(
        attend(rows[1:2, :2], known[1:2, :2], pos, params, 2), got_np[1:2], atol=1e-5
    )


def test_the_newest_entry_attends_only_to_older_ones_in_earlier_blocks() -> None:
    tower = _perturbed_tower(2, 11)
    pos, params = tower.export()
    rng = np.random.default_rng(1)
    rows = rng.normal(0, 1, (1, 6, 8)).astype(np.float32)
    known = np.ones((1, 6), bool)
    base = attend(rows, known, pos, params, 2)
    later = rows.copy()
    later[0, 3] += rng.normal(0, 1, 8).astype(np.float32)  # an older entry matters
    assert np.abs(attend(later, known, pos, params, 2) - base).max() > 1e-3


@cache
def _trained() -> tuple[Trainer, list[Sample], dict[int, str], ModelConfig]:
    config = ModelConfig(
        embedding_dim=16, user_layers=(32, 16), history_len=4, user_tower="attention",
        attention_len=8, attention_blocks=2, attention_heads=2, attention_ffn=24, seed=5,
    )
    stream = SyntheticStream(SyntheticConfig(users=200, items=150, clusters=6, history_len=12))
    samples = stream.take(24 * BATCH)
    keys = KeyCache()
    trainer = Trainer(config, TrainOptions(batch_size=BATCH, eval_rows=0), tag="attn")
    for i in range(0, len(samples), BATCH):
        trainer.train_step(to_batch(samples[i : i + BATCH], config.window, keys))
    item_ids = {keys.item(s.item_id): s.item_id for s in samples}
    return trainer, samples, item_ids, config


def test_trained_attention_tower_serves_exactly(tmp_path: Path) -> None:
    trainer, samples, item_ids, config = _trained()
    manifest = write_version(tmp_path / "v1", trainer, item_ids, "v1")
    assert manifest["format_version"] == 9  # attention (5) with the session-kNN part (9)
    assert manifest["attention"] == {"blocks": 2, "heads": 2, "len": 8, "pool": True}
    assert {f"attention_1_{n}.npy" for n in BLOCK_PARAMS} <= manifest["files"].keys()
    art = load_artifact(tmp_path / "v1")
    assert art.attention is not None and art.attention.length == 8

    picked = [s for s in samples[-60:] if len(s.history) >= 8][:30]
    assert picked
    user_ids = [s.user_id for s in picked] + ["nobody", picked[0].user_id, picked[1].user_id, "x"]
    histories = [list(s.history) for s in picked] + [
        list(picked[2].history[:3]),  # padded
        ["no-such-item", picked[3].history[0], "nor-this", *picked[3].history[1:6]],  # unknowns
        [],  # empty
        ["no-such-item"],  # nothing known
    ]
    keys = KeyCache()
    hist = np.zeros((len(user_ids), config.window), np.int64)
    for i, h in enumerate(histories):
        if h:
            hist[i, : min(len(h), config.window)] = [keys.item(x) for x in h[: config.window]]
    ukeys = np.array([user_key(u) for u in user_ids], np.int64)
    served = art.user_vectors(user_ids, histories)
    trained = trainer.user_vectors(ukeys, hist)
    np.testing.assert_allclose(served, trained, atol=1e-5)

    vkeys, vecs = trainer.item_vectors()
    order = {int(k): i for i, k in enumerate(vkeys)}
    rows = [order[item_key(i)] for i in art.item_ids.tolist()]
    np.testing.assert_allclose(served @ art.item_vectors.T, trained @ vecs[rows].T, atol=5e-5)
    # the attention matters: the tower without it scores differently
    assert not np.allclose(served[: len(picked)], served[len(picked) :].mean(0), atol=1e-3)


def test_checkpoint_restores_the_attention_weights(tmp_path: Path) -> None:
    trainer = _trained()[0]
    ckpt = tf.train.Checkpoint(**trainer.trackables())
    path = ckpt.write(str(tmp_path / "ckpt"))
    saved = [v.numpy().copy() for v in trainer.model.attention.variables_list]
    assert len(trainer.model.dense_variables) == 4 + len(saved)
    for v in trainer.model.attention.variables_list:
        v.assign(tf.zeros_like(v))
    ckpt.read(path).expect_partial()
    for v, want in zip(trainer.model.attention.variables_list, saved, strict=True):
        np.testing.assert_array_equal(v.numpy(), want)


def test_attention_artifact_is_verified(tmp_path: Path) -> None:
    trainer, _, item_ids, _ = _trained()
    write_version(tmp_path / "v1", trainer, item_ids, "v1")
    victim = tmp_path / "v1" / "attention_0_wq.npy"
    data = bytearray(victim.read_bytes())
    data[-1] ^= 0x01
    victim.write_bytes(bytes(data))
    with pytest.raises(ArtifactError, match="sha256"):
        load_artifact(tmp_path / "v1")

    write_version(tmp_path / "v2", trainer, item_ids, "v2")
    path = tmp_path / "v2" / "manifest.json"
    manifest = json.loads(path.read_text())
    manifest["format_version"] = 4
    path.write_text(json.dumps(manifest))
    with pytest.raises(ArtifactError, match="not valid in format 4"):
        load_artifact(tmp_path / "v2")


def test_config_validates_the_attention_options() -> None:
    assert ModelConfig().window == ModelConfig().history_len
    assert ModelConfig(user_tower="attention", attention_len=30).window == 30
    for bad in ({"user_tower": "rnn"}, {"attention_blocks": 3}, {"attention_len": 51},
                {"user_tower": "attention", "attention_heads": 5}):
        with pytest.raises(ValueError):
            ModelConfig(**bad)  # type: ignore[arg-type]
