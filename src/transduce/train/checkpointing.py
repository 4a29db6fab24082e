"""Training checkpoints: everything needed to continue a run exactly, written atomically, no pickle.

Section 6.1: "For the base models, we used a single model obtained by averaging the last 5
checkpoints, which were written at 10-minute intervals." The trainer writes one every N steps
and/or M minutes into the run directory and keeps the last K:

    RUN_DIR/checkpoints/
        step_0001000/
            model.safetensors     the weights   } a model directory: transduce.checkpoint.load_model
            config.json           the Config    } works on it directly
            optimizer.safetensors Adam's state, one tensor per (state name, parameter name),
                                  e.g. "exp_avg/encoder.layers.0.norm1.weight"
            rng.safetensors       torch RNG states of every rank (uint8 tensors), e.g. "cpu/rank0"
            trainer_state.json    step, epoch, position in the epoch, schedule, GradScaler, ...
        step_0002000/ ...
        latest                    one line: the name of the newest complete checkpoint

Atomicity: a checkpoint is written into a hidden temporary directory (`.tmp-step_...`), each
file fsync'ed, and the directory renamed into place with one `os.replace`; only then is
`latest` rewritten (temporary file + `os.replace`). A crash at any moment leaves `latest`
pointing at a complete checkpoint; half-written temporary directories are ignored (and removed
by the next successful save).

Nothing is ever unpickled: tensors are read with safetensors, everything else is JSON.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path
import torch
from safetensors.torch import load_file, save_file
from safetensors.torch import load_model as _st_load_model

from ..checkpoint import CONFIG, WEIGHTS, atomic_write_text, save_model
from ..config import Config

CHECKPOINTS = "checkpoints"
LATEST = "latest"
OPTIMIZER = "optimizer.safetensors"
RNG = "rng.safetensors"
STATE = "trainer_state.json"
FORMAT = 1

_NAME = re.compile(r"^step_(\d+)$")


@dataclass
class TrainingState:
    """The scalars of a checkpoint (trainer_state.json)."""

    step: int
    """Optimizer steps taken."""
    epoch: int = 0
    """Epoch of the next micro-batch."""
    position: int = 0
    """Index of the next micro-batch in this epoch's list of (per-rank) batches."""
    world_size: int = 1
    max_tokens: int = 0
    """Padded tokens per micro-batch per rank (the batching parameter)."""
    update_freq: int = 1
    seed: int = 0
    lr: float = 0.0
    """The learning rate of the last step taken."""
    train_seconds: float = 0.0
    """Training wall-clock time so far, over all sessions of the run."""
    target_tokens: int = 0
    """Non-pad target tokens trained on so far (all ranks), as of the last log line."""
    scaler: dict | None = None
    """torch.amp.GradScaler state (fp16), None otherwise."""
    schedule: dict = field(default_factory=dict)
    """The learning-rate schedule (equation 3): d_model, warmup_steps, scale."""
    optimizer: dict = field(default_factory=dict)
    """Adam's hyperparameters (for the record; the trainer rebuilds them from the config)."""
    on_interval: bool = True
    """Written at the checkpoint interval (6.1: "written at 10-minute intervals"); False for a
    checkpoint forced off the interval (the end of a run or a stop by --max-minutes), which
    "the last K" of averaging leaves out so that the averaged checkpoints stay evenly spaced."""

    def to_json(self) -> str:
        return json.dumps({"format": FORMAT, **self.__dict__}, indent=2)

    @classmethod
    def from_json(cls, text: str) -> "TrainingState":
        d = json.loads(text)
        if d.pop("format", None) != FORMAT:
            raise ValueError("unknown trainer_state.json format")
        return cls(**d)


def checkpoint_name(step: int) -> str:
    return f"step_{step:07d}"


def list_checkpoints(run_dir: str | os.PathLike) -> list[tuple[int, Path]]:
    """The complete checkpoints of a run as (step, directory), oldest first. A directory
    counts as complete when it has its name's form and its trainer_state.json (the last file
    written before the rename); temporary directories are skipped."""
    root = Path(run_dir) / CHECKPOINTS
    if not root.is_dir():
        return []
    found = []
    for p in root.iterdir():
        m = _NAME.match(p.name)
        if m and p.is_dir() and (p / STATE).is_file():
            found.append((int(m.group(1)), p))
    return sorted(found)


def on_interval(path: str | os.PathLike) -> bool:
    """Whether a checkpoint was written at the run's interval (older checkpoints: True)."""
    try:
        return bool(json.loads((Path(path) / STATE).read_text(encoding="utf-8")).get("on_interval", True))
    except (OSError, ValueError):
        return True


def latest_checkpoint(run_dir: str | os.PathLike) -> Path | None:
    """The checkpoint `latest` points to; if that pointer is missing or broken (a crash between
    the rename and the pointer write, or a deleted directory), the newest complete one."""
    root = Path(run_dir) / CHECKPOINTS
    pointer = root / LATEST
    if pointer.is_file():
        name = pointer.read_text(encoding="utf-8").strip()
        if _NAME.match(name) and (root / name / STATE).is_file():
            return root / name
    found = list_checkpoints(run_dir)
    return found[-1][1] if found else None


# --- optimizer state as named tensors -----------------------------------------------------------


def _param_names(model: torch.nn.Module) -> dict[int, str]:
    """id(parameter) -> its first name (a shared parameter, e.g. the tied embedding, once)."""
    names: dict[int, str] = {}
    for name, p in model.named_parameters():
        names.setdefault(id(p), name)
    return names


