"""The ingest API: ``POST /events`` into the Kafka ``events`` topic and ``POST /items`` (the
item catalogue, :mod:`stream.items`) into ``items``, acknowledged end to end.

``create_app(settings)`` builds the FastAPI app; its lifespan owns one long-lived Kafka
producer (``acks=all``, idempotent) and closes it on shutdown. ``POST /events`` takes one JSON
object, an array, or NDJSON; the rules of one event are in :mod:`stream.schema`. It answers
``202 {"accepted", "event_ids"}`` only after Kafka acknowledged every record; ``422`` naming
each invalid field (nothing written); ``413`` over ``ingest.max_body_bytes`` or
``ingest.max_batch``; ``415`` for other content types; ``401`` without the ``X-API-Key``;
``429`` with ``Retry-After`` over ``rate_limit_per_s`` (:mod:`stream.ingest.ratelimit`);
``503`` with ``Retry-After`` when Kafka does not acknowledge within
``ingest.produce_timeout_s`` (the producer gives the record up by then; the client retries
with the same ``event_id``s, and consumers dedupe: docs/design.md, "Wire formats").
``POST /items`` takes the same bodies of item records and answers the same way (``202
{"accepted", "item_ids"}``; ``413`` beyond ``ingest.max_item_batch``), behind the same API key
and rate limit. ``GET /health``, ``GET /metrics`` (names in :mod:`stream.ingest.metrics`), ``/docs``.
"""

from __future__ import annotations

import asyncio
import hmac
import itertools
import logging
import threading
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import orjson
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from feature_store.catalogue import FeatureSpec
from stream.errors import StreamError
from stream.ingest.metrics import (
    REASON_INVALID,
    REASON_TOO_LARGE,
    REASON_UNAUTHORIZED,
    REASON_UNAVAILABLE,
    REASON_UNSUPPORTED,
    IngestMetrics,
)
from stream.ingest.ratelimit import TokenBucket
from stream.items import ItemIn, ItemNormalizer, decode_items, item_record
from stream.kafka_client import KafkaUnavailable, ingest_producer_options, make_producer
from stream.schema import EventIn, EventNormalizer, EventValidationError, decode_events
from streamrec.settings import Settings

log = logging.getLogger(__name__)

NDJSON_TYPES = frozenset({"application/x-ndjson", "application/ndjson", "application/jsonl"})
RETRY_AFTER_S = 2
#: Extra wait beyond the producer's delivery timeout before a request gives up on its acks.
ACK_GRACE_S = 2.0

ProducerFactory = Callable[[Settings], Any]
Clock = Callable[[], int]


def wall_clock_ms() -> int:
    """Current wall-clock time in epoch milliseconds (the default injected clock)."""
    return time.time_ns() // 1_000_000


class IngestError(StreamError):
    """An ingest request failed; :func:`create_app` maps each subclass to one HTTP answer
    (and :class:`stream.kafka_client.KafkaUnavailable` to 503)."""

    status = 500
    reason = "error"

    def __init__(self, detail: str, errors: list[dict[str, Any]] | None = None) -> None:
        super().__init__(detail)
        self.detail = detail
        self.errors = errors


class InvalidEvents(IngestError):
    status, reason = 422, REASON_INVALID


class PayloadTooLarge(IngestError):
    status, reason = 413, REASON_TOO_LARGE


class UnsupportedMediaType(IngestError):
    status, reason = 415, REASON_UNSUPPORTED


class Unauthorized(IngestError):
    status, reason = 401, REASON_UNAUTHORIZED


class RateLimited(IngestError):
    status, reason = 429, "rate_limited"

    def __init__(self, detail: str, retry_after_s: int) -> None:
        super().__init__(detail)
        self.retry_after_s = retry_after_s


def default_producer_factory(settings: Settings) -> Any:
    return make_producer(
        settings.kafka, **ingest_producer_options(settings.ingest.produce_timeout_s)
    )


