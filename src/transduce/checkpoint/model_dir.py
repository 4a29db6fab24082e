"""Model directories (model.safetensors + config.json + checksums.json): saving and loading,
for training and inference alike."""

from __future__ import annotations

import functools
import json
import os
from pathlib import Path
from typing import Callable

import torch
from safetensors import safe_open
from safetensors.torch import save_file
from safetensors.torch import save_model as _st_save_model

from ..config import Config
from ..model import Transformer
from .files import CHECKSUMS, CONFIG, METADATA, WEIGHTS, atomic_write_text, digests, synced, verifying


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


def save_made_tensors_as_model(
    makers: dict[str, Callable[[], torch.Tensor]], config: Config, directory: str | os.PathLike
) -> Path:
    """A model directory whose tensors are made one at a time (`makers[name]()`, named as in
    model.safetensors, fp32), each written and let go before the next is made: an import that holds
    the model's largest tensor, not the model. Every parameter of `config`'s model is made once (of
    those it shares, any one name), at its shape: checked against the model built on the meta
    device, which allocates nothing."""
    shapes = skeleton(config).state_dict(keep_vars=True)
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


def load_model(
    directory: str | os.PathLike,
    device: str | torch.device = "cpu",
    dtype: torch.dtype | None = None,
    as_filled: Callable[[torch.nn.Module], None] | None = None,
) -> tuple[Transformer, Config]:
    """(the model in eval mode, its config), its weights loaded strictly from a model directory;
    with `dtype`, its floating-point tensors in that type (as `model.to(dtype)` would give them),
    read and cast one at a time, `as_filled` called on each part read (`build_model`)."""
    directory = Path(directory)
    config = load_config(directory)
    weights = directory / WEIGHTS
    if not weights.is_file():
        raise FileNotFoundError(f"{weights}: no such file")
    with verifying(directory, (WEIGHTS, CONFIG)):  # checksummed as it is read
        with safe_open(str(weights), "pt") as f:
            names = set(f.keys())
        model = build_model(
            config,
            names,
            lambda name: read_tensor(weights, name),
            device=device,
            dtype=dtype,
            where=weights,
            as_filled=as_filled,
        )
    return model.eval(), config


def skeleton(config: Config) -> Transformer:
    """The model of `config` on the meta device: its shapes, no memory for its weights, which are
    not initialised (`nn.init.normal_` has no meta kernel, and would import PyTorch's Python
    decompositions, about 70 MB, to draw numbers that are replaced at once; the sinusoids' table,
    3.5, is computed on the CPU for the same reason)."""
    normal = torch.nn.init.normal_
    torch.nn.init.normal_ = lambda tensor, *args, **kwargs: (
        tensor if tensor.is_meta else normal(tensor, *args, **kwargs)
    )
    try:
        with torch.device("meta"):
            return Transformer(config.model)
    finally:
        torch.nn.init.normal_ = normal


SAFETENSORS_DTYPES = {
    "F64": torch.float64,
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "I64": torch.int64,
    "I32": torch.int32,
    "I16": torch.int16,
    "I8": torch.int8,
    "U8": torch.uint8,
    "BOOL": torch.bool,
}
"""safetensors' names of the dtypes `read_tensor` reads itself (any other: through safetensors)."""


@functools.lru_cache(maxsize=4)
def _header(path: str, mtime_ns: int, size: int) -> tuple[int, dict]:
    """(where the data starts, the header) of a safetensors file, read once for a file as it is now."""
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        return 8 + n, json.loads(f.read(n))


def read_tensor(path: Path, name: str) -> torch.Tensor:
    """One tensor of a safetensors file, its bytes read into a tensor of its own: a model is read
    tensor by tensor, nothing of the file mapped. A mapped file's pages count in the process's
    memory for as long as they are mapped: a tensor copied out of the mapping held twice its size
    while it was read (the 119 MB embedding matrix of opus-mt-en-de's shape, the peak of loading
    it), and a tensor kept from it held a fifth of a gigabyte of OPUS-MT's file resident after
    decoding had dropped the large ones (docs/speed.md, "Memory at OPUS-MT's size")."""
    stat = os.stat(path)
    start, header = _header(str(path), stat.st_mtime_ns, stat.st_size)
    info = header.get(name)
    dtype = SAFETENSORS_DTYPES.get(info["dtype"]) if isinstance(info, dict) else None
    if dtype is None:  # a name or dtype of safetensors' own to explain
        with safe_open(str(path), "pt") as f:
            return f.get_tensor(name).clone()
    begin, end = info["data_offsets"]
    tensor = torch.empty(info["shape"], dtype=dtype)
    data = memoryview(tensor.view(-1).view(torch.uint8).numpy())
    if end - begin != len(data):
        raise ValueError(f"{path}: {name} holds {end - begin} bytes, not the {len(data)} of its shape and dtype")
    with open(path, "rb", buffering=0) as f:
        f.seek(start + begin)
        done = 0
        while done < len(data):
            n = f.readinto(data[done:])
            if not n:
                raise ValueError(f"{path}: ends inside {name}")
            done += n
    return tensor


