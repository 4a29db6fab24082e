"""A training run's directory (drawn in `transduce.checkpoint`): its files, training
checkpoints written whole or not at all, and the one-writer lock (`RunLock`)."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file
from safetensors.torch import load_model as _st_load_model

from ..config import Config
from ..errors import TrainingStopped, UsageError
from .files import (
    CHECKPOINTS,
    CHECKSUMS,
    CONFIG,
    DAMAGED,
    FORMAT,
    LATEST,
    LOCK,
    OPTIMIZER,
    RNG,
    STATE,
    WEIGHTS,
    DamagedCheckpoint,
    as_os_error,
    atomic_write_text,
    digests,
    fsync_dir,
    replace_dir,
    save_tensors,
    verify,
)
from .model_dir import save_model

_NAME = re.compile(r"^step_(\d+)$")


def prepare_run_dir(run_dir: Path, data_dir: Path, meta: dict, config: Config) -> None:
    """Create the run directory: config.json, data.json (+ "data_dir") and the vocabulary files."""
    (run_dir / "logs").mkdir(parents=True, exist_ok=True)
    atomic_write_text(run_dir / "config.json", config.to_json() + "\n")
    atomic_write_text(
        run_dir / "data.json", json.dumps({**meta, "data_dir": str(data_dir.absolute())}, indent=2) + "\n"
    )
    for name in sorted(set(meta["vocab"]["files"].values())):
        for f in (data_dir / name, (data_dir / name).with_suffix(".vocab")):
            copy = run_dir / f.name
            if f.is_file() and not (copy.is_file() and copy.read_bytes() == f.read_bytes()):
                shutil.copy2(f, copy)


def check_vocabulary(run_dir: Path, config: Config, data_dir: Path, meta: dict) -> None:
    """Refuse to resume a run on prepared data of another vocabulary (the same at another path passes)."""
    vocab = meta["vocab"]
    size = (int(vocab["size"]["src"]), int(vocab["size"]["tgt"]))
    shared = bool(vocab.get("shared", vocab["files"]["src"] == vocab["files"]["tgt"]))
    try:
        recorded = json.loads((run_dir / "data.json").read_text(encoding="utf-8"))
        run_vocab = recorded["vocab"]
    except (OSError, ValueError, KeyError, TypeError):
        recorded, run_vocab = {}, {}
    m = config.model
    differences = []
    if (m.src_vocab_size, m.target_vocab_size) != size:
        differences.append(f"sizes {size[0]}/{size[1]}, the run's {m.src_vocab_size}/{m.target_vocab_size}")
    run_shared = bool(run_vocab.get("shared", m.tgt_vocab_size is None))
    if shared != run_shared:
        differences.append(
            f"{'one shared' if shared else 'separate'} vocabular{'y' if shared else 'ies'}, "
            f"the run's {'one shared' if run_shared else 'separate'}"
        )
    run_files = run_vocab.get("files", vocab["files"])
    for role in ("src", "tgt"):
        ours, theirs = run_dir / run_files[role], data_dir / vocab["files"][role]
        if ours.is_file() and theirs.is_file() and ours.read_bytes() != theirs.read_bytes():
            differences.append(f"{theirs} is not the run's {ours}")
    if differences:
        used = recorded.get("data_dir", "the data it was trained on")
        raise UsageError(
            f"{data_dir} has another vocabulary than the run being resumed ({run_dir}): "
            f"{'; '.join(dict.fromkeys(differences))}; resume on the run's data ({used}), "
            "or start over with --restart or in another --run-dir"
        )


@dataclass
class TrainingState:
    """The scalars of a checkpoint (trainer_state.json)."""

    step: int  # optimizer steps taken
    epoch: int = 0  # of the next micro-batch
    position: int = 0  # index of the next micro-batch in this epoch's list of (per-rank) batches
    world_size: int = 1
    max_tokens: int = 0  # padded tokens per micro-batch per rank
    update_freq: int = 1
    seed: int = 0
    lr: float = 0.0  # of the last step taken
    train_seconds: float = 0.0  # wall-clock, over all sessions of the run
    target_tokens: int = 0  # non-pad target tokens trained on (all ranks), as of the last log line
    scaler: dict | None = None  # torch.amp.GradScaler state (fp16)
    schedule: dict = field(default_factory=dict)  # equation 3: d_model, warmup_steps, scale
    optimizer: dict = field(default_factory=dict)  # Adam's hyperparameters, for the record
    on_interval: bool = True
    """False for a checkpoint forced off the interval (6.1: "written at 10-minute intervals"),
    which averaging's "last K" leaves out so that the averaged checkpoints stay evenly spaced."""
    files: dict = field(default_factory=dict)  # {file name: {"sha256", "bytes"}} of the others
    precision: str = ""  # fp32, bf16, fp16, kept by `--precision auto` on resume; "" if older

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


