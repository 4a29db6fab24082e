"""A tiny translation model directory for the attention-view tests: a 2-layer Transformer
(d_model 32, 4 heads) with weights scaled up so that its heads attend sharply (not uniformly),
and a 100-piece sentencepiece vocabulary trained here, saved beside it as spm.model."""

import random
import shutil
from pathlib import Path

import torch

from transduce.checkpoint import save_model
from transduce.config import Config, ModelConfig
from transduce.data.vocab import Vocab, train_vocab
from transduce.model import Transformer

WORDS = [
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
    "making",
    "difficult",
]
N_LAYERS, N_HEADS = 2, 4


def make_model_dir(root: Path) -> Path:
    rng = random.Random(0)
    lines = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 12))) for _ in range(400)]
    spm = train_vocab(root / "spm", lines, vocab_size=100, num_threads=1)
    torch.manual_seed(0)
    mc = ModelConfig(
        src_vocab_size=len(Vocab(spm)), n_layers=N_LAYERS, d_model=32, d_ff=64, n_heads=N_HEADS, dropout=0.0
    )
    model = Transformer(mc)
    with torch.no_grad():  # sharper attention than the initialisation's near-uniform rows
        for name, p in model.named_parameters():
            if "in_proj" in name:
                p.mul_(3.0)
    d = root / "model"
    save_model(model, Config(model=mc), d)
    shutil.copy(spm, d / "spm.model")
    return d
