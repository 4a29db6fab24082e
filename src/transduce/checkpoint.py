"""Model files: weights in safetensors, the config as JSON beside them. Loading never unpickles.

A model directory holds::

    model.safetensors   the weights (a shared tensor such as the tied embedding stored once)
    config.json         the `Config` (model architecture and training regime) as JSON

Both are written to temporary names and moved into place with `os.replace`, so a crash while
writing never leaves a half-written file under the final name.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch
from safetensors.torch import load_model as _st_load_model
from safetensors.torch import save_model as _st_save_model

from .config import Config
from .model import Transformer

WEIGHTS = "model.safetensors"
CONFIG = "config.json"


def atomic_write_text(path: Path, text: str) -> None:
    """Write `text` to `path` through a temporary file and `os.replace`."""
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def save_model(model: Transformer, config: Config, directory: str | os.PathLike) -> Path:
    """Save weights (safetensors) and config (JSON) into `directory`; returns it."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    model = getattr(model, "module", model)  # unwrap DDP
    model = getattr(model, "_orig_mod", model)  # unwrap torch.compile
    tmp = directory / (WEIGHTS + ".tmp")
    _st_save_model(model, str(tmp), metadata={"format": "pt", "transduce": "1"})
    os.chmod(tmp, 0o644)  # safetensors creates files readable by their owner only
    os.replace(tmp, directory / WEIGHTS)
    atomic_write_text(directory / CONFIG, config.to_json() + "\n")
    return directory


def load_config(directory: str | os.PathLike) -> Config:
    path = Path(directory) / CONFIG
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such file (is {directory} a transduce model directory?)")
    return Config.from_dict(json.loads(path.read_text(encoding="utf-8")))


def load_model(directory: str | os.PathLike, device: str | torch.device = "cpu") -> tuple[Transformer, Config]:
    """Build the model from `config.json` and load `model.safetensors` into it (strictly: every
    tensor must be present with its shape). Returns (model in eval mode, config)."""
    directory = Path(directory)
    config = load_config(directory)
    model = Transformer(config.model)
    weights = directory / WEIGHTS
    if not weights.is_file():
        raise FileNotFoundError(f"{weights}: no such file")
    missing, unexpected = _st_load_model(model, str(weights), strict=True, device=str(device))
    return model.to(device).eval(), config
