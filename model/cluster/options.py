"""What the cluster trainer accepts: :class:`ClusterOptions`, :func:`check_supported`, and
its errors (no TensorFlow: checked before a cluster is started).
"""

from __future__ import annotations

from dataclasses import dataclass

from model.errors import ModelError
from model.towers.config import ModelConfig
from model.trainer.options import TrainOptions


class ClusterError(ModelError):
    """The cluster cannot train this config, or its state is not consistent."""


class StepsReplayed(ClusterError):
    """A step began more than once since the last cut (a worker failed mid-step)."""


@dataclass(frozen=True)
class ClusterOptions:
    #: dtype of rows and gradients on the wire ("float32" or "bfloat16"; tables stay
    #: float32); bfloat16 evaluates within noise of float32 (docs/cluster.md)
    wire_dtype: str = "bfloat16"
    #: Steps scheduled after an evaluated one before its head goes to the evaluation
    #: thread (which fetches it from the worker): the chief never waits for a step it has
    #: just scheduled, and the evaluation lags the training by this many batches at most.
    head_lag_steps: int = 4


def check_supported(config: ModelConfig, options: TrainOptions) -> None:
    """Raise :class:`ClusterError` naming what the cluster step does not support yet."""
    unsupported = []
    if config.attention:
        unsupported.append("the attention user tower (user_tower='attention')")
    if not config.train_history:
        unsupported.append("train_history=False (--no-history-grad)")
    if options.grad_accum_steps > 1:
        unsupported.append("gradient accumulation (--grad-accum > 1)")
    if options.mixed_precision or config.compute_dtype != "float32":
        unsupported.append("bfloat16 compute (--mixed-precision)")
    if not options.dedup_lookups:
        unsupported.append("dedup_lookups=False")
    if config.attr_tokens:
        unsupported.append("item attribute slots (trainer.attr_tokens > 0)")
    if unsupported:
        raise ClusterError("the cluster trainer does not support " + ", ".join(unsupported))
