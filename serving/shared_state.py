"""One delta composer per host: ``serve --workers N`` applies each delta once, not N times.

Without it every worker decodes, applies and composes every delta itself (``serving.deltas``):
N times the CPU, taken from requests, and N copies of the arrays. With it
(``serving.shared_deltas``, N > 1) the composer — a lower-priority process the workers'
supervisor starts and restarts — runs the host's one ``DeltaFollower`` and writes each state
into a slot file under ``/dev/shm`` (``model.delta.shared``) named by an atomically replaced
pointer; each worker's :class:`SharedFollower` maps the pointed slot and swaps the state in
as one reference, a fraction of the CPU of applying it. Only states of the registry's
``CURRENT`` are served; every worker serves the same file, so they converge by construction.
Slots, holds and restarts in detail: docs/internals.md.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import threading
import time
import weakref
from collections import Counter, deque
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, BinaryIO

from model.artifact.files import ServingArtifact
from model.artifact.registry import Registry
from model.delta import DeltaError, ModelState
from model.delta.shared import (
    generation,
    map_slot,
    mark_writing,
    read_shared,
    set_generation,
    write_shared,
)
from serving.deltas import DeltaFollower, FollowerThread, serve_in, state_status
from serving.loader import LoadedModel, ModelLoader

log = logging.getLogger(__name__)

#: The pointer file of a host's directory: ``{"slot", "generation", "status"}``.
POINTER = "current.json"
#: A worker's file of the (slot, generation) its live artifacts are of:
#: ``held-<pid>-<follower>.json``.
HELD = "held-"
#: The environment variable that gives a worker its host's directory.
SHARED_ENV = "SERVE_SHARED_STATE"


class Publisher:
    """The composer's sink: each state written into a free slot of ``directory``, then named
    in its pointer (module doc)."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.written = 0
        self.last_write_ms: float | None = None
        self._files: dict[str, BinaryIO] = {}

    def publish(self, state: ModelState, artifact: ServingArtifact,
                status: Mapping[str, Any]) -> tuple[str, int]:
        """Write the state into a slot no worker holds and point at it: (slot, generation)."""
        started = time.perf_counter()
        name, f = self._free_slot()
        gen = time.time_ns()  # unique across the composer's restarts too
        write_shared(f, state, artifact, status, gen)
        write_pointer(self.directory, name, gen, status)
        self.written += 1
        self.last_write_ms = (time.perf_counter() - started) * 1000.0
        return name, gen

    def _free_slot(self) -> tuple[str, BinaryIO]:
        """A slot to write, marked as being written: not the one the pointer names, and no
        live worker holds its generation (checked again after the mark, so a worker that
        took it meanwhile keeps it); a new slot when every one is held."""
        current = read_pointer(self.directory)
        names = sorted(p.name for p in self.directory.glob("slot-*.bin"))
        for name in names:
            if current is not None and name == current[0]:
                continue
            f = self._open(name)
            gen = generation(os.pread(f.fileno(), 16, 0))
            if (name, gen) in held_slots(self.directory):
                continue
            mark_writing(f)
            if (name, gen) in held_slots(self.directory):
                set_generation(f, gen)  # taken between the two looks: it stays as it was
                continue
            return name, f
        name = f"slot-{len(names)}.bin"
        while (self.directory / name).exists():
            name = f"slot-{int(name[5:-4]) + 1}.bin"
        (self.directory / name).touch()
        return name, self._open(name)

    def _open(self, name: str) -> BinaryIO:
        f = self._files.get(name)
        if f is None:
            f = self._files[name] = (self.directory / name).open("r+b")
        return f


def write_pointer(directory: Path, slot: str, gen: int, status: Mapping[str, Any]) -> None:
    """Name ``slot`` at generation ``gen`` in the directory's pointer, atomically."""
    tmp = directory / f".{POINTER}.tmp"
    tmp.write_text(json.dumps({"slot": slot, "generation": gen, "status": dict(status)}))
    os.replace(tmp, directory / POINTER)


def read_pointer(directory: Path) -> tuple[str, int] | None:
    """(slot, generation) the pointer names, or None."""
    try:
        pointer = json.loads((directory / POINTER).read_text())
    except FileNotFoundError:
        return None
    return str(pointer["slot"]), int(pointer["generation"])


