"""Serving benchmark: p50/p99 latency and requests/s of GET /recommend.

For each item count it builds a random artifact, seeds a throwaway ``redis-server``, starts
``streamrec serve`` as its own process and drives it with a closed-loop load generator
(``bench/serve.py loadgen``, its own process, one keep-alive connection per concurrent
client), steady and while a new version is published every ``--swap-every`` seconds.

``--retrieval exact,ann`` serves each item count once per way of ranking, one server after
the other (exact search over every item; the ANN index's two stages, ``model.scoring.ann``;
``default``: what ``serving.ann_min_items`` picks). Where the ANN index ranks, the run also
reports ``overlap``: the share of the exact top 10 that the server answered, over the first
``--overlap-users`` users (each request's history read from the same store, the exact top 10
computed in this process on the same version). ``--catalogue clustered`` draws item vectors
around 2,000 tastes with a popularity prior column (a trained catalogue's shape: an index
over isotropic random vectors finds little structure to use); ``gaussian``, the default, is
the artifact every earlier figure used.

    streamrec bench serve [--items 10000,100000] [--concurrency 1,16,64] [--duration 8]
                          [--retrieval default|exact|ann,...] [--catalogue gaussian|clustered]
                          [--json FILE]

The artifact, the JSON fields and the load record: docs/internals.md.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve()
REPO = HERE.parent.parent
USERS = 10_000
D = 32
COVISIT_NEIGHBOURS = 40
#: Histories of the artifact's session-kNN index by default (``--sessions``).
DEFAULT_SESSIONS = 100_000


# ----------------------------------------------------------------------------- load generator


async def _worker(host: str, port: int, users: list[str], k: int, stop_at: float,
                  warm_until: float, lat: list[float], counts: dict[str, int], seed: int) -> None:
    rng = np.random.default_rng(seed)
    reader, writer = await asyncio.open_connection(host, port)
    closed = False
    try:
        while True:
            now = time.perf_counter()
            if now >= stop_at:
                return
            user = users[int(rng.integers(len(users)))]
            if closed:
                reader, writer = await asyncio.open_connection(host, port)
                closed = False
            writer.write(f"GET /recommend?user_id={user}&k={k} HTTP/1.1\r\n"
                         f"Host: {host}\r\n\r\n".encode())
            try:
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n"):
                    if line[:15].lower() == b"content-length:":
                        length = int(line[15:])
                body = await reader.readexactly(length)
            except (asyncio.IncompleteReadError, ConnectionError, ValueError):
                counts["errors"] += 1
                writer.close()
                reader, writer = await asyncio.open_connection(host, port)
                continue
            done = time.perf_counter()
            counts["answered"] += 1
            if b"\r\nconnection: close" in head.lower():  # HTTP/1.1: the server closes it
                counts["closed_by_server"] += 1
                writer.close()
                closed = True  # the next request connects anew, within its latency
            if now < warm_until:
                continue
            lat.append(done - now)
            if not head.startswith(b"HTTP/1.1 200"):
                counts["errors"] += 1
            elif b'"source":"model"' not in body:
                counts["non_model"] += 1
    finally:
        writer.close()


async def _loadgen(url: str, concurrency: int, duration: float, warmup: float,
                   users: list[str], k: int) -> dict[str, Any]:
    host, port = url.split("//", 1)[1].rsplit(":", 1)
    lat: list[float] = []
    # answered: warm-up included; closed_by_server: answers with Connection: close (the
    # next request goes on a new connection, as an HTTP client's pool does)
    counts = {"errors": 0, "non_model": 0, "answered": 0, "closed_by_server": 0}
    start = time.perf_counter()
    warm_until = start + warmup
    stop_at = warm_until + duration
    await asyncio.gather(*(
        _worker(host, int(port), users, k, stop_at, warm_until, lat, counts, i)
        for i in range(concurrency)))
    arr = np.array(lat) * 1000.0
    return {
        "concurrency": concurrency,
        "requests": int(arr.size),
        "p50_ms": round(float(np.percentile(arr, 50)), 3) if arr.size else None,
        "p99_ms": round(float(np.percentile(arr, 99)), 3) if arr.size else None,
        "rps": round(arr.size / duration, 1),
        **counts,
    }


def loadgen_main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="bench/serve.py loadgen")
    p.add_argument("--url", required=True)
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--duration", type=float, default=8.0)
    p.add_argument("--warmup", type=float, default=1.0)
    p.add_argument("--users", type=int, default=USERS)
    p.add_argument("-k", type=int, default=20)
    a = p.parse_args(argv)
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    users = [f"u{i}" for i in range(a.users)]
    result = asyncio.run(_loadgen(a.url, a.concurrency, a.duration, a.warmup, users, a.k))
    print(json.dumps(result))
    return 0


# ----------------------------------------------------------------------------- orchestration


#: Tastes of ``--catalogue clustered``.
TASTES = 2_000


def _item_vectors(rng: np.random.Generator, n_items: int, catalogue: str) -> np.ndarray:
    """``gaussian``: ``[N, D]`` standard normal; ``clustered``: ``[N, D + 1]``, unit rows
    around one of :data:`TASTES` directions (noise 0.5 per unit of norm), times 3 (a learnt
    tower weight over a temperature), then the prior's column ``0.4 * log(1 / rank)`` of a
    random popularity rank (Zipf)."""
    if catalogue == "gaussian":
        return rng.normal(size=(n_items, D)).astype(np.float32)
    tastes = rng.normal(size=(TASTES, D))
    tastes /= np.linalg.norm(tastes, axis=1, keepdims=True)
    out = np.empty((n_items, D + 1), np.float32)
    for lo in range(0, n_items, 1 << 20):  # in chunks: 10M rows of float64 would be 2.6 GB
        hi = min(n_items, lo + (1 << 20))
        v = tastes[rng.integers(0, TASTES, hi - lo)] + 0.5 * rng.normal(size=(hi - lo, D)) / np.sqrt(D)
        out[lo:hi, :D] = 3.0 * v / np.linalg.norm(v, axis=1, keepdims=True)
    out[:, D] = -0.4 * np.log1p(rng.permutation(n_items))
    return out


#: Popularity of :func:`popular_items`: row ``r`` drawn about ``1 / (r + POPULAR_SHIFT)`` as
#: often (at 100k items the first row is ~1.1% of the draws and sits in ~5% of the sessions;
#: YOOCHOOSE's most held item: 2.7% of its sessions).
POPULAR_SHIFT = 10


def popular_items(rng: np.random.Generator, n_items: int, size: int) -> np.ndarray:
    """Item rows drawn with a popular head (:data:`POPULAR_SHIFT`), as a log's histories
    share it."""
    c = POPULAR_SHIFT
    rows = c * np.exp(rng.random(size) * np.log((n_items + c) / c)) - c
    return np.minimum(rows.astype(np.int64), n_items - 1)


def _sessions(rng: np.random.Generator, n_items: int, n_sessions: int, items: list[str]
              ) -> tuple[dict[str, np.ndarray], np.ndarray, dict[str, Any]] | None:
    """A session-kNN index (``model.scoring.sessions``, the model's defaults) learnt from
    ``n_sessions`` histories of 1-30 items (geometric, mean ~5), drawn by
    :func:`popular_items`; None for none."""
    if not n_sessions:
        return None
    from model.artifact.sessions import params_of
    from model.scoring.sessions import SessionIndex
    from model.towers.config import ModelConfig
    from streamrec.ids import item_keys

    cfg = ModelConfig()
    index = SessionIndex(cfg.sknn_sample, cfg.window, cfg.sknn_k or None,
                         max(cfg.sknn_max_sessions, n_sessions))
    lengths = np.minimum(rng.geometric(0.2, n_sessions), 30)
    users = np.repeat(np.arange(1, n_sessions + 1, dtype=np.int64), lengths)
    rows = popular_items(rng, n_items, users.size)
    order = rng.permutation(users.size)  # sessions interleaved, as a stream has them
    keys = np.asarray(item_keys(items), np.int64)
    for lo in range(0, users.size, 1 << 16):
        at = order[lo:lo + (1 << 16)]
        index.learn(users[at] + (1 << 40), keys[rows[at]])
    held = index.items.keys
    by_key = {int(k): r for r, k in enumerate(keys.tolist())}
    item_rows = np.array([by_key[int(k)] for k in held.tolist()], np.int64)
    return index.to_arrays(), item_rows, params_of(index, 1.0)


def _publish(reg: Any, version: str, n_items: int, seed: int, catalogue: str = "gaussian",
             sessions: int = 0) -> None:
    from model.artifact.files import write_artifact
    from model.scoring.selector import GROUP_STARTS
    from model.towers.config import ModelConfig
    from streamrec.ids import item_keys, user_key

    cfg = ModelConfig()  # the served defaults: the co-visitation window a request reads
    rng = np.random.default_rng(seed)
    items = [f"i{i}" for i in range(n_items)]
    # the co-visitation term (``model.scoring.covisit``): COVISIT_NEIGHBOURS random neighbours per
    # item, i.e. the trainer's default cap of 4M pairs at 100k items
    nbrs = np.sort(rng.integers(0, n_items, size=(n_items, COVISIT_NEIGHBOURS)), axis=1)
    covisit = (
        np.arange(n_items + 1, dtype=np.int64) * COVISIT_NEIGHBOURS,
        nbrs.reshape(-1).astype(np.int32),
        rng.exponential(size=n_items * COVISIT_NEIGHBOURS).astype(np.float32),
    )
    index = _sessions(rng, n_items, sessions, items)
    reg.publish(version, lambda d: write_artifact(
        d, version=version, item_ids=items,
        item_vectors=_item_vectors(rng, n_items, catalogue), score_bias=catalogue != "gaussian",
        item_hist_keys=item_keys(items), item_hist_rows=rng.normal(size=(n_items, D)),
        user_keys=np.array([user_key(f"u{i}") for i in range(USERS)]),
        user_rows=rng.normal(size=(USERS, D)), default_user_row=np.zeros(D),
        layers=[(rng.normal(size=(2 * D, 2 * D)) / 8, np.zeros(2 * D), "relu"),
                (rng.normal(size=(2 * D, D)) / 8, np.zeros(D), "linear")],
        normalize=True, manifest_extra={"trained_through_ms": 1_772_000_000_000 + seed},
        covisit=covisit,
        covisit_params={"weight": 2.0, "window": cfg.covisit_window, "decay": cfg.covisit_decay,
                        "last_weight": 1.0},
        sessions=None if index is None else index[:2],
        sessions_params=None if index is None else index[2],
        # the neighbour parts scaled per history size, as the panel's trainers serve them
        history_groups={"window": cfg.window, "starts": list(GROUP_STARTS),
                        "scales": HISTORY_SCALES},
    ))


#: Per history group, the (co-visitation, session-kNN) scales the benchmark's version serves
#: (``model.scoring.selector``; DIGINETICA's leaders on the real-log panel, seed 1).
HISTORY_SCALES = [[1.0, 4.0], [4.0, 16.0]]


def _seed_store(settings: Any, n_items: int) -> None:
    from feature_store.store import HistoryEntry, Trending, UserFeatures, open_store

    rng = np.random.default_rng(0)
    store = open_store(settings)
    users = []
    for i in range(USERS):
        # half the entries from the popular head (as the sessions' items, ``_sessions``)
        rows = np.where(rng.random(20) < 0.5, rng.integers(n_items, size=20),
                        popular_items(rng, n_items, 20))
        hist = tuple(HistoryEntry(f"i{j}", "click", 10_000 - n)
                     for n, j in enumerate(rows.tolist()))
        users.append(UserFeatures(f"u{i}", hist, {}, 10_000, 10_000))
        if len(users) == 1000:
            store.write_batch(users=users)
            users = []
    store.write_batch(trending=Trending(tuple((f"i{j}", 100.0 - j) for j in range(100)), 10_000))
    store.close()


#: ``--retrieval`` -> ``serving.ann_min_items`` of the server (None: its default).
RETRIEVALS = {"default": None, "exact": str(1 << 62), "ann": "1"}


def _run_items(n_items: int, concurrencies: list[int], duration: float, swap_every: float,
               work: Path, workers: int, retrieval: str = "default",
               catalogue: str = "gaussian", overlap_users: int = 500,
               sessions: int = 0) -> list[dict[str, Any]]:
    import httpx
    import redis

    from bench.harness import free_port, http_ok, stop_process, wait_until
    from bench.workers import memory_mb
    from model.artifact.registry import Registry
    from streamrec.settings import load_settings

    rport, sport = free_port(), free_port()
    work = Path(tempfile.mkdtemp(dir=work, prefix=f"{n_items}-{retrieval}-"))  # one per run
    settings = load_settings(redis={"port": rport, "key_prefix": "bench:"},
                             trainer={"registry_dir": work / "models",
                                      "model_name": "bench", "keep_versions": 3})
    (work / "redis").mkdir()
    procs: list[subprocess.Popen] = []
    try:
        procs.append(subprocess.Popen(
            [shutil.which("redis-server") or "redis-server", "--port", str(rport), "--save", "",
             "--appendonly", "no", "--dir", str(work / "redis")],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        client = redis.Redis(port=rport)
        wait_until(client.ping, 20, "redis")
        _seed_store(settings, n_items)
        reg = Registry(settings.trainer.registry_dir, "bench", redis_client=client,
                       key_prefix="bench:", keep=3)
        _publish(reg, "v0001", n_items, 1, catalogue, sessions)
        env = dict(os.environ, STREAMREC_REDIS__PORT=str(rport), STREAMREC_REDIS__KEY_PREFIX="bench:",
                   STREAMREC_TRAINER__REGISTRY_DIR=str(settings.trainer.registry_dir),
                   STREAMREC_TRAINER__MODEL_NAME="bench", STREAMREC_TRAINER__KEEP_VERSIONS="3",
                   OPENBLAS_NUM_THREADS=os.environ.get("OPENBLAS_NUM_THREADS", "1"))
        if RETRIEVALS[retrieval] is not None:
            env["STREAMREC_SERVING__ANN_MIN_ITEMS"] = str(RETRIEVALS[retrieval])
        log = (work / "serve.log").open("w")
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "deploy.cli", "serve", "--port", str(sport),
             "--workers", str(workers)],
            cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT))
        url = f"http://127.0.0.1:{sport}"
        wait_until(lambda: http_ok(url + "/health"), 300, "serve /health")
        # every worker serving (each loads the version, and builds its index, itself)
        wait_until(lambda: _swaps(httpx, url) >= workers, 600, "every worker serving a model")
        ann = _ann_used(httpx, url)
        overlap = _overlap(httpx, url, settings, reg, overlap_users) if ann else None
        if overlap is not None:
            print(f"items={n_items:>6} retrieval={retrieval}: the served top 10 holds "
                  f"{overlap:.3f} of the exact top 10 ({overlap_users} users)", flush=True)
        seq = [1]
        results = []
        for swapping in (False, True):
            for c in concurrencies:
                stop = threading.Event()
                swapper = threading.Thread(
                    target=_swap_loop,
                    args=(reg, n_items, swap_every, stop, seq, catalogue, sessions),
                    daemon=True)
                swaps_before = _swaps(httpx, url)
                if swapping:
                    swapper.start()
                out = subprocess.run(
                    [sys.executable, str(HERE), "loadgen", "--url", url, "--concurrency", str(c),
                     "--duration", str(duration)],
                    check=True, capture_output=True, text=True)
                stop.set()
                if swapping:
                    swapper.join()
                row = json.loads(out.stdout)
                row.update(items=n_items, swapping=swapping, workers=workers,
                           retrieval=retrieval, ann=ann, catalogue=catalogue, overlap=overlap,
                           sessions=sessions,
                           swaps=_swaps(httpx, url) - swaps_before,
                           memory_mb=memory_mb(procs[-1].pid),
                           loadavg_1m=round(os.getloadavg()[0], 2))
                print(f"items={n_items:>6} {retrieval:>7} c={c:>2} swapping={swapping!s:5} "
                      f"p50={row['p50_ms']}ms p99={row['p99_ms']}ms rps={row['rps']} "
                      f"errors={row['errors']} swaps={row['swaps']} "
                      f"memory={row['memory_mb']['pss_total']:.0f} MB PSS "
                      f"(largest RSS {row['memory_mb']['rss_max']:.0f} MB) "
                      f"load={row['loadavg_1m']}", flush=True)
                results.append(row)
        return results
    finally:
        for proc in reversed(procs):
            stop_process(proc, 10)


def _swaps(httpx: Any, url: str) -> int:
    return int(_metric(httpx, url, "streamrec_serving_model_swaps_total") or 0)


def _swap_loop(reg: Any, n_items: int, every: float, stop: threading.Event, seq: list[int],
               catalogue: str, sessions: int) -> None:
    while not stop.wait(every):
        seq[0] += 1
        _publish(reg, f"v{seq[0]:04d}", n_items, seq[0], catalogue, sessions)


def _metric(httpx: Any, url: str, name: str) -> float | None:
    for line in httpx.get(url + "/metrics", timeout=5.0).text.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    return None


def _ann_used(httpx: Any, url: str) -> bool:
    return bool(_metric(httpx, url, "streamrec_serving_ann_builds_total"))


def _overlap(httpx: Any, url: str, settings: Any, reg: Any, n_users: int, k: int = 10
             ) -> float:
    """Share of the exact top ``k`` in the served top ``k``, over users ``u0..``: their
    histories read from the store the server reads, the exact ranking computed here on the
    version the server answered with."""
    from feature_store.store import open_store
    from model.artifact.files import load_artifact
    from serving.retrieval import rank_with_model

    users = [f"u{i}" for i in range(n_users)]
    served: dict[str, list[str]] = {}
    versions = set()
    with httpx.Client(base_url=url, timeout=30.0) as client:
        for user in users:
            body = client.get("/recommend", params={"user_id": user, "k": k}).json()
            served[user] = [item["item_id"] for item in body["items"]]
            versions.add(body["model_version"])
    if len(versions) != 1:
        raise RuntimeError(f"the server answered from versions {sorted(versions)}")
    artifact = load_artifact(reg.path(versions.pop()))
    store = open_store(settings)
    try:
        features = store.read_users(users)
    finally:
        store.close()
    histories = [[h.item_id for h in f.history] if f else [] for f in features]
    exact = rank_with_model(artifact, users, histories, [k] * len(users), [True] * len(users))
    hits = sum(len({s.item_id for s in e} & set(served[u])) for u, e in zip(users, exact, strict=True))
    return hits / (k * len(users))


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["loadgen"]:
        return loadgen_main(argv[1:])
    p = argparse.ArgumentParser(prog="streamrec bench serve", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--items", default="10000,100000")
    p.add_argument("--concurrency", default="1,16,64")
    p.add_argument("--duration", type=float, default=10.0, help="measured seconds per run")
    p.add_argument("--swap-every", type=float, default=5.0)
    p.add_argument("--workers", type=int, default=os.cpu_count() or 1,
                   help="streamrec serve --workers (default: one per core, as serving.workers)")
    p.add_argument("--retrieval", default="default",
                   help="comma-separated: default (serving.ann_min_items decides), exact, ann; "
                   "each its own server, one after the other per item count")
    p.add_argument("--catalogue", choices=("gaussian", "clustered"), default="gaussian",
                   help="item vectors: isotropic gaussian (every earlier figure) or around "
                   f"{TASTES} tastes with a popularity prior (module doc)")
    p.add_argument("--overlap-users", type=int, default=500,
                   help="users whose served top 10 is compared with the exact one (ANN runs)")
    p.add_argument("--sessions", type=int, default=DEFAULT_SESSIONS,
                   help="histories in the version's session-kNN index (0: a version without "
                   "the part; default: %(default)s, the model's default having the part)")
    p.add_argument("--json", type=Path, help="write the results here")
    a = p.parse_args(argv)
    retrievals = a.retrieval.split(",")
    unknown = set(retrievals) - RETRIEVALS.keys()
    if unknown:
        p.error(f"--retrieval: unknown {sorted(unknown)} (of {sorted(RETRIEVALS)})")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    concurrencies = [int(c) for c in a.concurrency.split(",")]
    results: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="bench-serve-") as tmp:
        for n in (int(x) for x in a.items.split(",")):
            for retrieval in retrievals:
                results.extend(_run_items(n, concurrencies, a.duration, a.swap_every, Path(tmp),
                                          a.workers, retrieval, a.catalogue, a.overlap_users,
                                          a.sessions))
    if a.json:
        a.json.write_text(json.dumps(results, indent=1))
        print(f"wrote {a.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
