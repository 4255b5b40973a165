"""Subcommand: evaluate (registered into ``streamrec`` by deploy.cli).

``streamrec evaluate PATH [PATH ...]`` replays a log test-then-train through the model
in-process and prints Recall/NDCG next to its baselines (popularity, recent popularity,
co-occurrence, item-kNN, sequential rules, session-kNN); the protocol is in
``model.evaluation.replay`` (and in ``--help``). TensorFlow is imported only by the handler.
"""

from __future__ import annotations

import argparse
import itertools
import json
import logging
import time
from pathlib import Path
from typing import Any

from model.cli.evaluate_config import run_config
from model.evaluation.report import plot_over_time, table

log = logging.getLogger(__name__)

FORMATS = ("movielens", "ml-1m", "ml-100k", "ndjson", "csv")
#: ``model.evaluation.replay.EXCLUDE`` (not imported: the help stays light).
EXCLUDE = ("rated", "positives")
PROTOCOL = """\
Protocol (test-then-train):
  * The log is read, validated and ordered exactly as `streamrec replay` sends it
    (event time, then file order); every event goes through the feature functions of
    the Flink job, which give each positive event its point-in-time sample.
  * Positives: events with weight > 0; for MovieLens, ratings >= --like-threshold (4.0)
    (lower ratings are interactions, not positives).
  * The first --warmup (10%) of the positives are learned from, not scored.
  * Micro-batches of --batch-size (128) consecutive positives: each is scored with every
    method as it was before the batch, then every method learns from it (the model:
    --epochs optimizer steps of the live trainer's step on the batch).
  * Scoring an event: rank every item seen before its micro-batch, minus the user's
    earlier items (--exclude); a hit at K if the event's item is in the top K.
    --exclude rated (default): every item of any earlier event of the user (any event
    type: a low rating, an impression); --exclude positives: only the items of the
    user's earlier positive events (rated or shown items stay candidates).
  * Baselines on the same stream/batches/candidates/exclusions (model.evaluation.baselines):
    popularity: positive counts so far;
    recent_popularity: positive counts over the last --recent-window positives;
    cooccurrence: per candidate, the sum over the user's last --cooc-window items of how
      often the two were target and history item of one learned positive (symmetric);
    itemknn: item-kNN with popularity damping: the co-occurrence sums over the user's last
      --itemknn-window items, the p-th most recent weighted --itemknn-decay ** p, divided by
      (the candidate's count + 1) ** --itemknn-alpha;
    sr: sequential rules: how often (weighted 1 / distance, up to --sr-steps back) the
      candidate followed each of the user's last --sr-query items, weighted 1 / position;
    sknn: session-kNN (V-SKNN): of the --sknn-sample most recent other users sharing an item
      with the user's last --sknn-window items, the --sknn-k most similar (cosine, recent
      items weigh more), weighted by similarity and recency; a candidate scores the summed
      weights of its holders.
    The per-user baselines break ties by popularity. The report's best baseline is the
    best of all of them by Recall@10; their defaults were tuned across real logs.
Output: overall Recall@10/20 and NDCG@10/20 and the same per time chunk (--chunks); the
best baseline by Recall@10 and the model's ratios to it and to popularity; model-tower,
the towers' part of the learned mix alone on the same rows (with --retrieval ann also
model-exact, the same model ranking every candidate); the model and the best baseline
for events whose user had 0, 1-4 and 5+ earlier items.
"""


