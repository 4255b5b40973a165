"""The chief's side: a ``ParameterServerStrategy`` and its ``ClusterCoordinator``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from model.cluster.spec import CHIEF, ClusterLayout
from model.towers.tf_env import tf


@dataclass(frozen=True)
class Coordinator:
    """The strategy (variables created in its scope live on the PS) and the coordinator
    that schedules steps on the workers."""

    layout: ClusterLayout
    strategy: Any
    coordinator: Any


def connect(layout: ClusterLayout) -> Coordinator:
    """Connect this process as the chief of ``layout`` (its servers must be listening)."""
    resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
        tf.train.ClusterSpec(layout.as_dict()), rpc_layer="grpc", task_type=CHIEF, task_id=0
    )
    strategy = tf.distribute.experimental.ParameterServerStrategy(resolver)
    coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
    return Coordinator(layout, strategy, coordinator)
