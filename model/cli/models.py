"""Subcommands: models list|show|pin|unpin|rollback (registered into ``streamrec`` by deploy.cli).

Keep imports here light: heavy modules are imported inside the handlers.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any


def register(sub: Any) -> None:
    """Add these subcommands to the ``streamrec`` parser."""
    p = sub.add_parser(
        "models",
        help="list, inspect, pin or roll back model versions",
        description="Inspect and steer the model registry (trainer.registry_dir). Pointer "
        "changes update CURRENT, the Redis key and the pub/sub channel, so serving follows.",
    )
    p.add_argument("--model", help="model name (default: trainer.model_name)")
    msub = p.add_subparsers(dest="models_command", metavar="ACTION", required=True)
    msub.add_parser("list", help="kept versions, marking current and pinned").set_defaults(
        func=_list)
    show = msub.add_parser("show", help="print a version's manifest (default: current)")
    show.add_argument("version", nargs="?")
    show.set_defaults(func=_show)
    pin = msub.add_parser("pin", help="serve VERSION until unpinned")
    pin.add_argument("version")
    pin.set_defaults(func=_pin)
    msub.add_parser("unpin", help="drop the pin; serve the newest version").set_defaults(
        func=_unpin)
    rb = msub.add_parser("rollback", help="pin the version before the current one (or --to)")
    rb.add_argument("--to")
    rb.set_defaults(func=_rollback)


def _out(text: str) -> None:
    sys.stdout.write(text + "\n")


def _registry(args: argparse.Namespace) -> Any:
    import redis

    from model.artifact.registry import Registry
    from streamrec.settings import load_settings

    s = load_settings()
    password = s.redis.password.get_secret_value() if s.redis.password else None
    client = redis.Redis(host=s.redis.host, port=s.redis.port, db=s.redis.db, password=password,
                         socket_connect_timeout=1.0, socket_timeout=2.0)
    return Registry(s.trainer.registry_dir, args.model or s.trainer.model_name,
                    redis_client=client, key_prefix=s.redis.key_prefix,
                    keep=s.trainer.keep_versions)


def _guard(fn: Any) -> Any:
    def run(args: argparse.Namespace) -> int:
        from model.artifact.files import ArtifactError
        from model.artifact.registry import RegistryError

        try:
            return int(fn(args))
        except (RegistryError, ArtifactError) as exc:
            _out(f"error: {exc}")
            return 1

    return run


@_guard
def _list(args: argparse.Namespace) -> int:
    reg = _registry(args)
    current, pinned = reg.current(), reg.pinned()
    for version in reg.versions():
        manifest = reg.show(version)
        marks = ("*" if version == current else " ") + ("P" if version == pinned else " ")
        _out(f"{marks} {version}  created_at={manifest.get('created_at')}  "
              f"trained_through_ms={manifest.get('trained_through_ms')}  "
              f"items={manifest['dims'].get('items')}")
    if current is None:
        _out("(no current version)")
    return 0


@_guard
def _show(args: argparse.Namespace) -> int:
    reg = _registry(args)
    version = args.version or reg.current()
    if version is None:
        _out("error: no current version")
        return 1
    _out(json.dumps(reg.show(version), indent=2, sort_keys=True))
    return 0


@_guard
def _pin(args: argparse.Namespace) -> int:
    _out(f"pinned {_registry(args).pin(args.version)}")
    return 0


@_guard
def _unpin(args: argparse.Namespace) -> int:
    _out(f"unpinned; current = {_registry(args).unpin()}")
    return 0


@_guard
def _rollback(args: argparse.Namespace) -> int:
    _out(f"rolled back to {_registry(args).rollback(args.to)} (pinned)")
    return 0
