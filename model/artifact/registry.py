"""Versioned model registry on a shared directory, announced through Redis.

``Registry(root, model_name, redis_client=None, key_prefix="sr:", keep=5)``: ``publish``
(or ``stage`` + ``commit``) writes a version into a temp dir, verifies it, renames it into
place, moves ``CURRENT``, announces it and prunes old ones; ``import_dir``, ``versions``,
``current``, ``pinned``, ``path``, ``show``, ``pin``, ``unpin`` and ``rollback`` do what they say.

The layout, version names, the publish protocol, pins, rollback and pruning are the written
spec ``model/artifact/FORMAT.md``. The files are the source of truth: a Redis failure is
logged and the pointer change still stands (serving also polls ``CURRENT``).
"""

from __future__ import annotations

import fcntl
import logging
import os
import re
import shutil
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from model.artifact.files import ArtifactError, load_artifact, read_manifest
from model.errors import ModelError
from streamrec.atomic import atomic_write, fsync_tree, rename_durably

log = logging.getLogger(__name__)

CURRENT = "CURRENT"
PINNED = "PINNED"
#: The trainer's quality guard state (``model.trainer.guard_rule``), for serving's ``/model``.
GUARD = "GUARD.json"
STAGING = ".staging"
_VERSION_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


class RegistryError(ModelError):
    """A registry operation is impossible (unknown version, bad name, existing version...)."""


def natural_key(name: str) -> tuple[tuple[int, int | str], ...]:
    """Sort key comparing digit runs as numbers: v2 < v10."""
    return tuple(
        (0, int(part)) if part.isdigit() else (1, part)
        for part in re.split(r"(\d+)", name)
        if part
    )


def current_key(key_prefix: str, model_name: str) -> str:
    return f"{key_prefix}model:{model_name}:current"


def published_channel(key_prefix: str, model_name: str) -> str:
    return f"{key_prefix}model:{model_name}:published"


def check_version(version: str) -> str:
    if not _VERSION_RE.match(version):
        raise RegistryError(f"bad version name {version!r}")
    return version


