"""One source of truth per knob: ``Settings`` owns the default of every trainer knob; the
option dataclasses read it (``trainer_default``), the command line overrides it through one
path (``with_trainer``), and nothing changes a frozen settings object after it is built."""

from __future__ import annotations

import argparse
import ast
from pathlib import Path

import pytest

from streamrec.settings import Settings, TrainerSettings, load_settings, with_trainer
from tests.support import REPO_ROOT

#: Module -> option classes whose fields may name a trainer knob.
OPTION_CLASSES = {
    "model/trainer/options.py": ("TrainOptions",),
    "model/trainer/loop_options.py": ("LoopOptions",),
    "model/towers/config.py": ("ModelConfig",),
}
PACKAGES = ("streamrec", "stream", "model", "serving", "feature_store", "deploy", "bench")


def second_defaults(source: str, classes: tuple[str, ...]) -> list[str]:
    """Fields of ``classes`` named like a trainer knob whose default is not the knob's own
    (``trainer_default("<the field's name>")``)."""
    knobs = set(TrainerSettings.model_fields)
    found = []
    for node in ast.walk(ast.parse(source)):
        if not (isinstance(node, ast.ClassDef) and node.name in classes):
            continue
        for item in node.body:
            if not (isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name)):
                continue
            name = item.target.id
            if name not in knobs or item.value is None:
                continue
            value = item.value
            own = (isinstance(value, ast.Call) and isinstance(value.func, ast.Name)
                   and value.func.id == "trainer_default" and len(value.args) == 1
                   and isinstance(value.args[0], ast.Constant) and value.args[0].value == name)
            if not own:
                found.append(f"{node.name}.{name}")
    return found


@pytest.mark.parametrize("module", sorted(OPTION_CLASSES))
def test_no_option_class_gives_a_trainer_knob_a_second_default(module: str) -> None:
    source = (REPO_ROOT / module).read_text()
    assert second_defaults(source, OPTION_CLASSES[module]) == []


def test_the_knob_check_fails_on_a_second_default() -> None:
    source = (REPO_ROOT / "model/trainer/loop_options.py").read_text()
    broken = source.replace('export_every_s: float = trainer_default("export_every_s")',
                            "export_every_s: float = 30.0")
    assert broken != source
    assert second_defaults(broken, ("LoopOptions",)) == ["LoopOptions.export_every_s"]


def test_option_classes_carry_the_settings_defaults() -> None:
    from model.towers.config import ModelConfig
    from model.trainer.loop_options import LoopOptions
    from model.trainer.options import TrainOptions

    settings = Settings()
    built = (ModelConfig.from_settings(settings), TrainOptions.from_settings(settings),
             LoopOptions.from_settings(settings))
    for obj in built:
        for name in set(type(obj).__dataclass_fields__) & set(TrainerSettings.model_fields):
            assert getattr(obj, name) == getattr(settings.trainer, name), name
            assert type(obj).__dataclass_fields__[name].default == getattr(
                settings.trainer, name), name


def test_train_flags_override_settings_and_default_to_them() -> None:
    from model.cli.train import KNOB_FLAGS, knob_overrides, register

    parser = argparse.ArgumentParser()
    register(parser.add_subparsers())
    untouched = parser.parse_args(["train"])
    assert knob_overrides(untouched) == {}  # no flag: every knob as the settings say
    for _, key, _, _ in KNOB_FLAGS:
        assert key in TrainerSettings.model_fields, key
    args = parser.parse_args(["train", "--batch-size", "64", "--evict-every", "0",
                              "--no-fused-loss", "--mixed-precision"])
    settings = with_trainer(load_settings(), **knob_overrides(args))
    t = settings.trainer
    assert (t.batch_size, t.evict_every_steps, t.fused_loss, t.mixed_precision) == (
        64, 0, False, True)
    with pytest.raises(ValueError):
        with_trainer(settings, batch_timeout_s=-1.0)  # validated like the settings


def test_nothing_writes_into_a_frozen_object() -> None:
    offenders = [
        str(path.relative_to(REPO_ROOT))
        for package in PACKAGES
        for path in Path(REPO_ROOT / package).rglob("*.py")
        if "object.__setattr__" in path.read_text()
    ]
    assert offenders == []
