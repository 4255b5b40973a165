"""What the local stack runs: Kafka (KRaft), Redis, a standalone Flink cluster, our services.

Each component knows how to prepare its files, the command that runs it in the foreground,
the port it owns and a real readiness check. ``deploy.stack`` supervises them.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import sys
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from deploy.process import StackError, port_in_use
from streamrec.settings import Settings

REPO_ROOT = Path(__file__).resolve().parent.parent
JVM_LIB = REPO_ROOT / "deploy" / "jvm" / "lib"
KAFKA_LIB = JVM_LIB / "kafka"
FLINK_CONNECTOR_DIR = JVM_LIB / "flink"

SETUP_HINT = "Run `make setup` (it installs Python packages, redis-server and the JVM jars)."


@dataclass(frozen=True)
class Component:
    name: str
    port: int
    argv: Callable[[], list[str]]
    ready: Callable[[], bool]
    prepare: Callable[[], None] = lambda: None
    env: dict[str, str] = field(default_factory=dict)
    #: A string that must appear in the process's command line (pid-file sanity check).
    marker: str = ""
    #: One-shot components run to completion; readiness is checked afterwards.
    oneshot: bool = False



def kafka_cluster_id(random_bytes: Callable[[], bytes] = lambda: uuid.uuid4().bytes) -> str:
    """A KRaft cluster id: 16 random bytes, URL-safe base64 without padding. Like Kafka's own
    ``Uuid.randomUuid``, never one starting with ``-``: the storage tool's argument parser
    would read it as an option ("argument --cluster-id/-t: expected one argument")."""
    while True:
        cluster_id = base64.urlsafe_b64encode(random_bytes()).decode().rstrip("=")
        if not cluster_id.startswith("-"):
            return cluster_id

def http_ok(url: str, timeout_s: float = 2.0) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as resp:  # noqa: S310 - loopback
            return 200 <= resp.status < 300
    except (urllib.error.URLError, OSError, ValueError):
        return False


def http_json(url: str, timeout_s: float = 2.0) -> object:
    with urllib.request.urlopen(url, timeout=timeout_s) as resp:  # noqa: S310 - loopback
        return json.loads(resp.read())


def require_java() -> str:
    java = shutil.which("java")
    if not java:
        raise StackError(
            "Java was not found on PATH. Kafka and Flink need a Java 17+ runtime: install it "
            "(Debian: `apt-get install openjdk-17-jre-headless`) and run `streamrec up` again."
        )
    return java


def flink_home() -> Path:
    from stream.flink.submit import FlinkSubmitError
    from stream.flink.submit import flink_home as _home

    try:
        return _home()
    except FlinkSubmitError as exc:
        raise StackError(f"{exc}. {SETUP_HINT}") from exc


def connector_jar() -> Path:
    jars = sorted(FLINK_CONNECTOR_DIR.glob("flink-sql-connector-kafka-*.jar"))
    if not jars:
        raise StackError(f"The Flink Kafka connector jar is missing in {FLINK_CONNECTOR_DIR}. {SETUP_HINT}")
    return jars[-1]


# --------------------------------------------------------------------------- Kafka


def kafka_component(s: Settings, run_dir: Path) -> Component:
    k = s.kafka
    home = run_dir / "kafka"
    props = home / "server.properties"
    log4j = home / "log4j2.properties"
    data = home / "data"

    def prepare() -> None:
        java = require_java()
        if not list(KAFKA_LIB.glob("kafka_2.13-*.jar")):
            raise StackError(f"The Kafka broker jars are missing in {KAFKA_LIB}. {SETUP_HINT}")
        home.mkdir(parents=True, exist_ok=True)
        props.write_text(
            "\n".join(
                [
                    "process.roles=broker,controller",
                    "node.id=1",
                    f"controller.quorum.voters=1@{k.host}:{k.controller_port}",
                    f"listeners=PLAINTEXT://{k.host}:{k.port},CONTROLLER://{k.host}:{k.controller_port}",
                    f"advertised.listeners=PLAINTEXT://{k.host}:{k.port}",
                    "controller.listener.names=CONTROLLER",
                    "inter.broker.listener.name=PLAINTEXT",
                    "listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
                    f"log.dirs={data}",
                    f"num.partitions={k.partitions}",
                    "offsets.topic.replication.factor=1",
                    "offsets.topic.num.partitions=4",
                    "transaction.state.log.replication.factor=1",
                    "transaction.state.log.min.isr=1",
                    "transaction.state.log.num.partitions=4",
                    "share.coordinator.state.topic.replication.factor=1",
                    "share.coordinator.state.topic.min.isr=1",
                    "group.initial.rebalance.delay.ms=0",
                    "auto.create.topics.enable=true",
                    "log.retention.hours=168",
                    "",
                ]
            )
        )
        log4j.write_text(
            "status = warn\n"
            "appender.out.type = Console\n"
            "appender.out.name = OUT\n"
            "appender.out.layout.type = PatternLayout\n"
            "appender.out.layout.pattern = [%d] %p %m (%c)%n\n"
            "rootLogger.level = INFO\n"
            "rootLogger.appenderRef.out.ref = OUT\n"
            "logger.state.name = state.change.logger\n"
            "logger.state.level = WARN\n"
        )
        if not (data / "meta.properties").exists():
            cluster_id = kafka_cluster_id()
            result = subprocess.run(
                [java, *_kafka_jvm_args(), "kafka.tools.StorageTool", "format",
                 "-t", cluster_id, "-c", str(props)],
                capture_output=True, text=True, timeout=120, check=False,
            )
            if result.returncode != 0:
                raise StackError(
                    "Formatting Kafka's KRaft storage failed:\n"
                    f"{(result.stdout + result.stderr)[-2000:]}\n"
                    f"Remove {data} to start from empty storage."
                )

    def _kafka_jvm_args() -> list[str]:
        return [
            f"-Xmx{k.heap}", "-Xms128m", "-XX:+UseG1GC", "-Djava.awt.headless=true",
            *k.java_opts.split(), f"-Dlog4j2.configurationFile={log4j}", "-cp", f"{KAFKA_LIB}/*",
        ]

    def argv() -> list[str]:
        return [require_java(), *_kafka_jvm_args(), "kafka.Kafka", str(props)]

    def ready() -> bool:
        from stream.kafka_client import broker_ready

        return broker_ready(k)

    return Component("kafka", k.port, argv, ready, prepare, marker=str(props))


# --------------------------------------------------------------------------- Redis


def redis_component(s: Settings, run_dir: Path) -> Component:
    r = s.redis
    home = run_dir / "redis"

    def argv() -> list[str]:
        exe = shutil.which("redis-server")
        if not exe:
            raise StackError(f"redis-server was not found on PATH. {SETUP_HINT}")
        args = [exe, "--port", str(r.port), "--bind", s.stack.bind_host, "--dir", str(home),
                "--save", "", "--daemonize", "no", "--protected-mode", "yes"]
        args += ["--appendonly", "yes" if r.appendonly else "no"]
        if r.appendonly:
            # fsync once a second: a kill -9 loses at most the last second of writes, which
            # the feature job re-writes from its state (feature_store/FORMAT.md, "Generation").
            args += ["--appendfsync", "everysec"]
        if r.password is not None:
            args += ["--requirepass", r.password.get_secret_value()]
        return args

    def ready() -> bool:
        import redis

        client = redis.Redis(
            host=r.host, port=r.port, socket_timeout=1,
            password=r.password.get_secret_value() if r.password else None,
        )
        try:
            return bool(client.ping())
        finally:
            client.close()

    return Component(
        "redis", r.port, argv, ready, lambda: home.mkdir(parents=True, exist_ok=True),
        marker=f":{r.port}",
    )


# --------------------------------------------------------------------------- Flink


def install_connector() -> Path:
    """Put the Kafka connector jar into the distribution's lib/ (idempotent).

    ``pipeline.jars`` alone does not reach the PyFlink client's table planner, so the jar goes
    where both the cluster and the client load it, as in the official Flink images.
    """
    jar = connector_jar()
    target = flink_home() / "lib" / jar.name
    if not target.exists() or target.stat().st_size != jar.stat().st_size:
        for old in (flink_home() / "lib").glob("flink-sql-connector-kafka-*.jar"):
            old.unlink()
        shutil.copyfile(jar, target)
    return target


def flink_conf_dir(run_dir: Path) -> Path:
    return run_dir / "flink" / "conf"


def flink_lib_dir(run_dir: Path) -> Path:
    return run_dir / "flink" / "lib"


def prepare_flink_lib(run_dir: Path) -> Path:
    """The cluster's lib/: the distribution's jars (connector included) plus flink-python.

    Python operators in thread mode run inside the TaskManager's JVM (pemja), which needs
    ``flink-python`` on the cluster's own classpath; the wheel ships it in ``opt/``.
    """
    home = flink_home()
    lib = flink_lib_dir(run_dir)
    if lib.exists():
        shutil.rmtree(lib)
    lib.mkdir(parents=True)
    jars = [*(home / "lib").glob("*.jar"), *(home / "opt").glob("flink-python-*.jar")]
    for jar in jars:
        (lib / jar.name).symlink_to(jar)
    return lib


def flink_env(s: Settings, run_dir: Path) -> dict[str, str]:
    home = flink_home()
    return {
        "FLINK_HOME": str(home),
        "FLINK_LIB_DIR": str(flink_lib_dir(run_dir)),
        "FLINK_CONF_DIR": str(flink_conf_dir(run_dir)),
        "FLINK_LOG_DIR": str(run_dir / "flink" / "log"),
        "FLINK_PID_DIR": str(run_dir / "flink"),
    }


def write_flink_conf(s: Settings, run_dir: Path) -> None:
    f = s.flink
    home = flink_home()
    conf = flink_conf_dir(run_dir)
    conf.mkdir(parents=True, exist_ok=True)
    (run_dir / "flink" / "log").mkdir(parents=True, exist_ok=True)
    for name in ("log4j-console.properties", "log4j-cli.properties", "log4j.properties"):
        shutil.copyfile(home / "conf" / name, conf / name)
    shipped = (home / "conf" / "config.yaml").read_text()
    java_opts = next(
        (line.split("all:", 1)[1].strip() for line in shipped.splitlines()
         if line.strip().startswith("all: --add-exports")), "",
    )
    host = s.stack.bind_host
    checkpoints = (run_dir / "flink" / "checkpoints").resolve()
    reporters = flink_reporter_ports(s)
    settings = {
        "env.java.opts.all": java_opts,
        "jobmanager.rpc.address": host,
        "jobmanager.rpc.port": f.rpc_port,
        "jobmanager.bind-host": host,
        "jobmanager.memory.process.size": f.jobmanager_memory,
        "jobmanager.execution.failover-strategy": "region",
        "taskmanager.bind-host": host,
        "taskmanager.host": host,
        "taskmanager.numberOfTaskSlots": f.taskmanager_slots,
        "taskmanager.memory.process.size": f.taskmanager_memory,
        "parallelism.default": f.parallelism,
        "rest.address": host,
        "rest.bind-address": host,
        "rest.port": f.rest_port,
        "blob.server.port": "0",
        "taskmanager.rpc.port": "0",
        "taskmanager.data.port": "0",
        "execution.checkpointing.dir": f"file://{checkpoints}",
        "state.checkpoints.dir": f"file://{checkpoints}",
        "execution.checkpointing.interval": f"{f.checkpoint_interval_ms}ms",
        "execution.checkpointing.externalized-checkpoint-retention": "RETAIN_ON_CANCELLATION",
        "python.execution-mode": "thread",
        # pemja (thread mode) must come from the cluster classpath, not the job's.
        "classloader.parent-first-patterns.additional": "pemja.",
        "python.executable": sys.executable,
        "python.client.executable": sys.executable,
        # Prometheus reporter (plugins/metrics-prometheus of the distribution): each JVM takes
        # the first free port of the range, the JobManager first.
        "metrics.reporter.prom.factory.class":
            "org.apache.flink.metrics.prometheus.PrometheusReporterFactory",
        "metrics.reporter.prom.port": f"{reporters[0]}-{reporters[-1]}",
    }
    if f.jobmanager_java_opts:
        settings["env.java.opts.jobmanager"] = f.jobmanager_java_opts
    if f.taskmanager_java_opts:
        settings["env.java.opts.taskmanager"] = f.taskmanager_java_opts
    if f.taskmanagers > 1:
        # Spread a job's slots over the TaskManagers, so that parallel Python subtasks land in
        # different JVMs (one interpreter lock each).
        settings["taskmanager.load-balance.mode"] = "SLOTS"
    lines = ["# Written by `streamrec up` from the project's settings; edits are overwritten."]
    lines += [f"{key}: {json.dumps(value) if isinstance(value, str) else value}"
              for key, value in settings.items()]
    (conf / "config.yaml").write_text("\n".join(lines) + "\n")


def taskmanagers_argv(n: int) -> list[str]:
    """The ``flink-taskmanager`` component's command: ``n`` TaskManager JVMs in the foreground.

    Thread-mode Python operators of one JVM share ONE interpreter lock, so a TaskManager per
    slot is what lets parallel Python subtasks use several cores (``flink.taskmanagers``).
    With ``n`` > 1 one shell runs them all in its process group (the stack's one pid file stops
    or kills them together), and exits, stopping the others, as soon as one ends, so a dead
    TaskManager shows as a stopped component. Each JVM logs to its own file
    (``flink-console.sh`` numbers them).
    """
    script = str(flink_home() / "bin" / "taskmanager.sh")
    if n <= 1:
        return ["bash", script, "start-foreground"]
    loop = (
        'trap \'kill 0\' TERM INT; '
        f'for i in $(seq {n}); do bash "$0" start-foreground & done; '
        "wait -n; kill 0"
    )
    return ["bash", "-c", loop, script]


def flink_components(s: Settings, run_dir: Path) -> list[Component]:
    f = s.flink
    rest = f"http://{s.stack.bind_host}:{f.rest_port}"

    def prepare() -> None:
        require_java()
        install_connector()
        prepare_flink_lib(run_dir)
        write_flink_conf(s, run_dir)

    def jm_argv() -> list[str]:
        return ["bash", str(flink_home() / "bin" / "jobmanager.sh"), "start-foreground"]

    def tm_argv() -> list[str]:
        return taskmanagers_argv(f.taskmanagers)

    def jm_ready() -> bool:
        return http_ok(f"{rest}/config")

    def tm_ready() -> bool:
        overview = http_json(f"{rest}/overview")
        return isinstance(overview, dict) and int(overview.get("taskmanagers", 0)) >= f.taskmanagers

    env_fn = flink_env(s, run_dir)
    return [
        Component("flink-jobmanager", f.rest_port, jm_argv, jm_ready, prepare, env=env_fn,
                  marker="standalonesession|jobmanager.sh"),
        Component("flink-taskmanager", 0, tm_argv, tm_ready, env=env_fn,
                  marker="taskexecutor|taskmanager.sh"),
    ]


def flink_job_running(s: Settings) -> bool:
    """True if this settings' feature job (one per events topic) is RUNNING."""
    from stream.cli.features import job_name
    from stream.flink.submit import list_jobs

    return any(j.get("name") == job_name(s) and j.get("state") == "RUNNING"
               for j in list_jobs(s))


