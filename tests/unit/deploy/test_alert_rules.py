"""The Prometheus rules in deploy/prometheus: valid (`promtool check rules`), each alert seen
firing and not firing in `promtool test rules`, and naming only metrics we export."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from datetime import UTC, datetime
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from tests.support import REPO_ROOT

RULES_DIR = REPO_ROOT / "deploy" / "prometheus"
SUFFIXES = ("", "_total", "_bucket", "_count", "_sum")


def promtool() -> str:
    exe = shutil.which("promtool")
    if exe is None:
        pytest.fail("promtool not found: `make setup` installs Debian's prometheus package")
    return exe


def run(*args: str) -> str:
    proc = subprocess.run([promtool(), *args], cwd=RULES_DIR, capture_output=True, text=True,
                          timeout=120, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


def test_rules_are_valid() -> None:
    assert "SUCCESS" in run("check", "rules", "rules.yml")


def test_rules_unit_tests_pass() -> None:
    assert "SUCCESS" in run("test", "rules", "rules_test.yml")


def test_every_alert_has_a_firing_case() -> None:
    rules = (RULES_DIR / "rules.yml").read_text()
    tests = (RULES_DIR / "rules_test.yml").read_text()
    alerts = re.findall(r"^\s*- alert: (\w+)", rules, re.M)
    assert len(alerts) >= 9
    for name in alerts:
        case = re.search(rf"alertname: {name}\n\s*exp_alerts:\n\s*- exp_labels", tests)
        assert case, f"no test sees {name} firing"


def registered_families() -> set[str]:
    """The metric families the ingest API, the trainer, serving and the exporter register."""
    from model.cluster.metrics import ClusterMetrics
    from model.cluster.spec import ClusterLayout
    from model.trainer.metrics import TrainerMetrics
    from serving.metrics import ServingMetrics
    from stream import monitor
    from stream.ingest.metrics import IngestMetrics

    families = {f.name for f in ServingMetrics(clock=lambda: datetime.now(UTC)).exposition.collect()}
    families |= {f.name for f in TrainerMetrics().registry.collect()}
    cluster = CollectorRegistry()
    ClusterMetrics(cluster, ClusterLayout("h:1", ("h:2",), ("h:3",)))
    families |= {f.name for f in cluster.collect()}
    ingest = IngestMetrics(CollectorRegistry())
    families |= {f.name for f in ingest.registry.collect()}
    families |= {monitor.TOPIC_RECORDS, monitor.CONSUMER_LAG, monitor.KAFKA_UP, monitor.REDIS_UP,
                 monitor.FEATURE_FRESHNESS}
    return families


def exported_names() -> set[str]:
    """Every sample name a scrape can show: the families of ``streamrec.metric_names``
    with the suffixes Prometheus adds."""
    from streamrec.metric_names import all_names

    return {f + s for f in all_names() for s in SUFFIXES}


def test_metric_names_module_lists_every_registered_family() -> None:
    from streamrec.metric_names import all_names

    registered = registered_families()
    assert len(registered) >= 30
    assert registered == set(all_names()), registered ^ set(all_names())


def test_rules_name_only_exported_metrics() -> None:
    used = set(re.findall(r"\bstreamrec_\w+", (RULES_DIR / "rules.yml").read_text()))
    assert used, "the rules name no metric"
    assert used <= exported_names(), used - exported_names()


def test_generated_prometheus_config_is_valid(tmp_path: Path) -> None:
    from deploy.components import PROMETHEUS_RULES, prometheus_config
    from streamrec.settings import load_settings

    config = prometheus_config(load_settings(flink={"taskmanagers": 2}), PROMETHEUS_RULES)
    jobs = {j["job_name"]: j["static_configs"][0]["targets"] for j in config["scrape_configs"]}
    assert set(jobs) == {"prometheus", "ingest", "trainer", "serving", "exporter", "flink"}
    assert len(jobs["flink"]) == 3  # the JobManager and two TaskManagers
    path = tmp_path / "prometheus.yml"
    path.write_text(json.dumps(config))
    assert "SUCCESS" in run("check", "config", str(path))
