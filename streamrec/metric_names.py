"""Every Prometheus metric name streamrec exports, defined once (CONVENTIONS.md 10).

The modules that register them (``stream/ingest/metrics.py``, ``model/trainer/metrics.py``,
``model/cluster/metrics.py``, ``serving/metrics.py``, ``stream/monitor.py``) and those that read them (the dashboard's
collector in ``serving/stats.py``, the demo) import the names from here; the alert rules and
the Grafana dashboard in ``deploy/`` are checked against this module by the tests. Conventions:
counters are named here without ``_total`` (``prometheus_client`` appends it; ``*_TOTAL`` is
the sample name a scraper reads), base units (seconds, timestamps as ``*_timestamp_seconds``),
no per-user labels.
"""

from __future__ import annotations

# -- ingest API (stream/ingest/metrics.py) ----------------------------------------------------
INGEST_ACCEPTED = "streamrec_ingest_events_accepted"
INGEST_ACCEPTED_TOTAL = f"{INGEST_ACCEPTED}_total"
INGEST_REJECTED = "streamrec_ingest_events_rejected"
INGEST_REQUESTS = "streamrec_ingest_requests"
INGEST_PRODUCE_LATENCY = "streamrec_ingest_produce_latency_seconds"
INGEST_BATCH_SIZE = "streamrec_ingest_batch_events"

# -- trainer (model/trainer/metrics.py) -------------------------------------------------------
TRAINER_SAMPLES = "streamrec_trainer_samples"
TRAINER_SAMPLES_TOTAL = f"{TRAINER_SAMPLES}_total"
TRAINER_SAMPLES_LIFETIME = "streamrec_trainer_samples_trained_lifetime"
TRAINER_DLQ = "streamrec_trainer_dlq_records"
TRAINER_CATALOGUE_ITEMS = "streamrec_trainer_catalogue_items"
TRAINER_DUPLICATES = "streamrec_trainer_duplicate_samples"
TRAINER_BATCHES = "streamrec_trainer_batches"
TRAINER_EXPORTS = "streamrec_trainer_exports"
TRAINER_LOSS = "streamrec_trainer_loss"
TRAINER_STEP_SECONDS = "streamrec_trainer_step_seconds"
TRAINER_EXPORT_SECONDS = "streamrec_trainer_export_seconds"
TRAINER_DELTAS = "streamrec_trainer_deltas"
TRAINER_DELTA_ROWS = "streamrec_trainer_delta_rows"
TRAINER_DELTA_SECONDS = "streamrec_trainer_delta_seconds"
TRAINER_GUARD_HELD = "streamrec_trainer_guard_held"
TRAINER_GUARD_HELD_SECONDS = "streamrec_trainer_guard_held_seconds"
TRAINER_GUARD_RECALL = "streamrec_trainer_guard_recall"
TRAINER_GUARD_HOLDS = "streamrec_trainer_guard_holds"
TRAINER_GUARD_ROLLBACKS = "streamrec_trainer_guard_rollbacks"
TRAINER_QUALITY = "streamrec_trainer_quality_rolling"
TRAINER_QUALITY_LIFETIME = "streamrec_trainer_quality_lifetime"
TRAINER_TABLE_ROWS = "streamrec_trainer_table_rows"
TRAINER_TRAINED_THROUGH = "streamrec_trainer_trained_through_timestamp_seconds"
TRAINER_CONSUMED_OFFSETS = "streamrec_trainer_consumed_offsets"
TRAINER_FETCH_WAIT_SECONDS = "streamrec_trainer_fetch_wait_seconds"

# -- trainer cluster, per role (model/cluster/metrics.py; labels role, index) ---------------
CLUSTER_ROLE = "streamrec_cluster_role"
CLUSTER_SHARD_ROWS = "streamrec_cluster_shard_rows"
CLUSTER_ADMITTED_ROWS = "streamrec_cluster_admitted_rows"
CLUSTER_SENT_BYTES = "streamrec_cluster_sent_bytes"
CLUSTER_RECEIVED_BYTES = "streamrec_cluster_received_bytes"
CLUSTER_STEP_SECONDS = "streamrec_cluster_step_seconds"
CLUSTER_SCHEDULE_SECONDS = "streamrec_cluster_schedule_seconds"
CLUSTER_WAIT_SECONDS = "streamrec_cluster_wait_seconds"
CLUSTER_STEPS_IN_FLIGHT = "streamrec_cluster_steps_in_flight"
CLUSTER_SAMPLED = "streamrec_cluster_sampled_timestamp_seconds"

# -- serving API (serving/metrics.py) ---------------------------------------------------------
SERVING_REQUEST_SECONDS = "streamrec_serving_request_seconds"
SERVING_MODEL_VERSION_AGE = "streamrec_serving_model_version_age_seconds"
SERVING_MODEL_CREATED = "streamrec_serving_model_created_timestamp_seconds"
SERVING_MODEL_TRAINED_THROUGH = "streamrec_serving_model_trained_through_timestamp_seconds"
SERVING_MODEL_TRAINED_THROUGH_AGE = "streamrec_serving_model_trained_through_age_seconds"
SERVING_MODEL_SWAPS = "streamrec_serving_model_swaps"
SERVING_MODEL_REFUSED = "streamrec_serving_model_refused"
SERVING_FALLBACKS = "streamrec_serving_fallbacks"
SERVING_MODEL_ITEMS = "streamrec_serving_model_items"
SERVING_ANN_BUILDS = "streamrec_serving_ann_builds"
SERVING_ANN_EXACT_ROWS = "streamrec_serving_ann_exact_rows"
SERVING_STORE_STATE = "streamrec_serving_store_state"

# -- pipeline exporter (stream/monitor.py) ----------------------------------------------------
KAFKA_TOPIC_RECORDS = "streamrec_kafka_topic_records"
KAFKA_CONSUMER_LAG = "streamrec_kafka_consumer_lag_records"
KAFKA_UP = "streamrec_kafka_up"
REDIS_UP = "streamrec_redis_up"
FEATURE_FRESHNESS = "streamrec_feature_store_freshness_seconds"


def all_names() -> frozenset[str]:
    """Every metric family name above (what the rules and dashboards may refer to)."""
    return frozenset(v for k, v in globals().items()
                     if k.isupper() and isinstance(v, str) and not k.endswith("_TOTAL"))
