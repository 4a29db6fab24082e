"""`transduce import`: a Hugging Face MarianMT model (OPUS-MT's) as a transduce model directory, as it
is (`transduce.export.opus`): from a local directory, or by its hub id through huggingface_hub's cache."""

from __future__ import annotations

import argparse
from pathlib import Path

from ..errors import UsageError
from .options import epilog

DESCRIPTION = """\
Import SOURCE, a Hugging Face MarianMT model (OPUS-MT's, as Helsinki-NLP publish them,
or what `export marian` wrote), as a transduce model directory DIR, as it is: its ids,
vocabulary files and weights, its generation settings and languages, which translate
and serve decode with unless told otherwise. SOURCE: a directory, or a hub id such as
Helsinki-NLP/opus-mt-en-de, downloaded into huggingface_hub's cache ('transduce[hf]';
offline, HF_HUB_OFFLINE=1 reads the cache).
details: transduce docs export"""
EPILOG = epilog(
    "transduce import Helsinki-NLP/opus-mt-en-de -o models/en-de",
    "transduce import ./opus-mt-en-de -o models/en-de   # a downloaded directory",
    "transduce import m30k-marian -o m30k-back          # what export marian wrote",
)


def add_args(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("arguments")
    g.add_argument("source", metavar="SOURCE", help="a MarianMT directory, or a hub id (owner/name)")
    g.add_argument("--out", "-o", type=Path, required=True, metavar="DIR", help="the model directory to write")
    g.add_argument("--overwrite", action="store_true", help="replace DIR (never SOURCE)")


def run(args: argparse.Namespace) -> int:
    from ..export.opus import resolve_source, write_model_dir

    if args.out.name in ("", ".", ".."):  # the current directory or a parent: never replaced whole
        raise UsageError(f"--out {args.out}: name the new directory to write (not . or ..)")
    if args.out.exists() and not args.overwrite:
        raise FileExistsError(f"{args.out}: exists (use --overwrite to replace it)")
    path, hub_id = resolve_source(args.source)
    if args.out.exists() and (args.out.resolve() == path.resolve() or args.out.resolve() in path.resolve().parents):
        raise UsageError(
            f"--out {args.out}: is or holds SOURCE {path}, which --overwrite would delete; write it elsewhere"
        )
    args.out.parent.mkdir(parents=True, exist_ok=True)  # -o models/en-de on a fresh machine, as prepare's --out
    what = write_model_dir(path, args.out, name=hub_id)
    print(f"wrote {args.out}: transduce model directory from {args.source} ({what})")
    return 0
