"""The parameter-server cluster on real processes (``model.cluster``): exactness probe,
eviction, evaluate, the trainer from Kafka (with its per-role metrics) and kill -9 of each
role.

Each run is a child process (its chief joins the cluster, which a pytest process must not),
on free ports, with 2 parameter servers and 2 workers of its own.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from model.artifact.files import load_artifact
from model.artifact.registry import Registry
from model.evaluation.synthetic import SyntheticConfig, SyntheticStream
from model.trainer.samples import sample_digest
from serving.stats import Samples, parse_metrics
from streamrec.settings import Settings
from tests.integration.test_trainer import _env
from tests.support import REPO_ROOT, free_port, produce_samples, shared_data, wait_until

pytestmark = pytest.mark.integration

#: Deadline for the chief's four servers to listen: each imports TensorFlow, which took
#: over 90 s (the default) on the shared 2-core machine at a load average of ~50.
SERVERS_READY_S = "240"


def _probe(tmp_path: Path, *args: str) -> dict[str, object]:
    out = tmp_path / "probe.json"
    proc = subprocess.run(
        [sys.executable, "-m", "model.cluster.probe", "--ps", "2", "--workers", "2",
         "--json", str(out), *args],
        cwd=REPO_ROOT, env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
        capture_output=True, timeout=240, check=False,
    )
    assert out.is_file(), proc.stderr.decode()[-3000:]
    return json.loads(out.read_text())


def test_no_update_lost_or_doubled_on_two_ps_two_workers(tmp_path: Path) -> None:
    """Shared and disjoint keys in one run, bfloat16 on the wire (the probe's rows,
    gradients and accumulator steps are small integers, exact in bfloat16; float32 takes
    the same per-shard path without the casts)."""
    r = _probe(tmp_path, "--keys", "mixed", "--steps", "150", "--per-step", "48",
               "--wire-dtype", "bfloat16")
    assert r["wrong_rows"] == 0, r["examples_wrong"]
    assert r["wrong_accumulators"] == 0
    assert r["rows"] == r["keys"]
    assert r["begun"] == r["steps"]  # no step ran twice without a failure
    # both shards hold rows (key % 2)
    assert all(n > 0 for n in r["rows_per_shard"])  # type: ignore[attr-defined]
    # each step's keys half shared with other steps, half its own
    assert r["keys_once"] == r["steps"] * 24
    assert r["keys_in_several_steps"] == r["keys"] - r["keys_once"] > 0


def test_eviction_keeps_the_most_recent_rows_of_the_sharded_tables(tmp_path: Path) -> None:
    """16 steps of 1024 new users each, cap 4096 rows, eviction every 4 steps: after the
    last one the shards hold exactly the users of the last 4 steps (plus the default row)."""
    out = tmp_path / "memory.json"
    proc = subprocess.run(
        [sys.executable, "-m", "bench.cluster_memory", "--rows", "16384", "--batch", "1024",
         "--max-user-rows", "4096", "--evict-every", "4", "--report-every", "8192",
         "--json", str(out)],
        cwd=REPO_ROOT, env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
        capture_output=True, timeout=300, check=False,
    )
    assert out.is_file(), proc.stderr.decode()[-3000:]
    r = json.loads(out.read_text())
    half, final = r["points"][0], r["final"]
    assert r["evicted_rows"] == 16384 - 4096
    assert half["user_rows"] == final["user_rows"] == 4096 + 1  # + DEFAULT_KEY's row
    assert final["user_accumulators"] == 4096  # evicted with their rows
    assert min(final["user_rows_ps0"], final["user_rows_ps1"]) > 1000
    # the cut leaves the rows on the PS: the chief's table keeps its default row only, the
    # checkpoint has a data file per process holding variables (chief, ps0, ps1) and an
    # export reads exactly the users of the last 4 steps from the shards
    assert r["after_cut"]["chief_user_rows"] == 1
    assert len(r["checkpoint"]["data_files_mb"]) == 3
    read = r["export_read"]
    assert (read["user_keys"], read["user_key_min"], read["user_key_max"]) == (4096, 12289, 16384)


def test_evaluate_on_the_cluster_scores_like_one_process(tmp_path: Path) -> None:
    """``streamrec evaluate --ps 2 --workers 2`` (a child: its chief joins the cluster) and
    the one-process evaluation of the same MovieLens prefix."""
    ratings = shared_data() / "ml-latest-small" / "ratings.csv"
    if not ratings.is_file():
        pytest.skip(f"{ratings} is not there")
    argv = ["evaluate", str(ratings), "--format", "movielens", "--limit", "5000",
            "--epochs", "2"]
    out = tmp_path / "cluster.json"
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT),
           "STREAMREC_STACK__RUN_DIR": str(tmp_path / "run")}
    proc = subprocess.run(
        [sys.executable, "-m", "deploy.cli", *argv, "--ps", "2", "--workers", "2",
         "--wire-dtype", "bfloat16", "--json", str(out)],
        cwd=REPO_ROOT, env=env, capture_output=True, timeout=300, check=False,
    )
    assert proc.returncode == 0 and out.is_file(), proc.stderr.decode()[-3000:]
    from deploy.cli import main

    assert main([*argv, "--json", str(tmp_path / "one.json")]) == 0
    cluster = json.loads(out.read_text())
    one = json.loads((tmp_path / "one.json").read_text())
    assert cluster["config"]["cluster"] == {"ps": 2, "workers": 2, "wire_dtype": "bfloat16"}
    assert cluster["scored"] == one["scored"] > 1500
    assert cluster["recall@10"] > 1.3 * cluster["baselines"]["popularity"]["recall@10"]
    assert abs(cluster["recall@10"] - one["recall@10"]) < 0.06, (cluster, one)


@pytest.fixture(scope="module")
def heads(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One run of ``tests.integration.cluster_heads`` (its own 2 PS + 2 workers)."""
    out = tmp_path_factory.mktemp("heads") / "heads.json"
    proc = subprocess.run(
        [sys.executable, "-m", "tests.integration.cluster_heads", "--json", str(out)],
        cwd=REPO_ROOT, env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
        capture_output=True, timeout=300, check=False,
    )
    assert proc.returncode == 0 and out.is_file(), proc.stderr.decode()[-3000:]
    result: dict[str, Any] = json.loads(out.read_text())
    return result


