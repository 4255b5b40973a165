"""One error root for ``stream``: every exception class of the package derives from StreamError."""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import stream
from stream.errors import StreamError


def test_every_exception_of_stream_derives_from_stream_error() -> None:
    found = []
    for info in pkgutil.walk_packages(stream.__path__, "stream."):
        module = importlib.import_module(info.name)
        for _, cls in inspect.getmembers(module, inspect.isclass):
            if cls.__module__ == info.name and issubclass(cls, BaseException):
                found.append(cls)
    names = {cls.__name__ for cls in found}
    assert {"SchemaError", "EventValidationError", "IngestError", "InvalidEvents",
            "ReplayError", "ReplayFormatError", "BadEvent", "FlinkSubmitError",
            "KafkaUnavailable"} <= names
    assert [c.__name__ for c in found if not issubclass(c, StreamError)] == []


def test_value_errors_stay_value_errors() -> None:
    from stream.flink.parse import BadEvent
    from stream.replay.formats import ReplayFormatError
    from stream.schema import EventValidationError, SchemaError

    for cls in (SchemaError, EventValidationError, ReplayFormatError, BadEvent):
        assert issubclass(cls, ValueError)


def test_one_kafka_unavailable() -> None:
    import stream.ingest.api as api
    from stream.kafka_client import KafkaUnavailable

    assert api.KafkaUnavailable is KafkaUnavailable
