"""Everything a run leaves on disk, in one place: model directories, training checkpoints,
finding them, averaging them (Section 6.1), and resolving the MODEL argument of the inference
commands. Training and inference both read and write through this module; nothing is ever
unpickled (tensors are safetensors, everything else JSON).

A model directory (what `translate`, `evaluate` and `average` read and write)::

    model.safetensors   the weights (a shared tensor such as the tied embedding stored once)
    config.json         the `Config` (model architecture and training regime)
    checksums.json      SHA-256 and size of the two files above (written last)

A run directory (`transduce train --run-dir`)::

    RUN_DIR/config.json          the Config the run uses
    RUN_DIR/data.json            the data's metadata (+ "data_dir": where it was read from)
    RUN_DIR/spm*.model, *.vocab  the vocabulary files, copied: later commands need only RUN_DIR
    RUN_DIR/checkpoints/
        step_0001000/            a model directory, plus:
            optimizer.safetensors  Adam's state, one tensor per (state name, parameter name),
                                   e.g. "exp_avg/encoder.layers.0.norm1.weight"
            rng.safetensors        torch RNG states of every rank (uint8 tensors), e.g. "cpu/rank0"
            trainer_state.json     step, epoch, position in the epoch, schedule, GradScaler, ...,
                                   and the SHA-256 and size of every other file (written last)
        latest                   one line: the name of the newest complete checkpoint
        step_0000900.damaged/    a checkpoint found damaged on --resume, set aside (never deleted)
    RUN_DIR/.lock                held (flock) by the one trainer writing the run; says who it is
    RUN_DIR/logs/train.jsonl     one JSON object per line: start, train, valid, checkpoint, end
    RUN_DIR/logs/                TensorBoard event files (if tensorboard is installed)
    RUN_DIR/model/               the final model (a model directory)
    RUN_DIR/avg_lastK/           `transduce average`'s output (a model directory)

Atomicity: every file is written to a temporary name, fsync'ed and moved into place with
`os.replace`. A checkpoint is written into a hidden temporary directory (`.tmp-step_...`) and
renamed into place whole; only then is `latest` rewritten. A crash at any moment leaves `latest`
pointing at a complete checkpoint; half-written temporary directories are ignored (and removed by
the next successful save).

Integrity: loading verifies every file against the checksums written beside it (`verify`); a
damaged file (truncated by a full disk, a flipped bit) is a one-line `DamagedCheckpoint` error
naming the file. `transduce train --resume` then falls back to the newest intact checkpoint
(`newest_intact`). One writer: a trainer holds `RUN_DIR/.lock` (`RunLock`) for as long as it runs.

Section 6.1: "For the base models, we used a single model obtained by averaging the last 5
checkpoints, which were written at 10-minute intervals. For the big models, we averaged the last
20 checkpoints." `last_checkpoints` takes the last K written at the interval (a checkpoint forced
off it, at the end of a run, is left out), `average_checkpoints` their elementwise mean, and a
run directory given to an inference command means that average (`load_for_inference`).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import socket
import time
import dataclasses
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from safetensors.torch import load_model as _st_load_model
from safetensors.torch import save_model as _st_save_model

from .config import Config
from .errors import TrainingStopped
from .model import Transformer

WEIGHTS = "model.safetensors"
CONFIG = "config.json"
CHECKPOINTS = "checkpoints"
LATEST = "latest"
OPTIMIZER = "optimizer.safetensors"
RNG = "rng.safetensors"
STATE = "trainer_state.json"
CHECKSUMS = "checksums.json"
LOCK = ".lock"
DAMAGED = ".damaged"
FORMAT = 1

_NAME = re.compile(r"^step_(\d+)$")


# --- files --------------------------------------------------------------------------------------


def atomic_write_text(path: Path, text: str) -> None:
    """Write `text` to `path` through a temporary file, fsync and `os.replace`."""
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


@contextlib.contextmanager
def atomic_dir(out: str | os.PathLike):
    """A directory written whole or not at all (the exports, a model directory made from another
    format): yields a hidden temporary directory beside `out`, which replaces `out` (an existing
    one included) when the block ends without an error; on an error it is removed and `out` is
    left as it was."""
    out = Path(out)
    tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        yield tmp
        fsync_dir(tmp)
        if out.exists():
            old = out.with_name(f".{out.name}.old-{os.getpid()}")
            os.replace(out, old)
            os.replace(tmp, out)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, out)
        fsync_dir(out.parent)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def fsync_dir(path: Path) -> None:
    """Make a rename inside `path` durable (where directories can be opened)."""
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
    readable(path)


def file_digest(path: Path) -> dict:
    """{"sha256": hex digest, "bytes": size} of a file."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            h.update(chunk)
    return {"sha256": h.hexdigest(), "bytes": path.stat().st_size}


