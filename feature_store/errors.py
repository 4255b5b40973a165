"""Errors of the feature_store package, one root (:class:`FeatureStoreError`)."""

from __future__ import annotations


class FeatureStoreError(Exception):
    """Root of the errors the feature_store package raises."""


class OnlineStoreError(FeatureStoreError):
    """The online store failed: connection problems, a failed write, a corrupt record."""