class EventPublisher:
    """Owns the producer and turns "send these records" into "all acknowledged, or raise".

    The producer is created lazily (and again after it failed to connect), so the API starts
    and answers 503 while Kafka is down instead of refusing to start.
    """

    def __init__(self, settings: Settings, factory: ProducerFactory) -> None:
        self.settings = settings
        self.topic = settings.kafka.events_topic
        self.timeout_s = settings.ingest.produce_timeout_s
        self._factory = factory
        self._producer: Any = None
        self._lock = threading.Lock()
        self._failed_at: float | None = None
        #: "none" before the first publish, then "ok" or "failed" (for GET /health).
        self.last_outcome = "none"

    def producer(self) -> Any:
        """The producer, created (and warmed with the topic's metadata) on first use.

        Only one caller connects at a time; the others, and every caller shortly after a
        failed attempt, get :class:`KafkaUnavailable` at once instead of queueing behind a
        connection timeout.
        """
        producer = self._producer
        if producer is not None:
            return producer
        if not self._lock.acquire(blocking=False):
            raise KafkaUnavailable("connecting to Kafka")
        try:
            if self._producer is not None:
                return self._producer
            if self._failed_at is not None and time.monotonic() - self._failed_at < RETRY_AFTER_S:
                raise KafkaUnavailable("Kafka is unavailable (recent connection failure)")
            try:
                producer = self._factory(self.settings)
                producer.partitions_for(self.topic)
            except Exception as exc:  # kafka-python raises several unrelated types here
                self._failed_at = time.monotonic()
                if producer is not None:
                    producer.close(timeout=0)
                raise KafkaUnavailable(f"Kafka is unavailable: {exc}") from exc
            self._failed_at = None
            self._producer = producer
            return producer
        finally:
            self._lock.release()

    @property
    def ready(self) -> bool:
        return self._producer is not None

    async def publish(self, records: list[tuple[bytes, bytes]], topic: str | None = None) -> None:
        """Send ``(key, value)`` records to ``topic`` (default: the events topic); return once
        every one is acknowledged."""
        producer = self._producer or await asyncio.to_thread(self.producer)
        loop = asyncio.get_running_loop()
        done: asyncio.Future[None] = loop.create_future()
        total = len(records)
        acked = itertools.count(1)  # next() is atomic under the GIL
        failures: list[BaseException] = []

        def finish() -> None:
            if not done.done():
                done.set_result(None)

        def on_ack(_metadata: Any) -> None:
            if next(acked) == total:
                loop.call_soon_threadsafe(finish)

        def on_error(exc: BaseException) -> None:
            failures.append(exc)
            on_ack(None)

        send, topic = producer.send, topic or self.topic
        try:
            for key, value in records:
                future = send(topic, value=value, key=key)
                future.add_callback(on_ack)
                future.add_errback(on_error)
        except Exception as exc:  # a send that cannot even be queued
            self.last_outcome = "failed"
            log.warning("the producer refused a record (%s); it will be recreated", exc)
            await asyncio.to_thread(self._discard, producer)
            raise KafkaUnavailable(f"Kafka did not take the records: {exc}") from exc
        try:
            await asyncio.wait_for(asyncio.shield(done), self.timeout_s + ACK_GRACE_S)
        except TimeoutError as exc:
            log.error("no acknowledgement for %d records within %.1f s", total, self.timeout_s)
            self.last_outcome = "failed"
            await asyncio.to_thread(self._discard, producer)
            raise KafkaUnavailable("Kafka did not acknowledge in time") from exc
        if failures:
            log.warning("%d of %d records failed: %s", len(failures), total, failures[0])
            self.last_outcome = "failed"
            # An idempotent kafka-python producer whose batches expired (e.g. the broker was
            # killed with records in flight) never sends again, even once the broker is back:
            # replace it; the next request connects a fresh one (new producer id).
            await asyncio.to_thread(self._discard, producer)
            raise KafkaUnavailable(f"Kafka did not acknowledge every record: {failures[0]}")
        self.last_outcome = "ok"

    def health(self) -> dict[str, Any]:
        """Producer state and the outcome of the last publish (no extra Kafka round trip)."""
        return {
            "producer": "ready" if self._producer is not None else "not connected",
            "last_publish": self.last_outcome,
        }

    def _discard(self, producer: Any) -> None:
        """Drop a producer that refuses or loses records; its pending records fail."""
        with self._lock:
            if self._producer is producer:
                self._producer = None
        _close_producer(producer, timeout_s=0.0)

    def close(self) -> None:
        with self._lock:
            producer, self._producer = self._producer, None
        if producer is not None:
            _close_producer(producer, timeout_s=self.timeout_s)


def _close_producer(producer: Any, timeout_s: float) -> None:
    """Close ``producer``, forcing it when records are still pending after ``timeout_s``.

    kafka-python's ``close()`` flushes first and raises ``KafkaTimeoutError`` if the flush
    does not finish, leaving its sender thread running; the sender is then force-closed.
    """
    try:
        producer.close(timeout=timeout_s)
    except Exception as exc:  # noqa: BLE001 - kafka-python raises KafkaTimeoutError here
        log.warning("producer closed with records still pending (%s); forcing it", exc)
        sender = getattr(producer, "_sender", None)
        if sender is not None:
            sender.force_close()


