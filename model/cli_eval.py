"""Subcommand: evaluate (registered into ``streamrec`` by deploy.cli)."""

from __future__ import annotations

from typing import Any


def register(sub: Any) -> None:
    """Add these subcommands to the ``streamrec`` parser."""