# --------------------------------------------------------------------------- our services


def service_components(s: Settings, available: set[str]) -> list[Component]:
    """The project's own processes, for those whose CLI command exists so far."""
    py = sys.executable
    host = s.stack.bind_host
    services = [
        Component("ingest-api", s.ingest.port,
                  lambda: [py, "-m", "deploy.cli", "ingest-api"],
                  lambda: http_ok(f"http://{host}:{s.ingest.port}/health"),
                  marker="ingest-api"),
        Component("features", 0,
                  lambda: [py, "-m", "deploy.cli", "features"],
                  lambda: flink_job_running(s), marker="features", oneshot=True),
        Component("trainer", s.trainer.metrics_port,
                  lambda: [py, "-m", "deploy.cli", "train"],
                  lambda: http_ok(f"http://{host}:{s.trainer.metrics_port}/health"),
                  marker="train"),
        Component("serving", s.serving.port,
                  lambda: [py, "-m", "deploy.cli", "serve"],
                  lambda: http_ok(f"http://{host}:{s.serving.port}/health"),
                  # One BLAS thread per request thread: 16 request threads oversubscribe
                  # OpenBLAS otherwise (why: docs/decisions.md#serving-exact-search).
                  env={"OPENBLAS_NUM_THREADS": "1"}, marker="serve"),
        dashboard_collector_component(s),
    ]
    command_of = {"ingest-api": "ingest-api", "features": "features", "trainer": "train",
                  "serving": "serve", "dashboard-collector": "serve"}
    chosen = [c for c in services if command_of[c.name] in available]
    if "train" in available:
        at = next(i for i, c in enumerate(chosen) if c.name == "trainer")
        chosen[at:at] = trainer_cluster_components(s)
    return chosen