def digests(directory: Path, names) -> dict[str, dict]:
    return {name: file_digest(directory / name) for name in names if (directory / name).is_file()}


def as_os_error(e: Exception, path: Path) -> OSError:
    """safetensors reports a failed write as "... I/O error: No space left on device (os error
    28)": the OSError it stands for."""
    m = re.search(r"os error (\d+)", str(e))
    if m:
        code = int(m.group(1))
        return OSError(code, os.strerror(code), str(path))
    return OSError(0, str(e), str(path))


class DamagedCheckpoint(ValueError):
    """A model directory or checkpoint whose files are missing, truncated or altered: one line
    naming the file."""


def expected_digests(directory: Path) -> dict[str, dict] | None:
    """The checksums recorded in a directory: a checkpoint's trainer_state.json, else a model
    directory's checksums.json; None for a directory written before checksums (nothing to check)."""
    for name, key in ((STATE, "files"), (CHECKSUMS, None)):
        path = directory / name
        if path.is_file():
            try:
                recorded = json.loads(path.read_text(encoding="utf-8"))
            except (OSError, ValueError):
                raise DamagedCheckpoint(f"{path}: damaged (not readable JSON)") from None
            recorded = recorded.get(key) if key else recorded
            if recorded:
                return recorded
    return None


def verify(directory: str | os.PathLike, names=None) -> None:
    """Check the files of a model directory or checkpoint (all, or `names`) against their
    recorded SHA-256 and size; raise DamagedCheckpoint naming the first that differs."""
    directory = Path(directory)
    expected = expected_digests(directory)
    if expected is None:
        return
    for name, want in expected.items():
        if names is not None and name not in names:
            continue
        path = directory / name
        if not path.is_file():
            raise DamagedCheckpoint(f"{path}: missing (the checkpoint is incomplete)")
        size = path.stat().st_size
        if size != want["bytes"]:
            raise DamagedCheckpoint(f"{path}: damaged ({size:,} bytes, {want['bytes']:,} written: truncated?)")
        if file_digest(path)["sha256"] != want["sha256"]:
            raise DamagedCheckpoint(f"{path}: damaged (its SHA-256 differs from the one written with it)")


# --- model directories ----------------------------------------------------------------------------


def is_model_dir(path: Path) -> bool:
    return (path / WEIGHTS).is_file() and (path / CONFIG).is_file()


def save_model(model: torch.nn.Module, config: Config, directory: str | os.PathLike) -> Path:
    """Save weights (safetensors) and config (JSON) into `directory`; returns it."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    model = getattr(model, "module", model)  # unwrap DDP
    model = getattr(model, "_orig_mod", model)  # unwrap torch.compile
    tmp = directory / (WEIGHTS + ".tmp")
    _st_save_model(model, str(tmp), metadata={"format": "pt", "transduce": "1"})
    _finish_model_dir(directory, tmp, config)
    return directory


def _finish_model_dir(directory: Path, weights_tmp: Path, config: Config) -> None:
    """Move the written weights into place, write config.json, then checksums.json (last)."""
    with open(weights_tmp, "rb") as f:
        os.fsync(f.fileno())
    readable(weights_tmp)
    (directory / CHECKSUMS).unlink(missing_ok=True)  # never a stale one beside new files
    os.replace(weights_tmp, directory / WEIGHTS)
    atomic_write_text(directory / CONFIG, config.to_json() + "\n")
    atomic_write_text(directory / CHECKSUMS, json.dumps(digests(directory, (WEIGHTS, CONFIG)), indent=2) + "\n")


def save_tensors_as_model(tensors: dict[str, torch.Tensor], config: Config, directory: str | os.PathLike) -> Path:
    """Write `tensors` (named as in model.safetensors, e.g. an average) as a model directory."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    tmp = directory / (WEIGHTS + ".tmp")
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(tmp), metadata={"format": "pt", "transduce": "1"})
    _finish_model_dir(directory, tmp, config)
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
    verify(directory, (WEIGHTS, CONFIG))
    _st_load_model(model, str(weights), strict=True, device=str(device))
    return model.to(device).eval(), config


def model_from_tensors(tensors: dict[str, torch.Tensor], config: Config, where) -> Transformer:
    """A Transformer holding `tensors` (named as in model.safetensors, where a tied embedding
    is stored once under one of its names); every parameter must be covered."""
    model = Transformer(config.model)
    missing, unexpected = model.load_state_dict(tensors, strict=False)
    state = model.state_dict()
    loaded = {state[k].data_ptr() for k in tensors if k in state}
    missing = [k for k in missing if state[k].data_ptr() not in loaded]  # not an alias of a loaded tensor
    if missing or unexpected:
        raise ValueError(f"{where}: the weights do not fit the model (missing {missing[:3]}, unexpected {unexpected[:3]})")
    return model