class Registry:
    """One model's versions under ``<root>/<model_name>/`` (see the module doc)."""

    def __init__(
        self,
        root: str | Path,
        model_name: str,
        redis_client: Any | None = None,
        key_prefix: str = "sr:",
        keep: int = 5,
    ) -> None:
        if keep < 1:
            raise RegistryError("keep must be >= 1")
        self.model_dir = Path(root) / model_name
        self.model_name = model_name
        self.redis = redis_client
        self.key_prefix = key_prefix
        self.keep = keep

    # -- reading ------------------------------------------------------------------------
    def versions(self) -> list[str]:
        """Kept versions, oldest first."""
        if not self.model_dir.is_dir():
            return []
        names = [
            p.name
            for p in self.model_dir.iterdir()
            if p.is_dir() and _VERSION_RE.match(p.name) and (p / "manifest.json").is_file()
        ]
        return sorted(names, key=natural_key)

    def _read_pointer(self, name: str) -> str | None:
        try:
            value = (self.model_dir / name).read_text().strip()
        except FileNotFoundError:
            return None
        return value or None

    def current(self) -> str | None:
        return self._read_pointer(CURRENT)

    def pinned(self) -> str | None:
        return self._read_pointer(PINNED)

    def guard(self) -> dict[str, Any] | None:
        """The trainer's last quality guard note (:meth:`write_guard`), None if none."""
        import json

        try:
            value = json.loads((self.model_dir / GUARD).read_text())
        except (FileNotFoundError, ValueError):
            return None
        return value if isinstance(value, dict) else None

    def write_guard(self, note: dict[str, Any]) -> None:
        """Record the quality guard's state (a hold, rollback or resume) beside CURRENT."""
        import json

        self.model_dir.mkdir(parents=True, exist_ok=True)
        atomic_write(self.model_dir / GUARD, json.dumps(note, sort_keys=True) + "\n")

    def path(self, version: str) -> Path:
        path = self.model_dir / check_version(version)
        if not path.is_dir():
            raise RegistryError(f"unknown version {version!r} of {self.model_name}")
        return path

    def show(self, version: str) -> dict[str, Any]:
        return read_manifest(self.path(version))

    # -- writing ------------------------------------------------------------------------
    @contextmanager
    def _locked(self) -> Iterator[None]:
        self.model_dir.mkdir(parents=True, exist_ok=True)
        with (self.model_dir / ".lock").open("a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    def stage(self, version: str) -> Path:
        """A fresh temp dir (same filesystem) to write ``version`` into before :meth:`commit`."""
        check_version(version)
        staged = self.model_dir / STAGING / f"{version}.{uuid.uuid4().hex[:12]}"
        staged.mkdir(parents=True)
        return staged

    def commit(self, staged: str | Path, *, verify: bool = True) -> str:
        """Verify a staged artifact, rename it into place, move CURRENT (unless pinned)."""
        staged = Path(staged)
        if staged.parent != self.model_dir / STAGING:
            raise RegistryError(f"{staged} was not staged by this registry")
        try:
            version = check_version(str(read_manifest(staged)["version"]))
            if verify:
                load_artifact(staged)
        except (ArtifactError, RegistryError):
            shutil.rmtree(staged, ignore_errors=True)
            raise
        fsync_tree(staged)
        target = self.model_dir / version
        with self._locked():
            if target.exists():
                shutil.rmtree(staged, ignore_errors=True)
                raise RegistryError(f"version {version} already exists; versions are immutable")
            rename_durably(staged, target)
            pinned = self.pinned()
            if pinned is None:
                self._set_current(version)
            else:
                log.info("published %s; CURRENT stays on pinned %s", version, pinned)
            self._prune()
        log.info("published %s/%s", self.model_name, version)
        return version

    def publish(self, version: str, write: Callable[[Path], object]) -> str:
        """Stage, ``write(path)``, commit; a failing ``write`` leaves nothing behind."""
        staged = self.stage(version)
        try:
            write(staged)
        except BaseException:
            shutil.rmtree(staged, ignore_errors=True)
            raise
        return self.commit(staged)

    def import_dir(self, src: str | Path) -> str:
        """Copy an artifact directory into the registry as a new version."""
        version = str(read_manifest(src)["version"])
        return self.publish(version, lambda dst: shutil.copytree(src, dst, dirs_exist_ok=True))

    def pin(self, version: str) -> str:
        """Serve ``version`` until :meth:`unpin`, whatever gets published meanwhile."""
        with self._locked():
            self.path(version)
            atomic_write(self.model_dir / PINNED, version + "\n")
            self._set_current(version)
        return version

    def unpin(self) -> str | None:
        """Drop the pin; CURRENT returns to the newest version."""
        with self._locked():
            (self.model_dir / PINNED).unlink(missing_ok=True)
            versions = self.versions()
            if not versions:
                return None
            self._set_current(versions[-1])
            return versions[-1]

    def rollback_target(self, to: str | None = None) -> str:
        """The version :meth:`rollback` would pin: ``to``, or the one before CURRENT."""
        if to is None:
            cur = self.current()
            older = [v for v in self.versions() if cur is None or natural_key(v) < natural_key(cur)]
            if not older:
                raise RegistryError(f"no version older than {cur!r} to roll back to")
            to = older[-1]
        self.path(to)
        return to

    def rollback(self, to: str | None = None) -> str:
        """Pin the version before the current one (or ``to``)."""
        with self._locked():
            to = self.rollback_target(to)
            atomic_write(self.model_dir / PINNED, to + "\n")
            self._set_current(to)
        log.warning("rolled %s back to %s (pinned)", self.model_name, to)
        return to

    def announce(self, version: str) -> None:
        """Set the Redis pointer and publish ``version``; failures are logged, not raised."""
        if self.redis is None:
            return
        try:
            self.redis.set(current_key(self.key_prefix, self.model_name), version)
            self.redis.publish(published_channel(self.key_prefix, self.model_name), version)
        except Exception as exc:  # noqa: BLE001 - the file pointer already moved
            log.warning("could not announce %s on Redis (%s); serving will poll CURRENT", version, exc)

    def _set_current(self, version: str) -> None:
        if self.current() != version:
            atomic_write(self.model_dir / CURRENT, version + "\n")
        self.announce(version)

    def _prune(self) -> list[str]:
        versions = self.versions()
        protect = {self.current(), self.pinned()} | set(versions[-self.keep :])
        removed = []
        for version in versions:
            if version in protect:
                continue
            trash = self.model_dir / STAGING / f"trash-{version}.{uuid.uuid4().hex[:8]}"
            trash.parent.mkdir(parents=True, exist_ok=True)
            os.rename(self.model_dir / version, trash)
            shutil.rmtree(trash, ignore_errors=True)
            removed.append(version)
        if removed:
            log.info("pruned %s versions %s", self.model_name, removed)
        return removed