def dashboard_collector_component(s: Settings) -> Component:
    """The stack's one dashboard collector (``serving.dashboard_collector``): it scrapes the
    services for the dashboard, so no serving worker does; ready once its first snapshot is
    written (an earlier run's is removed first)."""
    from serving.stats_file import stats_path

    snapshot = stats_path(s)
    py = sys.executable
    return Component("dashboard-collector", 0,
                     lambda: [py, "-m", "deploy.cli", "dashboard-collector"],
                     snapshot.exists, lambda: snapshot.unlink(missing_ok=True),
                     marker="dashboard-collector")


def trainer_cluster_components(s: Settings) -> list[Component]:
    """``trainer-ps-N`` / ``trainer-worker-N`` of a fixed trainer cluster layout
    (``trainer.cluster_port`` or ``trainer.cluster_spec``), each ready when its gRPC port
    listens; none otherwise (one process, or a chief that starts its servers itself)."""
    from model.cluster.service import configured_layout

    if not s.trainer.ps:
        return []
    layout = configured_layout(s.trainer)
    if layout is None:
        return []
    py, out = sys.executable, []

    def argv_of(job: str, index: int) -> Callable[[], list[str]]:
        return lambda: [py, "-m", "deploy.cli", "train", "--role", job, "--index", str(index)]

    def ready_of(host: str, port: int) -> Callable[[], bool]:
        return lambda: port_in_use(host, port)

    for job, index in layout.roles():
        host, port = layout.address(job, index).rsplit(":", 1)
        out.append(Component(f"trainer-{job}-{index}", int(port), argv_of(job, index),
                             ready_of(host, int(port)), marker=f"--role {job} --index {index}"))
    return out


