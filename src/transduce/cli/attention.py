"""`transduce attention`: what the model attends to (`transduce.views.weights.attention_data`)
as PNG, an offline HTML page and JSON; what they hold: docs/attention.md."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from ..errors import DataError, UsageError
from .common import check_search_args, library_length_penalty, load_from_args
from ..defaults import ALPHA, ATTENTION_MAX_TOKENS, ATTENTION_TYPES, BEAM, MAX_LEN_OFFSET
from .options import add_hardware_args, add_model_args, add_search_args, epilog

DESCRIPTION = """\
Run MODEL once, teacher-forced, on SENTENCEs (and their targets, or its own translations)
and keep every attention weight: the paper's figures (PNG), an offline page (HTML), JSON.
Layers and heads are numbered from 1, as in the paper.
details: transduce docs attention"""
EPILOG = epilog(
    'transduce attention runs/multi30k-en-de "A dog runs ." --html dog.html',
    'transduce attention runs/multi30k-en-de "A dog runs ." --png d.png --query dog',
    "transduce attention runs/multi30k-en-de -i s.tsv --figure masks --png m.png",
)
PROG = "transduce attention"
TYPES = {kind.replace("_", "-"): kind for kind in ATTENTION_TYPES}  # --type's spelling -> the library's


def add_args(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("input and outputs")
    g.add_argument("model_path", type=Path, metavar="MODEL", help="a run directory or a model directory")
    g.add_argument("sentences", nargs="*", metavar="SENTENCE", help="source sentences, right after MODEL")
    g.add_argument("--input", "-i", type=Path, metavar="FILE", help="sentences, a line each (SOURCE[<TAB>TARGET])")
    g.add_argument(
        "--target-text",
        action="append",
        metavar="TEXT",
        dest="target_text",
        help="a SENTENCE's target, one each (default: translated)",
    )
    g.add_argument(
        "--keep-tokens",
        type=int,
        default=ATTENTION_MAX_TOKENS,
        metavar="N",
        help=f"subword tokens kept per side, the rest cut (default {ATTENTION_MAX_TOKENS})",
    )
    g.add_argument("--html", type=Path, metavar="FILE", help="the interactive page")
    g.add_argument("--json", type=Path, metavar="FILE", help="the weights as JSON")
    g.add_argument("--png", type=Path, metavar="FILE", help="a figure (see --figure)")
    g = parser.add_argument_group("the PNG figure")
    g.add_argument(
        "--figure",
        choices=("lines", "heatmap", "masks"),
        default="lines",
        metavar="F",
        help="lines (Figures 3-5; default), heatmap or masks",
    )
    g.add_argument(
        "--type",
        choices=tuple(TYPES),
        default="encoder",
        metavar="T",
        help="encoder (default), decoder-self or decoder-cross",
    )
    g.add_argument("--layer", type=int, metavar="N", help="layer, from 1 (default: the last)")
    g.add_argument("--heads", metavar="LIST", help="heads, from 1, e.g. 5,6 (default: all)")
    g.add_argument("--query", metavar="TOKEN|POS", help="one query only: a token or a position")
    g.add_argument("--sentence", type=int, default=1, metavar="N", help="which sentence, from 1 (default 1)")
    g.add_argument(
        "--layout",
        choices=("columns", "rows"),
        default="columns",
        metavar="L",
        help="lines: columns (default) or rows (the paper's)",
    )
    g = parser.add_argument_group("model and its translation (when no target is given; Section 6.1)")
    add_model_args(g)
    add_search_args(g, beam=BEAM, alpha=ALPHA, max_len_offset=MAX_LEN_OFFSET)
    add_hardware_args(g, precisions=())


def read_input(args: argparse.Namespace) -> tuple[list[str], list[str | None] | None]:
    sources = list(args.sentences)
    targets: list[str | None] | None = None
    if args.input is not None:
        if sources:
            raise UsageError("give sentences on the command line or --input, not both")
        from ..data.text import iter_lines, open_text

        targets = []
        with open_text(args.input) as f:
            for n, line in enumerate(iter_lines(f, args.input), start=1):
                if not line.strip():
                    continue
                parts = line.split("\t")
                if len(parts) > 2 or not parts[0].strip():
                    raise DataError("expected SOURCE or SOURCE<TAB>TARGET", args.input, n)
                sources.append(parts[0])
                targets.append(parts[1] if len(parts) == 2 else None)
        if not sources:
            raise DataError("no sentences", args.input)
    if args.target_text:
        if args.input is not None:
            raise UsageError(
                "--target-text goes with sentences on the command line; in --input, put targets after a tab"
            )
        if len(args.target_text) != len(sources):
            raise UsageError(
                f"{len(args.target_text)} --target-text for {len(sources)} sentences: give one per sentence"
            )
        targets = list(args.target_text)
    if not sources:
        raise UsageError("no sentence: give SENTENCE arguments or --input FILE")
    return sources, targets


def parse_heads(spec: str | None) -> list[int] | None:
    if spec is None:
        return None
    try:
        return [int(x) - 1 for x in spec.split(",") if x.strip()]
    except ValueError:
        raise UsageError(f"--heads {spec!r}: a comma-separated list of head numbers, from 1") from None


def write_bytes(path: Path, data: bytes) -> None:
    """`data` into `path`, whole or not at all."""
    from ..checkpoint.files import AtomicOutput

    out = AtomicOutput(path)
    try:
        out.write(data)
        out.commit()
    except BaseException:
        out.discard()
        raise


def run(args: argparse.Namespace) -> int:
    if not (args.html or args.json or args.png):
        raise UsageError("nothing to write: give --html FILE, --json FILE and/or --png FILE")
    if args.png:
        if args.png.suffix.lower() != ".png":
            raise UsageError(f"--png {args.png}: the figure is a PNG image; give a file name ending in .png")
        from ..views.figures import require_matplotlib

        require_matplotlib()  # before the model is loaded
    else:
        figure_only = [
            flag
            for flag, given in (
                ("--figure", args.figure != "lines"),
                ("--type", args.type != "encoder"),
                ("--layer", args.layer is not None),
                ("--heads", args.heads is not None),
                ("--query", args.query is not None),
                ("--sentence", args.sentence != 1),
                ("--layout", args.layout != "columns"),
            )
            if given
        ]
        if figure_only:
            raise UsageError(
                f"{', '.join(figure_only)} choose what the PNG figure shows: add --png FILE "
                "(the HTML page and the JSON hold every type, layer and head)"
            )
    check_search_args(args)
    library_length_penalty(args, "attention")
    for path in (args.html, args.json, args.png):
        if path is not None and not path.absolute().parent.is_dir():
            raise DataError("no such directory", path.absolute().parent)
    sources, targets = read_input(args)
    heads = parse_heads(args.heads)

    from ..views.weights import attention_data, find_token

    loaded = load_from_args(args)  # fp32: the weights as trained
    print(f"{PROG}: model {loaded.description}", file=sys.stderr)
    _, data = attention_data(
        loaded,
        sources,
        targets,
        beam=args.beam,
        alpha=args.alpha,
        greedy=args.greedy,
        max_len_offset=args.max_len_offset,
        max_tokens=args.keep_tokens,
    )
    for i, s in enumerate(data["sentences"], start=1):
        print(f"{i} source: {' '.join(s['source'])}")
        print(f"{i} target: {' '.join(s['target'][1:])}   ({s['target_from']})")
        for note in s["notes"]:
            print(f"{PROG}: note: sentence {i}: {note}", file=sys.stderr)

    outputs = []
    if args.png:
        from ..views import figures

        kind = TYPES[args.type]
        sentence = args.sentence - 1
        if not 0 <= sentence < len(data["sentences"]):
            raise UsageError(f"--sentence {args.sentence}: there are {len(data['sentences'])} sentences")
        layer = (args.layer - 1) if args.layer is not None else data["n_layers"] - 1
        query = None
        if args.query is not None:
            s = data["sentences"][sentence]
            side, labels, pieces = (
                ("source", s["source"], s["source_pieces"])
                if kind == "encoder"
                else (
                    "target (the token a decoder position predicts)",
                    s["predicts"],
                    s["target_pieces"][1:] + ["</s>"],
                )
            )
            query = find_token(labels, pieces, args.query, side)
        if args.figure == "lines":
            png = figures.lines_figure(
                data, sentence=sentence, kind=kind, layer=layer, heads=heads, query=query, layout=args.layout
            )
        elif args.figure == "heatmap":
            png = figures.heatmap_figure(data, sentence=sentence, kind=kind, layer=layer, heads=heads, query=query)
        else:
            png = figures.masks_figure(data)
        outputs.append((args.png, png))
    if args.json:
        outputs.append((args.json, (json.dumps(data, ensure_ascii=False, separators=(",", ":")) + "\n").encode()))
    if args.html:
        from ..views.page import render_page

        outputs.append((args.html, render_page(data, title=" / ".join(sources)[:80]).encode("utf-8")))
    for path, content in outputs:
        write_bytes(path, content)
        print(f"{PROG}: wrote {path}", file=sys.stderr)
    return 0
