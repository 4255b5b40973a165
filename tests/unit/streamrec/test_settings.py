"""Settings: environment round trip and strictness."""

from __future__ import annotations

import pytest
from pydantic import BaseModel, ValidationError

from streamrec.settings import Settings, load_settings, to_env


def test_to_env_round_trips_through_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    base = load_settings()
    custom = base.model_copy(update={
        "kafka": base.kafka.model_copy(update={"port": 19999, "events_topic": "x.events"}),
        "features": base.features.model_copy(update={"event_weights": {"click": 2.5}}),
    })
    for key, value in to_env(custom).items():
        monkeypatch.setenv(key, value)
    again = Settings()
    assert again.kafka.port == 19999
    assert again.kafka.events_topic == "x.events"
    assert again.features.event_weights == {"click": 2.5}
    assert again == custom


def test_unknown_settings_are_rejected() -> None:
    with pytest.raises(ValidationError):
        load_settings(kafka={"no_such_field": 1})


def test_settings_are_frozen() -> None:
    s = load_settings()
    with pytest.raises(ValidationError):
        s.kafka.port = 1  # type: ignore[misc]


def _sections() -> list[tuple[str, type[BaseModel]]]:
    out = []
    for name, field in Settings.model_fields.items():
        section = field.annotation
        assert isinstance(section, type) and issubclass(section, BaseModel), name
        out.append((name, section))
    return out


@pytest.mark.parametrize(("name", "section"), _sections(), ids=[n for n, _ in _sections()])
def test_every_setting_has_a_description(name: str, section: type[BaseModel]) -> None:
    """docs/operations.md promises every field is described in settings.py; keep that true."""
    missing = [
        f"{name}.{field_name}"
        for field_name, field in section.model_fields.items()
        if not (field.description or "").strip()
    ]
    assert not missing, f"settings without a description: {missing}"


def test_trainer_folders_follow_the_run_folder_unless_set(monkeypatch: pytest.MonkeyPatch) -> None:
    from pathlib import Path

    from streamrec.settings import load_settings

    for key in ("STREAMREC_STACK__RUN_DIR", "STREAMREC_TRAINER__REGISTRY_DIR",
                "STREAMREC_TRAINER__CHECKPOINT_DIR"):
        monkeypatch.delenv(key, raising=False)
    default = load_settings()
    assert default.trainer.registry_dir == Path(".streamrec/models")
    assert default.trainer.checkpoint_dir == Path(".streamrec/trainer")
    monkeypatch.setenv("STREAMREC_STACK__RUN_DIR", "/srv/rec")
    moved = load_settings()
    assert moved.trainer.registry_dir == Path("/srv/rec/models")
    assert moved.trainer.checkpoint_dir == Path("/srv/rec/trainer")
    monkeypatch.setenv("STREAMREC_TRAINER__REGISTRY_DIR", "/data/models")
    explicit = load_settings()
    assert explicit.trainer.registry_dir == Path("/data/models")
    assert explicit.trainer.checkpoint_dir == Path("/srv/rec/trainer")