def held_slots(directory: Path) -> set[tuple[str, int]]:
    """(slot, generation) that the live workers of ``directory`` hold (their ``held-<pid>``
    files); the file of a worker that is gone is removed."""
    out: set[tuple[str, int]] = set()
    for path in directory.glob(f"{HELD}*.json"):
        pid = int(path.stem[len(HELD):].split("-")[0])
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            path.unlink(missing_ok=True)
            continue
        except PermissionError:
            pass  # alive, another user's: counted
        try:
            text = path.read_text()
        except FileNotFoundError:
            continue  # the worker stopped meanwhile (it removes its file)
        try:  # whole or absent: a worker replaces it by a rename
            out.update((str(s), int(g)) for s, g in json.loads(text))
        except (TypeError, ValueError) as exc:
            # never write a slot a worker might hold: the publication fails, loudly
            raise DeltaError(f"{path}: not a list of held slots: {exc}") from exc
    return out


class ComposingFollower(DeltaFollower):
    """The host's follower: serves by publishing (module doc)."""

    def __init__(self, publisher: Publisher, registry: Registry, *args: Any, **kw: Any) -> None:
        super().__init__(None, registry, *args, **kw)  # type: ignore[arg-type]
        self.publisher = publisher
        self._catalog = ""

    def _serve(self, state: ModelState, artifact: Any) -> None:
        self.state = state
        self.last_created_at = state.created_at
        if self.composer.last != "patched":  # composed afresh: the catalog may be renumbered
            self._catalog = f"{os.getpid()}-{time.time_ns()}"
        status = self.status()
        # catalog: states of one value have catalogs each a prefix of the next (a worker
        # extends its id -> row map without comparing them)
        status.update(pid=os.getpid(), written_at=datetime.now(UTC).isoformat(),
                      last_write_ms=self.publisher.last_write_ms, catalog=self._catalog)
        self.publisher.publish(state, artifact, status)


