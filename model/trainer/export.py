"""Turn the trained tables into a serving artifact and publish it through the registry.

Exported as ``.npy`` files (``model.artifact.files``), not a SavedModel carrying the TFRA ops:
serving then needs numpy only, loads a version in milliseconds and knows exactly which ids the
model has rows for (TFRA returns a fresh random row for an unknown key). What is exported —
user and history rows, item vectors with their ids, the user tower's dense layers with the
pool residual folded in, the prior, the co-visitation pairs, the session-kNN index, the
attention tower — is the format ``model/artifact/FORMAT.md``; the list with each part's
condition: docs/internals.md.
Export time and size: ``docs/benchmarks.md#export``.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Mapping
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np

from model.artifact.files import write_artifact
from model.artifact.registry import Registry
from model.artifact.sessions import params_of as sessions_params
from model.scoring.cold import POPULAR
from model.scoring.pooling import fold_pool_residual
from model.scoring.prior import export_fields
from model.scoring.sorted_keys import find_sorted
from model.towers.two_tower import ModelConfig
from model.trainer.trainer import Trainer

log = logging.getLogger(__name__)


def artifact_arrays(trainer: Trainer, item_ids: Mapping[int, str]) -> dict[str, Any]:
    """Keyword arguments of :func:`model.artifact.files.write_artifact` for the current state."""
    trainer.wait_evaluation()  # the counted parts learn on the evaluation thread
    model = trainer.model
    ukeys, urows = trainer.known_rows(model.users)
    hkeys, hrows = trainer.item_hist_rows()  # with attribute parts: serving pools these
    vkeys, vecs = trainer.item_vectors()
    named = np.fromiter((int(k) in item_ids for k in vkeys), bool, vkeys.size)
    config = model.config
    tower = tower_fields(trainer)
    covisit: dict[str, Any] = {}
    if trainer.covisit is not None:
        covisit = {
            "covisit": trainer.covisit.csr(vkeys[named]),
            "covisit_params": {
                "weight": trainer.score_weights()[2],
                "last_weight": trainer.last_weight(),
                "window": config.covisit_window,
                "decay": config.covisit_decay,
            },
        }
    sessions: dict[str, Any] = {}
    if trainer.sessions is not None:
        catalogue = vkeys[named]
        order = np.argsort(catalogue, kind="stable")
        trainer.sessions.flush()
        held = trainer.sessions.items.keys
        pos, found = find_sorted(catalogue[order], held)
        sessions = {
            "sessions": (trainer.sessions.to_arrays(), np.where(found, order[pos], -1)),
            "sessions_params": sessions_params(trainer.sessions, trainer.sknn_weight()),
        }
    cold: dict[str, Any] = {"cold_start": trainer.cold_start(),
                            "history_groups": trainer.history_groups()}
    if cold["cold_start"] == POPULAR:
        cold["item_popularity"] = trainer.cold.counts.scores(vkeys[named])
    attention: dict[str, Any] = {}
    if model.attention is not None:
        pos, blocks = model.attention.export()
        attention = {
            "attention": {
                "pos": pos, "blocks": blocks, "heads": config.attention_heads,
                "pool": config.attention_pool,
            }
        }
    return {
        **covisit,
        **sessions,
        **attention,
        **cold,
        "item_ids": [item_ids[int(k)] for k in vkeys[named]],
        "item_vectors": vecs[named],
        "item_hist_keys": hkeys,
        "item_hist_rows": hrows,
        "user_keys": ukeys,
        "user_rows": urows,
        "default_user_row": trainer.default_row(model.users),
        **tower,
    }


def tower_fields(trainer: Trainer) -> dict[str, Any]:
    """The user tower's fields of a version: folded dense layers, normalisation, prior flag,
    history window and pooling (``model.scoring.prior.export_fields``)."""
    model, config = trainer.model, trainer.model.config
    layers = [
        (w.numpy(), b.numpy(), act)
        for w, b, act in zip(model.kernels, model.biases, model.activations, strict=True)
    ]
    # the residual's source is the last block of the MLP input (see TwoTower.user_mlp)
    before = config.embedding_dim * (2 if config.attention and config.attention_pool else 1)
    return export_fields(
        fold_pool_residual(layers, before, config.pool_residual),
        config.prior_weight,
        config.normalize and config.normalize_user,
        config.history_len,
        config.history_decay,
    )


def write_version(
    directory: str | Path,
    trainer: Trainer,
    item_ids: Mapping[int, str],
    version: str,
    manifest_extra: Mapping[str, Any] | None = None,
    created_at: datetime | None = None,
) -> dict[str, Any]:
    """Write the current model as one artifact directory; returns the manifest."""
    return write_artifact(
        directory,
        version=version,
        manifest_extra=manifest_extra,
        created_at=created_at,
        **artifact_arrays(trainer, item_ids),
    )


def publish_version(
    registry: Registry,
    trainer: Trainer,
    item_ids: Mapping[int, str],
    version: str,
    manifest_extra: Mapping[str, Any] | None = None,
    created_at: datetime | None = None,
    extra_files: Mapping[str, bytes] | None = None,
) -> str:
    """Stage, write, verify and publish one version (atomic: temp dir + rename + pointer).
    ``extra_files``: more files of the version beside the artifact (e.g. the delta
    snapshot, ``model/delta/FORMAT.md``), written before the rename; they carry their
    own checksums (the manifest does not list them)."""
    arrays = artifact_arrays(trainer, item_ids)

    def write(path: Path) -> None:
        write_artifact(
            path,
            version=version,
            manifest_extra=manifest_extra,
            created_at=created_at,
            **arrays,
        )
        for name, data in (extra_files or {}).items():
            (path / name).write_bytes(data)

    published = registry.publish(version, write)
    log.info("published version %s (%d items)", published, len(arrays["item_ids"]))
    return published


def feature_schema_hash(history_len: int, config: ModelConfig) -> str:
    spec = {
        "ids": "blake2b-8(kind\\x1fid)",
        "history_len": history_len,
        "embedding_dim": config.embedding_dim,
        "user_layers": list(config.user_layers),
        "admit_after": config.admit_after,
        "history_decay": config.history_decay,
    }
    return hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:16]
