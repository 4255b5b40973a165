"""Errors of the model package, one root (:class:`ModelError`); numpy-free, imports nothing."""

from __future__ import annotations


class ModelError(Exception):
    """Root of the errors the model package raises (artifacts, registry, samples)."""
