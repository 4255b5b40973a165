"""One trained model shared by the model unit tests (tracing a TFRA step takes ~15 s).

Not a ``conftest.py``: test modules import :func:`shared_trainer` explicitly. The cache
lives in this module, so every test file of the session gets the same instance.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache

from model.evaluation.synthetic import SyntheticConfig, SyntheticStream
from model.towers.two_tower import ModelConfig
from model.trainer.samples import KeyCache, Sample, to_batch
from model.trainer.trainer import Batch, Trainer, TrainOptions

HISTORY_LEN = 20
BATCH = 256


@dataclass
class Trained:
    trainer: Trainer
    samples: list[Sample]
    batches: list[Batch]
    item_ids: dict[int, str]


@cache
def shared_trainer() -> Trained:
    """A default-config trainer with the session-kNN part, fitted (test-then-train) on 60
    synthetic batches."""
    stream = SyntheticStream(SyntheticConfig(users=500, items=300, clusters=10, history_len=HISTORY_LEN))
    samples = stream.take(60 * BATCH)
    keys = KeyCache()
    batches = [to_batch(samples[i : i + BATCH], HISTORY_LEN, keys) for i in range(0, len(samples), BATCH)]
    trainer = Trainer(
        ModelConfig(history_len=HISTORY_LEN, sknn_weight=1.0),
        TrainOptions(batch_size=BATCH, eval_rows=64, eval_refresh_steps=5, eval_window=2000),
        tag="shared",
    )
    for batch in batches:
        trainer.fit_batch(batch)
    item_ids = {keys.item(s.item_id): s.item_id for s in samples}
    return Trained(trainer, samples, batches, item_ids)
