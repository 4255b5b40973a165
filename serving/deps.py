"""What one serving app is built from: :class:`ServingDeps`, and its defaults from settings.

Production passes the settings and, with several workers, the multiprocess metrics folder, the
connection balancer and the delta composer's folder; tests also inject a store, a registry and
a clock. :func:`resolve` fills what was not given from the settings (the Redis-backed registry
and pub/sub, the online store, the body cap, the dashboard snapshot's path).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from feature_store.store import OnlineStore, open_store
from model.artifact.registry import Registry
from serving.stats_file import stats_path
from streamrec.settings import Settings

if TYPE_CHECKING:
    from serving.balance import ConnectionBalancer


def utc_now() -> datetime:
    """The production clock (tests inject their own)."""
    return datetime.now(UTC)


@dataclass(frozen=True)
class ServingDeps:
    """The dependencies of ``serving.app.create_app``; all but ``settings`` are optional.

    ``store`` defaults to ``feature_store.open_store(settings)``, ``registry`` and
    ``pubsub_factory`` to the Redis-backed ones; ``watch=False`` skips the background tasks;
    ``max_body_bytes`` caps request bodies (413 beyond; default ``serving.max_body_bytes``);
    ``metrics_dir`` is the multiprocess metrics folder shared by the workers of one server
    (``/metrics`` then answers for all of them, see ``serving.metrics``); ``balancer`` evens
    keep-alive connections out over those workers (``serving.balance``); ``shared_dir`` is
    the folder of the host's delta composer, whose states this worker maps instead of
    following the deltas itself (``serving.shared_state``); ``ann_dir`` is the folder where
    the workers of one server build each version's ANN index once and map it
    (``model.scoring.ann``; None: each builds its own); ``stats_file`` is the dashboard
    collector's snapshot that ``GET /stats`` answers with (``serving.stats_file``).
    """

    settings: Settings
    store: OnlineStore | None = None
    clock: Callable[[], datetime] = utc_now
    registry: Registry | None = None
    pubsub_factory: Callable[[], Any] | None = None
    watch: bool = True
    max_body_bytes: int | None = None
    metrics_dir: str | None = None
    balancer: ConnectionBalancer | None = None
    shared_dir: Path | None = None
    ann_dir: Path | None = None
    stats_file: Path | None = None


@dataclass(frozen=True)
class Resolved:
    """:class:`ServingDeps` with every default filled in."""

    settings: Settings
    store: OnlineStore
    clock: Callable[[], datetime]
    registry: Registry
    pubsub_factory: Callable[[], Any] | None
    watch: bool
    max_body_bytes: int
    metrics_dir: str | None
    balancer: ConnectionBalancer | None
    shared_dir: Path | None
    ann_dir: Path | None
    stats_file: Path


def redis_kwargs(settings: Settings) -> dict[str, Any]:
    """The Redis client options of a serving worker."""
    rs = settings.redis
    password = rs.password.get_secret_value() if rs.password else None
    return {"host": rs.host, "port": rs.port, "db": rs.db, "password": password,
            "socket_timeout": 2.0, "socket_connect_timeout": 1.0}


def resolve(deps: ServingDeps) -> Resolved:
    """``deps`` with the defaults of its settings filled in (opens the Redis clients)."""
    settings = deps.settings
    registry = deps.registry
    if registry is None:
        import redis

        registry = Registry(
            settings.trainer.registry_dir,
            settings.trainer.model_name,
            redis_client=redis.Redis(**redis_kwargs(settings)),
            key_prefix=settings.redis.key_prefix,
            keep=settings.trainer.keep_versions,
        )
    pubsub_factory = deps.pubsub_factory
    if pubsub_factory is None and deps.watch:
        import redis.asyncio

        kwargs = redis_kwargs(settings) | {"socket_timeout": None}
        pubsub_factory = lambda: redis.asyncio.Redis(**kwargs)  # noqa: E731
    return Resolved(
        settings=settings,
        store=deps.store or open_store(settings, timeout_s=1.0),
        clock=deps.clock,
        registry=registry,
        pubsub_factory=pubsub_factory,
        watch=deps.watch,
        max_body_bytes=(deps.max_body_bytes if deps.max_body_bytes is not None
                        else settings.serving.max_body_bytes),
        metrics_dir=deps.metrics_dir,
        balancer=deps.balancer,
        shared_dir=deps.shared_dir,
        ann_dir=deps.ann_dir,
        stats_file=deps.stats_file or stats_path(settings),
    )
