"""`transduce parse`: English sentences in, constituency trees out, line for line (Section 6.3).

    echo "The cat sat on the mat." | transduce parse runs/wsj
    transduce parse runs/wsj --input sentences.txt --output trees.txt --svg pictures/
    transduce parse runs/wsj --tokenized < ptb_tokens.txt

MODEL is a run directory or model directory trained on a treebank (`transduce prepare --dataset
ptb-wsj`, then `transduce train`), as for `transduce translate`. Each input line is one
sentence of raw English, tokenized the Penn Treebank way (`transduce.parsing.tokenize`; with
`--tokenized`, split on spaces as it is, but for brackets, written as in the treebank: ``(`` as
``-LRB-``). Each output line is its tree, bracketed on one line,
``(TOP (S (NP (XX The) (XX cat)) ...))``, holding exactly the sentence's tokens; an empty line
gives an empty line. The model's output is repaired into a tree where it is not one (the count
of repairs is reported at the end), or, with `--constrained`, the beam search can produce only
well-formed trees (not in the paper).

Part-of-speech tags: a model prepared with `--keep-tags` predicts them, and they are printed; a
model trained on the paper's XX sequences (the default) does not, and its trees carry XX
(no tagger is run: a note says so).

Decoding is the paper's for parsing: beam 21, alpha 0.3, maximum output length input + 300.
`--svg DIR` also draws each tree, DIR/LINE.svg (LINE from 1), for a person to look at.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..data.text import iter_lines, open_text
from ..errors import DataError, UsageError
from ..parsing import parse as parsing
from ..checkpoint.files import AtomicOutput, check_output
from .common import (
    add_decoding_args, add_model_args, check_decoding_args, decoding_options, exit_on_sigterm, load_from_args,
)

HELP = "parse English sentences into constituency trees, line for line: beam 21, alpha 0.3, input + 300 (6.3)"
DESCRIPTION = __doc__
PROG = "transduce parse"


def add_args(parser: argparse.ArgumentParser) -> None:
    """The options of `transduce parse`."""
    parser.add_argument("model_path", type=Path, metavar="MODEL",
                        help="a run directory or model directory trained on a treebank")
    g = parser.add_argument_group("input and output")
    g.add_argument("--input", "-i", type=Path, metavar="FILE", help="sentences, one per line, plain or .gz (default: stdin)")
    g.add_argument("--output", "-o", type=Path, metavar="FILE",
                   help="trees, one per line (default: stdout); written atomically, gzip if FILE ends in .gz")
    g.add_argument("--tokenized", action="store_true",
                   help="the input is Penn Treebank tokens separated by spaces; brackets become -LRB- -RRB- etc. "
                        "(default: raw English, tokenized here)")
    g.add_argument("--svg", type=Path, metavar="DIR", help="also draw each tree as DIR/LINE.svg")
    g.add_argument("--constrained", action="store_true",
                   help="beam search that only produces well-formed trees (not in the paper; default: repair afterwards)")
    g.add_argument("--quiet", "-q", action="store_true", help="no notes (warnings still shown)")
    add_model_args(parser)
    add_decoding_args(parser, beam=parsing.DEFAULT_BEAM, alpha=parsing.DEFAULT_ALPHA,
                      max_len_offset=parsing.DEFAULT_MAX_LEN_OFFSET, batch_size=parsing.DEFAULT_BATCH_SIZE, section="6.3")


def check_parsing_model(model_path: Path, metadata: dict | None) -> None:
    """Refuse a model whose data.json does not say it was trained on a treebank."""
    if not parsing.is_parsing_model(metadata):
        raise DataError("not a parsing model (its data.json does not say task: parsing; prepare a treebank "
                        "with `transduce prepare --dataset ptb-wsj`)", model_path)


def run(args: argparse.Namespace) -> int:
    """Parse --input (or stdin) into --output (or stdout). An error, Ctrl-C or SIGTERM leaves no
    output file (nor changes the one there)."""
    with exit_on_sigterm(PROG):
        return _parse(args)


def _parse(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from ..parsing.svg import tree_svg
    from ..parsing.tokenize import escape_brackets, ptb_tokenize
    from ..parsing.trees import Repairs
    from ..translate import _find_metadata

    def warn(msg: str) -> None:
        tqdm.write(f"{PROG}: warning: {msg}", file=sys.stderr)

    check_decoding_args(args)
    check_output(args.output)  # before the model loads: a path that cannot be written, named
    p = args.model_path  # its data.json, in it or in the run directory above: checked before the model loads
    if (meta := _find_metadata([p, p.parent, p.parent.parent])) is not None:
        check_parsing_model(p, meta)
    if args.svg is not None and args.svg.exists() and not args.svg.is_dir():
        raise UsageError(f"--svg {args.svg}: not a directory")
    out: AtomicOutput | None = None
    infile = None
    try:
        if args.input is not None and str(args.input) != "-":
            infile, name, interactive = open_text(args.input), str(args.input), False
        else:
            infile, name, interactive = sys.stdin.buffer, "<stdin>", sys.stdin.isatty()
        loaded = load_from_args(args)
        check_parsing_model(args.model_path, loaded.metadata)
        if args.svg is not None:  # only now: a model refused leaves no directory behind
            args.svg.mkdir(parents=True, exist_ok=True)
        tags = parsing.predicts_tags(loaded.metadata)
        if not args.quiet:
            print(f"{PROG}: model {loaded.description}; {loaded.precision.line()}", file=sys.stderr)
            if not interactive:
                print(f"{PROG}: {loaded.workers_line}", file=sys.stderr)
            if not tags:
                print(f"{PROG}: note: this model was trained on XX sequences (the paper's): its trees carry no "
                      "part-of-speech tags (XX); no tagger is run. Prepare with --keep-tags to train one that "
                      "predicts them.", file=sys.stderr)
        if loaded.precision.warning:
            warn(loaded.precision.warning)
        if args.output is not None and str(args.output) != "-":
            out = AtomicOutput(args.output)
            write, flush = out.write, lambda: None
        else:
            write, flush = sys.stdout.buffer.write, sys.stdout.buffer.flush
        sentences = (escape_brackets(line.split()) if args.tokenized else ptb_tokenize(line)
                     for line in iter_lines(infile, name))
        options = {**decoding_options(args), "chunk_lines": 1 if interactive else args.chunk_lines,
                   "workers": 1 if interactive else args.workers}
        total, repaired, n = Repairs(), 0, 0
        for n, p in enumerate(parsing.parse_stream(loaded.model, loaded.src_vocab, loaded.tgt_vocab, sentences,
                                                   tags=tags, constrained=args.constrained, warn=warn,
                                                   source_name=name, **options), start=1):
            write(((str(p.tree) if p.tree is not None else "") + "\n").encode("utf-8"))
            if interactive:
                flush()
            total += p.repairs
            repaired += p.repairs.total > 0
            if args.svg is not None and p.tree is not None:
                (args.svg / f"{n}.svg").write_text(tree_svg(p.tree, title=" ".join(p.tree.leaves())), encoding="utf-8")
        flush()
        if out is not None:
            out.commit()
            out = None
        if not args.quiet:
            print(f"{PROG}: {n} lines; {repaired} outputs were not well-formed trees and were repaired "
                  f"({total.summary()})", file=sys.stderr)
    finally:
        if out is not None:
            out.discard()
        if infile is not None and infile is not sys.stdin.buffer:
            infile.close()
    return 0