def test_the_chiefs_user_tower_reads_the_rows_the_shards_hold(heads: dict[str, Any]) -> None:
    """``ClusterTrainer.tower_users`` (evaluate's scoring) equals the user vectors a worker
    step computes for the same rows before its update: the chief reads the rows from the
    parameter servers, not from its own tables, which no cut fills any more."""
    r = heads
    assert r["rows"] == 32
    assert r["max_abs"] > 0.01  # trained vectors, not zeros
    assert r["max_abs_diff"] < 1e-4 * max(1.0, r["max_abs"]), r


def test_a_further_pass_over_a_batch_waits_for_the_pass_before_it(
    heads: dict[str, Any],
) -> None:
    """Three passes over one batch on two workers (evaluate's ``--epochs``, the live
    trainer's spare epochs): each further pass is scheduled only once every earlier step
    has finished, so it steps from the state its previous pass left, as one process does.
    Two passes in flight at once would each step from the same state (the cluster's
    evaluate scored 1.3-2.3% below one process so)."""
    assert heads["passes_idle_at_schedule"] == [True, True, True]


# -- the trainer on the cluster, from Kafka --------------------------------------------------


def _train(
    settings: Settings, root: Path, cluster: bool, total: int,
    while_up: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Run ``streamrec train`` (one process or 2 PS + 2 workers) over the samples topic
    until ``total`` samples are trained; returns the manifest of its last version.

    With ``while_up`` the trainer runs without ``--max-samples``: once it reports ``total``
    samples trained, ``while_up(its base URL)`` runs, then SIGTERM stops it (it exports)."""
    s = settings.model_copy(update={"trainer": settings.trainer.model_copy(update={
        "registry_dir": root / "models", "checkpoint_dir": root / "trainer",
        "group_id": f"{settings.trainer.group_id}-{root.name}"})})
    port = free_port()
    env = _env(s, port)
    env["STREAMREC_STACK__RUN_DIR"] = str(root / "run")
    env["STREAMREC_STACK__READY_TIMEOUT_S"] = SERVERS_READY_S
    env["STREAMREC_TRAINER__CLUSTER_METRICS_EVERY_S"] = "1"
    # one optimizer step per batch, partial ones too: the per-role step counts are
    # checked against the batches trained
    env["STREAMREC_TRAINER__SPARE_EPOCHS"] = "1"
    argv = [sys.executable, "-m", "deploy.cli", "train", "--batch-size", "256",
            "--eval-rows", "64", "--eval-every", "1", "--export-every-s", "3600"]
    if while_up is None:
        argv += ["--max-samples", str(total)]
    if cluster:
        argv += ["--ps", "2", "--workers", "2"]
    root.mkdir(parents=True, exist_ok=True)
    url = f"http://127.0.0.1:{port}"
    with (root / "train.log").open("wb") as log:
        # its own process group, which `streamrec down` signals as a whole
        proc = subprocess.Popen(argv, cwd=REPO_ROOT, env=env, stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True)
        try:
            if while_up is not None:
                wait_until(lambda: httpx.get(url + "/health", timeout=2.0).json()
                           .get("samples_trained") == total, 300, f"{total} samples trained",
                           interval_s=0.5, process=proc)
                while_up(url)
                # as `streamrec down` stops it: the servers it started outlive the signal
                # until its last checkpoint and export are written
                os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=300)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    text = (root / "train.log").read_text()
    assert proc.returncode == 0 and "Traceback" not in text, text[-3000:]
    registry = Registry(s.trainer.registry_dir, s.trainer.model_name)
    current = registry.current()
    assert current is not None
    return {**registry.show(current), "path": registry.path(current)}


def test_cluster_trainer_from_kafka_exports_what_one_process_exports(
    settings: Settings, tmp_path: Path
) -> None:
    stream = SyntheticStream(SyntheticConfig(users=400, items=300, clusters=10, history_len=20,
                                             seed=3))
    samples = stream.take(12_000)
    produce_samples(settings, samples)
    scraped: list[Samples] = []
    cluster = _train(settings, tmp_path / "cluster", True, len(samples),
                     lambda url: scraped.append(_settled_cluster_metrics(url)))
    single = _train(settings, tmp_path / "single", False, len(samples))
    expected = str(sample_digest([s.sample_id for s in samples]))
    for manifest in (cluster, single):
        assert manifest["samples_trained"] == len(samples)
        assert manifest["sample_digest"] == expected
        assert sum(manifest["kafka_offsets"].values()) == len(samples)
    a, b = load_artifact(cluster["path"]), load_artifact(single["path"])
    # serving cannot tell them apart: the same format, ids and shapes
    assert sorted(a.item_ids) == sorted(b.item_ids)
    assert set(a.user_keys.tolist()) == set(b.user_keys.tolist())
    assert a.item_vectors.shape == b.item_vectors.shape
    assert [w.shape for w, _, _ in a.layers] == [w.shape for w, _, _ in b.layers]
    qa, qb = cluster["metrics"], single["metrics"]
    # the rows of each table split over both parameter servers (key % 2)
    for table in ("user_rows", "item_rows"):
        shards = [qa[f"{table}_ps{i}"] for i in range(2)]
        assert sum(shards) == qa[table] and min(shards) > 0, qa
    assert qa["ndcg@10"] > qa["popularity_ndcg@10"], qa
    assert abs(qa["recall@10"] - qb["recall@10"]) < 0.1, (qa, qb)
    _check_cluster_metrics(scraped[0], samples)


# -- the cluster's per-role metrics (scraped from the run above) --------------------------------


def _value(m: Samples, name: str, **labels: str) -> float:
    return m[(name, tuple(sorted(labels.items())))]


def _per(m: Samples, name: str, role: str, **labels: str) -> dict[str, float]:
    """``{index: value}`` of a series over the indexes of ``role``."""
    out = {}
    for (n, lab), v in m.items():
        d = dict(lab)
        if n == name and d.get("role") == role and all(d.get(k) == x for k, x in labels.items()):
            out[d["index"]] = v
    return out


def _settled_cluster_metrics(url: str) -> Samples:
    """The trainer's /metrics once a cluster sample was read after every step finished
    (steps finished on the workers = batches the chief trained, none in flight) and every
    step's head was fetched (``--eval-every 1``: the evaluation thread fetches each a few
    steps after it was scheduled, the rest once the trainer is idle)."""

    def settled() -> Samples | None:
        m = parse_metrics(httpx.get(url + "/metrics", timeout=5.0).text)
        batches = _value(m, "streamrec_trainer_batches_total")
        steps = sum(_per(m, "streamrec_cluster_step_seconds_count", "worker").values())
        in_flight = _value(m, "streamrec_cluster_steps_in_flight", role="chief", index="0")
        fetched = _value(m, "streamrec_cluster_wait_seconds_count", wait="fetch", role="chief",
                         index="0")
        done = batches > 0 and steps == batches == fetched and in_flight == 0
        return m if done else None

    return wait_until(settled, 120, "cluster metrics of every step", interval_s=0.5)


def _check_cluster_metrics(m: Samples, samples: list[Any]) -> None:
    """Real figures of the 2 PS + 2 workers run: rows per shard add up to what the chief
    admitted, every byte a PS booked is one a worker booked, one step time per step."""
    roles = {(dict(lab)["role"], dict(lab)["index"])
             for (name, lab) in m if name == "streamrec_cluster_role"}
    assert roles == {("chief", "0"), ("ps", "0"), ("ps", "1"), ("worker", "0"), ("worker", "1")}
    batches = _value(m, "streamrec_trainer_batches_total")
    distinct = {"user": len({s.user_id for s in samples}), "item": len({s.item_id for s in samples})}
    for table in ("user", "item"):
        shards = _per(m, "streamrec_cluster_shard_rows", "ps", table=table)
        admitted = _value(m, "streamrec_cluster_admitted_rows", role="chief", index="0",
                          table=table)
        assert len(shards) == 2 and min(shards.values()) > 0, shards
        # every admitted key has its row, plus the table's default row on one shard
        assert sum(shards.values()) == admitted + 1 == distinct[table] + 1, (table, shards, admitted)
    sent, received = ("streamrec_cluster_sent_bytes_total", "streamrec_cluster_received_bytes_total")
    ps_in, ps_out = _per(m, received, "ps"), _per(m, sent, "ps")
    w_out, w_in = _per(m, sent, "worker"), _per(m, received, "worker")
    chief_out = _value(m, sent, role="chief", index="0")
    assert min(ps_in.values()) > 0 and min(ps_out.values()) > 0, (ps_in, ps_out)
    assert chief_out > 0 and _value(m, received, role="chief", index="0") > 0
    # the two sides' books of the same exchanges agree (the chief's inputs reach a worker)
    assert sum(ps_in.values()) == sum(w_out.values())
    assert sum(ps_out.values()) + chief_out == sum(w_in.values())
    # one worker step time per step, each a real duration
    counts = _per(m, "streamrec_cluster_step_seconds_count", "worker")
    seconds = _per(m, "streamrec_cluster_step_seconds_sum", "worker")
    assert sum(counts.values()) == batches > 0
    assert all(seconds[i] > 0 for i, n in counts.items() if n), seconds
    inf = _per(m, "streamrec_cluster_step_seconds_bucket", "worker", le="+Inf")
    assert inf == counts
    # the chief: one schedule per step, one fetch wait per evaluated step (--eval-every 1)
    chief = {"role": "chief", "index": "0"}
    assert _value(m, "streamrec_cluster_schedule_seconds_count", **chief) == batches
    assert _value(m, "streamrec_cluster_wait_seconds_count", wait="fetch", **chief) == batches
    assert _value(m, "streamrec_trainer_fetch_wait_seconds_count") > 0
    per_step = (sum(ps_in.values()) + sum(ps_out.values())) / batches
    logging.getLogger(__name__).info(
        "cluster per step: %.0f B to and from the PS, %.1f ms on a worker; steps per worker %s",
        per_step, 1000 * sum(seconds.values()) / batches, counts)


# -- kill -9 of each role --------------------------------------------------------------------


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _children(pid: int, marker: str) -> list[int]:
    """Pids of the processes whose parent is ``pid`` and whose command line has ``marker``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == pid and marker in cmd:
            found.append(int(entry.name))
    return found