async def read_body(request: Request, limit: int) -> bytes:
    """The request body, refusing (413) more than ``limit`` bytes, declared or streamed."""
    declared = request.headers.get("content-length")
    if declared is not None:
        try:
            if int(declared) > limit:
                raise PayloadTooLarge(f"body of {declared} bytes exceeds {limit} bytes")
        except ValueError as exc:
            raise InvalidEvents("Content-Length is not a number") from exc
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise PayloadTooLarge(f"body exceeds {limit} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


def _batch_body(schema: str, max_items: int) -> dict[str, Any]:
    """OpenAPI request body of a batch endpoint: one ``schema`` object, an array of at most
    ``max_items`` of them, or NDJSON."""
    ref = {"$ref": f"#/components/schemas/{schema}"}
    array = {"type": "array", "items": ref, "minItems": 1, "maxItems": max_items}
    return {
        "requestBody": {
            "required": True,
            "content": {
                "application/json": {"schema": {"oneOf": [ref, array]}},
                "application/x-ndjson": {"schema": {"type": "string"}},
            },
        }
    }


def _batch_responses(noun: str) -> dict[int | str, dict[str, Any]]:
    """OpenAPI responses of a batch endpoint that writes ``noun`` records to Kafka."""
    return {
        202: {"description": f"Every {noun} acknowledged by Kafka."},
        413: {"description": "Body or batch too large."},
        429: {"description": "Rate limit exceeded; retry after Retry-After seconds."},
        422: {"description": f"Invalid {noun}s; nothing written."},
        503: {"description": "Kafka unavailable; retry after Retry-After seconds."},
    }


def create_app(
    settings: Settings,
    producer_factory: ProducerFactory = default_producer_factory,
    clock_ms: Clock = wall_clock_ms,
    rate_limit_per_s: float | None = None,
    rate_clock: Callable[[], float] = time.monotonic,
) -> FastAPI:
    """The ingest API for ``settings``; ``producer_factory`` and ``clock_ms`` are injectable.

    ``rate_limit_per_s`` caps ``POST /events`` requests per second (burst of one second's
    worth; 0 = no limit); ``rate_clock`` is the limiter's monotonic clock.
    """
    ingest = settings.ingest
    publisher = EventPublisher(settings, producer_factory)
    normalizer = EventNormalizer(settings.features.event_weights, clock_ms=clock_ms)
    item_normalizer = ItemNormalizer(FeatureSpec.load(settings.features.spec_file), clock_ms)
    items_topic = settings.kafka.items_topic
    metrics = IngestMetrics(CollectorRegistry())
    api_key = ingest.api_key.get_secret_value().encode() if ingest.api_key else None
    if rate_limit_per_s is None:
        rate_limit_per_s = settings.ingest.rate_limit_per_s
    limiter = TokenBucket(rate_limit_per_s, clock=rate_clock)

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        try:
            await asyncio.to_thread(publisher.producer)
            log.info("ingest API producing to %s at %s", publisher.topic, settings.kafka.bootstrap)
        except KafkaUnavailable as exc:
            log.warning("starting without Kafka (will retry on each request): %s", exc)
        try:
            yield
        finally:
            await asyncio.to_thread(publisher.close)

    app = FastAPI(
        title="streamrec ingest",
        summary="Events into Kafka, acknowledged end to end.",
        lifespan=lifespan,
    )
    app.state.publisher = publisher
    app.state.metrics = metrics

    @app.exception_handler(StreamError)
    async def stream_error(_request: Request, exc: StreamError) -> Response:
        """The one place errors become HTTP answers."""
        errors: list[dict[str, Any]] | None = None
        if isinstance(exc, IngestError):
            status, reason, detail, errors = exc.status, exc.reason, exc.detail, exc.errors
        elif isinstance(exc, KafkaUnavailable):
            status, reason, detail = 503, REASON_UNAVAILABLE, str(exc)
        else:  # a bug of ours, not of the request
            log.error("ingest request failed", exc_info=exc)
            status, reason, detail = 500, "error", "internal error"
        metrics.requests.labels(str(status)).inc()
        metrics.rejected.labels(reason).inc(len(errors or ()) or 1)
        # the body both APIs answer with (docs/design.md, "Errors"); ``errors`` lists the
        # refused events of a batch
        body: dict[str, Any] = {"error": reason, "detail": detail}
        if errors is not None:
            body["errors"] = errors
        headers = {"Retry-After": str(RETRY_AFTER_S)} if status == 503 else None
        if isinstance(exc, RateLimited):
            headers = {"Retry-After": str(exc.retry_after_s)}
        return JSONResponse(body, status_code=status, headers=headers)

    async def admitted_body(request: Request) -> tuple[bytes, bool]:
        """The body of a write request that passed the rate limit, the API key and the
        content type, and whether it is NDJSON (the same gate for events and items)."""
        wait_s = limiter.acquire()
        if wait_s > 0:
            raise RateLimited("too many requests", TokenBucket.retry_after_s(wait_s))
        if api_key is not None:
            given = request.headers.get("x-api-key", "").encode()
            if not hmac.compare_digest(given, api_key):
                raise Unauthorized("missing or wrong X-API-Key")
        media = request.headers.get("content-type", "application/json").split(";")[0].strip()
        ndjson = media.lower() in NDJSON_TYPES
        if (
            not ndjson
            and media.lower() not in ("application/json", "")
            and not media.endswith("+json")
        ):
            raise UnsupportedMediaType(f"unsupported Content-Type {media!r}")
        return await read_body(request, ingest.max_body_bytes), ndjson

    def validated(decode: Callable[[], list[Any]], normalize: Callable[[list[Any]], list[Any]],
                  limit: int, noun: str) -> list[dict[str, Any]]:
        """Decoded and normalised records, or the 413 / 422 naming every bad field."""
        try:
            items = decode()
            if len(items) > limit:
                raise PayloadTooLarge(f"{len(items)} {noun} exceed the batch limit {limit}")
            return normalize(items)
        except EventValidationError as exc:
            errors = [e.as_dict() for e in exc.errors]
            raise InvalidEvents(f"{len(errors)} invalid field(s); nothing written", errors) from exc
        except RecursionError as exc:  # json.loads on very deeply nested arrays/objects
            error = {"index": None, "field": "(json)", "error": "JSON nested too deeply"}
            raise InvalidEvents("JSON nested too deeply; nothing written", [error]) from exc

    @app.post(
        "/events",
        status_code=202,
        openapi_extra=_batch_body("EventIn", ingest.max_batch),
        responses=_batch_responses("event"),
    )
    async def post_events(request: Request) -> Response:
        """Validate a batch and write it to Kafka; answers only after every record is acked."""
        body, ndjson = await admitted_body(request)
        wire = validated(
            lambda: decode_events(body, ndjson=ndjson), normalizer.normalize,
            ingest.max_batch, "events",
        )
        dumps = orjson.dumps
        records = [(e["user_id"].encode(), dumps(e)) for e in wire]
        started = time.perf_counter()
        await publisher.publish(records)
        metrics.produce_latency.observe(time.perf_counter() - started)
        metrics.accepted.inc(len(wire))
        metrics.batch_size.observe(len(wire))
        metrics.requests.labels("202").inc()
        body_out = orjson.dumps({"accepted": len(wire), "event_ids": [e["event_id"] for e in wire]})
        return Response(body_out, status_code=202, media_type="application/json")

    @app.post(
        "/items",
        status_code=202,
        openapi_extra=_batch_body("ItemIn", ingest.max_item_batch),
        responses=_batch_responses("item"),
    )
    async def post_items(request: Request) -> Response:
        """Validate catalogue upserts/deletes and write them to the items topic; answers only
        after every record is acked."""
        body, ndjson = await admitted_body(request)
        wire = validated(
            lambda: decode_items(body, ndjson=ndjson), item_normalizer.normalize,
            ingest.max_item_batch, "items",
        )
        await publisher.publish([item_record(w) for w in wire], topic=items_topic)
        metrics.requests.labels("202").inc()
        body_out = orjson.dumps({"accepted": len(wire), "item_ids": [w["item_id"] for w in wire]})
        return Response(body_out, status_code=202, media_type="application/json")

    @app.get("/health")
    async def health() -> dict[str, Any]:
        """Liveness; ``kafka`` tells whether the producer exists and how the last publish went."""
        kafka = publisher.health()
        ok = kafka["producer"] == "ready" and kafka["last_publish"] != "failed"
        return {"status": "ok" if ok else "degraded", "topic": publisher.topic, "kafka": kafka}

    @app.get("/metrics")
    async def prometheus_metrics() -> Response:
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    # Publish the event schema in the OpenAPI document (the route reads the raw body itself).
    original_openapi = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = original_openapi()
            components = schema.setdefault("components", {}).setdefault("schemas", {})
            event_in = EventIn.model_json_schema(ref_template="#/components/schemas/{model}")
            # The accepted types are the configured ones, not any string.
            event_in["properties"]["event_type"]["enum"] = sorted(normalizer.event_types)
            components["EventIn"] = event_in
            components["ItemIn"] = ItemIn.model_json_schema(
                ref_template="#/components/schemas/{model}"
            )
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
    return app


def app_from_env() -> FastAPI:
    """uvicorn factory for multi-worker runs: each worker process reads its own settings."""
    from streamrec.settings import load_settings

    return create_app(load_settings())