def optimizer_tensors(optimizer: torch.optim.Optimizer, model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Flatten the optimizer's per-parameter state into {"<state>/<parameter name>": tensor}
    (e.g. "exp_avg_sq/decoder.layers.0.feed_forward.w_2.weight"), on the CPU."""
    names = _param_names(model)
    out = {}
    for group in optimizer.param_groups:
        for p in group["params"]:
            for key, value in optimizer.state.get(p, {}).items():
                if not torch.is_tensor(value):
                    value = torch.tensor(value)
                out[f"{key}/{names[id(p)]}"] = value.detach().to("cpu", copy=True).contiguous()
    return out


def load_optimizer_tensors(optimizer: torch.optim.Optimizer, model: torch.nn.Module, tensors: dict[str, torch.Tensor]) -> None:
    """Inverse of `optimizer_tensors`: restore the per-parameter state, keeping the optimizer's
    current hyperparameters (they come from the config)."""
    names = _param_names(model)
    by_name: dict[str, dict[str, torch.Tensor]] = {}
    for key, value in tensors.items():
        state_key, _, pname = key.partition("/")
        by_name.setdefault(pname, {})[state_key] = value
    sd = optimizer.state_dict()
    state = {}
    index = 0
    for group in optimizer.param_groups:
        for p in group["params"]:
            saved = by_name.pop(names[id(p)], None)
            if saved is not None:
                state[index] = saved
            index += 1
    if by_name:
        raise ValueError(f"optimizer state for unknown parameters: {sorted(by_name)[:3]} ...")
    sd["state"] = state
    optimizer.load_state_dict(sd)  # moves each tensor to its parameter's device (step stays fp32)


# --- save / load --------------------------------------------------------------------------------


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:  # e.g. Windows: directories cannot be opened
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def readable(path: Path) -> None:
    """Give a file the permissions the umask allows (safetensors creates files 0600)."""
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(path, 0o666 & ~umask)


def _save_tensors(tensors: dict[str, torch.Tensor], path: Path) -> None:
    save_file(tensors, str(path), metadata={"format": "pt", "transduce": str(FORMAT)})
    with open(path, "rb") as f:
        os.fsync(f.fileno())


def save_checkpoint(
    run_dir: str | os.PathLike,
    model: torch.nn.Module,
    config: Config,
    optimizer: torch.optim.Optimizer,
    state: TrainingState,
    rng: dict[str, torch.Tensor],
    keep_last: int = 0,
) -> Path:
    """Write checkpoint `step_{state.step}` atomically, point `latest` at it, then delete all
    but the newest `keep_last` checkpoints (0 keeps all). Returns its directory.

    `model` is the plain module (not the DDP/compiled wrapper); `rng` maps names such as
    "cpu/rank0" to RNG state tensors (see `trainer.gather_rng_states`).
    """
    root = Path(run_dir) / CHECKPOINTS
    root.mkdir(parents=True, exist_ok=True)
    name = checkpoint_name(state.step)
    final = root / name
    tmp = root / f".tmp-{name}-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        save_model(model, config, tmp)  # model.safetensors + config.json: a model directory
        _save_tensors(optimizer_tensors(optimizer, model), tmp / OPTIMIZER)
        _save_tensors({k: v.to("cpu").contiguous() for k, v in rng.items()}, tmp / RNG)
        for f in tmp.glob("*.safetensors"):
            readable(f)
        atomic_write_text(tmp / STATE, state.to_json() + "\n")  # last: marks the directory complete
        _fsync_dir(tmp)
        if final.exists():  # the same step saved again (e.g. a resumed run that ends at once)
            old = root / f".old-{name}-{os.getpid()}"
            os.replace(final, old)
            os.replace(tmp, final)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, final)
        _fsync_dir(root)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    atomic_write_text(root / LATEST, name + "\n")
    _fsync_dir(root)
    for p in root.glob(".tmp-*"):  # left by earlier crashes
        shutil.rmtree(p, ignore_errors=True)
    if keep_last > 0:
        for _, old in list_checkpoints(run_dir)[:-keep_last]:
            if old != final:
                shutil.rmtree(old, ignore_errors=True)
    return final


@dataclass
class LoadedCheckpoint:
    path: Path
    state: TrainingState
    rng: dict[str, torch.Tensor]


def load_checkpoint(
    path: str | os.PathLike,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer | None = None,
    device: str | torch.device = "cpu",
) -> LoadedCheckpoint:
    """Load a checkpoint directory's weights into `model` (strictly), its state into
    `optimizer` (if given); return its TrainingState and RNG tensors."""
    path = Path(path)
    for f in (WEIGHTS, CONFIG, STATE):
        if not (path / f).is_file():
            raise FileNotFoundError(f"{path / f}: no such file (not a complete checkpoint)")
    state = TrainingState.from_json((path / STATE).read_text(encoding="utf-8"))
    _st_load_model(model, str(path / WEIGHTS), strict=True, device=str(device))
    if optimizer is not None:
        # Read on the CPU: load_state_dict moves each tensor where its parameter's policy wants
        # it (Adam keeps a non-fused `step` on the CPU).
        load_optimizer_tensors(optimizer, model, load_file(str(path / OPTIMIZER)))
    rng = load_file(str(path / RNG)) if (path / RNG).is_file() else {}
    return LoadedCheckpoint(path, state, rng)


def read_checkpoint_config(path: str | os.PathLike) -> Config:
    return Config.from_dict(json.loads((Path(path) / CONFIG).read_text(encoding="utf-8")))