# --------------------------------------------------------------------------- monitoring

PROMETHEUS_RULES = REPO_ROOT / "deploy" / "prometheus" / "rules.yml"


def flink_reporter_ports(s: Settings) -> list[int]:
    """Ports of Flink's Prometheus reporters: the JobManager's, then one per TaskManager."""
    base = s.prometheus.flink_reporter_port
    return list(range(base, base + 1 + s.flink.taskmanagers))


def prometheus_config(s: Settings, rules: Path) -> dict[str, object]:
    """prometheus.yml: every component of the stack as a scrape job."""
    p, host = s.prometheus, s.stack.bind_host

    def reach(bound: str) -> str:  # a wildcard bind address is reached on the stack's host
        return host if bound in ("0.0.0.0", "::", "") else bound

    def job(name: str, *targets: str) -> dict[str, object]:
        return {"job_name": name, "static_configs": [{"targets": list(targets)}]}

    return {
        "global": {
            "scrape_interval": f"{p.scrape_interval_s:g}s",
            "scrape_timeout": f"{min(p.scrape_interval_s, 10.0):g}s",
            "evaluation_interval": f"{p.evaluation_interval_s:g}s",
        },
        "rule_files": [str(rules)],
        "scrape_configs": [
            job("prometheus", f"{host}:{p.port}"),
            job("ingest", f"{reach(s.ingest.host)}:{s.ingest.port}"),
            job("trainer", f"{reach(s.trainer.metrics_host)}:{s.trainer.metrics_port}"),
            job("serving", f"{reach(s.serving.host)}:{s.serving.port}"),
            job("exporter", f"{host}:{p.exporter_port}"),
            job("flink", *(f"{host}:{port}" for port in flink_reporter_ports(s))),
        ],
    }


