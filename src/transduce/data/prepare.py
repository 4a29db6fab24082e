"""`transduce prepare`: parallel text -> subword vocabulary -> memory-mapped token arrays.

    transduce prepare --dataset multi30k --src en --tgt de --out data/multi30k-en-de
    transduce prepare --train-src train.en --train-tgt train.de \\
                      --valid-src dev.en --valid-tgt dev.de --src en --tgt de --out data/mine

Steps (Section 5.1 of the paper):
1. train a BPE vocabulary with sentencepiece on a sample of the training text, shared by source
   and target unless --separate-vocab;
2. encode every split and store it with `IndexedWriter` ({split}.src/.tgt .bin/.idx): subword
   ids + EOS per sentence. Training pairs go through the length filter (--max-len,
   --max-ratio; see text.py); evaluation splits are kept whole;
3. write data.json: languages, vocabulary files, per-split counts, the filter report and the
   absolute paths of the original text files (the references for BLEU).

Output directory:
    spm.model (or spm.src.model + spm.tgt.model), spm*.vocab
    train.src.bin/.idx  train.tgt.bin/.idx  valid.*  test.*  (+ extra test sets by name)
    data.json

Everything is written into a temporary directory beside --out and renamed into place at the end,
so a failure leaves nothing behind. Errors in the input are reported on one line
(`transduce prepare: error: <file>:<line>: <what>`) with exit status 2.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from itertools import islice
from pathlib import Path
from typing import Iterable, Iterator

from tqdm import tqdm

from .batching import METADATA
from .datasets import DATASETS, fetch, get_dataset
from .indexed import IndexedWriter
from .text import DEFAULT_MAX_LEN, DEFAULT_MAX_RATIO, DataError, FilterReport, filter_reason, read_lines, read_parallel
from .vocab import (
    BOS, DEFAULT_CHARACTER_COVERAGE, DEFAULT_SAMPLE_SIZE, DEFAULT_VOCAB_SIZE, EOS, PAD, UNK, Vocab, train_vocab,
)

CHUNK = 10_000  # lines encoded at a time


@dataclass
class Split:
    """One split to prepare: its name in the output and its two text files."""

    name: str  # "train", "valid", "test", or the dataset's own name for extra test sets
    src: Path
    tgt: Path
    origin: str  # where it came from, e.g. "multi30k:test_2016_flickr" or "files"


# --- the command line -------------------------------------------------------------------------------


def add_args(parser: argparse.ArgumentParser) -> None:
    """Add the options of `transduce prepare` to `parser`."""
    g = parser.add_argument_group("input: a registered dataset")
    g.add_argument("--dataset", choices=sorted(DATASETS), help="dataset name (fetched once, see transduce.data.datasets)")
    g.add_argument("--src", help="source language, e.g. en (a label only when giving files)")
    g.add_argument("--tgt", help="target language, e.g. de")
    g.add_argument("--variant", default="raw", help="multi30k: raw (cased, untokenized; default) or tok (lowercased, tokenized)")
    g.add_argument("--train-split", help="train on this split of the dataset instead of its usual one (e.g. train-sample)")
    g.add_argument("--data-dir", help="local mirror of the datasets (default: $TRANSDUCE_DATA_DIR, or ../shared/data beside the repository)")
    g.add_argument("--cache-dir", help="where downloads go (default: $TRANSDUCE_CACHE_DIR or ~/.cache/transduce)")

    g = parser.add_argument_group("input: your own line-aligned files (plain or .gz)")
    for split in ("train", "valid", "test"):
        g.add_argument(f"--{split}-src", type=Path, metavar="FILE")
        g.add_argument(f"--{split}-tgt", type=Path, metavar="FILE")

    g = parser.add_argument_group("vocabulary (sentencepiece BPE)")
    g.add_argument("--vocab-size", type=int, default=DEFAULT_VOCAB_SIZE,
                   help=f"number of pieces (default {DEFAULT_VOCAB_SIZE}, for small corpora; the paper: 37000)")
    g.add_argument("--separate-vocab", action="store_true", help="train separate source and target vocabularies")
    g.add_argument("--vocab-sample", type=int, default=DEFAULT_SAMPLE_SIZE,
                   help=f"train it on a random sample of this many sentences (default {DEFAULT_SAMPLE_SIZE:,})")
    g.add_argument("--character-coverage", type=float, default=DEFAULT_CHARACTER_COVERAGE,
                   help=f"share of characters the vocabulary covers, the rest become UNK (default {DEFAULT_CHARACTER_COVERAGE:g})")
    g.add_argument("--seed", type=int, default=0, help="seed of the sentence sample")

    g = parser.add_argument_group("filtering of training pairs (lengths in subword tokens)")
    g.add_argument("--max-len", type=int, default=DEFAULT_MAX_LEN, help=f"drop pairs with a longer side (default {DEFAULT_MAX_LEN})")
    g.add_argument("--max-ratio", type=float, default=DEFAULT_MAX_RATIO,
                   help=f"drop pairs whose length ratio exceeds this (default {DEFAULT_MAX_RATIO:g})")

    g = parser.add_argument_group("output")
    g.add_argument("--out", type=Path, required=True, metavar="DIR", help="output directory")
    g.add_argument("--overwrite", action="store_true", help="replace DIR if it exists")
    g.add_argument("--no-progress", action="store_true", help="no progress bars")


def run(args: argparse.Namespace) -> int:
    """Run `transduce prepare`; return the exit status (0, or 2 for bad input)."""
    try:
        _check_output_dir(Path(args.out).absolute(), args.overwrite)  # before any slow work
        splits, src_lang, tgt_lang = resolve_splits(args)
        meta = prepare(
            splits,
            args.out,
            src_lang=src_lang,
            tgt_lang=tgt_lang,
            vocab_size=args.vocab_size,
            separate_vocab=args.separate_vocab,
            sample_size=args.vocab_sample,
            character_coverage=args.character_coverage,
            seed=args.seed,
            max_len=args.max_len,
            max_ratio=args.max_ratio,
            overwrite=args.overwrite,
            progress=not args.no_progress,
            extra={"dataset": args.dataset, "variant": args.variant if args.dataset else None},
        )
    except DataError as e:
        print(f"transduce prepare: error: {e}", file=sys.stderr)
        return 2
    except OSError as e:  # e.g. no space left, permission denied on --out
        where = f"{e.filename}: " if e.filename else ""
        print(f"transduce prepare: error: {where}{e.strerror or e}", file=sys.stderr)
        return 2
    print_report(meta)
    return 0


def resolve_splits(args: argparse.Namespace) -> tuple[list[Split], str, str]:
    """The splits to prepare (train first), from --dataset or from the file options."""
    files = {k: getattr(args, k) for k in ("train_src", "train_tgt", "valid_src", "valid_tgt", "test_src", "test_tgt")}
    given = {k: v for k, v in files.items() if v is not None}
    if args.dataset and given:
        raise DataError("give either --dataset or --train-src/--train-tgt/..., not both")
    if not args.dataset:
        for split in ("train", "valid"):
            if files[f"{split}_src"] is None or files[f"{split}_tgt"] is None:
                raise DataError(f"give --dataset, or --{split}-src and --{split}-tgt")
        if (files["test_src"] is None) != (files["test_tgt"] is None):
            raise DataError("give both --test-src and --test-tgt, or neither")
        names = ["train", "valid"] + (["test"] if files["test_src"] else [])
        splits = [Split(n, files[f"{n}_src"], files[f"{n}_tgt"], "files") for n in names]
        return splits, args.src or "src", args.tgt or "tgt"

    info = get_dataset(args.dataset)
    if not args.src or not args.tgt:
        raise DataError(f"--dataset {info.name} needs --src and --tgt (languages: {', '.join(info.langs)})")
    if args.src == args.tgt:
        raise DataError(f"--src and --tgt are both {args.src!r}")
    wanted = [("train", args.train_split or info.train), ("valid", info.valid), ("test", info.tests[0])]
    wanted += [(name, name) for name in info.tests[1:]]
    splits = []
    for name, origin in wanted:
        src, tgt = (
            fetch(info.name, origin, lang, variant=args.variant, data_dir=args.data_dir, cache_dir=args.cache_dir)
            for lang in (args.src, args.tgt)
        )
        splits.append(Split(name, src, tgt, f"{info.name}:{origin}"))
    return splits, args.src, args.tgt


# --- the work ---------------------------------------------------------------------------------------


def prepare(
    splits: list[Split],
    out: str | Path,
    *,
    src_lang: str,
    tgt_lang: str,
    vocab_size: int = DEFAULT_VOCAB_SIZE,
    separate_vocab: bool = False,
    sample_size: int = DEFAULT_SAMPLE_SIZE,
    character_coverage: float = DEFAULT_CHARACTER_COVERAGE,
    seed: int = 0,
    max_len: int = DEFAULT_MAX_LEN,
    max_ratio: float = DEFAULT_MAX_RATIO,
    overwrite: bool = False,
    progress: bool = True,
    extra: dict | None = None,
) -> dict:
    """Build the output directory `out` from `splits` (the first is the training split) and
    return its metadata (also written to out/data.json)."""
    if not splits or splits[0].name != "train":
        raise ValueError("the first split must be 'train'")
    out = Path(out).absolute()
    _check_output_dir(out, overwrite)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    try:
        start = time.perf_counter()
        vocab_meta, src_vocab, tgt_vocab = _train_vocabularies(
            splits[0], tmp, vocab_size, separate_vocab, sample_size, character_coverage, seed, progress
        )
        split_meta = {}
        for split in splits:
            split_meta[split.name] = _binarize(
                split, src_vocab, tgt_vocab, tmp, filter_pairs=split.name == "train",
                max_len=max_len, max_ratio=max_ratio, progress=progress,
            )
        if split_meta["train"]["pairs"] == 0:
            raise DataError("every training pair was filtered out (see --max-len, --max-ratio)", splits[0].src)
        meta = {
            "format": 1,
            "src_lang": src_lang,
            "tgt_lang": tgt_lang,
            **(extra or {}),
            "vocab": vocab_meta,
            "special_ids": {"pad": PAD, "unk": UNK, "bos": BOS, "eos": EOS},
            "filter": {"max_len": max_len, "max_ratio": max_ratio, "applies_to": ["train"]},
            "splits": split_meta,
            "seconds": round(time.perf_counter() - start, 1),
        }
        (tmp / METADATA).write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")
        _move_into_place(tmp, out, overwrite)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    meta["out"] = str(out)
    return meta


def _check_output_dir(out: Path, overwrite: bool) -> None:
    if out.exists() and not out.is_dir():
        raise DataError("exists and is not a directory", out)
    if out.is_dir() and any(out.iterdir()) and not overwrite:
        raise DataError("output directory is not empty (use --overwrite to replace it)", out)


def _move_into_place(tmp: Path, out: Path, overwrite: bool) -> None:
    """Rename the finished temporary directory to `out` (replacing an old one if allowed)."""
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o777 & ~umask)  # mkdtemp made it private
    _check_output_dir(out, overwrite)
    if out.exists():
        old = out.with_name(f".{out.name}.old-{os.getpid()}")
        os.rename(out, old)
        os.rename(tmp, out)
        shutil.rmtree(old)
    else:
        os.rename(tmp, out)


def _train_vocabularies(train: Split, out_dir: Path, vocab_size, separate, sample_size, coverage, seed, progress):
    """Train the shared (or the two separate) sentencepiece models on the training split."""

    def lines(sentences: Iterable[str], desc: str) -> Iterator[str]:
        yield from tqdm(sentences, desc=desc, unit=" lines", unit_scale=True, disable=not progress, mininterval=1)

    options = dict(vocab_size=vocab_size, sample_size=sample_size, character_coverage=coverage, seed=seed)
    if not separate:
        both_sides = (line for pair in read_parallel(train.src, train.tgt) for line in pair)
        model = train_vocab(out_dir / "spm", lines(both_sides, "vocab: read train (both sides)"), **options)
        src_vocab = tgt_vocab = Vocab(model)
        files = {"src": model.name, "tgt": model.name}
    else:
        src_model = train_vocab(out_dir / "spm.src", lines(read_lines(train.src), "vocab: read train source"), **options)
        tgt_model = train_vocab(out_dir / "spm.tgt", lines(read_lines(train.tgt), "vocab: read train target"), **options)
        src_vocab, tgt_vocab = Vocab(src_model), Vocab(tgt_model)
        files = {"src": src_model.name, "tgt": tgt_model.name}
    meta = {
        "type": "sentencepiece-bpe",
        "shared": not separate,
        "files": files,
        "size": {"src": len(src_vocab), "tgt": len(tgt_vocab)},
        "sample_size": sample_size,
        "character_coverage": coverage,
        "seed": seed,
    }
    return meta, src_vocab, tgt_vocab


def _chunks(items: Iterable, size: int) -> Iterator[list]:
    items = iter(items)
    while chunk := list(islice(items, size)):
        yield chunk


def _binarize(split: Split, src_vocab: Vocab, tgt_vocab: Vocab, out_dir: Path, *, filter_pairs, max_len, max_ratio, progress) -> dict:
    """Encode one split into {name}.src / {name}.tgt token arrays; return its metadata."""
    report = FilterReport(max_len=max_len, max_ratio=max_ratio)
    bar = tqdm(desc=f"binarize {split.name}", unit=" lines", unit_scale=True, disable=not progress, mininterval=1)
    line = 0
    with (
        IndexedWriter(out_dir / f"{split.name}.src", len(src_vocab)) as src_out,
        IndexedWriter(out_dir / f"{split.name}.tgt", len(tgt_vocab)) as tgt_out,
        bar,
    ):
        for chunk in _chunks(read_parallel(split.src, split.tgt), CHUNK):
            src_ids = src_vocab.encode_batch([s for s, _ in chunk])
            tgt_ids = tgt_vocab.encode_batch([t for _, t in chunk])
            kept_src, kept_tgt = [], []
            for s, t in zip(src_ids, tgt_ids):
                line += 1
                reason = filter_reason(len(s), len(t), max_len, max_ratio) if filter_pairs else None
                report.count(reason, line)
                if reason is None:
                    kept_src.append(s)
                    kept_tgt.append(t)
            src_out.add_many(kept_src)
            tgt_out.add_many(kept_tgt)
            bar.update(len(chunk))
    return {
        "origin": split.origin,
        "src_file": str(Path(split.src).absolute()),
        "tgt_file": str(Path(split.tgt).absolute()),
        "pairs": src_out.num_sentences,
        "src_tokens": src_out.num_tokens,  # EOS included
        "tgt_tokens": tgt_out.num_tokens,
        "src_max_len": src_out.max_size,
        "tgt_max_len": tgt_out.max_size,
        "filtered": filter_pairs,
        "filter_report": report.to_dict(),
    }


def print_report(meta: dict, file=None) -> None:
    """What was written, and for the training split what the filter kept and dropped."""
    file = file or sys.stdout
    v = meta["vocab"]
    kind = "shared" if v["shared"] else "separate"
    sizes = f"{v['size']['src']}" if v["shared"] else f"{v['size']['src']} source, {v['size']['tgt']} target"
    print(f"prepared {meta['src_lang']}->{meta['tgt_lang']} in {meta['out']} ({meta['seconds']} s)", file=file)
    print(f"  vocabulary: {kind} BPE, {sizes} pieces ({', '.join(sorted(set(v['files'].values())))})", file=file)
    for name, s in meta["splits"].items():
        r = s["filter_report"]
        counts = f"{s['pairs']:,} pairs, {s['src_tokens']:,} / {s['tgt_tokens']:,} tokens"
        if s["filtered"]:
            report = FilterReport(**r)
            print(f"  {name}: {counts}; {report.summary()}", file=file)
        else:
            print(f"  {name}: {counts} (evaluation split: kept whole)", file=file)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="transduce prepare",
        description="Train a BPE vocabulary and write memory-mapped token arrays for training.",
    )
    add_args(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
