"""A tiny prepared-data directory for the training tests: random sequences and their reversals,
written with the data module's IndexedWriter plus a data.json as `transduce prepare` writes."""

import json
from pathlib import Path

import numpy as np

from transduce.data.indexed import IndexedWriter

VOCAB = 24


def make_data(out: Path, n_train: int = 60, n_valid: int = 12, separate: bool = False, seed: int = 0) -> Path:
    """Write the directory (separate=True: separate source/target vocabularies) and return it."""
    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    tgt_vocab = VOCAB + 5 if separate else VOCAB
    for split, n in (("train", n_train), ("valid", n_valid)):
        src = [rng.integers(4, VOCAB, rng.integers(1, 10)).tolist() for _ in range(n)]
        for side, sents, v in (("src", src, VOCAB), ("tgt", [s[::-1] for s in src], tgt_vocab)):
            with IndexedWriter(out / f"{split}.{side}", v) as w:
                w.add_many(sents)
    files = {"src": "spm.src.model", "tgt": "spm.tgt.model"} if separate else {"src": "spm.model", "tgt": "spm.model"}
    for name in set(files.values()):
        (out / name).write_bytes(b"not a real sentencepiece model")
    meta = {
        "format": 1,
        "src_lang": "x",
        "tgt_lang": "y",
        "special_ids": {"pad": 0, "unk": 1, "bos": 2, "eos": 3},
        "vocab": {"shared": not separate, "files": files, "size": {"src": VOCAB, "tgt": tgt_vocab}},
    }
    (out / "data.json").write_text(json.dumps(meta))
    return out
