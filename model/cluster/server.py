"""One parameter-server or worker process: ``python -m model.cluster.server``.

The process runs a ``tf.distribute.Server`` of the given role until it is killed; all work
arrives from the chief over gRPC (``model.cluster.coordinator``). :func:`launch` starts the
processes of a whole layout and waits until each listens.
"""

from __future__ import annotations

import argparse
import logging
import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from model.cluster.spec import ClusterLayout

log = logging.getLogger(__name__)


def serve(layout: ClusterLayout, job: str, index: int, threads: int = 0) -> None:
    """Run the server of ``job:index`` in this process until it is killed (blocks).

    ``threads``: TF intra-op threads (0 = ``TF_NUM_INTRAOP_THREADS``, 1 unless set:
    ``model.towers.tf_env``). The inter-op pool keeps TF's default: with one thread a
    worker's step waits on its reads from the parameter servers holding the only one."""
    from model.towers.tf_env import tf

    config = tf.compat.v1.ConfigProto()
    if threads:
        config.intra_op_parallelism_threads = threads
    server = tf.distribute.Server(
        tf.train.ClusterSpec(layout.as_dict()), job_name=job, task_index=index,
        protocol="grpc", config=config, start=True,
    )
    log.info("%s:%d serving at %s", job, index, layout.address(job, index))
    server.join()


def argv(layout: ClusterLayout, job: str, index: int) -> list[str]:
    """Command line of one server process."""
    return [sys.executable, "-m", "model.cluster.server", "--cluster", layout.to_json(),
            "--job", job, "--index", str(index)]


def die_with_parent() -> None:
    """In the child before exec: SIGKILL it when its parent dies (Linux ``prctl``), so a
    chief killed with -9 leaves no servers behind."""
    import ctypes
    import signal

    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except OSError:
        pass  # not Linux: the servers then outlive a killed chief


def chief_child() -> None:
    """In a server the chief starts, before exec: :func:`die_with_parent`, and SIGINT and
    SIGTERM ignored. ``streamrec down`` and a terminal's Ctrl-C signal the chief's whole
    process group; a server dying of it would take its shard before the chief's orderly
    stop writes its last checkpoint (the stop would fail like a lost server). The chief
    stops its servers itself once that is done (:meth:`LocalCluster.stop`); a chief that
    does not stop in time is killed with its group by SIGKILL, which no process ignores."""
    import signal

    die_with_parent()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_IGN)  # kept across exec (ignored stays ignored)


def listening(address: str, timeout_s: float = 0.5) -> bool:
    host, port = address.rsplit(":", 1)
    try:
        with socket.create_connection((host, int(port)), timeout=timeout_s):
            return True
    except OSError:
        return False


@dataclass
class LocalCluster:
    """Server processes of a layout started by :func:`launch` (the chief runs in the caller)."""

    layout: ClusterLayout
    procs: dict[tuple[str, int], subprocess.Popen[bytes]] = field(default_factory=dict)
    env: Mapping[str, str] = field(default_factory=dict)
    log_dir: Path | None = None

    def start(self, job: str, index: int) -> subprocess.Popen[bytes]:
        if self.log_dir is None:
            proc = subprocess.Popen(
                argv(self.layout, job, index), env={**os.environ, **self.env},
                stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT, preexec_fn=chief_child,
            )
        else:
            self.log_dir.mkdir(parents=True, exist_ok=True)
            with open(self.log_dir / f"{job}-{index}.log", "ab") as out:
                proc = subprocess.Popen(
                    argv(self.layout, job, index), env={**os.environ, **self.env},
                    stdout=out, stderr=subprocess.STDOUT, preexec_fn=chief_child,
                )
        self.procs[(job, index)] = proc
        return proc

    def wait_ready(self, timeout_s: float = 60.0, clock: Callable[[], float] = time.monotonic) -> None:
        """Block until every server listens; raises if one exits or the deadline passes."""
        deadline = clock() + timeout_s
        pending = dict(self.procs)
        while pending:
            for role, proc in list(pending.items()):
                if proc.poll() is not None:
                    raise RuntimeError(f"cluster server {role} exited with {proc.returncode}")
                if listening(self.layout.address(*role)):
                    del pending[role]
            if pending and clock() > deadline:
                raise TimeoutError(f"cluster servers not listening after {timeout_s}s: {sorted(pending)}")
            if pending:
                time.sleep(0.1)

    def kill(self, job: str, index: int) -> None:
        proc = self.procs[(job, index)]
        proc.kill()
        proc.wait()

    def stop(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.kill()
        for proc in self.procs.values():
            proc.wait()


def launch(
    layout: ClusterLayout, env: Mapping[str, str] | None = None, log_dir: Path | None = None,
    timeout_s: float = 60.0,
) -> LocalCluster:
    """Start every parameter server and worker of ``layout`` and wait until they listen."""
    cluster = LocalCluster(layout, env=dict(env or {}), log_dir=log_dir)
    try:
        for job, index in layout.roles():
            cluster.start(job, index)
        cluster.wait_ready(timeout_s)
    except BaseException:
        cluster.stop()
        raise
    return cluster


def main(args: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="Run one parameter server or worker of a cluster.")
    p.add_argument("--cluster", required=True, help="the ClusterLayout as JSON")
    p.add_argument("--job", required=True, choices=["ps", "worker"])
    p.add_argument("--index", type=int, required=True)
    p.add_argument("--threads", type=int, default=0,
                   help="TF intra-op threads (0 = TF_NUM_INTRAOP_THREADS, 1 unless set)")
    ns = p.parse_args(args)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    serve(ClusterLayout.from_json(ns.cluster), ns.job, ns.index, ns.threads)
    return 0


if __name__ == "__main__":
    sys.exit(main())
