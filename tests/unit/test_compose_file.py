"""docker-compose.yml cannot be run here (no Docker engine), so its structure is checked:
services, health checks, ports, dependency conditions, and that every project command is a
real `streamrec` subcommand."""

from __future__ import annotations

import argparse

import yaml

from deploy.cli import build_parser
from tests.support import REPO_ROOT

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
                "features", "trainer", "serving"}
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
