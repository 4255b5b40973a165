"""Settings: environment round trip and strictness."""

from __future__ import annotations

import pytest
from pydantic import BaseModel, ValidationError

from feature_store.settings import Settings, load_settings, to_env


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
    """README promises every field is described in settings.py; keep that true."""
    missing = [
        f"{name}.{field_name}"
        for field_name, field in section.model_fields.items()
        if not (field.description or "").strip()
    ]
    assert not missing, f"settings without a description: {missing}"