def monitoring_components(s: Settings, run_dir: Path) -> list[Component]:
    """The pipeline exporter and Prometheus (scraping every component, with the rules)."""
    py, host, p = sys.executable, s.stack.bind_host, s.prometheus
    home = run_dir / "prometheus"
    config = home / "prometheus.yml"

    def prepare() -> None:
        home.mkdir(parents=True, exist_ok=True)
        rules = (p.rules_file or PROMETHEUS_RULES).resolve()
        config.write_text(json.dumps(prometheus_config(s, rules), indent=1) + "\n")

    def argv() -> list[str]:
        exe = shutil.which("prometheus")
        if not exe:
            raise StackError(f"prometheus was not found on PATH. {SETUP_HINT}")
        return [exe, f"--config.file={config}", f"--storage.tsdb.path={home / 'data'}",
                f"--web.listen-address={host}:{p.port}", "--storage.tsdb.retention.time=2d",
                "--log.level=warn"]

    return [
        Component("exporter", p.exporter_port, lambda: [py, "-m", "deploy.cli", "exporter"],
                  lambda: http_ok(f"http://{host}:{p.exporter_port}/health"), marker="exporter"),
        Component("prometheus", p.port, argv,
                  lambda: http_ok(f"http://{host}:{p.port}/-/ready"), prepare,
                  marker=str(config)),
    ]


def prometheus_targets(s: Settings, timeout_s: float = 2.0) -> list[dict[str, str]]:
    """Prometheus' scrape targets: ``job``, ``instance``, ``health`` (up/down/unknown) and
    ``error`` (the last scrape's); raises ``OSError``/``ValueError`` if it does not answer."""
    url = f"http://{s.stack.bind_host}:{s.prometheus.port}/api/v1/targets?state=active"
    body = http_json(url, timeout_s)
    active = body["data"]["activeTargets"] if isinstance(body, dict) else []
    return [{"job": t["labels"].get("job", ""), "instance": t["labels"].get("instance", ""),
             "health": t.get("health", "unknown"), "error": t.get("lastError", "")}
            for t in active]


def child_env(extra: dict[str, str]) -> dict[str, str]:
    env = dict(os.environ)
    env.update(extra)
    return env
