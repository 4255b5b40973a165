"""Subcommands: train (registered into ``streamrec`` by deploy.cli).

Keep imports here light: heavy modules are imported inside the handlers.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
from contextlib import ExitStack
from typing import Any, NoReturn

log = logging.getLogger(__name__)

EPILOG = """\
The trainer consumes the samples topic from the offsets saved in its newest checkpoint
(STREAMREC_TRAINER__CHECKPOINT_DIR), trains test-then-train, and every --export-every-s
seconds or --export-every-samples samples checkpoints and publishes a model version to
STREAMREC_TRAINER__REGISTRY_DIR. GET /health and /metrics on STREAMREC_TRAINER__METRICS_PORT.

With --ps N --workers M (settings trainer.ps / trainer.workers) the step runs on a
parameter-server cluster (model/cluster: tables sharded over the PS, steps on the workers,
this process the chief holding the consumer, offsets and checkpoints). Unless
trainer.cluster_port or trainer.cluster_spec fixes the layout, the chief starts the PS and
worker processes itself on free ports; with a fixed layout each runs as
`streamrec train --role ps|worker --index I`.

examples:
  streamrec train
  streamrec train --ps 2 --workers 2
  streamrec train --grad-accum 4 --mixed-precision --item-lr 0.1 --evict-every 500