def guarded(load, *args, **kwargs):
    """Loading errors (a damaged or mismatched safetensors file, a bad config.json) as a
    one-line ValueError naming the first argument (the path)."""
    try:
        return load(*args, **kwargs)
    except (FileNotFoundError, ValueError):  # DamagedCheckpoint included
        raise
    except Exception as e:  # safetensors' SafetensorError, torch's RuntimeError on shape mismatch, ...
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ValueError(f"{args[0]}: cannot load the model ({first})") from None


# --- run directories ------------------------------------------------------------------------------


def prepare_run_dir(run_dir: Path, data_dir: Path, meta: dict, config: Config) -> None:
    """Create the run directory: config.json, data.json (with the data directory's absolute
    path) and copies of the vocabulary files."""
    (run_dir / "logs").mkdir(parents=True, exist_ok=True)
    atomic_write_text(run_dir / "config.json", config.to_json() + "\n")
    atomic_write_text(run_dir / "data.json", json.dumps({**meta, "data_dir": str(data_dir.absolute())}, indent=2) + "\n")
    for name in sorted(set(meta["vocab"]["files"].values())):
        for f in (data_dir / name, (data_dir / name).with_suffix(".vocab")):
            if f.is_file() and not (run_dir / f.name).is_file():
                shutil.copy2(f, run_dir / f.name)


# --- training checkpoints -------------------------------------------------------------------------


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
    files: dict = field(default_factory=dict)
    """{file name: {"sha256", "bytes"}} of every other file of the checkpoint (`verify`)."""

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
    "cpu/rank0" to RNG state tensors (see `transduce.train.distributed.gather_rng_states`).
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
        files = {**json.loads((tmp / CHECKSUMS).read_text(encoding="utf-8")), **digests(tmp, (CHECKSUMS, OPTIMIZER, RNG))}
        state = dataclasses.replace(state, files=files)
        atomic_write_text(tmp / STATE, state.to_json() + "\n")  # last: marks the directory complete
        fsync_dir(tmp)
        if final.exists():  # the same step saved again (e.g. a resumed run that ends at once)
            old = root / f".old-{name}-{os.getpid()}"
            os.replace(final, old)
            os.replace(tmp, final)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, final)
        fsync_dir(root)
    except SafetensorError as e:  # safetensors' own error for a failed write (a full disk)
        shutil.rmtree(tmp, ignore_errors=True)
        raise as_os_error(e, tmp) from None
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    atomic_write_text(root / LATEST, name + "\n")
    fsync_dir(root)
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
    try:
        state = TrainingState.from_json((path / STATE).read_text(encoding="utf-8"))
    except (ValueError, TypeError):
        raise DamagedCheckpoint(f"{path / STATE}: damaged (not a readable training state)") from None
    verify(path)
    try:
        _st_load_model(model, str(path / WEIGHTS), strict=True, device=str(device))
        if optimizer is not None:
            # Read on the CPU: load_state_dict moves each tensor where its parameter's policy wants
            # it (Adam keeps a non-fused `step` on the CPU).
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


# --- one writer per run directory -----------------------------------------------------------------