def checkpoint_step(path: str | os.PathLike) -> int:
    """The step in a checkpoint's name (`step_0001000` or `step_0001000.damaged`: 1000)."""
    return int(Path(path).name.split(".")[0].split("_")[1])


def list_checkpoints(run_dir: str | os.PathLike) -> list[tuple[int, Path]]:
    """The complete checkpoints of a run (with trainer_state.json) as (step, directory), oldest first."""
    root = Path(run_dir) / CHECKPOINTS
    if not root.is_dir():
        return []
    named = ((_NAME.match(p.name), p) for p in root.iterdir())
    return sorted((int(m.group(1)), p) for m, p in named if m and p.is_dir() and (p / STATE).is_file())


def on_interval(path: str | os.PathLike) -> bool:
    """Whether a checkpoint was written at the run's interval (older checkpoints: True)."""
    try:
        return bool(json.loads((Path(path) / STATE).read_text(encoding="utf-8")).get("on_interval", True))
    except (OSError, ValueError):
        return True


def recorded_precision(run_dir: str | os.PathLike) -> tuple[str, Path] | None:
    """(precision, checkpoint) of the run's newest intact checkpoint that records one (`latest`
    first, then newest first; damaged ones passed over as `restore` will); None if none does."""
    latest = latest_checkpoint(run_dir)
    for path in ([latest] if latest else []) + [p for _, p in reversed(list_checkpoints(run_dir)) if p != latest]:
        try:
            precision = json.loads((path / STATE).read_text(encoding="utf-8")).get("precision")
            verify(path)
        except (OSError, ValueError, AttributeError):  # unreadable or damaged, as `restore` will say
            continue
        if precision:
            return str(precision), path
    return None


def latest_checkpoint(run_dir: str | os.PathLike) -> Path | None:
    """The checkpoint `latest` points to, else (a missing or broken pointer) the newest one."""
    root = Path(run_dir) / CHECKPOINTS
    pointer = root / LATEST
    if pointer.is_file():
        name = pointer.read_text(encoding="utf-8").strip()
        if _NAME.match(name) and (root / name / STATE).is_file():
            return root / name
    found = list_checkpoints(run_dir)
    return found[-1][1] if found else None


def _param_names(model: torch.nn.Module) -> dict[int, str]:
    """id(parameter) -> its first name (a shared parameter, e.g. the tied embedding, once)."""
    names: dict[int, str] = {}
    for name, p in model.named_parameters():
        names.setdefault(id(p), name)
    return names


