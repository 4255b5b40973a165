"""Background loading of what the request path reads: model versions and the trending list.

:class:`ModelLoader` learns of a new version from the Redis pub/sub channel (and, as a
backup, by reading the registry's ``CURRENT`` pointer every ``poll_interval_s``), loads it in
a worker thread, verifies every checksum, runs a smoke query, and only then replaces one
immutable :class:`LoadedModel` reference. A request reads that reference once, so in-flight
requests finish on the version they started with. A version failing any check is refused,
logged and counted, and the previous one keeps serving; it is retried only if its manifest
changes. :class:`TrendingCache` keeps the last trending list read from the online store, so
the popular fallback still answers while the store is down.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

from feature_store.store import OnlineStore
from model.artifact.files import ArtifactError, ServingArtifact, load_artifact
from model.artifact.registry import Registry, RegistryError, published_channel
from model.scoring import ann as ann_index
from model.scoring.topk import top_k
from serving.errors import VersionRefused
from serving.metrics import ServingMetrics

log = logging.getLogger(__name__)

Clock = Callable[[], datetime]


@dataclass(frozen=True, slots=True)
class LoadedModel:
    """The served version: swapped as one reference, never mutated."""

    artifact: ServingArtifact
    manifest: Mapping[str, Any]
    loaded_at: datetime
    #: The version's ANN index as it stands for this artifact (``model.scoring.ann``); None:
    #: exact search (a catalogue below ``serving.ann_min_items``).
    ann: ann_index.AnnView | None = None

    @property
    def version(self) -> str:
        return self.artifact.version

    @property
    def created_at(self) -> datetime | None:
        raw = self.manifest.get("created_at")
        return datetime.fromisoformat(raw) if isinstance(raw, str) else None

    @property
    def trained_through_ms(self) -> int | None:
        raw = self.manifest.get("trained_through_ms")
        return int(raw) if isinstance(raw, int | float) else None


def smoke_check(artifact: ServingArtifact, k: int = 10) -> None:
    """Run one query through the version; raise :class:`VersionRefused` if it misbehaves."""
    n = artifact.item_ids.shape[0]
    if n == 0:
        raise VersionRefused("no items")
    history = [str(i) for i in artifact.item_ids[:3].tolist()]
    vec = artifact.user_vectors(["\x00smoke"], [history])
    if vec.shape != (1, artifact.dim) or not np.isfinite(vec).all():
        raise VersionRefused(f"user tower gave {vec.shape}, finite={np.isfinite(vec).all()}")
    idx, scores = top_k(artifact.item_vectors, vec[0], k)
    if idx.shape[0] != min(k, n) or not np.isfinite(scores).all():
        raise VersionRefused("smoke query returned a wrong or non-finite top-k")


class ModelLoader:
    """Holds the served :class:`LoadedModel` and swaps in new versions off the request path."""

    def __init__(
        self,
        registry: Registry,
        metrics: ServingMetrics,
        clock: Clock,
        poll_interval_s: float = 5.0,
        ann_min_items: int | None = None,
        ann: ann_index.AnnParams | None = None,
        ann_cache: Path | None = None,
    ) -> None:
        self.registry = registry
        self.metrics = metrics
        self.clock = clock
        self.poll_interval_s = poll_interval_s
        #: Catalogues of at least this many items are ranked through an ANN index (None:
        #: always exactly).
        self.ann_min_items = ann_min_items
        self.ann = ann or ann_index.AnnParams()
        #: The folder where the server's workers share each version's index (None: each
        #: worker builds its own in its memory).
        self.ann_cache = ann_cache
        self._current: LoadedModel | None = None
        self._lock = threading.Lock()
        self._refused: dict[str, tuple[int | None, str]] = {}
        self._wake: asyncio.Event | None = None

    @property
    def current(self) -> LoadedModel | None:
        return self._current

    @property
    def refused(self) -> dict[str, str]:
        """Refused versions -> reason."""
        return {v: reason for v, (_, reason) in self._refused.items()}

    def age_s(self) -> float:
        model = self._current
        if model is None:
            return float("nan")
        born = model.created_at or model.loaded_at
        return (self.clock() - born).total_seconds()

    def _refuse(self, version: str, stamp: int | None, reason: str, detail: str) -> None:
        self._refused[version] = (stamp, f"{reason}: {detail}")
        self.metrics.refused.labels(reason).inc()
        log.error("refused model version %s (%s): %s", version, reason, detail)

    def _stamp(self, version: str) -> int | None:
        try:
            return (self.registry.path(version) / "manifest.json").stat().st_mtime_ns
        except (RegistryError, OSError):
            return None

    def prepare(self, version: str) -> LoadedModel:
        """Load, verify and smoke-test ``version`` without serving it; refusals are recorded."""
        stamp = self._stamp(version)
        try:
            artifact = load_artifact(self.registry.path(version),
                                     map_vectors_from=self.ann_min_items)
            if artifact.version != version:
                raise VersionRefused(f"manifest names {artifact.version!r}")
            smoke_check(artifact)
        except RegistryError as exc:
            self._refuse(version, stamp, "missing", str(exc))
            raise VersionRefused(str(exc)) from exc
        except ArtifactError as exc:
            self._refuse(version, stamp, "artifact", str(exc))
            raise VersionRefused(str(exc)) from exc
        except VersionRefused as exc:
            self._refuse(version, stamp, "smoke", str(exc))
            raise
        except (ValueError, FloatingPointError, MemoryError) as exc:
            self._refuse(version, stamp, "smoke", repr(exc))
            raise VersionRefused(repr(exc)) from exc
        return LoadedModel(artifact, artifact.manifest, self.clock().astimezone(UTC),
                           self.ann_view(artifact, None))

    def ann_view(self, artifact: ServingArtifact, previous: LoadedModel | None
                 ) -> ann_index.AnnView | None:
        """The ANN index of ``artifact`` when its catalogue is large enough: ``previous``'s
        index followed when it was built for the same version (a delta's artifact), else
        a new one (seconds at 1M items; called off the request path). None: exact search,
        also when building fails (logged: exact search is slower, never wrong)."""
        n = int(artifact.item_ids.shape[0])
        if self.ann_min_items is None or n < self.ann_min_items:
            return None
        has_prior, cold = artifact.score_bias, artifact.cold_column()
        try:
            if (previous is not None and previous.ann is not None
                    and previous.version == artifact.version):
                view = ann_index.follow(previous.ann.index, artifact.item_vectors, has_prior,
                                        cold)
                if view is not None:
                    return view
            view = ann_index.build(artifact.item_vectors, has_prior, self.ann, cold,
                                   self.ann_cache, artifact.version)
        except (ImportError, RuntimeError, ValueError, MemoryError, OSError):
            log.exception("no ANN index for %s (%d items): exact search", artifact.version, n)
            return None
        self.metrics.ann_builds.inc()
        return view

    def swap(
        self, model: LoadedModel, only_if_current: bool = False, quiet: bool = False
    ) -> bool:
        """Serve ``model`` (one reference assignment). With ``only_if_current``, only if the
        registry still points at it (a pin may have moved the pointer meanwhile); ``quiet``:
        log at debug level (a delta's swap, every second)."""
        with self._lock:
            if only_if_current and self.registry.current() != model.version:
                log.info("not swapping in %s: the registry moved on", model.version)
                return False
            previous = self._current
            self._current = model
            self._refused.pop(model.version, None)
            self.metrics.swaps.inc()
            self.metrics.items.set(model.artifact.item_ids.shape[0])
            self.metrics.ann_exact_rows.set(model.ann.exact_rows.size if model.ann else 0)
            self.metrics.served(model.created_at or model.loaded_at, model.trained_through_ms)
        log.log(logging.DEBUG if quiet else logging.INFO, "serving model version %s (was %s)",
                model.version, previous.version if previous else None)
        return True

    def load(self, version: str) -> LoadedModel:
        """:meth:`prepare` then :meth:`swap` (blocking; call it off the event loop)."""
        model = self.prepare(version)
        self.swap(model)
        return model

    def check(self) -> LoadedModel | None:
        """Load the version ``CURRENT`` names if it is new and not already refused."""
        wanted = self.registry.current()
        model = self._current
        if wanted is None or (model is not None and model.version == wanted):
            return model
        refused = self._refused.get(wanted)
        if refused is not None and refused[0] == self._stamp(wanted):
            return model
        try:
            self.swap(self.prepare(wanted), only_if_current=True)
        except VersionRefused:
            pass  # recorded, logged and counted by prepare(); the old version keeps serving
        return self._current

    def wake(self) -> None:
        """Ask the watcher to check ``CURRENT`` now (called on a pub/sub message)."""
        if self._wake is not None:
            self._wake.set()

    async def watch(self) -> None:
        """Check ``CURRENT`` on wake-up or every ``poll_interval_s``, until cancelled."""
        self._wake = asyncio.Event()
        while True:
            self._wake.clear()
            try:
                await asyncio.to_thread(self.check)
            except OSError as exc:
                log.warning("registry check failed: %s", exc)
            try:
                await asyncio.wait_for(self._wake.wait(), self.poll_interval_s)
            except TimeoutError:
                pass  # the periodic backup check

    async def listen(
        self, client_factory: Callable[[], Any], retry_s: float = 0.5, max_retry_s: float = 10.0
    ) -> None:
        """Wake the watcher on every message of the registry's pub/sub channel; reconnect
        after errors with a doubling delay (a missed message is caught by the periodic check)."""
        channel = published_channel(self.registry.key_prefix, self.registry.model_name)
        delay = retry_s
        while True:
            client = client_factory()
            try:
                pubsub = client.pubsub()
                await pubsub.subscribe(channel)
                delay = retry_s
                self.wake()  # anything published while disconnected
                while True:
                    msg = await pubsub.get_message(ignore_subscribe_messages=True, timeout=30.0)
                    if msg is not None:
                        log.info("version announced: %r", msg.get("data"))
                        self.wake()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - any client error: retry later
                log.warning("model pub/sub unavailable (%s); retrying in %.1fs", exc, delay)
            finally:
                await client.aclose()
            await asyncio.sleep(delay)
            delay = min(delay * 2, max_retry_s)


class TrendingCache:
    """The last trending list read from the online store (the popular fallback)."""

    def __init__(self, store: OnlineStore, n: int, refresh_s: float = 5.0) -> None:
        self.store = store
        self.n = n
        self.refresh_s = refresh_s
        self.items: Sequence[tuple[str, float]] = ()
        self.loaded = False

    def refresh(self) -> bool:
        """Read the list once; on failure keep the cached one. Returns success."""
        try:
            trending = self.store.read_trending(self.n)
        except Exception as exc:  # noqa: BLE001 - store down: keep serving the cached list
            log.warning("trending refresh failed (%s); keeping %d cached items", exc, len(self.items))
            return False
        self.items = tuple(trending.items) if trending is not None else ()
        self.loaded = True
        return True

    async def run(self) -> None:
        """Refresh every ``refresh_s`` until cancelled."""
        while True:
            await asyncio.to_thread(self.refresh)
            await asyncio.sleep(self.refresh_s)