class _Feeder(threading.Thread):
    """Produces ``samples`` at ``per_s`` until ``rest`` is set, then the rest at once."""

    def __init__(self, settings: Settings, samples: list[Any], per_s: float,
                 rest: threading.Event) -> None:
        super().__init__(daemon=True)
        self.settings, self.samples, self.per_s, self.rest = settings, samples, per_s, rest
        self.error: BaseException | None = None

    def _paced(self) -> Iterator[Any]:
        step = max(1, int(self.per_s / 10))
        for i in range(0, len(self.samples), step):
            yield from self.samples[i : i + step]
            self.rest.wait(step / self.per_s)  # the pace; ends early once the rest is due

    def run(self) -> None:
        try:
            produce_samples(self.settings, self._paced())
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            self.error = exc


class _Supervised:
    """``streamrec train --ps 2 --workers 2`` restarted whenever it exits before the end, as
    `streamrec up` restarts a component (the chief starts its own servers)."""

    def __init__(self, settings: Settings, root: Path, total: int) -> None:
        self.env = _env(settings, free_port())
        self.env["STREAMREC_STACK__RUN_DIR"] = str(root / "run")
        self.env["STREAMREC_STACK__READY_TIMEOUT_S"] = SERVERS_READY_S
        self.port = int(self.env["STREAMREC_TRAINER__METRICS_PORT"])
        self.root, self.total = root, total
        self.proc: subprocess.Popen[bytes] | None = None
        self.exits: list[int] = []

    def start(self) -> None:
        log = (self.root / f"chief-{len(self.exits)}.log").open("wb")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "deploy.cli", "train", "--ps", "2", "--workers", "2",
             "--batch-size", "256", "--eval-rows", "32", "--export-every-s", "2",
             "--evict-every", "0", "--max-samples", str(self.total)],
            cwd=REPO_ROOT, env=self.env, stdout=log, stderr=subprocess.STDOUT,
        )

    def poll(self) -> None:
        """Restart the chief if it exited before training everything."""
        assert self.proc is not None
        code = self.proc.poll()
        if code is not None:
            self.exits.append(code)
            if code != 0:
                self.start()

    def health(self) -> dict[str, Any]:
        self.poll()
        try:
            return httpx.get(f"http://127.0.0.1:{self.port}/health", timeout=2.0).json()
        except httpx.HTTPError:
            return {}

    def trained(self) -> int:
        return int(self.health().get("samples_trained", 0))

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=30)


