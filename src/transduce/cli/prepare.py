"""`transduce prepare`: its flags, the splits they name, and one call into
`transduce.data.prepare.prepare`."""

from __future__ import annotations

import argparse
from pathlib import Path

from typing import TYPE_CHECKING

from ..data.corpora import DATASETS
from ..data.datasets import get_dataset
from ..defaults import CHARACTER_COVERAGE, MAX_LEN, MAX_RATIO, TREE_MAX_LEN, TREE_VOCAB_SIZE, VOCAB_SAMPLE, VOCAB_SIZE
from ..errors import UsageError
from .options import add_quiet, epilog

if TYPE_CHECKING:  # the library that imports PyTorch: imported by `run`, not by the flags (--help)
    from ..data.prepare import Split

DESCRIPTION = """\
Learn a sentencepiece BPE vocabulary and write the token arrays that `transduce
train` reads: from a registered dataset (--dataset), your line-aligned files, or a
treebank (parsing, Section 6.3).
details: transduce docs cli prepare"""
EPILOG = epilog(
    "transduce prepare --dataset multi30k --src en --tgt de -o data/m30k",
    "transduce prepare --train-src t.en --train-tgt t.de --valid-src v.en \\\n      --valid-tgt v.de -o data/mine",
    "transduce prepare --dataset ptb-wsj -o data/wsj",
)
FILE_FLAGS = ("train_src", "train_tgt", "valid_src", "valid_tgt", "test_src", "test_tgt")
TREE_FLAGS = ("train_trees", "valid_trees", "test_trees")


def add_args(parser: argparse.ArgumentParser) -> None:
    """The options of `transduce prepare`."""
    g = parser.add_argument_group("input: a registered dataset, or your files (plain or .gz)")
    g.add_argument("--dataset", choices=sorted(DATASETS), metavar="NAME", help=", ".join(sorted(DATASETS)))
    g.add_argument("--src", metavar="LANG", help="source language, e.g. en")
    g.add_argument("--tgt", metavar="LANG", help="target language, e.g. de")
    g.add_argument("--variant", default="raw", metavar="V", help="multi30k: raw (default) or tok (lowercased)")
    g.add_argument("--train-split", metavar="NAME", help="another training split (e.g. train-sample)")
    g.add_argument("--data-dir", metavar="DIR", help="datasets' mirror (default $TRANSDUCE_DATA_DIR)")
    g.add_argument("--cache-dir", metavar="DIR", help="downloads (default ~/.cache/transduce)")
    for name in FILE_FLAGS:
        split, side = name.split("_")
        g.add_argument(
            "--" + name.replace("_", "-"),
            type=Path,
            metavar="FILE",
            help=f"{split} {'source' if side == 'src' else 'target'} sentences, a line each",
        )
    for name in TREE_FLAGS:
        g.add_argument(
            "--" + name.replace("_", "-"),
            type=Path,
            metavar="FILE",
            help=f"{name.split('_')[0]} trees, bracketed or PTB .mrg",
        )
    g.add_argument("--keep-tags", action="store_true", help="trees keep their POS tags (default XX, the paper)")

    g = parser.add_argument_group("vocabulary and filtering (lengths in subword tokens)")
    g.add_argument("--vocab", type=Path, metavar="PATH", help="PATH's vocabulary (an SPM file or a model dir)")
    g.add_argument(
        "--vocab-size",
        type=int,
        metavar="N",
        help=f"pieces (default {VOCAB_SIZE}; the paper 37000; trees {TREE_VOCAB_SIZE})",
    )
    g.add_argument("--separate-vocab", action="store_true", help="separate source and target vocabularies")
    g.add_argument(
        "--vocab-sample",
        type=int,
        default=VOCAB_SAMPLE,
        metavar="N",
        help=f"learn it from N sentences (default {VOCAB_SAMPLE})",
    )
    g.add_argument(
        "--character-coverage",
        type=float,
        default=CHARACTER_COVERAGE,
        metavar="X",
        help=f"characters covered, the rest UNK (default {CHARACTER_COVERAGE:g})",
    )
    g.add_argument("--seed", type=int, default=0, help="seed of the sentence sample (default 0)")
    g.add_argument(
        "--max-len", type=int, metavar="N", help=f"drop longer pairs (default {MAX_LEN}; trees {TREE_MAX_LEN})"
    )
    g.add_argument(
        "--max-ratio",
        type=float,
        default=MAX_RATIO,
        metavar="X",
        help=f"drop pairs of a longer ratio (default {MAX_RATIO:g}; trees: none)",
    )

    g = parser.add_argument_group("output")
    g.add_argument("--out", "-o", type=Path, required=True, metavar="DIR", help="the output directory")
    g.add_argument("--overwrite", action="store_true", help="replace DIR if it exists")
    add_quiet(g, "no progress bars")


