"""The root of every error raised by ``stream``.

Each package module defines its own errors next to the code that raises them (``SchemaError``
and ``EventValidationError`` in :mod:`stream.rules` / :mod:`stream.schema`, ``IngestError``
in :mod:`stream.ingest.api`, ``KafkaUnavailable`` in :mod:`stream.kafka_client`,
``ReplayError``, ``ReplayFormatError``, ``BadEvent``, ``FlinkSubmitError``); all derive from
:class:`StreamError`, so a caller can catch everything of ``stream`` at once. Errors that
callers also catch as ``ValueError`` keep it as a second base.
"""

from __future__ import annotations


class StreamError(Exception):
    """Something in ``stream`` failed; subclasses say what."""