def build_model(
    config: Config,
    names: set[str],
    read,
    *,
    device: str | torch.device = "cpu",
    dtype: torch.dtype | None = None,
    where: object = "the weights",
    as_filled: Callable[[torch.nn.Module], None] | None = None,
) -> Transformer:
    """A Transformer whose every parameter and persistent buffer is `read(name)` for a name in
    `names` (the weights file's: a tensor tied to another is stored under one of its names), each
    cast to `dtype` where floating (None: as stored) and moved to `device` as soon as read; built
    without memory of its own first (the meta device), so that loading holds the model once, plus
    one tensor. Read in parts: what lies outside the layers (embeddings, final norms, output
    projection and bias), then each decoder layer, then each encoder layer; `as_filled(part)` is
    called as each is read (the model for the first, each layer for the others), so that a model
    made for decoding only can be quantized or packed a part at a time, never all in its float
    type at once (`decoding.ready.load_for_decoding`). Raises ValueError naming `where` when the
    weights do not fit the model."""
    model = skeleton(config)
    aliases: dict[int, list[str]] = {}
    for prefix, module in model.named_modules(remove_duplicate=False):
        aliases.setdefault(id(module), []).append(prefix)
    used, missing = set(), []

    def load(module: torch.nn.Module, key: str, old: torch.Tensor) -> torch.Tensor | None:
        found = [n for n in (f"{p}.{key}" if p else key for p in aliases[id(module)]) if n in names]
        if not found:
            missing.append(f"{aliases[id(module)][0]}.{key}")
            return None
        t = read(found[0])
        used.update(found)
        if t.shape != old.shape:
            raise ValueError(f"{where}: {found[0]} has shape {tuple(t.shape)}, the model's {tuple(old.shape)}")
        return t.to(device=device, dtype=dtype if dtype is not None and t.is_floating_point() else t.dtype)

    def fill(module: torch.nn.Module) -> None:
        for key, p in list(module._parameters.items()):
            if p is not None and (t := load(module, key, p)) is not None:
                module._parameters[key] = torch.nn.Parameter(t, requires_grad=p.requires_grad)
        for key, b in list(module._buffers.items()):
            if b is None:
                continue
            if key in module._non_persistent_buffers_set:  # computed, not stored: the sinusoids (3.5)
                if b.is_meta:
                    raise ValueError(f"{where}: {aliases[id(module)][0]}.{key} is neither stored nor computed")
                module._buffers[key] = b.to(
                    device=device, dtype=dtype if dtype is not None and b.is_floating_point() else b.dtype
                )
            elif (t := load(module, key, b)) is not None:
                module._buffers[key] = t

    in_layers = {id(m) for stack in (model.encoder, model.decoder) for m in stack.layers.modules()}
    for part in [model, *model.decoder.layers, *model.encoder.layers]:
        for module in part.modules():  # nothing held past the part: `as_filled` may let its tensors go
            if part is not model or id(module) not in in_layers:
                fill(module)
        if as_filled is not None:
            as_filled(part)
    unexpected = sorted(names - used)
    if missing or unexpected:
        raise ValueError(
            f"{where}: the weights do not fit the model (missing {missing[:3]}, unexpected {unexpected[:3]})"
        )
    return model


def model_from_tensors(tensors: dict[str, torch.Tensor], config: Config, where) -> Transformer:
    """A Transformer holding `tensors` (named as in model.safetensors); every parameter covered."""
    model = Transformer(config.model)
    missing, unexpected = model.load_state_dict(tensors, strict=False)
    state = model.state_dict()
    loaded = {state[k].data_ptr() for k in tensors if k in state}
    missing = [k for k in missing if state[k].data_ptr() not in loaded]  # not an alias of a loaded tensor
    if missing or unexpected:
        raise ValueError(
            f"{where}: the weights do not fit the model (missing {missing[:3]}, unexpected {unexpected[:3]})"
        )
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
