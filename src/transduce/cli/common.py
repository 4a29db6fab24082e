"""What the commands that decode share once their flags are parsed (the flags themselves are
`transduce.cli.options`): checking the decoding flags, loading the model they choose, and the
keyword arguments of the decoding calls."""

from __future__ import annotations

import argparse
import contextlib
import math
import sys

import torch

from ..device import resolve_device
from ..translate import LoadedModel, choose_workers, load_translation_model


def fill_decoding_defaults(args: argparse.Namespace, **defaults) -> None:
    """Set the decoding flags left unset (None) to `defaults` (beam=..., alpha=..., ...)."""
    for name, value in defaults.items():
        if getattr(args, name, None) is None:
            setattr(args, name, value)


def check_decoding_args(args: argparse.Namespace) -> None:
    """Refuse, before anything loads, the model and decoding flags that cannot work."""
    if args.threads is not None and args.threads < 1:
        raise ValueError(f"--threads must be at least 1, not {args.threads}")
    if not (math.isfinite(args.alpha) and args.alpha >= 0):  # nan: every line runs to the maximum length
        raise ValueError(f"--alpha must be a finite number >= 0, not {args.alpha}")
    for name in ("beam", "batch_tokens", "batch_size", "max_input_tokens", "chunk_lines"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be at least 1")
    if args.max_len_offset < 0:
        raise ValueError("--max-len-offset must not be negative")
    if getattr(args, "constrained", False) and args.greedy:  # parse, evaluate
        raise ValueError("--constrained is a beam search: give --beam 1 rather than --greedy")
    if args.workers != "auto" and args.workers > 1 and resolve_device(args.device).type != "cpu":
        raise ValueError("--workers is for the CPU: on a GPU, decode with one process")
    if args.precision == "int8" and resolve_device(args.device).type != "cpu":
        raise ValueError("--precision int8 runs on the CPU only: add --device cpu")
    if args.precision == "bf16":
        dev = resolve_device(args.device)
        if dev.type == "cuda" and not torch.cuda.is_bf16_supported():
            raise ValueError("this GPU does not support bf16")


def load_from_args(args: argparse.Namespace) -> LoadedModel:
    """The model the model flags choose, in the precision --precision chooses
    (`transduce.ready.load_for_decoding`); `args.workers` is set to the workers chosen and
    `args.bf16` to whether the precision is bf16."""
    from ..ready import load_for_decoding

    loaded = load_for_decoding(args.model_path, precision=args.precision, device=args.device, threads=args.threads,
                               workers=getattr(args, "workers", None), checkpoint=args.checkpoint,
                               average=args.average, vocab=args.vocab, src_vocab=args.src_vocab,
                               tgt_vocab=args.tgt_vocab)
    if getattr(args, "workers", None) is not None:  # translate, evaluate, parse
        args.workers = loaded.workers
    args.bf16 = loaded.precision.precision == "bf16"
    return loaded


def decoding_options(args: argparse.Namespace) -> dict:
    """The keyword arguments of `translate_stream` / `translate_lines` that the flags set."""
    return dict(beam=args.beam, alpha=args.alpha, max_len_offset=args.max_len_offset, greedy=args.greedy,
                batch_tokens=args.batch_tokens, batch_size=args.batch_size, max_input_tokens=args.max_input_tokens,
                bf16=args.bf16, chunk_lines=args.chunk_lines, workers=args.workers)


@contextlib.contextmanager
def exit_on_sigterm(prog: str):
    """While entered (in the main thread; elsewhere it does nothing), SIGTERM ends the command as
    Ctrl-C does, through its `finally` blocks (an output's temporary file is discarded, the
    file it would replace left as it was), with "terminated" and the status the signal's own
    action gives, 143 (128 + 15). Forked decoding workers go back to the default action
    (`transduce.translate`)."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handle(signum, frame):
        signal.signal(signal.SIGTERM, signal.SIG_DFL)  # a second SIGTERM ends it at once
        print(f"{prog}: terminated", file=sys.stderr)
        raise SystemExit(128 + signum)

    previous = signal.signal(signal.SIGTERM, handle)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
