"""docker-compose.yml cannot be run here (no Docker engine), so its structure is checked:
services, health checks, ports, dependency conditions, and that every project command is a
real `streamrec` subcommand."""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
from pathlib import Path

import yaml

from deploy.cli import build_parser
from deploy.components import PROMETHEUS_RULES, prometheus_config
from streamrec.settings import load_settings
from tests.support import REPO_ROOT
from tests.unit.deploy.test_alert_rules import exported_names

COMPOSE = yaml.safe_load((REPO_ROOT / "docker-compose.yml").read_text())
SERVICES = COMPOSE["services"]


def _subcommands() -> set[str]:
    parser = build_parser()
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return set(action.choices)
    raise AssertionError("no subcommands")


def test_the_pipeline_services_are_present() -> None:
    expected = {"kafka", "redis", "flink-jobmanager", "flink-taskmanager", "ingest-api",
                "features", "trainer", "serving", "exporter", "prometheus", "grafana"}
    assert expected <= set(SERVICES)


def test_infrastructure_uses_official_images() -> None:
    assert SERVICES["kafka"]["image"].startswith("apache/kafka:4.")
    assert SERVICES["redis"]["image"].startswith("redis:7")
    assert SERVICES["flink-jobmanager"]["image"].startswith("flink:2.2")


def test_long_running_services_have_health_checks_and_ports() -> None:
    ports = {"kafka": 9092, "redis": 6379, "flink-jobmanager": 8081, "ingest-api": 8001,
             "serving": 8000}
    for name, port in ports.items():
        svc = SERVICES[name]
        assert "healthcheck" in svc, name
        assert any(str(p).endswith(f":{port}") for p in svc["ports"]), name
    assert "healthcheck" in SERVICES["trainer"]


def test_dependencies_wait_for_health() -> None:
    for name, svc in SERVICES.items():
        for dep, cond in (svc.get("depends_on") or {}).items():
            assert dep in SERVICES, (name, dep)
            wanted = ("service_completed_successfully" if dep == "topics"
                      else "service_healthy")
            assert cond["condition"] == wanted, (name, dep)


def test_every_project_command_is_a_real_subcommand() -> None:
    commands = _subcommands()
    project = [svc for svc in SERVICES.values() if svc.get("image", "").startswith("streamrec")
               and "command" in svc]
    assert project
    for svc in project:
        assert svc["command"][0] in commands, svc["command"]


def test_named_volumes_for_state() -> None:
    assert {"kafka-data", "redis-data", "models"} <= set(COMPOSE["volumes"])


# ------------------------------------------------------------------------- monitoring

def _mounts(service: str) -> dict[str, str]:
    """Container path -> repository file or folder, for the bind mounts of ``service``."""
    out = {}
    for volume in SERVICES[service]["volumes"]:
        source, target = volume.split(":")[:2]
        if source.startswith("./"):
            assert (REPO_ROOT / source).exists(), source
            out[target] = source[2:]
    return out


def test_monitoring_services_use_official_images_with_health_checks() -> None:
    assert SERVICES["prometheus"]["image"].startswith("prom/prometheus:v2.")
    assert SERVICES["grafana"]["image"].startswith("grafana/grafana:")
    for name, port in (("prometheus", 9090), ("grafana", 3000)):
        assert "healthcheck" in SERVICES[name], name
        assert any(str(p).endswith(f":{port}") for p in SERVICES[name]["ports"]), name
    assert SERVICES["exporter"]["command"] == ["exporter"] and "healthcheck" in SERVICES["exporter"]
    for flink in ("flink-jobmanager", "flink-taskmanager"):
        props = SERVICES[flink]["environment"]["FLINK_PROPERTIES"]
        assert "PrometheusReporterFactory" in props and "metrics.reporter.prom.port: 9249" in props


def test_compose_prometheus_scrapes_every_component(tmp_path: Path) -> None:
    mounts = _mounts("prometheus")
    assert mounts["/etc/prometheus/rules.yml"] == "deploy/prometheus/rules.yml"
    config = yaml.safe_load((REPO_ROOT / mounts["/etc/prometheus/prometheus.yml"]).read_text())
    assert config["rule_files"] == ["/etc/prometheus/rules.yml"]
    local = prometheus_config(load_settings(), PROMETHEUS_RULES)
    jobs = {j["job_name"]: j for j in config["scrape_configs"]}
    assert set(jobs) == {j["job_name"] for j in local["scrape_configs"]}
    for job in jobs.values():
        hosts = [t.rsplit(":", 1)[0] for c in job.get("static_configs", []) for t in c["targets"]]
        hosts += [n for c in job.get("dns_sd_configs", []) for n in c["names"]]
        assert hosts, job
        for host in hosts:
            assert host == "localhost" or host in SERVICES, (job["job_name"], host)
    promtool = shutil.which("promtool")
    assert promtool, "promtool not found: `make setup` installs Debian's prometheus package"
    config["rule_files"] = [str(PROMETHEUS_RULES)]
    copy = tmp_path / "prometheus.yml"
    copy.write_text(yaml.safe_dump(config))
    proc = subprocess.run([promtool, "check", "config", str(copy)], capture_output=True,
                          text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_grafana_dashboard_is_provisioned_and_reads_real_series() -> None:
    mounts = _mounts("grafana")
    provisioning = REPO_ROOT / mounts["/etc/grafana/provisioning"]
    (source,) = yaml.safe_load(
        (provisioning / "datasources" / "prometheus.yml").read_text())["datasources"]
    assert source["url"] == "http://prometheus:9090"
    (provider,) = yaml.safe_load(
        (provisioning / "dashboards" / "streamrec.yml").read_text())["providers"]
    assert provider["options"]["path"] == "/var/lib/grafana/dashboards"
    dashboards = list((REPO_ROOT / mounts["/var/lib/grafana/dashboards"]).glob("*.json"))
    assert dashboards
    recorded = set(re.findall(r"record: (streamrec:\S+)", PROMETHEUS_RULES.read_text()))
    exported = exported_names()
    for path in dashboards:
        dash = json.loads(path.read_text())
        assert dash["panels"], path
        for panel in dash["panels"]:
            assert panel["datasource"]["uid"] == source["uid"], panel["title"]
            assert panel["targets"], panel["title"]
            for target in panel["targets"]:
                expr = target["expr"]
                assert set(re.findall(r"\bstreamrec:[\w:]+", expr)) <= recorded, expr
                assert set(re.findall(r"\bstreamrec_\w+", expr)) <= exported, expr
