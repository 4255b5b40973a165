"""Model checkpoint and consumed Kafka offsets, saved together atomically.

Layout under ``checkpoint_dir``: ``ckpt-NNNNNNNNNN/`` (``tf.*`` files of the
``tf.train.Checkpoint`` of tables, stats, dense weights and optimizer slots; ``state.json``
with the offsets, counters and digest; ``arrays.npz`` auxiliary arrays such as the item id
map and the co-visitation state), ``LATEST`` (the newest complete one) and ``.tmp-*``.

A checkpoint is written into a temp directory, fsynced, renamed to ``ckpt-N`` and only then
``LATEST`` moves, so a crash at any point leaves the previous checkpoint — model state and
offsets of the same moment — as the one a restart resumes from. :class:`LoopState` is what
``state.json`` holds; :func:`check_offsets` refuses offsets beyond the samples topic's end.
"""

from __future__ import annotations

import json
import logging
import shutil
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from model.errors import ModelError
from model.towers.tf_env import tf
from streamrec.atomic import atomic_write, commit_dir

log = logging.getLogger(__name__)

LATEST = "LATEST"
PREFIX = "ckpt-"


@dataclass(frozen=True)
class Restored:
    path: Path
    state: dict[str, Any]
    arrays: dict[str, np.ndarray]


class CheckpointStore:
    """Writes and reads checkpoints of one trainer (see the module doc)."""

    def __init__(self, directory: str | Path, trackables: Mapping[str, Any], keep: int = 2) -> None:
        self.directory = Path(directory)
        self.keep = max(1, keep)
        self._ckpt = tf.train.Checkpoint(**trackables)

    def _complete(self) -> list[Path]:
        if not self.directory.is_dir():
            return []
        return sorted(
            p for p in self.directory.iterdir()
            if p.is_dir() and p.name.startswith(PREFIX) and (p / "state.json").is_file()
        )

    def latest(self) -> Path | None:
        try:
            name = (self.directory / LATEST).read_text().strip()
        except FileNotFoundError:
            return None
        path = self.directory / name
        return path if (path / "state.json").is_file() else None

    def save(self, state: Mapping[str, Any], arrays: Mapping[str, np.ndarray] | None = None) -> Path:
        self.directory.mkdir(parents=True, exist_ok=True)
        for stale in self.directory.glob(".tmp-*"):
            shutil.rmtree(stale, ignore_errors=True)
        done = self._complete()
        seq = int(done[-1].name[len(PREFIX):]) + 1 if done else 1
        tmp = self.directory / f".tmp-{seq}-{uuid.uuid4().hex[:8]}"
        tmp.mkdir()
        self._ckpt.write(str(tmp / "tf"))
        (tmp / "state.json").write_text(json.dumps(dict(state), sort_keys=True))
        np.savez(tmp / "arrays.npz", **dict(arrays or {}))
        target = self.directory / f"{PREFIX}{seq:010d}"
        commit_dir(tmp, target)
        atomic_write(self.directory / LATEST, target.name + "\n")
        for old in self._complete()[: -self.keep]:
            shutil.rmtree(old, ignore_errors=True)
        log.info("checkpoint %s saved", target.name)
        return target

    def restore(self) -> Restored | None:
        """Load the newest complete checkpoint into the trackables; None if there is none."""
        path = self.latest()
        if path is None:
            return None
        self._ckpt.read(str(path / "tf")).expect_partial()
        state = json.loads((path / "state.json").read_text())
        with np.load(path / "arrays.npz", allow_pickle=False) as data:
            arrays = {k: data[k] for k in data.files}
        log.info("restored checkpoint %s", path.name)
        return Restored(path, state, arrays)


class OffsetsBeyondTopic(ModelError):
    """The restored checkpoint consumed further than the samples topic reaches: the topic
    was deleted and created again, or the checkpoint belongs to another broker."""


def check_offsets(saved: dict[str, int], ends: dict[int, int], topic: str,
                  checkpoint_dir: object) -> None:
    """Refuse to resume when a saved offset of ``topic`` is beyond its end offset: the
    consumer would silently restart from the beginning and mix another stream into a model
    whose offsets and trained-id set describe this one. ``ends`` is partition -> end offset."""
    prefix = f"{topic}:"
    beyond = {
        key: (at, ends.get(int(key[len(prefix):]), 0))
        for key, at in saved.items()
        if key.startswith(prefix) and at > ends.get(int(key[len(prefix):]), 0)
    }
    if beyond:
        shown = ", ".join(f"{k} saved {a} > end {e}" for k, (a, e) in sorted(beyond.items()))
        raise OffsetsBeyondTopic(
            f"the checkpoint in {checkpoint_dir} has consumed {topic} beyond its end ({shown}): "
            "the topic was created again or the checkpoint belongs to another broker. Point "
            "STREAMREC_TRAINER__CHECKPOINT_DIR (and REGISTRY_DIR) at a folder of this stack, "
            "or remove the old checkpoint to train from the beginning."
        )


@dataclass
class LoopState:
    """What a checkpoint stores besides the TF objects."""

    offsets: dict[str, int] = field(default_factory=dict)
    samples_trained: int = 0
    digest: int = 0
    dlq_records: int = 0
    trained_through_ms: int | None = None
    export_seq: int = 0
    last_version: str | None = None
    #: Samples skipped because their sample_id was trained already (model.trainer.dedupe).
    duplicates_dropped: int = 0
    #: The quality guard's state and pin (``GuardedPublishing.to_json``; None: off).
    guard: dict[str, Any] | None = None

    def to_json(self) -> dict[str, Any]:
        return {**self.__dict__, "digest": str(self.digest)}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> LoopState:
        data = dict(data)
        data["digest"] = int(data.get("digest", 0))
        return cls(**{k: v for k, v in data.items() if k in cls.__dataclass_fields__})
