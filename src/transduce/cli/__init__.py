"""The `transduce` command: one entry point, thin.

Each subcommand is a module of this package: `HELP` and `DESCRIPTION`, `add_args(parser)` (its
flags) and `run(args)` (a call into the library). `main` parses the command line and runs the
subcommand through `report_errors`, the one place where errors become what the user sees:
a problem of the user's input is one line, ``transduce SUBCOMMAND: error: MESSAGE``, and exit
status 2, never a traceback.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import os
import sys
from typing import Callable

from ..errors import TransduceError

DESCRIPTION = """\
transduce: the Transformer of "Attention Is All You Need" (Vaswani et al., 2017).

Data flows one way: text -> vocabulary -> token arrays -> batches -> model -> search -> text.

subcommands:
  info        show a preset's configuration (Table 3 knobs) and its parameter count
  prepare     learn a BPE vocabulary and binarize parallel text (a named dataset or your files)
  train       train on prepared data: Adam + equation 3, label smoothing, token-budget batches,
              bf16/fp16, gradient accumulation, checkpoints, exact resume, DDP via torchrun
  average     average the last K checkpoints of a run into one model (the paper: 5 / 20)
  translate   translate a file or stdin line for line: beam 4, alpha 0.6, input + 50 (6.1)
  evaluate    score translations: sacreBLEU + chrF, the paper's tokenized compound-split BLEU,
              and Multi30k's lowercased tokenized BLEU; parses: EVALB F1 (COLLINS.prm)
  parse       parse English sentences into constituency trees, line for line (6.3)
  serve       serve a model over HTTP: a JSON API, requests batched dynamically
  export      a model as a CTranslate2 or Hugging Face MarianMT directory (and MarianMT back)
  synthetic   train a small model on a copy/reverse task and report greedy exact match:
              a one- to two-minute end-to-end check that masks, shifting and decoding fit together
  attention   show what the model attends to: the paper's figures (PNG), an offline HTML page,
              the masks applied, JSON
  experiment  Table 3's variants and Table 2's cost as one rerunnable experiment: each variant a
              `transduce train` run, then dev perplexity, dev BLEU, FLOPs, MFU; a table and a plot

Run `transduce SUBCOMMAND --help` for the options of each.
"""

SUBCOMMANDS = ("info", "prepare", "train", "average", "translate", "evaluate", "parse", "attention", "serve", "export",
               "synthetic", "experiment")
"""In the order of `transduce --help`; each is the module `transduce.cli.NAME`."""


def build_parser() -> argparse.ArgumentParser:
    from .. import __version__

    parser = argparse.ArgumentParser(
        prog="transduce", description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--version", action="version", version=f"transduce {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="SUBCOMMAND")
    for name in SUBCOMMANDS:
        module = importlib.import_module(f"{__name__}.{name}")
        p = sub.add_parser(name, help=module.HELP, description=module.DESCRIPTION, epilog=getattr(module, "EPILOG", None),
                           formatter_class=argparse.RawDescriptionHelpFormatter)
        module.add_args(p)
        p.set_defaults(run=module.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    try:  # the subcommands' modules import torch: a Ctrl-C in those seconds ends as any other
        parser = build_parser()
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    args = parser.parse_args(argv)
    if not getattr(args, "run", None):
        parser.print_help()
        return 2
    return report_errors(f"transduce {args.command}", args.run, args)


def error_message(e: BaseException) -> str:
    """The one line that says what went wrong: an OSError as 'FILENAME: strerror', a KeyError as
    its key's message (not its repr), anything else as str(e)."""
    if isinstance(e, OSError) and e.strerror:
        message = f"{e.filename}: {e.strerror}" if e.filename else e.strerror
    elif isinstance(e, KeyError) and e.args:
        message = str(e.args[0])
    else:
        message = str(e) or type(e).__name__
    return " ".join(message.split("\n"))


def report_errors(prog: str, run: Callable[..., int | None], *args) -> int:
    """`run(*args)`, returning its exit status. Bad input (TransduceError, and the ValueError,
    KeyError and OSError, FileNotFoundError included, that library code raises for it) is one
    line on stderr, ``PROG: error: MESSAGE``, and status 2; a closed stdout (`| head`) ends
    quietly with 0; Ctrl-C is "interrupted" and 130."""
    try:
        return int(run(*args) or 0)
    except BrokenPipeError:  # the reader is gone: stop quietly, and keep Python's exit flush quiet too
        with contextlib.suppress(OSError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except (TransduceError, ValueError, KeyError, OSError) as e:
        print(f"{prog}: error: {error_message(e)}", file=sys.stderr)
        return 2
