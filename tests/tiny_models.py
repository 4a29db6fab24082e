"""Tiny random models with real sentencepiece vocabularies, for the export and server tests:
shared or separate vocabularies, any ModelConfig knob, saved as a model directory that
`transduce translate` loads (spm.model beside it, or data.json naming spm.src/spm.tgt)."""

import json
import random
import shutil
from pathlib import Path

import torch

from transduce.checkpoint import save_model
from transduce.config import Config, ModelConfig
from transduce.data.vocab import BOS, EOS, PAD, Vocab, train_vocab
from transduce.model import Transformer

SRC_WORDS = [
    "a",
    "man",
    "woman",
    "dog",
    "runs",
    "sits",
    "on",
    "the",
    "grass",
    "red",
    "blue",
    "ball",
    "with",
    "two",
    "children",
    "play",
    "near",
    "water",
    "street",
    "looks",
]
TGT_WORDS = [
    "ein",
    "mann",
    "frau",
    "hund",
    "läuft",
    "sitzt",
    "auf",
    "dem",
    "gras",
    "rot",
    "blau",
    "ball",
    "mit",
    "zwei",
    "kinder",
    "spielen",
    "nahe",
    "wasser",
    "straße",
    "schaut",
]


def sentences(words, n: int, seed: int = 0, lo: int = 2, hi: int = 12) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(words) for _ in range(rng.randint(lo, hi))) for _ in range(n)]


def make_model(root: Path, *, shared: bool = True, seed: int = 0, **knobs) -> Path:
    """A model directory under `root`: a random Transformer (2 layers, d_model 32 unless `knobs`
    say otherwise) and its vocabulary (100 pieces; separate: 100 source, 90 target)."""
    root.mkdir(parents=True, exist_ok=True)
    src_lines, tgt_lines = sentences(SRC_WORDS, 300, seed), sentences(TGT_WORDS, 300, seed + 1)
    if shared:
        sv = tv = Vocab(train_vocab(root / "spm", src_lines + tgt_lines, vocab_size=100, num_threads=1))
    else:
        sv = Vocab(train_vocab(root / "spm.src", src_lines, vocab_size=100, num_threads=1))
        tv = Vocab(train_vocab(root / "spm.tgt", tgt_lines, vocab_size=90, num_threads=1))
    torch.manual_seed(seed)
    c = dict(n_layers=2, d_model=32, d_ff=64, n_heads=4, dropout=0.0)
    c.update(knobs)
    mc = ModelConfig(src_vocab_size=len(sv), tgt_vocab_size=None if shared else len(tv), share_embeddings=shared, **c)
    model = Transformer(mc)
    with torch.no_grad():  # non-zero LayerNorm parameters and biases, so that every one of them is exercised
        for name, p in model.named_parameters():
            if "norm" in name or name.endswith("bias"):
                p.add_(torch.randn_like(p) * 0.1)
    d = root / "model"
    save_model(model, Config(model=mc), d)
    if shared:
        shutil.copy(sv.path, d / "spm.model")
    else:
        shutil.copy(sv.path, d / "spm.src.model")
        shutil.copy(tv.path, d / "spm.tgt.model")
        meta = {
            "format": 1,
            "vocab": {
                "shared": False,
                "files": {"src": "spm.src.model", "tgt": "spm.tgt.model"},
                "size": {"src": len(sv), "tgt": len(tv)},
            },
        }
        (d / "data.json").write_text(json.dumps(meta))
    return d


def padded_batch(src_vocab: Vocab, tgt_vocab: Vocab, n: int = 6, seed: int = 3):
    """(src (B, S), tgt_in (B, T), source ids, target ids): sources with EOS and targets after
    BOS, right-padded, of different lengths (so padding is exercised on both sides)."""
    src_ids = [src_vocab.encode(s) + [EOS] for s in sentences(SRC_WORDS, n, seed)]
    tgt_ids = [tgt_vocab.encode(s) for s in sentences(TGT_WORDS, n, seed + 1)]
    S, T = max(map(len, src_ids)), max(len(t) + 1 for t in tgt_ids)
    src = torch.full((n, S), PAD, dtype=torch.long)
    tgt = torch.full((n, T), PAD, dtype=torch.long)
    for i, (s, t) in enumerate(zip(src_ids, tgt_ids)):
        src[i, : len(s)] = torch.tensor(s)
        tgt[i, : len(t) + 1] = torch.tensor([BOS] + t)
    return src, tgt, src_ids, tgt_ids
