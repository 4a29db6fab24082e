"""Flags shared by `transduce translate` and `transduce evaluate`: which model (and vocabulary)
to load, the search of Section 6.1 and the batching of the input; and loading the model they
choose."""

from __future__ import annotations

import argparse
import contextlib
import math
import sys
from pathlib import Path

import torch

from ..device import DEVICES, resolve_device
from ..precision import DECODING_PRECISIONS
from ..translate import (
    DEFAULT_ALPHA, DEFAULT_BATCH_SIZE, DEFAULT_BATCH_TOKENS, DEFAULT_BEAM, DEFAULT_CHUNK_LINES, DEFAULT_MAX_INPUT_TOKENS,
    DEFAULT_MAX_LEN_OFFSET, WORKERS_MAX_D_MODEL, LoadedModel, choose_workers, load_translation_model,
)


def add_model_args(parser: argparse.ArgumentParser) -> None:
    """Options that choose the model and the vocabulary."""
    g = parser.add_argument_group("model")
    g.add_argument("--checkpoint", metavar="NAME|PATH",
                   help="one checkpoint of the run, unaveraged: step_0100000, 100000, latest, model (the final "
                        "weights), or a model directory")
    g.add_argument("--average", type=int, metavar="K",
                   help="average the last K checkpoints of the run in memory (default for a run directory: the "
                        "run's train.average_last, as in 6.1: 5 base, 20 big; or all it has, if fewer)")
    g.add_argument("--vocab", type=Path, metavar="SPM_MODEL", help="shared sentencepiece model (default: found beside the model)")
    g.add_argument("--src-vocab", type=Path, metavar="SPM_MODEL", help="separate source vocabulary")
    g.add_argument("--tgt-vocab", type=Path, metavar="SPM_MODEL", help="separate target vocabulary")
    g.add_argument("--device", default="auto", metavar="NAME", help=f"{DEVICES} (default: auto, CUDA if available)")
    g.add_argument("--threads", type=int, metavar="N", help="CPU threads, at least 1 (default: PyTorch's)")


def add_decoding_args(parser: argparse.ArgumentParser, *, beam: int | None = DEFAULT_BEAM, alpha: float | None = DEFAULT_ALPHA,
                      max_len_offset: int | None = DEFAULT_MAX_LEN_OFFSET, batch_size: int | None = DEFAULT_BATCH_SIZE,
                      section: str = "6.1", note: str = "") -> None:
    """Search and batching options, with these defaults (None: chosen later by the task, `note`
    says how)."""
    def default(value) -> str:
        return f"default {value}" if value is not None else f"default: {note}"

    g = parser.add_argument_group(f"search (Section {section})")
    g.add_argument("--beam", type=int, default=beam, help=f"beam size ({default(beam)})")
    g.add_argument("--alpha", type=float, default=alpha,
                   help=f"length penalty ((5+|Y|)/6)^alpha ({default(alpha)})")
    g.add_argument("--max-len-offset", type=int, default=max_len_offset,
                   help=f"maximum output length = input length + this ({default(max_len_offset)})")
    g.add_argument("--greedy", action="store_true", help="greedy decoding (the fast beam-1 path; ignores --beam, --alpha)")
    add_precision_args(g)
    g = parser.add_argument_group("batching")
    g.add_argument("--batch-tokens", type=int, default=DEFAULT_BATCH_TOKENS,
                   help=f"padded source tokens per batch at most (default {DEFAULT_BATCH_TOKENS})")
    g.add_argument("--batch-size", type=int, default=batch_size,
                   help=f"sentences per batch at most ({default(batch_size)})")
    g.add_argument("--max-input-tokens", type=int, default=DEFAULT_MAX_INPUT_TOKENS,
                   help=f"longer input lines are truncated, with a warning (default {DEFAULT_MAX_INPUT_TOKENS})")
    g.add_argument("--chunk-lines", type=int, default=DEFAULT_CHUNK_LINES,
                   help=f"lines read and sorted by length at a time (default {DEFAULT_CHUNK_LINES})")
    g.add_argument("--workers", type=_workers, default="auto", metavar="W",
                   help="CPU: decode W batches at once, in W processes forked from this one, the threads divided "
                        f"among them; auto (default): one per thread for models up to d_model {WORKERS_MAX_D_MODEL} "
                        "read from a file, else 1 (the choice is printed; docs/speed.md); fewer batches than "
                        "workers (a short input) are decoded in this process with every thread")


