"""The configuration of a ``streamrec evaluate`` run: its flags over the live trainer's
defaults (``ModelConfig`` / ``TrainOptions``), as the report's ``config`` records it.
"""

from __future__ import annotations

import argparse
from typing import Any


def run_config(args: argparse.Namespace, settings: Any) -> dict[str, Any]:
    dim = args.embedding_dim or settings.trainer.embedding_dim
    layers = args.user_layers or f"{2 * dim},{dim}"
    return {
        "batch_size": args.batch_size,
        "warmup": args.warmup,
        "epochs": args.epochs,
        "learning_rate": args.learning_rate,
        "dense_lr": args.dense_lr,
        "temperature": _default(args.temperature, "temperature"),
        "embedding_dim": dim,
        "user_layers": [int(x) for x in layers.split(",")],
        "history_len": _default(args.history_len, "history_len"),
        "history_decay": _default(args.history_decay, "history_decay"),
        "pool_residual": _default(args.pool_residual, "pool_residual"),
        "covisit_weight": _default(args.covisit_weight, "covisit_weight"),
        "mix": _default(args.mix, "mix"),
        "retrieval": getattr(args, "retrieval", "exact"),
        "mix_lr": _default(args.mix_lr, "mix_lr"),
        "mix_select": bool(_default(args.mix_select, "mix_select")),
        "rare_select": _default(getattr(args, "rare_select", None), "rare_select"),
        "covisit_window": _default(args.covisit_window, "covisit_window"),
        "covisit_decay": _default(args.covisit_decay, "covisit_decay"),
        "covisit_half_life": _default(args.covisit_half_life, "covisit_half_life"),
        "covisit_reverse": _default(args.covisit_reverse, "covisit_reverse"),
        "sknn_weight": _default(args.sknn_weight, "sknn_weight"),
        "sknn_part_sample": _default(args.sknn_part_sample, "sknn_sample"),
        "sknn_part_k": _default(args.sknn_part_k, "sknn_k"),
        "sknn_part_window": _default(args.sknn_part_window, "sknn_window"),
        "train_history": bool(_default(args.history_grad, "train_history")),
        "user_tower": _default(args.user_tower, "user_tower"),
        **{
            f"attention_{n}": _default(getattr(args, f"attention_{n}"), f"attention_{n}")
            for n in ("blocks", "heads", "len", "ffn")
        },
        "attention_pool": bool(_default(args.attention_pool, "attention_pool")),
        "admit_after": args.admit_after,
        "normalize": not args.no_normalize,
        "normalize_user": not args.no_normalize_user,
        "prior_weight": _default(args.prior_weight, "prior_weight"),
        "user_admit_after": args.user_admit_after,
        "seed": settings.trainer.seed if args.seed is None else args.seed,
        "exclude": args.exclude,
        "recent_window": args.recent_window,
        "cooc_window": args.cooc_window,
        "itemknn_window": args.itemknn_window,
        "itemknn_alpha": args.itemknn_alpha,
        "itemknn_decay": args.itemknn_decay,
        "sr_steps": args.sr_steps,
        "sr_query": args.sr_query,
        "sknn_sample": args.sknn_sample,
        "sknn_k": args.sknn_k,
        "sknn_window": args.sknn_window,
        "sampled_negatives": _default(args.negatives, "sampled_negatives"),
        "mask_same_user": bool(_default(args.mask_same_user, "mask_same_user")),
        "logq_estimator": _default(args.logq, "logq_estimator"),
        "logq_half_life": _default(args.logq_half_life, "logq_half_life"),
        "aux_weight": _default(args.aux_weight, "aux_weight"),
        "items": None if getattr(args, "items", None) is None else str(args.items),
        "attr_tokens": (args.attr_tokens if getattr(args, "items", None) is not None
                        and args.slots else 0),
        "attr_lr": getattr(args, "attr_lr", None),
        "attr_admit_after": _default(getattr(args, "attr_admit_after", None),
                                     "attr_admit_after"),
        "content_window": getattr(args, "content_window", 20),
        "content_gamma": getattr(args, "content_gamma", 1.0),
        "cluster": {"ps": args.ps, "workers": args.workers,
                    "wire_dtype": args.wire_dtype or settings.trainer.wire_dtype},
    }


def _default(value: Any, name: str) -> Any:
    """``value`` if given, else the ``ModelConfig``/``TrainOptions`` default (the live
    trainer's)."""
    if value is not None:
        return value
    from dataclasses import fields

    from model.towers.two_tower import ModelConfig
    from model.trainer.options import TrainOptions

    defaults = {f.name: f.default for cls in (ModelConfig, TrainOptions) for f in fields(cls)}
    return defaults[name]
