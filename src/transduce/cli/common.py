"""What the commands that decode share once their flags (`transduce.cli.options`) are parsed:
their checks, the model they choose, the decoding calls' keyword arguments, line-for-line streams."""

from __future__ import annotations

import argparse
import contextlib
import math
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from .. import defaults
from ..data.text import iter_lines, open_text

if TYPE_CHECKING:  # the library that imports PyTorch: imported where it is used, not by the flags (--help)
    from ..decoding.ready import LoadedModel


def fill_decoding_defaults(args: argparse.Namespace, parsing: bool = False) -> None:
    """Set the search and batch flags left unset (None) to the task's defaults: translation's
    (Section 6.1), or with `parsing` the parser's (6.3)."""
    for name in ("beam", "alpha", "max_len_offset", "batch_size"):
        if getattr(args, name, None) is None:
            setattr(args, name, getattr(defaults, ("PARSE_" if parsing else "") + name.upper()))


class ModelDefault:
    """A flag's default that an imported model's own setting replaces (`fill_model_search_defaults`);
    equal to the value it stands for, so that the parsed flags read as their defaults."""


class _Int(int, ModelDefault):
    pass


class _Float(float, ModelDefault):
    pass


class _Str(str, ModelDefault):
    pass


def model_default(value):
    """`value` (int, float or str) marked as a default that an imported model's own may replace."""
    return {int: _Int, float: _Float, str: _Str}[type(value)](value)


def fill_model_search_defaults(args: argparse.Namespace) -> None:
    """--beam and --length-penalty left at their defaults (`model_default`): an imported model's own
    settings, the search Hugging Face generate runs by default (`transduce.checkpoint.generation`,
    found beside MODEL as its vocabulary is), each setting the flags leave unset; with no such
    model, the defaults (Section 6.1's beam 4, gnmt:0.6) as they are."""
    from ..checkpoint.generation import find_generation

    path = Path(args.model_path)
    own = find_generation([path, path.parent, path.parent.parent]) if path.is_dir() else None
    if own is None or getattr(args, "engine", "torch") != "torch":
        return
    search = own.search()
    if isinstance(args.beam, ModelDefault):
        args.beam, args.greedy = search["beam"], args.greedy or search["greedy"]
    if isinstance(args.length_penalty, ModelDefault):
        args.length_penalty, args.alpha = search["length_penalty"], search["alpha"]


def warner(prog: str):
    """A function that prints "PROG: warning: MESSAGE" on stderr, above the progress bar if any."""
    from tqdm import tqdm

    return lambda msg: tqdm.write(f"{prog}: warning: {msg}", file=sys.stderr)


def check_search_args(args: argparse.Namespace, *at_least_1: str) -> None:
    """Refuse --threads, --length-penalty, --beam, --max-len-offset and the flags `at_least_1` out
    of range; `args.alpha` becomes a number."""
    if args.threads is not None and args.threads < 1:
        raise ValueError(f"--threads must be at least 1, not {args.threads}")
    check_length_penalty(args)
    for name in ("beam", *at_least_1):
        if getattr(args, name) < 1:
            flag = "truncate-input" if name == "max_input_tokens" else name.replace("_", "-")  # its flag's name
            raise ValueError(f"--{flag} must be at least 1")
    if args.max_len_offset < 0:
        raise ValueError("--max-len-offset must not be negative")


def check_length_penalty(args: argparse.Namespace) -> None:
    """--length-penalty FORMULA[:ALPHA] (`transduce.cli.options.LengthPenalty`): a known formula
    and an alpha that is a finite number >= 0 (none: no alpha); `args.alpha` a float from here on."""
    from .options import LENGTH_PENALTIES

    formula, alpha = args.length_penalty, args.alpha
    given = f"--length-penalty {formula}" + (f":{alpha}" if isinstance(alpha, str) else "")
    if formula not in LENGTH_PENALTIES:
        raise ValueError(f"{given}: the formula is one of {', '.join(LENGTH_PENALTIES)} (e.g. gnmt:0.6, the paper's)")
    if formula == "none" and alpha not in (0.0, None):
        raise ValueError(f"{given}: none takes no alpha")
    try:
        value = float(alpha)
    except (TypeError, ValueError):
        value = math.nan
    if not (math.isfinite(value) and value >= 0):  # nan: every line runs to the maximum length
        raise ValueError(f"{given}: alpha must be a finite number >= 0")
    args.alpha = value


PENALTY_KINDS = {"gnmt": "paper", "none": "paper", "hf": "hf", "ct2": "ct2"}
"""--length-penalty's formula -> the library's `length_penalty` argument (none is alpha 0)."""


def library_length_penalty(args: argparse.Namespace, what: str, takes: tuple[str, ...] = ("gnmt", "none")) -> str:
    """The library's `length_penalty` for --length-penalty, refused in one line where `what` (a
    command or engine) decodes with none of `takes`."""
    if args.length_penalty not in takes:
        raise ValueError(f"--length-penalty {args.length_penalty}: {what} takes {', '.join(takes)}")
    return PENALTY_KINDS[args.length_penalty]