"""


#: (flag, trainer.* setting, type, help) of the flags that override a setting.
KNOB_FLAGS: tuple[tuple[str, str, type, str], ...] = (
    ("--batch-size", "batch_size", int, "samples per step"),
    ("--export-every-s", "export_every_s", float, "seconds between model versions"),
    ("--export-every-samples", "export_every_samples", int, "samples between model versions"),
    ("--delta-every-s", "delta_every_s", float, "seconds between deltas, 0 = none"),
    ("--batch-timeout-s", "batch_timeout_s", float, "train a partial batch after this wait"),
    ("--admit-after", "admit_after", int, "sightings before an id gets its own row"),
    ("--attr-tokens", "attr_tokens", int,
     "attribute keys per item from the catalogue (items topic), 0 = ids only"),
    ("--max-user-rows", "max_user_rows", int, "eviction cap of users"),
    ("--max-item-rows", "max_item_rows", int, "eviction cap of items"),
    ("--evict-every", "evict_every_steps", int, "evict every N steps, 0 = never"),
    ("--grad-accum", "grad_accum_steps", int, "accumulate gradients over N micro-batches"),
    ("--user-lr", "user_lr", float, "learning rate of the user table"),
    ("--item-lr", "item_lr", float, "learning rate of the item table"),
    ("--dense-lr", "dense_lr", float, "learning rate of the dense layers"),
    ("--aux-weight", "aux_weight", float,
     "weight of the item-to-item history-pool term of the loss, 0 = off"),
    ("--eval-rows", "eval_rows", int, "rows per batch scored test-then-train, 0 = off"),
    ("--eval-every", "eval_every", int, "score the head of every N-th batch only"),
    ("--ps", "ps", int, "parameter servers of a cluster"),
    ("--workers", "workers", int, "workers of a cluster"),
)
#: Flags with their own action or choices that override a setting too.
SWITCHES = ("mixed_precision", "train_history", "fused_loss", "wire_dtype")


def knob_overrides(args: argparse.Namespace) -> dict[str, Any]:
    """The ``trainer.*`` settings the command line gives (flags left out are None)."""
    keys = [key for _, key, _, _ in KNOB_FLAGS] + list(SWITCHES)
    return {key: getattr(args, key) for key in keys if getattr(args, key, None) is not None}


def register(sub: Any) -> None:
    """Add these subcommands to the ``streamrec`` parser."""
    p = sub.add_parser(
        "train",
        help="run the incremental TFRA trainer (samples topic -> model versions)",
        description="Train the two-tower model continuously from the samples topic, exactly "
        "once across restarts, and publish versions to the model registry.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--port", type=int, help="health/metrics port (default: trainer.metrics_port)")
    p.add_argument("--max-samples", type=int, help="stop after this many trained samples")
    # Every flag below overrides the trainer.* setting it names (one path: with_trainer);
    # the defaults are the settings' (STREAMREC_TRAINER__*, docs/operations.md).
    for flag, key, kind, text in KNOB_FLAGS:
        p.add_argument(flag, dest=key, type=kind, help=f"{text} (default: trainer.{key})")
    p.add_argument("--mixed-precision", dest="mixed_precision", action="store_true",
                   default=None, help="bfloat16 compute, float32 master weights "
                   "(default: trainer.mixed_precision)")
    p.add_argument("--no-history-grad", dest="train_history", action="store_false",
                   default=None, help="history rows learn only as targets, faster steps "
                   "(default: trainer.train_history)")
    p.add_argument("--no-fused-loss", dest="fused_loss", action="store_false", default=None,
                   help="the loss op by op instead of compiled by XLA: the same loss, no "
                   "compile at start-up, slower steps (default: trainer.fused_loss)")
    p.add_argument("--wire-dtype", choices=["float32", "bfloat16"],
                   help="rows and updates on the cluster's wire (default: trainer.wire_dtype)")
    p.add_argument("--role", choices=["chief", "ps", "worker"], default="chief",
                   help="run one server of a fixed cluster layout instead of the chief")
    p.add_argument("--index", type=int, default=0, help="task index of --role ps|worker")
    p.set_defaults(func=run_train)


def run_train(args: argparse.Namespace) -> int:
    from datetime import UTC, datetime

    from model.trainer.metrics import HealthServer, TrainerMetrics
    from streamrec.settings import load_settings, with_trainer

    settings = with_trainer(load_settings(), **knob_overrides(args))
    tcfg = settings.trainer
    if args.role != "chief":
        return _serve_role(settings, args.role, args.index)
    ps, workers = tcfg.ps, tcfg.workers
    if (ps > 0) != (workers > 0):
        raise SystemExit("a trainer cluster needs --ps and --workers both >= 1 (or both 0)")
    port = args.port if args.port is not None else tcfg.metrics_port
    metrics = TrainerMetrics()
    holder: dict[str, Any] = {}

    def status() -> dict[str, Any]:
        service = holder.get("service")
        return service.status() if service else {"status": "starting"}

    def delta() -> dict[str, Any] | None:
        service = holder.get("service")
        return service.delta_status(checksum=True) if service else None

    server = HealthServer(settings.stack.bind_host, port, metrics, status,
                          {"/delta": delta}).start()
    try:
        from model.towers.two_tower import ModelConfig
        from model.trainer.checkpoint import OffsetsBeyondTopic
        from model.trainer.loop_options import LoopOptions
        from model.trainer.service import TrainerService
        from model.trainer.trainer import TrainOptions

        config = ModelConfig.from_settings(settings)
        options = TrainOptions.from_settings(settings)
        loop = LoopOptions.from_settings(settings, max_samples=args.max_samples)
        from model.trainer.trainer import Trainer

        with ExitStack() as stack:
            if ps:
                from model.cluster.local import cluster_trainer

                log_dir = settings.stack.run_dir / "logs" / "trainer-cluster"
                trainer: Any = stack.enter_context(
                    cluster_trainer(settings, config, options, log_dir=log_dir, metrics=metrics))
            else:
                trainer = Trainer(config, options)
            service = TrainerService(
                settings,
                trainer,
                loop,
                clock=lambda: datetime.now(UTC),
                metrics=metrics,
                redis_client=_redis_client(settings),
            )
            holder["service"] = service

            def stop(signum: int, _frame: Any) -> None:
                log.info("signal %d: finishing the current batch, then checkpoint + export", signum)
                service.stop_event.set()

            signal.signal(signal.SIGTERM, stop)
            signal.signal(signal.SIGINT, stop)
            try:
                state = service.run()
            except OffsetsBeyondTopic as exc:
                log.error("%s", exc)
                code = 2
            except Exception:
                if not ps:
                    raise
                # e.g. a step re-run after a worker failure (StepsReplayed): nothing after the
                # last cut is saved; exit at once (TF's coordinator can hang in its destructor),
                # the servers die with this process, the restart resumes from the last cut
                log.exception("trainer cluster failed: exiting to resume from the last checkpoint")
                _leave(1)
            else:
                log.info("trainer stopped: %d samples trained", state.samples_trained)
                code = 0
    finally:
        server.stop()
    if ps:
        # saved, and the servers are stopped (the stack above closed); a worker lost during
        # the run (a chief that finished within the watchdog's grace of it) hung the teardown
        _leave(code)
    return code


def _leave(code: int) -> NoReturn:
    """End a chief on a cluster now, its logs flushed, without the interpreter's teardown:
    there TF's ``ClusterCoordinator.__del__`` waits for a lost worker to come back, for good."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _serve_role(settings: Any, role: str, index: int) -> int:
    """One PS or worker server of the fixed layout of the settings (blocks until killed)."""
    from model.cluster.server import serve
    from model.cluster.service import configured_layout

    layout = configured_layout(settings.trainer)
    if layout is None:
        raise SystemExit("--role ps|worker needs trainer.cluster_port or trainer.cluster_spec")
    serve(layout, role, index)
    return 0


def _redis_client(settings: Any) -> Any:
    import redis

    r = settings.redis
    password = r.password.get_secret_value() if r.password else None
    return redis.Redis(host=r.host, port=r.port, db=r.db, password=password, socket_timeout=2.0)
