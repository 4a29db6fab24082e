"""Model directories (model.safetensors + config.json + checksums.json): saving and loading,
for training and inference alike."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Callable

import torch
from safetensors.torch import load_model as _st_load_model
from safetensors.torch import save_file
from safetensors.torch import save_model as _st_save_model

from ..config import Config
from ..model import Transformer
from .files import CHECKSUMS, CONFIG, METADATA, WEIGHTS, atomic_write_text, digests, synced, verify


def is_model_dir(path: Path) -> bool:
    return (path / WEIGHTS).is_file() and (path / CONFIG).is_file()


def save_model(model: torch.nn.Module, config: Config, directory: str | os.PathLike) -> Path:
    """Save weights (safetensors) and config (JSON) into `directory`; returns it."""
    model = getattr(model, "module", model)  # unwrap DDP
    model = getattr(model, "_orig_mod", model)  # unwrap torch.compile
    return _write_model_dir(directory, config, lambda tmp: _st_save_model(model, tmp, metadata=METADATA))


def _write_model_dir(directory: str | os.PathLike, config: Config, write_weights) -> Path:
    """`write_weights(temporary name)`, moved into place, then config.json, then checksums.json."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    weights_tmp = directory / (WEIGHTS + ".tmp")
    write_weights(str(weights_tmp))
    synced(weights_tmp)
    (directory / CHECKSUMS).unlink(missing_ok=True)  # never a stale one beside new files
    os.replace(weights_tmp, directory / WEIGHTS)
    atomic_write_text(directory / CONFIG, config.to_json() + "\n")
    atomic_write_text(directory / CHECKSUMS, json.dumps(digests(directory, (WEIGHTS, CONFIG)), indent=2) + "\n")
    return directory


def save_tensors_as_model(tensors: dict[str, torch.Tensor], config: Config, directory: str | os.PathLike) -> Path:
    """Write `tensors` (named as in model.safetensors, e.g. an average) as a model directory."""
    tensors = {k: v.contiguous() for k, v in tensors.items()}
    return _write_model_dir(directory, config, lambda tmp: save_file(tensors, tmp, metadata=METADATA))


def save_made_tensors_as_model(makers: dict[str, Callable[[], torch.Tensor]], config: Config,
                               directory: str | os.PathLike) -> Path:
    """A model directory whose tensors are made one at a time (`makers[name]()`, named as in
    model.safetensors, fp32), each written and let go before the next is made: an import that holds
    the model's largest tensor, not the model. Every parameter of `config`'s model is made once (of
    those it shares, any one name), at its shape: checked against the model built on the meta
    device, which allocates nothing."""
    with torch.device("meta"):
        shapes = Transformer(config.model).state_dict(keep_vars=True)
    groups: dict[int, list[str]] = {}
    for name, t in shapes.items():
        groups.setdefault(id(t), []).append(name)
    aliases = {}
    for names in groups.values():
        made = [n for n in names if n in makers]
        if len(made) != 1:
            raise ValueError(f"{names[0]}: {'made twice' if made else 'not made'}")
        aliases.update({n: made[0] for n in names if n != made[0]})
    unknown = set(makers) - set(shapes)
    if unknown:
        raise ValueError(f"not a parameter of the model: {sorted(unknown)[:3]}")
    return _write_model_dir(directory, config, lambda tmp: _write_streamed(tmp, makers, shapes, aliases))


def _write_streamed(path: str, makers: dict, shapes: dict, aliases: dict) -> None:
    """safetensors' format written a tensor at a time: the header (every tensor's dtype, shape and
    offsets, known from `shapes`), then each tensor's bytes in that order."""
    header, offset = {}, 0
    for name in makers:
        n = 4 * shapes[name].numel()
        header[name] = {"dtype": "F32", "shape": list(shapes[name].shape), "data_offsets": [offset, offset + n]}
        offset += n
    header["__metadata__"] = {**METADATA, **aliases}
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(len(text).to_bytes(8, "little") + text)
        for name, make in makers.items():
            t = make().detach().to(torch.float32, memory_format=torch.contiguous_format).cpu()
            if t.shape != shapes[name].shape:
                raise ValueError(f"{name}: made of shape {tuple(t.shape)}, the model's is {tuple(shapes[name].shape)}")
            f.write(memoryview(t.contiguous().numpy()).cast("B"))
            del t


def load_config(directory: str | os.PathLike) -> Config:
    path = Path(directory) / CONFIG
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such file (is {directory} a transduce model directory?)")
    return Config.from_dict(json.loads(path.read_text(encoding="utf-8")))


def load_model(directory: str | os.PathLike, device: str | torch.device = "cpu") -> tuple[Transformer, Config]:
    """(the model in eval mode, its config), its weights loaded strictly from a model directory."""
    directory = Path(directory)
    config = load_config(directory)
    model = Transformer(config.model)
    weights = directory / WEIGHTS
    if not weights.is_file():
        raise FileNotFoundError(f"{weights}: no such file")
    verify(directory, (WEIGHTS, CONFIG))
    _st_load_model(model, str(weights), strict=True, device=str(device))
    return model.to(device).eval(), config


def model_from_tensors(tensors: dict[str, torch.Tensor], config: Config, where) -> Transformer:
    """A Transformer holding `tensors` (named as in model.safetensors); every parameter covered."""
    model = Transformer(config.model)
    missing, unexpected = model.load_state_dict(tensors, strict=False)
    state = model.state_dict()
    loaded = {state[k].data_ptr() for k in tensors if k in state}
    missing = [k for k in missing if state[k].data_ptr() not in loaded]  # not an alias of a loaded tensor
    if missing or unexpected:
        raise ValueError(f"{where}: the weights do not fit the model (missing {missing[:3]}, unexpected {unexpected[:3]})")
    return model


def guarded(load, *args, **kwargs):
    """`load(*args, ...)`, its errors a one-line ValueError naming `args[0]` (the path)."""
    try:
        return load(*args, **kwargs)
    except (FileNotFoundError, ValueError):  # DamagedCheckpoint included
        raise
    except Exception as e:  # safetensors' SafetensorError, torch's RuntimeError on shape mismatch, ...
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ValueError(f"{args[0]}: cannot load the model ({first})") from None
