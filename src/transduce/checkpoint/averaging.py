"""Section 6.1's checkpoint averaging, and what the MODEL argument of the inference commands
names: a model directory, or a run directory standing for the average of its last checkpoints
(or one of them)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import safe_open

from ..config import Config
from ..model import Transformer
from .files import CHECKPOINTS, CONFIG, WEIGHTS, verify
from .model_dir import build_model, guarded, is_model_dir, load_config, load_model, read_tensor
from .run_dir import checkpoint_name, latest_checkpoint, list_checkpoints, on_interval


def last_checkpoints(run_dir: str | os.PathLike, k: int, flag: str = "--average") -> list[Path]:
    """The newest `k` checkpoints of a run written at its interval, oldest first (6.1: "the last
    5 checkpoints, which were written at 10-minute intervals"); one forced off the interval is
    left out unless the run has no other. `flag`: the caller's option for `k`, for the errors."""
    found = list_checkpoints(run_dir)
    if not found:
        raise FileNotFoundError(f"{Path(run_dir) / CHECKPOINTS}: no checkpoints")
    if k < 1:
        raise ValueError(f"{flag} must be at least 1")
    found = [(s, p) for s, p in found if on_interval(p)] or found
    if len(found) < k:
        raise ValueError(
            f"asked for the last {k} checkpoints but {run_dir} has {len(found)} "
            f"({', '.join(p.name for _, p in found)}); use {flag} {len(found)}, or train keeping more "
            "(train --keep-last)"
        )
    return [p for _, p in found[-k:]]


def average_checkpoints(paths: list[str | os.PathLike]) -> tuple[dict[str, torch.Tensor], Config]:
    """The elementwise mean of the weights of the model directories `paths` (6.1), tensor by
    tensor from their model.safetensors in float64, rounded once to the tensors' dtype. Returns
    (tensors under the file's own names, the config of the last checkpoint): `averaged_reader`'s
    every tensor."""
    names, read, config = averaged_reader([Path(p) for p in paths])
    return {name: read(name) for name in sorted(names)}, config


def averaged_reader(paths: list[Path]) -> tuple[set[str], object, Config]:
    """`average_checkpoints` a tensor at a time: (the tensor names, read(name) -> that tensor's
    mean over `paths`, the same bits, the config of the last checkpoint), so that a model is built
    from an average without every averaged tensor in memory at once (`model_dir.build_model`)."""
    if not paths:
        raise ValueError("no checkpoints to average")
    config, names = None, None
    for path in paths:
        c = load_config(path)
        if config is not None and c.model != config.model:
            raise ValueError(f"{path}: a different model architecture than {paths[0]}")
        config = c
        verify(path, (WEIGHTS, CONFIG))
        with safe_open(str(Path(path) / WEIGHTS), "pt") as f:
            found = set(f.keys())
        if names is not None and found != names:
            raise ValueError(f"{path}: other tensors than {paths[0]}")
        names = found

    def read(name: str) -> torch.Tensor:
        first = read_tensor(Path(paths[0]) / WEIGHTS, name)
        total = first.double()
        for path in paths[1:]:
            t = read_tensor(Path(path) / WEIGHTS, name)
            if t.shape != total.shape:
                raise ValueError(f"{path}: {name} has shape {tuple(t.shape)}, not {tuple(total.shape)}")
            total += t.double()
        return (total / len(paths)).to(first.dtype)

    return names, read, config


def default_average(run_dir: Path) -> int | None:
    """Checkpoints to average by default: train.average_last (6.1), or all if fewer; None if none."""
    found = list_checkpoints(run_dir)
    if not found:
        return None
    regular = [p for _, p in found if on_interval(p)] or [p for _, p in found]
    k = guarded(load_config, found[-1][1]).train.average_last
    return max(1, min(k, len(regular)))


def resolve_checkpoint(run_dir: Path, name: str) -> Path:
    """A checkpoint given as a path, a name under RUN_DIR or its checkpoints/, a step number or `latest`."""
    as_path = Path(name)
    if is_model_dir(as_path):
        return as_path
    if name == "latest":
        found = latest_checkpoint(run_dir)
        if found is None:
            raise FileNotFoundError(f"{run_dir / CHECKPOINTS}: no checkpoints")
        return found
    candidates = [run_dir / name, run_dir / CHECKPOINTS / name]
    if name.isdigit():
        candidates.append(run_dir / CHECKPOINTS / checkpoint_name(int(name)))
    for c in candidates:
        if is_model_dir(c):
            return c
    raise FileNotFoundError(
        f"{name}: no such checkpoint (a model directory, a name under {run_dir / CHECKPOINTS}, "
        "a step number, 'latest' or 'model')"
    )


NOT_A_MODEL = (
    "neither a model directory (model.safetensors + config.json) nor a run directory with a model/ or checkpoints/"
)


def check_model_path(path: Path) -> None:
    """Raise FileNotFoundError unless `path` can be a MODEL argument given alone, reading nothing."""
    if not path.is_dir():
        raise FileNotFoundError(f"{path}: no such directory (a training run directory or a model directory)")
    if not (is_model_dir(path) or is_model_dir(path / "model") or list_checkpoints(path)):
        raise FileNotFoundError(f"{path}: {NOT_A_MODEL}")


@dataclass
class Resolved:
    """What a MODEL argument stands for, loaded."""

    model: Transformer  # in eval mode, on the device asked for
    config: Config
    description: str  # a model directory's path, or 'average of the last 5 checkpoints (...)'
    search_dirs: list[Path]  # where data.json and the vocabulary are looked for


def load_for_inference(
    path: str | os.PathLike,
    *,
    checkpoint: str | None = None,
    average: int | None = None,
    device: str | torch.device = "cpu",
    dtype: torch.dtype | None = None,
    as_filled=None,
) -> Resolved:
    """The model a MODEL argument names: a model directory; or, for a run directory, the average
    of its last `average` checkpoints (by default `default_average`, as for Table 2), one
    `checkpoint` (`resolve_checkpoint`), or its model/ when it has no checkpoints. `dtype`: its
    floating-point tensors in that type, cast as they are read; `as_filled`: called on each part
    read (`model_dir.build_model`)."""
    path = Path(path)
    if not path.is_dir():
        raise FileNotFoundError(f"{path}: no such directory (a training run directory or a model directory)")
    if checkpoint is not None and average is not None:
        raise ValueError("give --checkpoint or --average, not both")
    if average is None and checkpoint is None and not is_model_dir(path):
        average = default_average(path)
    if average is not None:
        if average < 1:
            raise ValueError("--average must be at least 1")
        paths = last_checkpoints(path, average, flag="--average")
        names, read, config = guarded(averaged_reader, paths)
        model = guarded(
            build_model, config, names, read, device=device, dtype=dtype, where=paths[-1], as_filled=as_filled
        ).eval()
        what = f"average of the last {len(paths)} checkpoints ({paths[0].name} .. {paths[-1].name}) of {path}"
        return Resolved(model, config, what, [path])
    if checkpoint is not None:
        model_dir = resolve_checkpoint(path, checkpoint)
    elif is_model_dir(path):
        model_dir = path
    elif is_model_dir(path / "model"):
        model_dir = path / "model"
    else:
        raise FileNotFoundError(f"{path}: {NOT_A_MODEL}")
    model, config = guarded(load_model, model_dir, device=device, dtype=dtype, as_filled=as_filled)
    # A run directory holds data.json; a checkpoint's is two levels up (RUN_DIR/checkpoints/step_*).
    return Resolved(
        model, config, str(model_dir), list(dict.fromkeys([path, model_dir, model_dir.parent, model_dir.parent.parent]))
    )