def register(sub: Any) -> None:
    """Add these subcommands to the ``streamrec`` parser."""
    p = sub.add_parser(
        "evaluate",
        help="test-then-train replay of a log: Recall/NDCG vs tuned kNN and popularity baselines",
        description=PROTOCOL,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("paths", nargs="+", type=Path, metavar="PATH", help="log file(s), in order")
    p.add_argument("--format", choices=FORMATS, default=None, help="default: detected")
    p.add_argument("--map", default=None, help="csv: user_id=COL,item_id=COL,ts=COL[,...]")
    p.add_argument("--like-threshold", type=float, default=4.0)
    p.add_argument("--event-type", default=None, help="csv: event type of every row")
    p.add_argument("--limit", type=int, default=None, help="only the first N events (in order)")
    p.add_argument("--batch-size", type=int, default=128, help="micro-batch of positives")
    p.add_argument("--warmup", type=float, default=0.1, help="fraction of positives not scored")
    p.add_argument("--chunks", type=int, default=10, help="time chunks of the over-time figures")
    p.add_argument(
        "--exclude",
        choices=EXCLUDE,
        default="rated",
        help="earlier items of the user removed from the candidates (default: rated)",
    )
    b = p.add_argument_group("baselines (defaults tuned across the real-log panel)")
    b.add_argument("--recent-window", type=int, default=2000, help="recent_popularity: positives")
    b.add_argument("--cooc-window", type=int, default=20, help="cooccurrence: user's last items")
    b.add_argument("--itemknn-window", type=int, default=20, help="itemknn: user's last items")
    b.add_argument("--itemknn-alpha", type=float, default=0.3,
                   help="itemknn: a candidate's sum is divided by (its count + 1) ** alpha")
    b.add_argument("--itemknn-decay", type=float, default=0.7,
                   help="itemknn: weight decay ** p of the user's p-th most recent item")
    b.add_argument("--sr-steps", type=int, default=10,
                   help="sr: history items a rule reaches back (weight 1 / distance)")
    b.add_argument("--sr-query", type=int, default=12, help="sr: user's last items read")
    b.add_argument("--sknn-sample", type=int, default=300, help="sknn: recent neighbours sampled")
    b.add_argument("--sknn-k", type=int, default=75,
                   help="sknn: the most similar of the sampled neighbours that count (0 = all)")
    b.add_argument("--sknn-window", type=int, default=20, help="sknn: user's last items")
    g = p.add_argument_group("model (ModelConfig / TrainOptions)")
    g.add_argument("--epochs", type=int, default=10, help="optimizer steps per micro-batch")
    g.add_argument("--learning-rate", type=float, default=1.0, help="tables (Adagrad)")
    g.add_argument("--dense-lr", type=float, default=0.1, help="user-tower dense layers")
    g.add_argument(
        "--temperature", type=float, default=None, help="softmax temperature (default: ModelConfig's)"
    )
    g.add_argument("--embedding-dim", type=int, default=None, help="default: trainer setting")
    g.add_argument("--user-layers", default=None, help="e.g. 64,32 (last = embedding dim)")
    g.add_argument("--history-len", type=int, default=None, help="history items the model pools (default: ModelConfig)")
    g.add_argument(
        "--history-decay", type=float, default=None,
        help="recency weight decay of the history pool per position (1 = mean; default: ModelConfig)",
    )
    g.add_argument(
        "--pool-residual", type=float, default=None,
        help="weight of the history pool added to the user tower's output (0 = none; default: ModelConfig)",
    )
    g.add_argument(
        "--covisit-weight", type=float, default=None,
        help="weight of the item co-visitation term (0 = towers only; default: ModelConfig)",
    )
    g.add_argument(
        "--mix", choices=("learned", "fixed"), default=None,
        help="weights of the score's parts: learned from the stream (model.scoring.mixer), or "
        "the constants 1, --prior-weight, --covisit-weight (default: ModelConfig)",
    )
    g.add_argument("--mix-lr", type=float, default=None,
                   help="Adagrad step of the learned mix (default: ModelConfig)")
    g.add_argument("--mix-select", action=argparse.BooleanOptionalAction, default=None,
                   help="per history size (1-4, 5+ items), serve the scales of the neighbour "
                   "parts' learnt weights that have ranked best (model.scoring.selector; "
                   "default: ModelConfig, on)")
    g.add_argument("--rare-select", action=argparse.BooleanOptionalAction, default=None,
                   help="serve the scales of the towers' part on rarely chosen items (never "
                   "chosen, 1-4 positives so far) that have ranked best "
                   "(model.scoring.rarity; default: ModelConfig, on with attribute slots: "
                   "--items without --no-slots)")
    g.add_argument("--covisit-window", type=int, default=None, help="default: ModelConfig")
    g.add_argument("--covisit-decay", type=float, default=None, help="default: ModelConfig")
    g.add_argument(
        "--covisit-half-life", type=float, default=None,
        help="half-life of co-visitation weights in samples (0 = none; default: ModelConfig)",
    )
    g.add_argument(
        "--covisit-reverse", type=float, default=None,
        help="weight of a co-visitation's reverse direction (what came before an item; "
        "0 = none; default: ModelConfig)",
    )
    g.add_argument(
        "--sknn-weight", type=float, default=None,
        help="initial weight of the session-kNN part of the score (model.scoring.sessions; "
        "0 = none; default: ModelConfig)",
    )
    g.add_argument("--sknn-part-sample", type=int, default=None,
                   help="the part's recent neighbours read per row (default: ModelConfig)")
    g.add_argument("--sknn-part-k", type=int, default=None,
                   help="the part's most similar of them that count (0 = all; default: "
                   "ModelConfig)")
    g.add_argument("--sknn-part-window", type=int, default=None,
                   help="the row's most recent items the part compares (default: ModelConfig)")
    g.add_argument(
        "--history-grad", type=int, choices=(0, 1), default=None,
        help="0: history rows learn only as targets/negatives (default: ModelConfig.train_history)",
    )
    g.add_argument(
        "--user-tower", choices=("pool", "attention"), default=None,
        help="history pool alone, or with causal self-attention (default: ModelConfig)",
    )
    for name in ("blocks", "heads", "len", "ffn"):
        g.add_argument(f"--attention-{name}", type=int, default=None, help="default: ModelConfig")
    g.add_argument(
        "--attention-pool", type=int, choices=(0, 1), default=None,
        help="1: the attention tower also reads the pool (default: ModelConfig)",
    )
    g.add_argument("--admit-after", type=int, default=1)
    g.add_argument("--no-normalize", action="store_true", help="no L2 normalisation")
    g.add_argument("--seed", type=int, default=None, help="default: trainer setting")
    g.add_argument(
        "--prior-weight",
        type=float,
        default=None,
        help="popularity prior in the score: <u,v>/T + W * log q (model.scoring.prior); 0 = none; "
        "default: ModelConfig's",
    )
    g.add_argument(
        "--user-admit-after", type=int, default=None, help="user-table admission (default: --admit-after)"
    )
    g.add_argument(
        "--no-normalize-user", action="store_true", help="L2-normalise item vectors only"
    )
    g.add_argument(
        "--negatives", type=int, default=None, help="sampled uniform negatives per step"
    )
    g.add_argument(
        "--mask-same-user", type=int, choices=(0, 1), default=None,
        help="1: in-batch positives of the row's own user are no negatives",
    )
    g.add_argument(
        "--aux-weight", type=float, default=None,
        help="weight of the history-pool item-item loss; 0 = none (default: TrainOptions')",
    )
    g.add_argument("--logq", choices=("gap", "count"), default=None, help="frequency estimate")
    g.add_argument("--logq-half-life", type=float, default=None, help="count estimate, samples")
    p.add_argument(
        "--row-codec", default=None, metavar="CODEC[,CODEC...]",
        help="also score the model as serving holds it after the delta stream, its rows "
        "passed through each row codec (float32, float16, bfloat16, int8; "
        "model.evaluation.served); reported as served-CODEC with the change against "
        "served-float32 (added when missing)",
    )
    r = p.add_argument_group("retrieval (serving's two stages; model.scoring.ann)")
    r.add_argument(
        "--retrieval", choices=("exact", "ann"), default="exact",
        help="ann: rank each event over what serving's ANN index would let it score (the "
        "index's candidates, the rows changed since it was built, the prior's and the cold "
        "start's top, the history's co-visitation rows), as serving ranks catalogues of "
        "serving.ann_min_items items; exact: every candidate (learned mix only)")
    r.add_argument("--ann-candidates", type=int, default=None,
                   help="default: serving.ann_candidates")
    r.add_argument("--ann-nprobe", type=int, default=None, help="default: serving.ann_nprobe")
    r.add_argument("--ann-lists", type=int, default=None, help="default: serving.ann_lists")
    c = p.add_argument_group("cluster (model/cluster; default: one process)")
    c.add_argument("--ps", type=int, default=0, help="train on N parameter servers (with --workers)")
    c.add_argument("--workers", type=int, default=0, help="workers of the cluster (with --ps)")
    c.add_argument("--wire-dtype", choices=("float32", "bfloat16"), default=None,
                   help="rows and updates on the cluster's wire (default: trainer.wire_dtype)")
    it = p.add_argument_group("item catalogue (feature_store/catalogue.py slots)")
    it.add_argument("--items", type=Path, default=None, metavar="FILE",
                    help="catalogue file (NDJSON item records or MovieLens movies.csv): its "
                    "items are candidates from the start, the model composes their "
                    "attributes (--slots), the content baseline ranks by them, and the "
                    "figures are also given by the item's earlier positives")
    it.add_argument("--slots", action=argparse.BooleanOptionalAction, default=True,
                    help="with --items: the model's item rows compose the attribute slots "
                    "(--no-slots: ids only, over the same candidates)")
    it.add_argument("--attr-tokens", type=int, default=32,
                    help="most attribute tokens an item's row composes")
    it.add_argument("--attr-admit-after", type=int, default=None, metavar="N",
                    help="an attribute key gets a row once N catalogued items name it "
                    "(default: trainer.attr_admit_after, 1: every key)")
    it.add_argument("--attr-lr", type=float, default=None,
                    help="Adagrad step of the attribute table (default: 3 times the "
                    "tables' step)")
    it.add_argument("--content-window", type=int, default=20,
                    help="content: the user's last items whose categories count")
    it.add_argument("--content-gamma", type=float, default=1.0,
                    help="content: popularity damping exponent, (count + 1) ** gamma")
    p.add_argument("--json", type=Path, default=None, help="write the figures as JSON")
    p.add_argument("--plot", type=Path, default=None, help="draw the figures over time (PNG)")
    p.add_argument("--progress", action="store_true", help="show a progress bar")
    p.set_defaults(func=_handle)


def _handle(args: argparse.Namespace) -> int:
    from stream.replay.formats import ReplayFormatError, parse_mapping
    from stream.replay.runner import ReplayError
    from streamrec.settings import load_settings

    settings = load_settings()
    now_ms = time.time_ns() // 1_000_000
    started = time.monotonic()
    try:
        from model.evaluation.replay import load_stream

        args.catalogue = _catalogue(args, settings, now_ms)
        stream, replay_report = load_stream(
            args.paths,
            args.format,
            settings.features,
            now_ms,
            mapping=parse_mapping(args.map),
            like_threshold=args.like_threshold,
            event_type=args.event_type,
            limit=args.limit,
            catalogue=[(item["item_id"], int(item["ts"])) for item in args.catalogue],
        )
    except (ReplayError, ReplayFormatError, ValueError) as exc:
        print(f"evaluate: {exc}")
        return 2
    if not stream.positives:
        print("evaluate: no positive events in the log")
        return 1
    if (args.ps > 0) != (args.workers > 0):
        print("evaluate: a cluster needs --ps and --workers both >= 1")
        return 2
    if args.ps and args.items is not None and args.slots:
        print("evaluate: item attributes (--items with --slots) train in one process; not with --ps")
        return 2
    if args.row_codec and args.items is not None and args.slots:
        print("evaluate: --row-codec plays rows without item attributes; use --no-slots")
        return 2
    if args.ps and args.row_codec:
        # the cluster's rows reach the chief's tables only at a cut: no delta stream to play
        print("evaluate: --row-codec plays the delta stream of one process; not with --ps")
        return 2
    result = _run(args, settings, stream)
    doc = result.report("model", args.chunks, args.side)
    doc["seconds"] = round(time.monotonic() - started, 1)
    doc["rejected_rows"] = replay_report["rejected"]
    doc["exclude"] = args.exclude
    doc["config"] = run_config(args, settings)
    doc["score_weights"] = args.score_weights
    doc["history_groups"] = args.history_groups
    doc["item_groups"] = args.item_groups
    if args.retrieval == "ann":
        # how much of the catalogue the two stages scored per event (the rest: left out)
        doc["retrieval_share"] = round(args.retrieval_share, 4)
    if args.codecs:
        doc["row_codecs"] = _codec_figures(doc, args)
    print(table(doc))
    print("score weights (" + doc["config"]["mix"] + "): "
          + ", ".join(f"{k} {v:.3f}" for k, v in args.score_weights.items()))
    if args.history_groups:
        starts = args.history_groups["starts"]
        names = [f"{s}-{e - 1}" if e - 1 > s else f"{s}" for s, e in zip(starts, starts[1:],
                                                                            strict=False)]
        names.append(f"{starts[-1]}+")
        print("scales of the learned weights per history size (co-visitation, session-kNN): "
              + ", ".join(f"{name} items {a:g}, {b:g}" for name, (a, b) in
                          zip(names, args.history_groups["scales"], strict=True)))
    if args.item_groups:
        print("scales of the towers' part on rare items: " + ", ".join(
            f"{s} positives {x:g}" if s + 1 == e else f"{s}-{e - 1} positives {x:g}"
            for s, e, x in zip(args.item_groups["starts"],
                               [*args.item_groups["starts"][1:], args.item_groups["below"]],
                               args.item_groups["scales"], strict=True)))
    if args.retrieval == "ann":
        exact = doc.get("side", {}).get("model-exact", {}).get("recall@10")
        print(f"retrieval ann: each event ranked over {100 * args.retrieval_share:.1f}% of the "
              "items the model has a row for, on average"
              + ("" if exact is None else f"; Recall@10 {doc['recall@10']:.4f} against "
                 f"{exact:.4f} ranking every candidate (model-exact)"))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(doc, indent=2))
    if args.plot:
        plot_over_time(doc, args.plot)
    return 0


