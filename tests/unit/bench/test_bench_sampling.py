"""The benchmarks' own sampling rules (pure logic): probe gaps and the host record."""

from __future__ import annotations

import random

import pytest

from bench.freshness import gap
from bench.host import host


def test_probe_gaps_average_the_interval_within_half_of_it() -> None:
    rng = random.Random(3)
    gaps = [gap(rng, 2.0) for _ in range(2000)]
    assert all(1.0 <= g <= 3.0 for g in gaps)
    assert sum(gaps) / len(gaps) == pytest.approx(2.0, abs=0.05)


def test_probes_meet_a_periodic_update_at_every_phase() -> None:
    """A fixed gap of twice the deltas' period meets them at one phase only; drawn gaps
    fall in every tenth of the period."""
    period, rng, now = 1.0, random.Random(7), 0.0
    deciles = set()
    for _ in range(200):
        now += gap(rng, 2.0 * period)
        deciles.add(int((now % period) / period * 10))
    assert deciles == set(range(10))


def test_the_host_record_names_the_processor_and_times_its_probes() -> None:
    facts = host()
    assert facts["cores"] >= 1
    assert isinstance(facts["cpu"], str) and facts["cpu"]
    assert set(facts["flags"]) <= {"avx2", "fma", "avx512f", "avx512_bf16", "avx512_vnni"}
    assert facts["sgemm_108k_x33_b8_ms"] > 0 and facts["python_loop_100k_ms"] > 0
    assert "sgemm_108k_x33_b8_ms" not in host(probe=False)