def _workers(value: str) -> int | str:
    if value == "auto":
        return value
    try:
        n = int(value)
    except ValueError:
        n = 0
    if n < 1:
        raise argparse.ArgumentTypeError(f"expected auto or a positive number, not {value!r}")
    return n


def add_precision_args(g) -> None:
    """--precision (and its short forms --bf16, --int8), for translate, evaluate and serve."""
    g.add_argument("--precision", choices=DECODING_PRECISIONS, default="auto",
                   help="auto (default): fp32 or bf16 weights, whichever a short timed probe of a decoding step's "
                        "products at the model's sizes finds faster (bf16 needs 1.25x; never probed, never chosen "
                        "where the CPU only emulates bf16); the choice and the measured ratios are printed. "
                        "auto-int8: the same, int8 also a candidate (taken at 1.1x the better float). fp32; bf16 "
                        "(warns where the CPU only emulates it); int8 (CPU only, not exact: the decoder's linear layers' "
                        "weights int8 per output channel, activations quantized on the fly, products through "
                        "oneDNN's int8 kernels, the source side and the rest in bf16 where the CPU has it "
                        "natively, else fp32; on a CPU with AMX the output projection alone, where bf16 beats "
                        "int8 at the decoder's sizes; TRANSDUCE_INT8_LAYERS=decoder|output|all chooses; "
                        "docs/speed.md). Log-probabilities and scores stay fp32")
    g.add_argument("--bf16", action="store_const", const="bf16", dest="precision", help="the same as --precision bf16")
    g.add_argument("--int8", action="store_const", const="int8", dest="precision", help="the same as --precision int8")


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
    """The model the model flags choose, in the precision --precision chooses (`args.bf16` is
    set to whether that is bf16)."""
    if args.threads:
        torch.set_num_threads(args.threads)
    loaded = load_translation_model(
        args.model_path, checkpoint=args.checkpoint, average=args.average, vocab=args.vocab,
        src_vocab=args.src_vocab, tgt_vocab=args.tgt_vocab, device=resolve_device(args.device),
    )
    from ..int8 import int8_shapes
    from ..precision import choose_decoding_precision

    mc = loaded.config.model
    threads = torch.get_num_threads()
    if getattr(args, "workers", None) is not None:  # translate, evaluate, parse
        args.workers, why = choose_workers(args.workers, next(loaded.model.parameters()).device, threads, mc.d_model)
        loaded.workers_line = f"workers: {args.workers} x {max(1, threads // args.workers)} thread(s) ({why})"
    # measured with the threads each worker will decode with (what is fastest changes with them)
    torch.set_num_threads(max(1, threads // (args.workers if getattr(args, "workers", None) else 1)))
    try:
        loaded.precision = choose_decoding_precision(args.precision, next(loaded.model.parameters()).device,
                                                     d_model=mc.d_model, d_ff=mc.d_ff, vocab=mc.target_vocab_size,
                                                     shapes=int8_shapes(loaded.model))
    finally:
        torch.set_num_threads(threads)
    args.bf16 = loaded.precision.precision == "bf16"
    if args.bf16:
        loaded.model.to(torch.bfloat16)  # bf16 weights: no per-step casts (faster than autocast)
    elif loaded.precision.precision == "int8":
        from ..int8 import quantize_int8

        if loaded.precision.base == "bf16":
            loaded.model.to(torch.bfloat16)  # what int8 leaves as is runs in bf16
        quantize_int8(loaded.model, **loaded.precision.int8_options())  # once, here; kernels.apply keeps it
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