class SharedFollower(FollowerThread):
    """A worker's follower of its host's composer (module doc); ``status`` as
    ``DeltaFollower.status``, the composer's counters included."""

    name = "shared-state"

    def __init__(self, loader: ModelLoader, registry: Registry, directory: Path,
                 clock: Callable[[], datetime], poll_s: float = 0.02) -> None:
        self.loader, self.registry, self.directory = loader, registry, directory
        self.clock, self.poll_s = clock, poll_s
        self.state: ModelState | None = None
        self.composer: dict[str, Any] = {}
        self.mapped = 0
        self.errors = 0
        self.last_map_ms: float | None = None
        self._seen: tuple[int, int] | None = None
        self._serving: tuple[str, int] | None = None
        self._catalog: str | None = None
        self._artifact: ServingArtifact | None = None
        self._retired: LoadedModel | None = None
        #: Each slot's mapping (remapped when the slot grew).
        self._maps: dict[str, Any] = {}
        #: (slot, generation) of every artifact of this worker still alive, with their
        #: count: the composer rewrites none of them (``held_slots``). The follower's thread
        #: alone changes it; an artifact freed on any thread queues its key in ``_freed``.
        self._held: Counter[tuple[str, int]] = Counter()
        self._freed: deque[tuple[str, int]] = deque()
        self._held_file = directory / f"{HELD}{os.getpid()}-{id(self):x}.json"
        self._written: set[tuple[str, int]] | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def stop(self, timeout_s: float = 10.0) -> None:
        super().stop(timeout_s)
        self._held_file.unlink(missing_ok=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.check()
            except Exception as exc:  # noqa: BLE001 - a bad slot or pointer: the next one
                self.errors += 1
                log.warning("shared state in %s: %s", self.directory, exc)
                self._stop.wait(1.0)
            self._stop.wait(self.poll_s)

    def _hold(self, key: tuple[str, int]) -> None:
        self._held[key] += 1
        self._write_held()

    def _write_held(self) -> None:
        """The ``held-*`` file, the freed artifacts' keys taken off first."""
        while self._freed:
            key = self._freed.popleft()
            self._held[key] -= 1
        held = {key for key, n in self._held.items() if n > 0}
        if held == self._written:
            return
        tmp = self._held_file.with_name(f".{self._held_file.name}.tmp")
        tmp.write_text(json.dumps(sorted(held)))
        os.replace(tmp, self._held_file)
        self._written = held

    def check(self) -> bool:
        """Map and serve the pointer's state if it is new and of ``CURRENT``; True if it did."""
        self._write_held()  # the artifacts freed since the last look
        try:
            st = (self.directory / POINTER).stat()
        except FileNotFoundError:
            return False  # no composer output yet: the registry's version serves
        seen = (st.st_ino, st.st_mtime_ns)
        if seen == self._seen:
            return False
        pointer = json.loads((self.directory / POINTER).read_text())
        self._seen, self.composer = seen, dict(pointer["status"])
        key = (str(pointer["slot"]), int(pointer["generation"]))
        if key == self._serving:
            return False
        started = time.perf_counter()
        self._hold(key)  # before reading: the composer then leaves the slot as it is
        catalog = self.composer.get("catalog")
        try:
            buf = self._map(key[0])
            state, artifact, _ = read_shared(
                buf, key[1], self._artifact,
                prefix_known=bool(catalog) and catalog == self._catalog)
        except DeltaError:
            self._held[key] -= 1
            self._write_held()
            if generation(buf) != key[1]:  # rewritten since the pointer named it: the
                self._seen = None          # next look reads the pointer again
                return False
            raise  # the slot is of the pointer's generation and does not read: an error
        # freed on whatever thread drops it last (a request's too): only a queue append
        weakref.finalize(artifact, self._freed.append, key)
        if state.base_version != self.registry.current():
            return False
        self._serving, self._artifact, self.state = key, artifact, state
        self._catalog = catalog
        self._retired = serve_in(self.loader, artifact, self.clock)
        self._write_held()  # the state retired before this one is freed by now
        self.mapped += 1
        self.last_map_ms = (time.perf_counter() - started) * 1000.0
        return True

    def _map(self, slot: str) -> Any:
        """The slot's mapping, mapped anew when the slot grew since."""
        buf = self._maps.get(slot)
        size = (self.directory / slot).stat().st_size
        if buf is None or len(buf) < size:
            with (self.directory / slot).open("rb") as f:
                buf = self._maps[slot] = map_slot(f)
        return buf

    def status(self, checksum: bool = False) -> dict[str, Any]:
        """What ``/model`` shows under ``delta`` (``DeltaFollower.status``'s keys)."""
        c = self.composer
        return {
            **state_status(self.state, self.clock, checksum),
            "applied": c.get("applied", 0),
            "resyncs": c.get("resyncs", 0),
            "errors": c.get("errors", 0) + self.errors,
            "last_apply_ms": c.get("last_apply_ms"),
            "last_apply_cpu_ms": c.get("last_apply_cpu_ms"),
            "composer": {"pid": c.get("pid"), "seq": c.get("seq"),
                         "last_write_ms": c.get("last_write_ms"), "mapped": self.mapped,
                         "last_map_ms": self.last_map_ms},
        }


def main(argv: list[str] | None = None) -> int:
    """The composer process: ``python -m serving.shared_state --dir D`` (started by
    ``serve --workers N``; the settings are the server's, from the environment)."""
    p = argparse.ArgumentParser(prog="python -m serving.shared_state",
                                description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--dir", type=Path, required=True, help="the host's state directory")
    p.add_argument("--log-level", default="warning")
    args = p.parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(),
                        format="%(asctime)s %(levelname)s composer %(message)s")
    import signal

    from streamrec.settings import load_settings

    settings = load_settings()
    parent = os.getppid()
    os.nice(settings.serving.delta_composer_nice)
    # reads CURRENT and the versions' snapshots only: no Redis
    registry = Registry(settings.trainer.registry_dir, settings.trainer.model_name,
                        keep=settings.trainer.keep_versions)
    args.dir.mkdir(parents=True, exist_ok=True)
    follower = ComposingFollower(Publisher(args.dir), registry, settings.kafka,
                                 lambda: datetime.now(UTC))
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    follower.start()
    while not stop.wait(1.0):
        if os.getppid() != parent:  # the server is gone (killed): so is its composer
            break
    follower.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
