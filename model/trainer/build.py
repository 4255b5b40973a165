"""The trainer service built from settings: the one place the CLI, the tests and the benches
build the trainer's model, options and loop."""

from __future__ import annotations

from typing import Any

from model.towers.two_tower import ModelConfig
from model.trainer.loop_options import LoopOptions
from model.trainer.options import TrainOptions
from model.trainer.service import Clock, TrainerService
from model.trainer.trainer import Trainer
from streamrec.settings import Settings


def build_service(
    settings: Settings,
    model_config: ModelConfig | None = None,
    options: TrainOptions | None = None,
    loop: LoopOptions | None = None,
    *,
    clock: Clock,
    redis_client: Any | None = None,
) -> TrainerService:
    """A service with its trainer built from settings (explicit configs win): the one place
    the CLI, the tests and the benches build the trainer's model, options and loop."""
    config = model_config or ModelConfig.from_settings(settings)
    opts = options or TrainOptions.from_settings(settings)
    return TrainerService(settings, Trainer(config, opts), loop, clock=clock, redis_client=redis_client)
