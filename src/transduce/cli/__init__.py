"""The `transduce` command: one entry point, thin.

Each subcommand is a module of this package: `DESCRIPTION` and `EPILOG` (its one-screen help),
`add_args(parser)` (its flags, the shared groups from `transduce.cli.options`) and `run(args)` (a
call into the library). `main` imports only the subcommand named on the command line and runs it
through `report_errors`, where bad input becomes one line, ``transduce SUBCOMMAND: error: MESSAGE``,
and exit status 2, never a traceback."""

from __future__ import annotations

import argparse
import contextlib
import importlib
import os
import sys
from typing import Callable

from ..errors import TransduceError

DESCRIPTION = """\
The Transformer of "Attention Is All You Need" (Vaswani et al., 2017).
Data flows one way: text -> vocabulary -> token arrays -> batches -> model -> text."""

SUMMARIES = {  # in the order of `transduce --help`; each is the module `transduce.cli.NAME` (`MODULES`)
    "info": "a preset's configuration (Table 3's knobs) and parameter count",
    "prepare": "learn a BPE vocabulary and binarize parallel text or a treebank",
    "train": "train on prepared data (Section 5; torchrun for many GPUs)",
    "average": "average the last K checkpoints of a run (6.1)",
    "translate": "translate a file or stdin line for line (beam search, 6.1)",
    "shortlist": "a vocabulary shortlist from parallel text: faster, not exact decoding",
    "evaluate": "score translations (BLEU in every convention) or parses (EVALB)",
    "parse": "parse English into constituency trees, line for line (6.3)",
    "attention": "what the model attends to: figures (PNG), an offline page, JSON",
    "serve": "serve a model over HTTP: a JSON API, requests batched",
    "import": "import a Hugging Face MarianMT model (OPUS-MT's) by name or directory",
    "export": "export to CTranslate2 or Hugging Face MarianMT",
    "synthetic": "an end-to-end check: train and decode a copy/reverse task",
    "experiment": "Table 3's variants and Table 2's cost as one rerunnable experiment",
    "docs": "print a page of this documentation (the list without a topic)",
}
"""Each subcommand's one line, here so that `transduce --help` imports no subcommand (nor torch)."""

SUBCOMMANDS = tuple(SUMMARIES)

MODULES = {"import": "import_"}
"""A subcommand whose module has another name (`import` is a Python keyword)."""

EPILOG = "Run `transduce SUBCOMMAND --help` for its options; details: transduce docs cli."


def version() -> str:
    """The installed distribution's version (pyproject's), else the package's."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as distribution_version

    try:
        return distribution_version("transduce")
    except PackageNotFoundError:
        from .. import __version__

        return __version__


class _Version(argparse.Action):
    """--version: the version read only when asked for."""

    def __call__(self, parser, namespace, values, option_string=None):
        print(f"transduce {version()}")
        parser.exit()


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The parser of the `transduce` command; with `only`, only that subcommand's module imported."""
    from .options import HelpFormatter, usage

    listing = "\n\nsubcommands:\n" + "".join(f"  {name:<11} {line}\n" for name, line in SUMMARIES.items())
    parser = argparse.ArgumentParser(
        prog="transduce",
        usage="%(prog)s [-h] [--version] SUBCOMMAND ...",
        description=DESCRIPTION + listing.rstrip(),
        epilog=EPILOG,
        formatter_class=HelpFormatter,
        allow_abbrev=False,
    )
    parser.add_argument("--version", action=_Version, nargs=0, help="show the version and exit")
    sub = parser.add_subparsers(dest="command", metavar="SUBCOMMAND", help=argparse.SUPPRESS)
    for name in SUBCOMMANDS:  # listed once, in the description
        if only is not None and name != only:
            sub.add_parser(name, add_help=False)
            continue
        module = importlib.import_module(f"{__name__}.{MODULES.get(name, name)}")  # `import` is a keyword
        p = sub.add_parser(
            name,
            prog=f"transduce {name}",
            description=module.DESCRIPTION,
            epilog=getattr(module, "EPILOG", None),
            formatter_class=HelpFormatter,
            add_help=False,
            allow_abbrev=False,
        )  # a flag is its whole name
        module.add_args(p)
        _add_help(p)
        p.usage = usage(p)
        p.set_defaults(run=module.run)
    return parser


def _add_help(parser: argparse.ArgumentParser) -> None:
    """-h, --help, in the parser's own options if it has any, else in its first group."""
    own, groups = parser._action_groups[1], [g for g in parser._action_groups[2:] if g._group_actions]
    target = own if own._group_actions or not groups else groups[0]
    target.add_argument("-h", "--help", action="help", help="show this help and exit")


def chosen(argv: list[str]) -> str | None:
    """The subcommand named on the command line (its first word that is not an option)."""
    for arg in argv:
        if not arg.startswith("-"):
            return arg if arg in SUMMARIES else None
    return None


def main(argv: list[str] | None = None) -> int:
    """Run the command line `argv` (default: the process's); returns the exit status."""
    argv = sys.argv[1:] if argv is None else list(argv)
    try:  # a subcommand's module imports torch: a Ctrl-C in those seconds ends as any other
        command = chosen(argv)
        parser = build_parser(only=command or "")
        args = parser.parse_args(argv)
        if not getattr(args, "run", None):
            parser.print_help()
            return 2
        return report_errors(f"transduce {args.command}", args.run, args)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


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
    """`run(*args)`, returning its exit status. Bad input (TransduceError, ValueError, KeyError,
    OSError) is one line, ``PROG: error: MESSAGE``, and status 2; a closed stdout (`| head`) ends
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
