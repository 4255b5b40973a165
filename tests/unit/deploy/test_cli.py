"""The `streamrec` CLI: every subcommand explains itself, and help stays light."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import pytest

from deploy import cli_stack
from deploy.cli import build_parser, main


def _subcommands() -> dict[str, argparse.ArgumentParser]:
    for action in build_parser()._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    raise AssertionError("no subcommands")


def test_stack_and_pipeline_commands_exist() -> None:
    names = set(_subcommands())
    assert {"up", "down", "status", "topics", "bench", "simulate"} <= names


@pytest.mark.parametrize("name", sorted(_subcommands()))
def test_each_subcommand_has_a_description(name: str) -> None:
    parser = _subcommands()[name]
    assert (parser.description or "").strip(), f"`streamrec {name} --help` explains nothing"


def test_help_does_not_load_heavy_libraries() -> None:
    code = (
        "import sys\n"
        "from deploy.cli import build_parser\n"
        "build_parser().format_help()\n"
        "heavy = [m for m in ('tensorflow', 'pyflink', 'fastapi', 'kafka') if m in sys.modules]\n"
        "print(','.join(heavy))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


def test_no_command_prints_help_and_fails(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([]) == 2
    assert "streamrec" in capsys.readouterr().out


def test_bench_help_says_it_needs_a_source_checkout() -> None:
    description = " ".join((_subcommands()["bench"].description or "").split())
    assert "source checkout" in description


def test_bench_without_a_checkout_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """An installed package has no bench/: the command explains, it does not crash."""
    monkeypatch.setattr(cli_stack, "REPO_ROOT", tmp_path)
    assert main(["bench", "ingest"]) == 2
    err = capsys.readouterr().err
    assert "source checkout" in err
    assert str(tmp_path / "bench") in err


def test_bench_with_a_checkout_runs_the_script(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "bench").mkdir()
    (tmp_path / "bench" / "ingest.py").write_text(
        "def main(argv):\n    return 0 if argv == ['--x', '1'] else 3\n"
    )
    monkeypatch.setattr(cli_stack, "REPO_ROOT", tmp_path)
    assert main(["bench", "ingest", "--x", "1"]) == 0


def test_demo_names_the_served_state_with_its_deltas() -> None:
    from deploy.demo import served_model

    assert served_model({}) == ("-", None)
    assert served_model({"version": "v1", "age_s": 40.0}) == ("v1", 40.0)
    assert served_model({"version": "v1", "age_s": 40.0,
                         "delta": {"seq": 0, "lag_s": None}}) == ("v1", 40.0)
    assert served_model({"version": "v1", "age_s": 40.0,
                         "delta": {"seq": 17, "lag_s": 0.8}}) == ("v1+17", 0.8)
