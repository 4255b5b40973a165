"""One error root per package (CONVENTIONS.md 8), and the serving app's one HTTP mapping."""

from __future__ import annotations

import inspect

import pytest

import feature_store.errors
import serving.errors
from feature_store.errors import FeatureStoreError, OnlineStoreError
from model.errors import ModelError


def test_feature_store_errors_share_one_root() -> None:
    from feature_store import store

    assert issubclass(OnlineStoreError, FeatureStoreError)
    assert store.OnlineStoreError is OnlineStoreError  # the seam re-exports its error
    for _, cls in inspect.getmembers(feature_store.errors, inspect.isclass):
        assert issubclass(cls, FeatureStoreError)


def test_model_errors_share_one_root() -> None:
    from model.artifact.files import ArtifactError
    from model.artifact.registry import RegistryError
    from model.trainer.samples import SampleError

    for cls in (ArtifactError, RegistryError, SampleError):
        assert issubclass(cls, ModelError)
    assert issubclass(SampleError, ValueError)  # callers catching ValueError still do


def test_serving_errors_share_one_root() -> None:
    from serving.stats import ScrapeError

    assert issubclass(ScrapeError, serving.errors.ServingError)
    for _, cls in inspect.getmembers(serving.errors, inspect.isclass):
        if cls.__module__ == "serving.errors":
            assert issubclass(cls, serving.errors.ServingError)


@pytest.mark.parametrize("error, status", [
    (serving.errors.NotFound("nope"), 404),
    (serving.errors.StoreUnavailable("down"), 503),
    (serving.errors.Forbidden("no"), 403),
])
def test_one_handler_answers_every_serving_error(error: Exception, status: int) -> None:
    from fastapi import FastAPI
    from fastapi.testclient import TestClient

    app = FastAPI()
    serving.errors.install(app)

    @app.get("/boom")
    def boom() -> None:
        raise error

    with TestClient(app) as client:
        resp = client.get("/boom")
    assert resp.status_code == status
    assert resp.json() == {"error": type(error).code, "detail": str(error)}
