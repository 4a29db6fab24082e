"""`transduce shortlist`: a model's vocabulary shortlist from parallel text, one call into
`transduce.decoding.shortlist`."""

from __future__ import annotations

import argparse
import itertools
import os
from pathlib import Path

from .options import add_quiet, epilog

DESCRIPTION = """\
Not in the paper: the target tokens each source token makes likely, counted in parallel text
in MODEL's vocabularies, so that `translate --shortlist` searches each batch over its own few
thousand candidates instead of the whole vocabulary (faster at large vocabularies; not exact).
details: transduce docs speed shortlist"""
EPILOG = epilog(
    "transduce shortlist models/en-de --train-src train.en --train-tgt train.de",
    "transduce translate models/en-de --shortlist --int8 < in.en > out.de",
)


def add_args(parser: argparse.ArgumentParser) -> None:
    from ..defaults import SHORTLIST_FREQUENT, SHORTLIST_PER_SOURCE

    g = parser.add_argument_group("arguments")
    g.add_argument("model", type=Path, metavar="MODEL", help="a model or run directory (its vocabularies)")
    g.add_argument(
        "--train-src", type=Path, required=True, metavar="FILE", help="parallel text's source side, a sentence a line"
    )
    g.add_argument("--train-tgt", type=Path, required=True, metavar="FILE", help="its target side, line for line")
    g.add_argument(
        "--per-source",
        type=int,
        default=SHORTLIST_PER_SOURCE,
        metavar="K",
        help=f"target tokens kept for each source token (default {SHORTLIST_PER_SOURCE})",
    )
    g.add_argument(
        "--frequent",
        type=int,
        default=SHORTLIST_FREQUENT,
        metavar="N",
        help=f"the N most frequent targets, always in (default {SHORTLIST_FREQUENT})",
    )
    g.add_argument("--out", "-o", type=Path, metavar="FILE", help="default MODEL/shortlist.safetensors")
    add_quiet(g, "no progress bar")


def run(args: argparse.Namespace) -> int:
    from ..data.text import read_parallel
    from ..decoding.ready import vocabulary_of
    from ..decoding.shortlist import FILE, build
    from tqdm import tqdm

    if args.per_source < 1 or args.frequent < 0:
        raise ValueError("--per-source must be positive and --frequent not negative")
    if not args.model.is_dir():
        raise FileNotFoundError(f"{args.model}: no such directory (a model or run directory)")
    src_vocab, tgt_vocab = vocabulary_of(args.model)
    out = args.out or args.model / FILE

    def pairs():  # encoded 10,000 pairs at a time (sentencepiece's threads)
        lines = read_parallel(args.train_src, args.train_tgt)
        with tqdm(desc="shortlist", unit=" pairs", mininterval=1, disable=args.quiet) as bar:
            while chunk := list(itertools.islice(lines, 10_000)):
                src, tgt = zip(*chunk)
                yield from zip(src_vocab.encode_batch(src), tgt_vocab.encode_batch(tgt))
                bar.update(len(chunk))

    shortlist = build(pairs(), len(src_vocab), len(tgt_vocab), per_source=args.per_source, frequent=args.frequent)
    tmp = out.with_name(out.name + ".tmp")
    shortlist.save(tmp)
    os.chmod(tmp, 0o644)
    tmp.replace(out)  # nothing half-written
    info = shortlist.info
    print(
        f"wrote {out}: {info['pairs']:,} sentence pairs; {info['frequent']} frequent target tokens and up to "
        f"{info['per_source']} for each of {len(src_vocab):,} source tokens"
    )
    return 0