def check_decoding_args(args: argparse.Namespace) -> None:
    """Refuse, before anything loads, the model and decoding flags that cannot work."""
    import torch

    from ..device import resolve_device

    check_search_args(args, "batch_tokens", "batch_size", "max_input_tokens", "chunk_lines")
    if getattr(args, "constrained", False) and args.greedy:  # parse, evaluate
        raise ValueError("--constrained is a beam search: give --beam 1 rather than --greedy")
    if args.workers != "auto" and args.workers > 1 and resolve_device(args.device).type != "cpu":
        raise ValueError("--workers is for the CPU: on a GPU, decode with one process")
    if args.precision == "int8" and resolve_device(args.device).type != "cpu":
        raise ValueError("--precision int8 runs on the CPU only: add --device cpu")
    if args.precision == "bf16" and resolve_device(args.device).type == "cuda" and not torch.cuda.is_bf16_supported():
        raise ValueError("this GPU does not support bf16")


def load_from_args(args: argparse.Namespace) -> LoadedModel:
    """The model the model flags choose, in the precision --precision chooses (fp32 without one;
    `transduce.decoding.ready.load_for_decoding`); `args.workers` is set to the workers chosen and
    `args.bf16` to whether the precision is bf16."""
    from ..decoding.ready import load_for_decoding

    loaded = load_for_decoding(
        args.model_path,
        precision=getattr(args, "precision", "fp32"),
        device=args.device,
        threads=args.threads,
        workers=getattr(args, "workers", None),
        checkpoint=args.checkpoint,
        average=args.average,
        vocab=args.vocab,
        src_vocab=args.src_vocab,
        tgt_vocab=args.tgt_vocab,
        keep_freed=getattr(args, "keep_freed", True),
    )
    if getattr(args, "workers", None) is not None:  # translate, evaluate, parse
        args.workers = loaded.workers
    args.bf16 = loaded.precision.precision == "bf16"
    return loaded


def model_metadata(path: Path) -> dict | None:
    """The data.json a model is loaded with (its directory's, or the run's above it)."""
    from ..decoding.ready import find_metadata

    return find_metadata([path, path.parent, path.parent.parent])


def decoding_options(args: argparse.Namespace) -> dict:
    """The keyword arguments of `translate_stream` / `translate_lines` that the flags set."""
    return dict(
        beam=args.beam,
        alpha=args.alpha,
        max_len_offset=args.max_len_offset,
        greedy=args.greedy,
        batch_tokens=args.batch_tokens,
        batch_size=args.batch_size,
        max_input_tokens=args.max_input_tokens,
        bf16=args.bf16,
        chunk_lines=args.chunk_lines,
        workers=args.workers,
    )


@contextlib.contextmanager
def exit_on_sigterm(prog: str):
    """While entered (in the main thread), SIGTERM ends the command as Ctrl-C does, through its
    `finally` blocks (an output's temporary file discarded), with "terminated" and status 143."""
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


def to_file(path: Path | None) -> bool:
    """Whether --input or --out names a file (not stdin or stdout: none, or "-")."""
    return path is not None and str(path) != "-"


class LineStreams:
    """The streams of a command that writes a line per input line: --input (or stdin) opened now,
    --out (or stdout) by `output()`, once the model has loaded, written whole or not at all. As a
    context manager: `commit()` at the end; leaving otherwise discards the output."""

    def __init__(self, args: argparse.Namespace):
        self.args, self.out = args, None
        if to_file(args.input):
            self.infile, self.name, self.interactive = open_text(args.input), str(args.input), False
        else:
            self.infile, self.name, self.interactive = sys.stdin.buffer, "<stdin>", sys.stdin.isatty()

    def lines(self):
        return iter_lines(self.infile, self.name)

    def options(self) -> dict:
        """`decoding_options`, one line at a time in an interactive session, and the source's name."""
        one = self.interactive
        return {
            **decoding_options(self.args),
            "chunk_lines": 1 if one else self.args.chunk_lines,
            "workers": 1 if one else self.args.workers,
            "source_name": self.name,
        }

    def output(self):
        """(write, flush) of --out, or of stdout."""
        if to_file(self.args.out):
            from ..checkpoint.files import AtomicOutput

            self.out = AtomicOutput(self.args.out)
            return self.out.write, lambda: None
        return sys.stdout.buffer.write, sys.stdout.buffer.flush

    def commit(self) -> None:
        if self.out is not None:
            self.out.commit()
            self.out = None

    def __enter__(self) -> LineStreams:
        return self

    def __exit__(self, *exc) -> None:
        if self.out is not None:
            self.out.discard()
        if self.infile is not sys.stdin.buffer:
            self.infile.close()
