"""The cluster's layout: chief, parameter servers and workers on local ports (no TensorFlow).

A :class:`ClusterLayout` is the ``tf.train.ClusterSpec`` dict of one cluster, picked from
free ports at run time (never fixed ones) and passed to every role as JSON, so each process
(``python -m model.cluster.server``) and the chief agree on the same addresses.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass

from streamrec.ports import free_ports

CHIEF, PS, WORKER = "chief", "ps", "worker"


@dataclass(frozen=True)
class ClusterLayout:
    """Addresses (``host:port``) of the chief, the parameter servers and the workers."""

    chief: str
    ps: tuple[str, ...]
    workers: tuple[str, ...]

    def __post_init__(self) -> None:
        if not self.ps or not self.workers:
            raise ValueError("a cluster needs at least one parameter server and one worker")

    @classmethod
    def local(cls, num_ps: int, num_workers: int, host: str = "127.0.0.1") -> ClusterLayout:
        """A layout on free ports of ``host``."""
        ports = free_ports(1 + num_ps + num_workers, host)
        addr = [f"{host}:{p}" for p in ports]
        return cls(addr[0], tuple(addr[1 : 1 + num_ps]), tuple(addr[1 + num_ps :]))

    @classmethod
    def from_ports(
        cls, chief: int, ps: Sequence[int], workers: Sequence[int], host: str = "127.0.0.1"
    ) -> ClusterLayout:
        return cls(
            f"{host}:{chief}", tuple(f"{host}:{p}" for p in ps), tuple(f"{host}:{p}" for p in workers)
        )

    @classmethod
    def from_base(cls, host: str, base: int, num_ps: int, num_workers: int) -> ClusterLayout:
        """Consecutive ports from ``base``: the chief, then each PS, then each worker."""
        ports = list(range(base, base + 1 + num_ps + num_workers))
        return cls.from_ports(ports[0], ports[1 : 1 + num_ps], ports[1 + num_ps :], host)

    @property
    def num_ps(self) -> int:
        return len(self.ps)

    @property
    def num_workers(self) -> int:
        return len(self.workers)

    def as_dict(self) -> dict[str, list[str]]:
        """The ``tf.train.ClusterSpec`` dict."""
        return {CHIEF: [self.chief], PS: list(self.ps), WORKER: list(self.workers)}

    def to_json(self) -> str:
        return json.dumps(self.as_dict(), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> ClusterLayout:
        data = json.loads(text)
        return cls(data[CHIEF][0], tuple(data[PS]), tuple(data[WORKER]))

    def address(self, job: str, index: int) -> str:
        return self.as_dict()[job][index]

    def ps_devices(self) -> list[str]:
        """TF device names of the parameter servers, in shard order (key % num_ps)."""
        return [f"/job:{PS}/replica:0/task:{i}/device:CPU:0" for i in range(self.num_ps)]

    def roles(self) -> list[tuple[str, int]]:
        """(job, index) of every server process (the chief's own server runs in the chief)."""
        return [(PS, i) for i in range(self.num_ps)] + [(WORKER, i) for i in range(self.num_workers)]
