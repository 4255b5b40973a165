"""What machine a benchmark ran on, written into its JSON beside the figures.

The same 2-core size of machine has come with different processors from one day to the
next (serving's requests/s moved ~1.5x between them at the same code), so a figure is only
comparable with another one of the same host, or through a probe of the host's speed.
:func:`host` gives the processor, the cores the process may use, the instruction sets that
change numpy's kernels, and two probes timed here: a float32 matrix product of serving's
shape (``~108k`` items by 33 dims, a batch of 8 queries, one BLAS thread, as
``streamrec serve`` runs it) and a loop of pure Python, in a child process (so the BLAS
thread count is the probe's own). Each probe is the median of a few dozen repeats; with
the child's start they take ~0.5 s.

    python -m bench.host          # the facts and the probes, as JSON
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

_REPO = Path(__file__).resolve().parent.parent

#: Instruction sets worth naming: each one changes which kernels OpenBLAS and numpy pick.
_FLAGS = ("avx2", "fma", "avx512f", "avx512_bf16", "avx512_vnni")


def _cpuinfo() -> tuple[str, set[str]]:
    model, flags = platform.processor() or "unknown", set()
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return model, flags
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "model name" and value.strip():
            model = value.strip()
        elif key.strip() == "flags":
            flags = set(value.split())
    return model, flags


def _median_ms(fn: Any, repeats: int) -> float:
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return round(float(np.median(times)) * 1000.0, 3)


def _python_loop() -> int:
    total = 0
    for i in range(100_000):
        total += i * i % 7
    return total


def host(probe: bool = True) -> dict[str, Any]:
    """The host's processor, usable cores, memory, instruction sets and (``probe``) speed."""
    model, flags = _cpuinfo()
    out: dict[str, Any] = {
        "cpu": model,
        "cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
        else os.cpu_count(),
        "flags": [f for f in _FLAGS if f in flags],
        "memory_gib": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1),
        "kernel": platform.release(),
        "load_avg": [round(x, 2) for x in os.getloadavg()],
    }
    if probe:
        child = subprocess.run(
            [sys.executable, "-c", "import json, bench.host as h; print(json.dumps(h.probes()))"],
            env=dict(os.environ, OPENBLAS_NUM_THREADS="1",
                     PYTHONPATH=os.pathsep.join(filter(None, [str(_REPO),
                                                              os.environ.get("PYTHONPATH")]))),
            capture_output=True, text=True, check=True)
        out.update(json.loads(child.stdout))
    return out


def probes() -> dict[str, float]:
    """The speed probes, in this process (its BLAS threads as they are)."""
    rng = np.random.default_rng(0)
    items = rng.standard_normal((108_000, 33)).astype(np.float32)
    queries = rng.standard_normal((8, 33)).astype(np.float32)
    return {"sgemm_108k_x33_b8_ms": _median_ms(lambda: items @ queries.T, 40),
            "python_loop_100k_ms": _median_ms(_python_loop, 20)}


if __name__ == "__main__":
    print(json.dumps(host(), indent=2))