def resolve_splits(args: argparse.Namespace) -> tuple[list[Split], str, str]:
    """The splits to prepare (train first), from --dataset or from the file options."""
    from ..data.prepare import Split, dataset_splits

    files = {k: getattr(args, k) for k in FILE_FLAGS}
    if args.dataset and any(v is not None for v in files.values()):
        raise UsageError("give either --dataset or --train-src/--train-tgt/..., not both")
    if not args.dataset:
        for split in ("train", "valid"):
            if files[f"{split}_src"] is None or files[f"{split}_tgt"] is None:
                raise UsageError(f"give --dataset, or --{split}-src and --{split}-tgt")
        if (files["test_src"] is None) != (files["test_tgt"] is None):
            raise UsageError("give both --test-src and --test-tgt, or neither")
        names = ["train", "valid"] + (["test"] if files["test_src"] else [])
        splits = [Split(n, files[f"{n}_src"], files[f"{n}_tgt"], "files") for n in names]
        return splits, args.src or "src", args.tgt or "tgt"

    info = get_dataset(args.dataset)
    if not args.src or not args.tgt:
        raise UsageError(f"--dataset {info.name} needs --src and --tgt (languages: {', '.join(info.langs)})")
    if args.src == args.tgt:
        raise UsageError(f"--src and --tgt are both {args.src!r}")
    splits = dataset_splits(
        info.name,
        args.src,
        args.tgt,
        variant=args.variant,
        train_split=args.train_split,
        data_dir=args.data_dir,
        cache_dir=args.cache_dir,
    )
    return splits, args.src, args.tgt


def resolve_tree_splits(args: argparse.Namespace) -> list[tuple[str, Path, str]] | None:
    """The treebank splits to prepare, or None when the input is parallel text."""
    from ..parsing.data import dataset_tree_splits

    trees = {k: getattr(args, k) for k in TREE_FLAGS}
    is_treebank = bool(args.dataset) and get_dataset(args.dataset).kind == "treebank"
    if not is_treebank and not any(trees.values()):
        if args.keep_tags:
            raise UsageError("--keep-tags is for treebanks (--dataset ptb-wsj or --train-trees ...)")
        return None
    if any(getattr(args, k) is not None for k in FILE_FLAGS) or (args.dataset and any(trees.values())):
        raise UsageError("give one input: --dataset, --train-src/--train-tgt/..., or --train-trees/--valid-trees/...")
    if args.separate_vocab or args.src or args.tgt:
        raise UsageError(
            "a treebank has words as source and trees as target, with separate vocabularies: "
            "drop --src/--tgt/--separate-vocab"
        )
    if is_treebank:
        return dataset_tree_splits(args.dataset, data_dir=args.data_dir)
    if trees["train_trees"] is None or trees["valid_trees"] is None:
        raise UsageError("give --train-trees and --valid-trees (and optionally --test-trees)")
    return [(n, trees[f"{n}_trees"], "files") for n in ("train", "valid", "test") if trees[f"{n}_trees"] is not None]


def check_numbers(args: argparse.Namespace) -> None:
    """Refuse numeric options out of range (0 for --vocab-size or --max-len is not the default)."""
    for name, ok, what in (
        ("vocab_size", args.vocab_size is None or args.vocab_size >= 1, "at least 1"),
        ("vocab_sample", args.vocab_sample >= 1, "at least 1"),
        ("character_coverage", 0.98 <= args.character_coverage <= 1, "in [0.98, 1] (sentencepiece's range)"),
        ("max_len", args.max_len is None or args.max_len >= 1, "at least 1"),
        ("max_ratio", args.max_ratio >= 1, "at least 1 (a ratio of the longer side to the shorter)"),
    ):
        if not ok:
            raise UsageError(f"--{name.replace('_', '-')} must be {what}, not {getattr(args, name):g}")


def check_inputs(args: argparse.Namespace) -> None:
    """Every file the flags name exists, before any work (or progress bar): one line naming it."""
    for name in FILE_FLAGS + TREE_FLAGS:
        path = getattr(args, name)
        if path is not None and not path.is_file():
            raise UsageError(f"{path}: {'not a file' if path.exists() else 'no such file'}")


def run(args: argparse.Namespace) -> int:
    from ..data import prepare
    from ..data.prepare import check_output_dir, print_report
    from ..finetune import model_vocabulary
    from ..parsing.data import prepare_treebank

    check_numbers(args)
    check_inputs(args)
    check_output_dir(Path(args.out).absolute(), args.overwrite)  # before any slow work
    tree_splits = resolve_tree_splits(args)
    if args.vocab is not None and (tree_splits is not None or args.vocab_size or args.separate_vocab):
        raise UsageError(
            "--vocab PATH takes PATH's vocabulary: drop --vocab-size and --separate-vocab "
            "(and it is for parallel text, not a treebank)"
        )
    if tree_splits is not None:
        meta = prepare_treebank(
            tree_splits,
            args.out,
            tags=args.keep_tags,
            vocab_size=args.vocab_size or TREE_VOCAB_SIZE,
            max_len=args.max_len or TREE_MAX_LEN,
            overwrite=args.overwrite,
            progress=not args.quiet,
            sample_size=args.vocab_sample,
            character_coverage=args.character_coverage,
            seed=args.seed,
            extra={"dataset": args.dataset, "variant": None},
        )
        print_report(meta)
        return 0
    splits, src_lang, tgt_lang = resolve_splits(args)
    given = model_vocabulary(args.vocab) if args.vocab is not None else None
    meta = prepare.prepare(
        splits,
        args.out,
        src_lang=src_lang,
        tgt_lang=tgt_lang,
        vocab_size=args.vocab_size or VOCAB_SIZE,
        separate_vocab=args.separate_vocab,
        sample_size=args.vocab_sample,
        character_coverage=args.character_coverage,
        seed=args.seed,
        max_len=args.max_len or MAX_LEN,
        max_ratio=args.max_ratio,
        overwrite=args.overwrite,
        progress=not args.quiet,
        extra={"dataset": args.dataset, "variant": args.variant if args.dataset else None},
        vocab=given,
    )
    print_report(meta)
    return 0
