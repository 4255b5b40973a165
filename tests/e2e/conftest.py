"""The whole pipeline on the test stack: ingest API, Flink feature job, trainer and serving
started as real processes (the same commands `streamrec up` runs) on their own topics and
Redis key prefix."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from streamrec.settings import Settings
from tests.support import isolated_settings, service_env

SERVICES = ["ingest-api", "features", "trainer", "serving"]


@pytest.fixture(scope="session")
def pipeline(stack: Settings, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Settings]:
    from deploy.stack import Stack

    base = isolated_settings(stack, tmp_path_factory.mktemp("pipeline"), prefix="e")
    s = base.model_copy(update={
        "trainer": base.trainer.model_copy(update={"export_every_s": 5.0}),
        "serving": base.serving.model_copy(update={"poll_interval_s": 1.0}),
        "stack": base.stack.model_copy(update={"ready_timeout_s": 240.0}),
    })
    with service_env(s):
        runner = Stack(s, available_commands={"ingest-api", "features", "train", "serve"})
        try:
            runner.up(SERVICES)
            yield s
        finally:
            runner.down(SERVICES)
            _cancel_feature_job(s)


def _cancel_feature_job(s: Settings) -> None:
    from stream.flink.submit import cancel_job, list_jobs

    for job in list_jobs(s):
        if job.get("state") == "RUNNING" and str(job.get("name", "")).endswith(s.kafka.events_topic):
            cancel_job(s, str(job["jid"]))