class RunLock:
    """An exclusive `flock` on RUN_DIR/.lock for as long as a trainer runs: the kernel releases
    it when the process ends, however it ends (kill -9 included), so a stale lock never blocks.
    The file says who holds it (pid, host, since when), for the error a second trainer gets.
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
            raise RunLocked(f"{self.path.parent} is being written by another trainer ({self.holder()}); "
                            "wait for it to end, stop it, or use another --run-dir") from None
        os.ftruncate(fd, 0)
        os.write(fd, json.dumps({"pid": os.getpid(), "host": socket.gethostname(),
                                 "since": time.strftime("%Y-%m-%d %H:%M:%S")}).encode() + b"\n")
        self._fd = fd
        return self

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


# --- averaging (6.1) ------------------------------------------------------------------------------


def last_checkpoints(run_dir: str | os.PathLike, k: int) -> list[Path]:
    """The newest `k` complete checkpoints of a run written at its checkpoint interval, oldest
    first (6.1: "the last 5 checkpoints, which were written at 10-minute intervals"). A
    checkpoint forced off the interval (the end of a run that did not end on it) is left out,
    unless the run has no other."""
    found = list_checkpoints(run_dir)
    if not found:
        raise FileNotFoundError(f"{Path(run_dir) / CHECKPOINTS}: no checkpoints")
    if k < 1:
        raise ValueError("--last must be at least 1")
    regular = [(s, p) for s, p in found if on_interval(p)]
    found = regular or found
    if len(found) < k:
        raise ValueError(f"asked for the last {k} checkpoints but {run_dir} has {len(found)} "
                         f"({', '.join(p.name for _, p in found)}); use --last {len(found)} or keep more (--keep-last)")
    return [p for _, p in found[-k:]]


def average_checkpoints(paths: list[str | os.PathLike]) -> tuple[dict[str, torch.Tensor], Config]:
    """The elementwise mean of the weights of the model directories `paths` (same architecture),
    read straight from their model.safetensors (no model is built): taken tensor by tensor in
    float64 and rounded once to the tensors' dtype; a tied embedding is stored, and averaged,
    once. Returns (tensors under the file's own names, the config of the last checkpoint)."""
    if not paths:
        raise ValueError("no checkpoints to average")
    total: dict[str, torch.Tensor] = {}
    dtypes: dict[str, torch.dtype] = {}
    config = None
    for path in paths:
        c = load_config(path)
        if config is not None and c.model != config.model:
            raise ValueError(f"{path}: a different model architecture than {paths[0]}")
        config = c
        verify(path, (WEIGHTS, CONFIG))
        tensors = load_file(str(Path(path) / WEIGHTS))
        if total and tensors.keys() != total.keys():
            raise ValueError(f"{path}: other tensors than {paths[0]}")
        for name, t in tensors.items():
            if name not in total:
                total[name], dtypes[name] = t.double(), t.dtype
            else:
                if t.shape != total[name].shape:
                    raise ValueError(f"{path}: {name} has shape {tuple(t.shape)}, not {tuple(total[name].shape)}")
                total[name] += t.double()
    assert config is not None
    return {name: (s / len(paths)).to(dtypes[name]) for name, s in total.items()}, config


def default_average(run_dir: Path) -> int | None:
    """For a run directory with checkpoints: how many of the last to average by default, the run's
    own train.average_last (6.1: 5 for base, 20 for big), or all it has if fewer. None when
    it has no checkpoints."""
    found = list_checkpoints(run_dir)
    if not found:
        return None
    regular = [p for _, p in found if on_interval(p)] or [p for _, p in found]
    k = guarded(load_config, found[-1][1]).train.average_last
    return max(1, min(k, len(regular)))


# --- the MODEL argument of the inference commands ------------------------------------------------


def resolve_checkpoint(run_dir: Path, name: str) -> Path:
    """A checkpoint given as a path, a name under RUN_DIR/checkpoints, a step number, `latest`
    or `model`."""
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
    raise FileNotFoundError(f"{name}: no such checkpoint (a model directory, a name under {run_dir / CHECKPOINTS}, "
                            "a step number, 'latest' or 'model')")


@dataclass
class Resolved:
    """What a MODEL argument stands for, loaded."""

    model: Transformer
    """In eval mode, on the device asked for."""
    config: Config
    description: str
    """For the user: a model directory's path, or 'average of the last 5 checkpoints (...)'."""
    search_dirs: list[Path]
    """Where files that belong with the model (data.json, the vocabulary) are looked for."""


def load_for_inference(path: str | os.PathLike, *, checkpoint: str | None = None, average: int | None = None,
                       device: str | torch.device = "cpu") -> Resolved:
    """The model a MODEL argument names: a model directory itself; or, for a run directory, the
    average of its last `average` checkpoints (by default its train.average_last, as every result
    of the paper, 6.1), or one `checkpoint` (`resolve_checkpoint`), or its model/ when it has no
    checkpoints. Raises FileNotFoundError or ValueError with a one-line message."""
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
        paths = last_checkpoints(path, average)
        tensors, config = guarded(average_checkpoints, paths)
        model = model_from_tensors(tensors, config, paths[-1]).to(device).eval()
        what = f"average of the last {len(paths)} checkpoints ({paths[0].name} .. {paths[-1].name}) of {path}"
        return Resolved(model, config, what, [path])
    if checkpoint is not None:
        model_dir = resolve_checkpoint(path, checkpoint)
    elif is_model_dir(path):
        model_dir = path
    elif is_model_dir(path / "model"):
        model_dir = path / "model"
    else:
        raise FileNotFoundError(f"{path}: neither a model directory (model.safetensors + config.json) "
                                "nor a run directory with a model/ or checkpoints/")
    model, config = guarded(load_model, model_dir, device=device)
    # A run directory holds data.json; a checkpoint's is two levels up (RUN_DIR/checkpoints/step_*).
    return Resolved(model, config, str(model_dir),
                    list(dict.fromkeys([path, model_dir, model_dir.parent, model_dir.parent.parent])))
