"""`transduce prepare` (Section 5.1): parallel text -> a BPE vocabulary (shared unless
--separate-vocab) -> memory-mapped token arrays, in a directory of:

    spm.model (or spm.src.model + spm.tgt.model), spm*.vocab
    train.src.bin/.idx  train.tgt.bin/.idx  valid.*  test.*  (+ extra test sets by name)
    data.json           languages, vocabulary files, per-split counts, the filter report and
                        the original text files (the references for BLEU)

or, given an existing model's vocabulary (`GivenVocabulary`, `prepare --vocab MODEL`: fine-tuning,
`transduce.finetune`), with its files copied in place of a learned one.
"""

from __future__ import annotations

import json
import shutil
import sys
import time
from dataclasses import dataclass
from itertools import islice
from pathlib import Path
from typing import Iterable, Iterator

from tqdm import tqdm

from ..checkpoint.files import atomic_dir
from ..defaults import CHARACTER_COVERAGE, MAX_LEN, MAX_RATIO, VOCAB_SAMPLE, VOCAB_SIZE
from ..errors import DataError
from .batching import METADATA
from .datasets import fetch, get_dataset
from .indexed import IndexedWriter
from .text import FilterReport, filter_reason, read_lines, read_parallel
from .vocab import Vocab, train_vocab

CHUNK = 10_000  # lines encoded at a time


@dataclass
class Split:
    """One split to prepare: its name in the output and its two text files."""

    name: str  # "train", "valid", "test", or the dataset's own name for extra test sets
    src: Path
    tgt: Path
    origin: str  # where it came from, e.g. "multi30k:test_2016_flickr" or "files"
    files: dict[str, str] | None = None  # what data.json records instead of src_file/tgt_file


@dataclass
class GivenVocabulary:
    """An existing vocabulary to encode with instead of learning one (`transduce.finetune.model_vocabulary`)."""

    record: dict  # what data.json says of it ("files", "size", "shared", ...)
    files: list[Path]  # copied into the output directory: the files "files" names, and any it needs beside them
    src: Vocab
    tgt: Vocab


def dataset_splits(
    name: str,
    src: str,
    tgt: str,
    *,
    variant: str = "raw",
    train_split: str | None = None,
    data_dir: str | None = None,
    cache_dir: str | None = None,
) -> list[Split]:
    """The splits of a registered dataset, fetched: train, valid, test, then its other tests."""
    info = get_dataset(name)
    wanted = [("train", train_split or info.train), ("valid", info.valid), ("test", info.tests[0])]
    wanted += [(test, test) for test in info.tests[1:]]
    for _, origin in wanted:
        for lang in (src, tgt):
            info.source(origin, lang, variant)  # a wrong language, split or variant refused before any download

    def fetched(origin: str, lang: str) -> Path:
        return fetch(info.name, origin, lang, variant=variant, data_dir=data_dir, cache_dir=cache_dir)

    return [
        Split(split, fetched(origin, src), fetched(origin, tgt), f"{info.name}:{origin}") for split, origin in wanted
    ]


def prepare(
    splits: list[Split],
    out: str | Path,
    *,
    src_lang: str,
    tgt_lang: str,
    vocab_size: int = VOCAB_SIZE,
    separate_vocab: bool = False,
    sample_size: int = VOCAB_SAMPLE,
    character_coverage: float = CHARACTER_COVERAGE,
    seed: int = 0,
    max_len: int = MAX_LEN,
    max_ratio: float = MAX_RATIO,
    overwrite: bool = False,
    progress: bool = True,
    extra: dict | None = None,
    tgt_vocab_type: str = "bpe",
    vocab: GivenVocabulary | None = None,
) -> dict:
    """Build the output directory `out` from `splits` (the first is the training split) and
    return its metadata (out/data.json). `tgt_vocab_type="word"`: a closed word-level target
    vocabulary of its own (implies `separate_vocab`), e.g. linearized trees. `vocab`: encode with
    it (its files copied beside the arrays) rather than learn one; the vocabulary options unused."""
    if not splits or splits[0].name != "train":
        raise ValueError("the first split must be 'train'")
    out = Path(out).absolute()
    check_output_dir(out, overwrite)
    out.parent.mkdir(parents=True, exist_ok=True)
    with atomic_dir(out) as tmp:
        start = time.perf_counter()
        if vocab is not None:
            for f in vocab.files:
                shutil.copy2(f, tmp / f.name)
            vocab_meta, src_vocab, tgt_vocab = vocab.record, vocab.src, vocab.tgt
        else:
            vocab_meta, src_vocab, tgt_vocab = _train_vocabularies(
                splits[0],
                tmp,
                vocab_size,
                separate_vocab,
                sample_size,
                character_coverage,
                seed,
                progress,
                tgt_vocab_type,
            )
        split_meta = {}
        for split in splits:
            split_meta[split.name] = _binarize(
                split,
                src_vocab,
                tgt_vocab,
                tmp,
                filter_pairs=split.name == "train",
                max_len=max_len,
                max_ratio=max_ratio,
                progress=progress,
            )
        if split_meta["train"]["pairs"] == 0:
            raise DataError("every training pair was filtered out (see --max-len, --max-ratio)", splits[0].src)
        meta = {
            "format": 1,
            "src_lang": src_lang,
            "tgt_lang": tgt_lang,
            **(extra or {}),
            "vocab": vocab_meta,
            "special_ids": tgt_vocab.ids.to_dict(),  # the vocabulary's: its model's (`ModelConfig.special_ids`)
            "filter": {"max_len": max_len, "max_ratio": max_ratio, "applies_to": ["train"]},
            "splits": split_meta,
            "seconds": round(time.perf_counter() - start, 1),
        }
        (tmp / METADATA).write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")
        check_output_dir(out, overwrite)  # again, before replacing it
    meta["out"] = str(out)
    return meta