def optimizer_tensors(optimizer: torch.optim.Optimizer, model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The optimizer's per-parameter state as {"<state>/<parameter name>": CPU tensor}."""
    names = _param_names(model)
    out = {}
    for group in optimizer.param_groups:
        for p in group["params"]:
            for key, value in optimizer.state.get(p, {}).items():
                out[f"{key}/{names[id(p)]}"] = torch.as_tensor(value).detach().to("cpu", copy=True).contiguous()
    return out


def load_optimizer_tensors(
    optimizer: torch.optim.Optimizer, model: torch.nn.Module, tensors: dict[str, torch.Tensor]
) -> None:
    """Inverse of `optimizer_tensors`, keeping the optimizer's hyperparameters (from the config)."""
    names = _param_names(model)
    by_name: dict[str, dict[str, torch.Tensor]] = {}
    for key, value in tensors.items():
        state_key, _, pname = key.partition("/")
        by_name.setdefault(pname, {})[state_key] = value
    params = [names[id(p)] for group in optimizer.param_groups for p in group["params"]]
    state = {i: by_name.pop(name) for i, name in enumerate(params) if name in by_name}
    if by_name:
        raise ValueError(f"optimizer state for unknown parameters: {sorted(by_name)[:3]} ...")
    # load_state_dict moves each tensor to its parameter's device (step stays fp32)
    optimizer.load_state_dict({**optimizer.state_dict(), "state": state})


def save_checkpoint(
    run_dir: str | os.PathLike,
    model: torch.nn.Module,
    config: Config,
    optimizer: torch.optim.Optimizer,
    state: TrainingState,
    rng: dict[str, torch.Tensor],
    keep_last: int = 0,
) -> Path:
    """Write checkpoint `step_{state.step}` atomically, point `latest` at it, then `prune` to
    `keep_last` (0 keeps all). Returns its directory. `model` is the plain module; `rng` maps
    names such as "cpu/rank0" to RNG state tensors (`train.distributed.gather_rng_states`)."""
    root = Path(run_dir) / CHECKPOINTS
    root.mkdir(parents=True, exist_ok=True)
    name = checkpoint_name(state.step)
    final = root / name
    tmp = root / f".tmp-{name}-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        save_model(model, config, tmp)  # model.safetensors + config.json: a model directory
        save_tensors(optimizer_tensors(optimizer, model), tmp / OPTIMIZER)
        save_tensors({k: v.to("cpu").contiguous() for k, v in rng.items()}, tmp / RNG)
        files = {
            **json.loads((tmp / CHECKSUMS).read_text(encoding="utf-8")),
            **digests(tmp, (CHECKSUMS, OPTIMIZER, RNG)),
        }
        state = dataclasses.replace(state, files=files)
        atomic_write_text(tmp / STATE, state.to_json() + "\n")  # last: marks the directory complete
        fsync_dir(tmp)
        replace_dir(tmp, final)  # final exists when the same step is saved again
        fsync_dir(root)
    except BaseException as e:
        shutil.rmtree(tmp, ignore_errors=True)
        if isinstance(e, SafetensorError):  # safetensors' own error for a failed write (a full disk)
            raise as_os_error(e, tmp) from None
        raise
    atomic_write_text(root / LATEST, name + "\n")
    fsync_dir(root)
    for p in root.glob(".tmp-*"):  # left by earlier crashes
        shutil.rmtree(p, ignore_errors=True)
    if keep_last > 0:
        prune(run_dir, keep_last, final)
    return final


def prune(run_dir: str | os.PathLike, keep_last: int, newest: Path) -> None:
    """Delete all checkpoints but the newest `keep_last` written at the run's interval and
    `newest`: one forced off the interval, which averaging leaves out (6.1), takes no one's place."""
    found = [p for _, p in list_checkpoints(run_dir)]
    keep = set([p for p in found if on_interval(p)][-keep_last:]) | {newest}
    for old in found:
        if old not in keep:
            shutil.rmtree(old, ignore_errors=True)


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
    """Load a checkpoint's weights into `model` (strictly) and `optimizer`; return the rest."""
    path = Path(path)
    for f in (WEIGHTS, CONFIG, STATE):
        if not (path / f).is_file():
            raise FileNotFoundError(f"{path / f}: no such file (not a complete checkpoint)")
    try:
        state = TrainingState.from_json((path / STATE).read_text(encoding="utf-8"))
    except (ValueError, TypeError):
        raise DamagedCheckpoint(f"{path / STATE}: damaged (not a readable training state)") from None
    verify(path)
    try:
        _st_load_model(model, str(path / WEIGHTS), strict=True, device=str(device))
        if optimizer is not None:  # read on the CPU: load_state_dict moves each tensor where it belongs
            load_optimizer_tensors(optimizer, model, load_file(str(path / OPTIMIZER)))
        rng = load_file(str(path / RNG)) if (path / RNG).is_file() else {}
    except (OSError, ValueError):
        raise
    except Exception as e:  # a checkpoint from before checksums, damaged: safetensors' own error
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise DamagedCheckpoint(f"{path}: damaged ({first})") from None
    return LoadedCheckpoint(path, state, rng)


def set_aside(path: Path) -> Path:
    """Rename a damaged checkpoint to `step_N.damaged` (kept for inspection, no longer listed)."""
    target = path.with_name(path.name + DAMAGED)
    n = 1
    while target.exists():
        n += 1
        target = path.with_name(f"{path.name}{DAMAGED}.{n}")
    os.replace(path, target)
    return target


class RunLock:
    """An exclusive `flock` on RUN_DIR/.lock for as long as a trainer runs: the kernel releases
    it however the process ends, so a stale lock never blocks. The file says who holds it.
    Where `fcntl` does not exist (Windows) there is no lock."""

    def __init__(self, run_dir: str | os.PathLike):
        self.path = Path(run_dir) / LOCK
        self._fd: int | None = None

    def acquire(self) -> "RunLock":
        try:
            import fcntl
        except ImportError:
            return self
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            raise RunLocked(
                f"{self.path.parent} is being written by another trainer ({self.holder()}); "
                "wait for it to end, stop it, or use another --run-dir"
            ) from None
        os.ftruncate(fd, 0)
        os.write(
            fd,
            json.dumps(
                {"pid": os.getpid(), "host": socket.gethostname(), "since": time.strftime("%Y-%m-%d %H:%M:%S")}
            ).encode()
            + b"\n",
        )
        self._fd = fd
        return self

    @property
    def held(self) -> bool:
        """Whether this process holds the lock now."""
        return self._fd is not None

    def holder(self) -> str:
        try:
            who = json.loads(self.path.read_text(encoding="utf-8"))
            return f"process {who['pid']} on {who['host']}, since {who['since']}"
        except (OSError, ValueError, KeyError):
            return "a process that has not yet said who it is"

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing the descriptor releases the flock
            self._fd = None

    def __enter__(self) -> "RunLock":
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()


class RunLocked(TrainingStopped):
    """A second trainer on a run directory that one is already writing."""
