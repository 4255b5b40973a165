"""The replay ledger: every event id a replay delivered to a topic, so no row is sent twice.

A second replay of the same log — or of an overlapping one — sends only the rows no replay
delivered before (the rest count as ``already_replayed``), so nothing downstream sees them
again. Under ``<run_dir>/replay/ledger/<topic>/`` it keeps ``ledger.json`` (segments, the
topic's end offsets, a ``clean`` flag) and ``seg-*.npy`` segments of sorted id hashes, one
written after each replay checkpoint Kafka acknowledged. A ledger left unclean by a crash is
completed from the topic before the next replay; a topic made again resets it. Memory: 8 bytes
per delivered event in one :class:`~streamrec.idset.IdSet`. Details: docs/internals.md.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from streamrec.atomic import atomic_write
from streamrec.idset import IdSet, id_hashes

log = logging.getLogger(__name__)

VERSION = 1
MANIFEST = "ledger.json"
#: Segments kept before they are merged into one.
MAX_SEGMENTS = 16


@dataclass
class Ledger:
    """The delivered ids of one topic (module doc)."""

    directory: Path
    ids: IdSet = field(default_factory=IdSet)
    segments: list[str] = field(default_factory=list)
    offsets: dict[int, int] = field(default_factory=dict)
    clean: bool = True

    @classmethod
    def open(cls, directory: Path) -> Ledger:
        try:
            data = json.loads((directory / MANIFEST).read_text())
        except FileNotFoundError:
            return cls(directory)
        if data.get("version") != VERSION:
            raise ValueError(f"{directory / MANIFEST}: unknown ledger version {data.get('version')}")
        segments = [str(s) for s in data["segments"]]
        parts = [np.load(directory / s, allow_pickle=False) for s in segments]
        ids = IdSet.from_array(np.concatenate(parts) if parts else np.zeros(0, np.int64))
        offsets = {int(p): int(o) for p, o in data.get("offsets", {}).items()}
        return cls(directory, ids, segments, offsets, bool(data.get("clean", True)))

    def __len__(self) -> int:
        return len(self.ids)

    def contains(self, hashes: np.ndarray) -> np.ndarray:
        return self.ids.contains(hashes)

    def reconcile(
        self,
        end_offsets: dict[int, int],
        ids_after: Callable[[dict[int, int]], set[str]],
    ) -> int:
        """Before a replay: reset if the topic was recreated; if the last replay did not
        finish cleanly, add the ids found in the topic after ``offsets``. Returns how many
        ids were added."""
        if any(end < self.offsets.get(p, 0) for p, end in end_offsets.items()) or (
            self.offsets and not end_offsets
        ):
            log.warning("topic behind the replay ledger %s (recreated?): resetting the ledger",
                        self.directory)
            for name in self.segments:
                (self.directory / name).unlink(missing_ok=True)
            self.ids, self.segments, self.offsets, self.clean = IdSet(), [], {}, True
            self._save()
        if self.clean:
            return 0
        found = sorted(ids_after(dict(self.offsets)))
        added = int(self.ids.admit(found).sum()) if found else 0
        if added:
            self._write_segment(id_hashes(found))
        log.info("replay ledger %s: the last replay stopped early; %d ids found after it",
                 self.directory, added)
        return added

    def begin(self, end_offsets: dict[int, int]) -> None:
        """A replay starts sending: the ledger is complete up to ``end_offsets``."""
        self.offsets, self.clean = dict(end_offsets), False
        self._save()

    def record(self, hashes: np.ndarray) -> None:
        """Acknowledged ids (after a producer flush)."""
        if len(hashes):
            self.ids.admit_hashes(hashes)
            self._write_segment(hashes)

    def finish(self, end_offsets: dict[int, int]) -> None:
        """The replay ended with every send acknowledged and recorded."""
        self.offsets, self.clean = dict(end_offsets), True
        self._save()

    def _write_segment(self, hashes: np.ndarray) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        if len(self.segments) >= MAX_SEGMENTS:
            merged = self.ids.to_array()
            old, self.segments = self.segments, []
            self._store(np.sort(merged))
            for name in old:
                (self.directory / name).unlink(missing_ok=True)
        else:
            self._store(np.unique(np.asarray(hashes, dtype=np.int64)))

    def _store(self, sorted_hashes: np.ndarray) -> None:
        last = max((int(s[4:-4]) for s in self.segments), default=0)
        existing = sorted(self.directory.glob("seg-*.npy"))
        if existing:
            last = max(last, max(int(p.name[4:-4]) for p in existing))
        name = f"seg-{last + 1:06d}.npy"
        with (self.directory / name).open("wb") as fh:
            np.save(fh, sorted_hashes, allow_pickle=False)
            fh.flush()
            os.fsync(fh.fileno())
        self.segments.append(name)
        self._save()

    def _save(self) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        atomic_write(self.directory / MANIFEST, json.dumps({
            "version": VERSION,
            "segments": self.segments,
            "offsets": {str(p): o for p, o in sorted(self.offsets.items())},
            "clean": self.clean,
        }))


def event_id_hashes(values: list[bytes]) -> np.ndarray:
    """:func:`~streamrec.idset.id_hashes` of the ``event_id`` of wire values."""
    import orjson

    return id_hashes([orjson.loads(v)["event_id"] for v in values])