def _codecs(spec: str | None) -> list[str]:
    """The codecs of ``--row-codec``, float32 (the reference) first."""
    if not spec:
        return []
    from model.delta import CODECS

    asked = [c.strip() for c in spec.split(",") if c.strip()]
    unknown = sorted(set(asked) - set(CODECS))
    if unknown:
        raise SystemExit(f"evaluate: unknown row codec(s) {unknown}: one of {', '.join(CODECS)}")
    return ["float32", *(c for c in dict.fromkeys(asked) if c != "float32")]


def _codec_figures(doc: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    """Per codec: its figures, their relative change against float32 and the delta
    stream's bytes per scored batch."""
    served = doc["side"]
    ref = served["served-float32"]
    out: dict[str, Any] = {}
    for codec in args.codecs:
        figs = served[f"served-{codec}"]
        out[codec] = {
            **figs,
            "change_vs_float32": {k: (v - ref[k]) / ref[k] if ref[k] else None
                                  for k, v in figs.items()},
            "delta_bytes_per_batch": args.codec_bytes[codec] / max(args.codec_deltas, 1),
        }
    return out


def _run(args: argparse.Namespace, settings: Any, stream: Any) -> Any:
    from contextlib import ExitStack

    with ExitStack() as stack:
        return _run_in(args, settings, stream, stack)


def _run_in(args: argparse.Namespace, settings: Any, stream: Any, stack: Any) -> Any:
    from model.evaluation.baselines import (
        CooccurrenceBaseline,
        ItemKNNBaseline,
        PopularityBaseline,
        RecentPopularityBaseline,
        SequentialRulesBaseline,
        SessionKNNBaseline,
    )
    from model.evaluation.learners import (
        BaselineLearner,
        ExactLearner,
        HistoryLearner,
        PartLearner,
        TwoTowerLearner,
    )
    from model.evaluation.replay import EvalOptions, Learner, evaluate
    from model.towers.two_tower import ModelConfig
    from model.trainer.trainer import Trainer, TrainOptions

    cfg = run_config(args, settings)
    make: Any = Trainer
    if args.ps:
        from functools import partial

        wire = cfg["cluster"]["wire_dtype"]
        make = partial(_cluster, stack, settings, args.ps, args.workers, wire)
    trainer = make(
        ModelConfig(
            embedding_dim=cfg["embedding_dim"],
            user_layers=tuple(cfg["user_layers"]),
            history_len=cfg["history_len"],
            history_decay=cfg["history_decay"],
            pool_residual=cfg["pool_residual"],
            covisit_weight=cfg["covisit_weight"],
            mix=cfg["mix"],
            mix_lr=cfg["mix_lr"],
            mix_select=cfg["mix_select"],
            rare_select=cfg["rare_select"],
            covisit_window=cfg["covisit_window"],
            covisit_decay=cfg["covisit_decay"],
            covisit_half_life=cfg["covisit_half_life"],
            covisit_reverse=cfg["covisit_reverse"],
            sknn_weight=cfg["sknn_weight"],
            sknn_sample=cfg["sknn_part_sample"],
            sknn_k=cfg["sknn_part_k"],
            sknn_window=cfg["sknn_part_window"],
            train_history=cfg["train_history"],
            **{k: v for k, v in cfg.items() if k.startswith(("user_tower", "attention_"))},
            temperature=cfg["temperature"],
            normalize=cfg["normalize"],
            admit_after=cfg["admit_after"],
            user_admit_after=cfg["user_admit_after"],
            normalize_user=cfg["normalize_user"],
            prior_weight=cfg["prior_weight"],
            seed=cfg["seed"],
            attr_tokens=cfg["attr_tokens"],
            attr_admit_after=cfg["attr_admit_after"],
        ),
        TrainOptions(
            batch_size=args.batch_size,
            learning_rate=cfg["learning_rate"],
            dense_lr=cfg["dense_lr"],
            aux_weight=cfg["aux_weight"],
            eval_rows=0,
            # the evaluation evicts nothing and steps each micro-batch once per epoch
            evict_every_steps=0,
            spare_epochs=1,
            sampled_negatives=cfg["sampled_negatives"],
            mask_same_user=cfg["mask_same_user"],
            logq_estimator=cfg["logq_estimator"],
            logq_half_life=cfg["logq_half_life"],
            attr_lr=cfg["attr_lr"],
        ),
        tag=_eval_tag(),
    )
    if cfg["attr_tokens"]:
        trainer.set_catalogue(args.spec, ((it["item_id"], it["attributes"])
                                          for it in args.catalogue))
    args.codecs = _codecs(args.row_codec)
    if args.retrieval == "ann" and cfg["mix"] != "learned":
        raise SystemExit("evaluate: --retrieval ann ranks the learned mix (--mix learned)")
    served: list[Learner] = []
    if args.codecs:
        from model.evaluation.served import ServedLearner, ServedRows

        rows = ServedRows(trainer, stream.item_ids, args.codecs)
        served = [ServedLearner(rows, c, stream.item_index) for c in args.codecs]
    model = TwoTowerLearner(trainer, trainer.config.window, cfg["epochs"]).bind(
        stream.item_ids, lambda pos: stream.excluded(pos, args.exclude), _ann_params(args)
    )
    # the towers alone, from the same rows' parts (learned mix only: the fixed mix has none)
    parts: list[Learner] = [PartLearner(model, "tower")] if cfg["mix"] == "learned" else []
    if model.ann is not None:  # and the model ranking every candidate, on the same rows
        parts.append(ExactLearner(model))
    args.side = [m.name for m in (*parts, *served)]
    learners: list[Learner] = [
        model,
        *parts,
        *served,
        BaselineLearner(PopularityBaseline()),
        BaselineLearner(RecentPopularityBaseline(args.recent_window)),
        HistoryLearner(CooccurrenceBaseline(args.cooc_window), stream.item_index),
        HistoryLearner(
            ItemKNNBaseline(args.itemknn_window, args.itemknn_alpha, args.itemknn_decay),
            stream.item_index,
        ),
        HistoryLearner(SequentialRulesBaseline(args.sr_steps, args.sr_query), stream.item_index),
        HistoryLearner(
            SessionKNNBaseline(args.sknn_sample, args.sknn_window, k=args.sknn_k or None),
            stream.item_index,
        ),
    ]
    if args.catalogue:
        from model.evaluation.content import ContentBaseline

        learners.append(HistoryLearner(
            ContentBaseline(_category_tokens(args, stream.item_ids), args.content_window,
                            args.content_gamma),
            stream.item_index))
    options = EvalOptions(
        batch_size=args.batch_size,
        warmup_fraction=args.warmup,
        chunks=args.chunks,
        exclude=args.exclude,
    )
    bar = None
    if args.progress:
        from tqdm import tqdm

        bar = tqdm(total=0, unit="batch")

    def progress(done: int, total: int) -> None:
        if bar is not None:
            bar.total = total
            bar.update(done - bar.n)

    try:
        result = evaluate(stream, learners, options, progress)
        args.score_weights = trainer.mixer.as_dict()
        args.history_groups = trainer.history_groups()
        args.item_groups = trainer.item_groups()
        args.retrieval_share = model.retrieval_share
        if args.codecs:
            args.codec_bytes, args.codec_deltas = rows.bytes, rows.deltas
        return result
    finally:
        if bar is not None:
            bar.close()


def _catalogue(args: argparse.Namespace, settings: Any, now_ms: int) -> list[dict[str, Any]]:
    """The items of ``--items`` (wire records, deletions dropped); [] without it. Sets
    ``args.spec``, the feature spec they are read with."""
    from feature_store.catalogue import FeatureSpec
    from stream.items import read_catalogue

    args.spec = FeatureSpec.load(settings.features.spec_file)
    if args.items is None:
        return []
    return [item for item in read_catalogue(args.items, spec=args.spec, now_ms=now_ms)
            if not item.get("deleted")]


def _category_tokens(args: argparse.Namespace, item_ids: list[str]) -> list[list[int]]:
    """Per candidate, the ids of its category tokens (``ContentBaseline``)."""
    from feature_store.catalogue import slot_tokens
    from model.evaluation.content import CATEGORY_KINDS

    slots = [s for s in args.spec.item_slots if s.kind in CATEGORY_KINDS]
    attrs = {item["item_id"]: item["attributes"] for item in args.catalogue}
    vocab: dict[tuple[str, str], int] = {}
    out = []
    for item_id in item_ids:
        a = attrs.get(item_id, {})
        out.append([vocab.setdefault((s.name, t), len(vocab))
                    for s in slots for t in slot_tokens(s, a.get(s.name))])
    return out


#: Evaluations run so far in this process (:func:`_eval_tag`).
_RUNS = itertools.count()


def _eval_tag() -> str:
    """The model tag of this process's next evaluation: "eval", then "eval1", "eval2", ...
    TFRA tables of one name share their rows within a process, so a second evaluation
    under the first one's tag would start from the rows the first trained (on its whole
    log: the future of every event the second one scores)."""
    n = next(_RUNS)
    return f"eval{n}" if n else "eval"


def _cluster(stack: Any, settings: Any, ps: int, workers: int, wire: str, config: Any,
             options: Any, tag: str) -> Any:
    """A ClusterTrainer on ``ps`` + ``workers`` local servers that stop with ``stack``."""
    from model.cluster.local import local_trainer

    log_dir = settings.stack.run_dir / "logs" / "evaluate-cluster"
    return stack.enter_context(
        local_trainer(settings, ps, workers, config, options, wire_dtype=wire, tag=tag,
                      log_dir=log_dir)
    )


def _ann_params(args: argparse.Namespace) -> Any:
    """``AnnParams`` of ``--retrieval ann`` (serving's settings where a flag is not given),
    or None for exact ranking."""
    if args.retrieval != "ann":
        return None
    from model.scoring.ann import AnnParams
    from streamrec.settings import load_settings

    sv = load_settings().serving
    return AnnParams(
        nlist=args.ann_lists if args.ann_lists is not None else sv.ann_lists,
        nprobe=args.ann_nprobe if args.ann_nprobe is not None else sv.ann_nprobe,
        candidates=args.ann_candidates if args.ann_candidates is not None else sv.ann_candidates,
        rebuild_share=sv.ann_rebuild_share)