def test_kill_9_of_a_worker_a_ps_and_the_chief_still_trains_every_sample_once(
    settings: Settings, tmp_path: Path
) -> None:
    stream = SyntheticStream(SyntheticConfig(users=300, items=200, history_len=20, seed=8))
    samples = stream.take(60_000)
    # The samples trickle in (all of them over 240 s) until the kills are done, then the rest
    # at once: a chief with every sample at hand can train to the end and cut within the
    # watchdog's grace of a kill, leaving its restart nothing to train past that cut.
    rest = threading.Event()
    feeder = _Feeder(settings, samples, len(samples) / 240.0, rest)
    feeder.start()
    registry = Registry(settings.trainer.registry_dir, settings.trainer.model_name)
    run = _Supervised(settings, tmp_path, len(samples))
    run.start()
    try:
        for role in ("--job worker", "--job ps", "chief"):
            # live progress past the newest cut, so the kill loses uncheckpointed work
            wait_until(lambda: registry.current() is not None
                       and run.trained() > registry.show(registry.current())["samples_trained"]
                       and run.trained() < len(samples), 240, f"progress before killing {role}")
            assert run.proc is not None
            servers = _children(run.proc.pid, "model.cluster.server")
            if role == "chief":
                victim = run.proc.pid
            else:
                (victim, *_) = _children(run.proc.pid, role)
            chief = run.proc
            os.kill(victim, signal.SIGKILL)
            # a lost server ends the chief (its watchdog), which takes its servers with it
            chief.wait(timeout=60)
            wait_until(lambda servers=servers: not any(map(_alive, servers)), 30,
                       "the chief's servers to exit with it")
        rest.set()
        feeder.join(120)
        assert not feeder.is_alive() and feeder.error is None, feeder.error
        wait_until(lambda: run.health().get("samples_trained") == len(samples)
                   or (run.proc is not None and run.proc.poll() == 0), 300, "all samples trained")
        wait_until(lambda: run.proc is not None and run.proc.poll() is not None, 120,
                   "the chief to stop after --max-samples")
        run.poll()
    finally:
        run.stop()
    manifest = registry.show(registry.current())  # type: ignore[arg-type]
    assert manifest["samples_trained"] == len(samples)
    assert manifest["sample_digest"] == str(sample_digest([s.sample_id for s in samples]))
    assert sum(manifest["kafka_offsets"].values()) == len(samples)
    # each kill ended the chief without saving (a lost server: its watchdog kills it, or a
    # step re-run was detected at the next cut: it exits 1) and its restart resumed from the
    # last cut; the last run finished the topic
    assert all(code in (1, -signal.SIGKILL) for code in run.exits[:-1]), run.exits
    assert len(run.exits) >= 4 and run.exits[-1] == 0, run.exits

