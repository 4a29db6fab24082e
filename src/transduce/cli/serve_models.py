"""`transduce serve` with several models (`transduce.serve.models`): whether the MODEL arguments
are a set (`several`), and the set opened, every model read and checked, none loaded (`open_set`:
each is loaded on demand, on the decoding thread, as the flags say)."""

from __future__ import annotations

import argparse

from ..errors import UsageError
from .common import load_from_args


def several(args: argparse.Namespace) -> bool:
    """Whether the models are a set (`serve.models`): MODEL given more than once, a directory of
    model directories, --max-memory or --pivot."""
    from ..checkpoint import check_model_path

    if len(args.model_paths) > 1 or args.max_memory is not None or args.pivot is not None:
        return True
    try:
        check_model_path(args.model_path)
    except FileNotFoundError:
        return args.model_path.is_dir() and args.engine == "torch" and args.checkpoint is None
    return False


def open_set(args: argparse.Namespace, limits):
    """The models behind the server, read (not loaded: each on demand, on the decoding thread),
    every one checked now."""
    from ..serve.backend import torch_engine
    from ..serve.catalog import parse_size
    from ..serve.models import open_models

    for flag in ("checkpoint", "vocab", "src_vocab", "tgt_vocab"):
        if getattr(args, flag, None) is not None:
            raise UsageError(f"--{flag.replace('_', '-')} is one model's: serve that model alone")
    if args.engine != "torch":
        raise UsageError("--engine ct2 serves one model: several are served by the torch engine")
    max_memory = parse_size(args.max_memory) if args.max_memory is not None else None

    def load(served):
        one = argparse.Namespace(**{**vars(args), "model_path": served.path, "keep_freed": False})  # unloads give back
        loaded = load_from_args(one)
        return torch_engine(
            loaded,
            batch_tokens=args.batch_tokens,
            batch_size=args.batch_size,
            max_tokens=limits.max_tokens,
            bf16=one.bf16,
        )

    models = open_models(args.model_paths, load, max_memory=max_memory, pivot=args.pivot)
    if models.pivot is not None and models.pivot not in models.sources():
        raise UsageError(f"--pivot {args.pivot}: no model translates from it")
    return models