def check_output_dir(out: Path, overwrite: bool) -> None:
    if out.exists() and not out.is_dir():
        raise DataError("exists and is not a directory", out)
    if out.is_dir() and any(out.iterdir()) and not overwrite:
        raise DataError("output directory is not empty (use --overwrite to replace it)", out)


WORD_VOCAB_LIMIT = 100_000  # A closed word-level target vocabulary: every symbol of the training targets, up to this


def _train_vocabularies(
    train: Split, out_dir: Path, vocab_size, separate, sample_size, coverage, seed, progress, tgt_type: str = "bpe"
):
    """Train the shared (or the two separate) sentencepiece models on the training split."""
    if tgt_type not in ("bpe", "word"):
        raise ValueError(f"target vocabulary type must be 'bpe' or 'word', not {tgt_type!r}")
    separate = separate or tgt_type == "word"

    def lines(sentences: Iterable[str], desc: str) -> Iterator[str]:
        yield from tqdm(sentences, desc=desc, unit=" lines", unit_scale=True, disable=not progress, mininterval=1)

    options = dict(vocab_size=vocab_size, sample_size=sample_size, character_coverage=coverage, seed=seed)
    if not separate:
        both_sides = (line for pair in read_parallel(train.src, train.tgt) for line in pair)
        model = train_vocab(out_dir / "spm", lines(both_sides, "vocab: read train (both sides)"), **options)
        src_vocab = tgt_vocab = Vocab(model)
    else:
        src_model = train_vocab(
            out_dir / "spm.src", lines(read_lines(train.src), "vocab: read train source"), **options
        )
        word = {"vocab_size": WORD_VOCAB_LIMIT, "sample_size": 0, "model_type": "word"}
        tgt_options = {**options, **word} if tgt_type == "word" else options
        tgt_model = train_vocab(
            out_dir / "spm.tgt", lines(read_lines(train.tgt), "vocab: read train target"), **tgt_options
        )
        src_vocab, tgt_vocab = Vocab(src_model), Vocab(tgt_model)
    meta = {
        "type": "sentencepiece-bpe",
        **({"tgt_type": "sentencepiece-word"} if tgt_type == "word" else {}),
        "shared": not separate,
        "files": {"src": src_vocab.path.name, "tgt": tgt_vocab.path.name},
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


def _binarize(
    split: Split, src_vocab: Vocab, tgt_vocab: Vocab, out_dir: Path, *, filter_pairs, max_len, max_ratio, progress
) -> dict:
    """Encode one split into {name}.src / {name}.tgt token arrays; return its metadata."""
    report = FilterReport(max_len=max_len, max_ratio=max_ratio)
    bar = tqdm(desc=f"binarize {split.name}", unit=" lines", unit_scale=True, disable=not progress, mininterval=1)
    line = 0
    with (
        IndexedWriter(out_dir / f"{split.name}.src", len(src_vocab), src_vocab.eos) as src_out,
        IndexedWriter(out_dir / f"{split.name}.tgt", len(tgt_vocab), tgt_vocab.eos) as tgt_out,
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
        **(split.files or {"src_file": str(Path(split.src).absolute()), "tgt_file": str(Path(split.tgt).absolute())}),
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
    sizes = f"{v['size']['src']}" if v["shared"] else f"{v['size']['src']} source, {v['size']['tgt']} target"
    kind = f"{'shared' if v['shared'] else 'separate'} BPE"
    if v.get("tgt_type") == "sentencepiece-word":  # never shared
        kind = "source BPE, target closed word-level"
    if v.get("from_model"):
        kind = f"{'shared' if v['shared'] else 'separate'}, the model's ({v['from_model']})"
    print(f"prepared {meta['src_lang']}->{meta['tgt_lang']} in {meta['out']} ({meta['seconds']} s)", file=file)
    print(f"  vocabulary: {kind}, {sizes} pieces ({', '.join(sorted(set(v['files'].values())))})", file=file)
    for name, s in meta["splits"].items():
        counts = f"{s['pairs']:,} pairs, {s['src_tokens']:,} / {s['tgt_tokens']:,} tokens"
        origin = s["origin"].partition(":")[2]  # the dataset's own split name, e.g. newstest2013
        if origin and origin != name:
            name += f" ({origin})"
        if s["filtered"]:
            print(f"  {name}: {counts}; {FilterReport(**s['filter_report']).summary()}", file=file)
        else:
            print(f"  {name}: {counts} (evaluation split: kept whole)", file=file)
