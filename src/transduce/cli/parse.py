"""`transduce parse`: English sentences in, constituency trees out, line for line (Section 6.3),
through `transduce.parsing.parse.parse_stream`; details: docs/parsing.md."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..defaults import PARSE_ALPHA, PARSE_BATCH_SIZE, PARSE_BEAM, PARSE_MAX_LEN_OFFSET
from ..errors import DataError, UsageError
from ..parsing import parse as parsing
from .common import (
    LineStreams,
    check_decoding_args,
    exit_on_sigterm,
    library_length_penalty,
    load_from_args,
    model_metadata,
    warner,
)
from .options import add_decoding_args, add_line_args, add_quiet, epilog

DESCRIPTION = """\
Parse raw English (or --tokenized PTB tokens), one sentence per line, into bracketed
trees, one per line: beam 21, alpha 0.3, input + 300 (Section 6.3). MODEL: a run or
model directory trained on a treebank (`prepare --dataset ptb-wsj`).
details: transduce docs parsing"""
EPILOG = epilog(
    'echo "The cat sat on the mat." | transduce parse runs/wsj',
    "transduce parse runs/wsj -i sentences.txt -o trees.txt --svg pictures/",
)
PROG = "transduce parse"


def add_args(parser: argparse.ArgumentParser) -> None:
    """The options of `transduce parse`."""
    g = add_line_args(parser, "a run or model directory trained on a treebank", "trees")
    g.add_argument("--tokenized", action="store_true", help="the input is PTB tokens (default: raw English)")
    g.add_argument("--svg", type=Path, metavar="DIR", help="also draw each tree as DIR/LINE.svg")
    g.add_argument("--constrained", action="store_true", help="beam search of trees only (not the paper)")
    add_quiet(g, "no notes (warnings still shown)")
    add_decoding_args(
        parser,
        beam=PARSE_BEAM,
        alpha=PARSE_ALPHA,
        max_len_offset=PARSE_MAX_LEN_OFFSET,
        batch_size=PARSE_BATCH_SIZE,
        section="6.3",
    )


def check_parsing_model(model_path: Path, metadata: dict | None) -> None:
    """Refuse a model whose data.json does not say it was trained on a treebank."""
    if not parsing.is_parsing_model(metadata):
        raise DataError(
            "not a parsing model (its data.json does not say task: parsing; prepare a treebank "
            "with `transduce prepare --dataset ptb-wsj`)",
            model_path,
        )


@exit_on_sigterm(PROG)
def run(args: argparse.Namespace) -> int:
    """Parse --input (or stdin) into --out (or stdout); an error, Ctrl-C or SIGTERM leaves no output."""
    from ..checkpoint.files import check_output
    from ..parsing.svg import tree_svg
    from ..parsing.tokenize import escape_brackets, ptb_tokenize
    from ..parsing.trees import Repairs

    warn = warner(PROG)
    check_decoding_args(args)
    library_length_penalty(args, "parse")
    check_output(args.out)  # before the model loads: a path that cannot be written, named
    if (meta := model_metadata(args.model_path)) is not None:  # checked before the model loads
        check_parsing_model(args.model_path, meta)
    if args.svg is not None and args.svg.exists() and not args.svg.is_dir():
        raise UsageError(f"--svg {args.svg}: not a directory")
    with LineStreams(args) as streams:
        loaded = load_from_args(args)
        check_parsing_model(args.model_path, loaded.metadata)
        if args.svg is not None:  # only now: a model refused leaves no directory behind
            args.svg.mkdir(parents=True, exist_ok=True)
        tags = parsing.predicts_tags(loaded.metadata)
        if not args.quiet:
            print(f"{PROG}: model {loaded.description}; {loaded.precision.line()}", file=sys.stderr)
            if not streams.interactive:
                print(f"{PROG}: {loaded.workers_line}", file=sys.stderr)
            if not tags:
                print(
                    f"{PROG}: note: this model was trained on XX sequences (the paper's): its trees carry no "
                    "part-of-speech tags (XX); no tagger is run. Prepare with --keep-tags to train one that "
                    "predicts them.",
                    file=sys.stderr,
                )
        if loaded.precision.warning:
            warn(loaded.precision.warning)
        write, flush = streams.output()
        sentences = (
            escape_brackets(line.split()) if args.tokenized else ptb_tokenize(line) for line in streams.lines()
        )
        total, repaired, n = Repairs(), 0, 0
        for n, p in enumerate(
            parsing.parse_stream(
                loaded.model,
                loaded.src_vocab,
                loaded.tgt_vocab,
                sentences,
                tags=tags,
                constrained=args.constrained,
                warn=warn,
                **streams.options(),
            ),
            start=1,
        ):
            write(((str(p.tree) if p.tree is not None else "") + "\n").encode("utf-8"))
            if streams.interactive:
                flush()
            total += p.repairs
            repaired += p.repairs.total > 0
            if args.svg is not None and p.tree is not None:
                (args.svg / f"{n}.svg").write_text(tree_svg(p.tree, title=" ".join(p.tree.leaves())), encoding="utf-8")
        flush()
        streams.commit()
        if not args.quiet:
            print(
                f"{PROG}: {n} lines; {repaired} outputs were not well-formed trees and were repaired "
                f"({total.summary()})",
                file=sys.stderr,
            )
    return 0
