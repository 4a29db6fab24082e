"""What a training run holds, shared by the trainer's phases and by `transduce.train.recovery`:
the options of `transduce train`, the batches in order (5.1), the log, what a run fixes before its
first step (`Run`) and what the loop changes step after step (`LoopState`)."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from torch import Tensor, nn

from ..config import Config
from ..data.batching import ParallelDataset
from ..errors import DataError, UsageError
from ..model import Transformer
from .distributed import DistEnv
from .signals import StopSignals


@dataclass
class TrainOptions:
    """How to run the training (the regime itself, Section 5, is `Config.train`). Every field is a
    flag of `transduce train` (`--no-NAME` turns off a boolean on by default), its help, metavar and
    choices the field's metadata (`transduce.cli.fields`)."""

    max_tokens: int | None = field(default=None, metadata={"metavar": "N", "help": (
        "padded tokens per micro-batch (default: the preset's)")})
    """Per micro-batch per process, each side; unset: train.max_tokens (25000 in the paper) divided by
    processes x update_freq."""
    update_freq: int = field(default=1, metadata={"metavar": "K", "help": "micro-batches per optimizer step (default 1)"})
    """8 on one device emulates the paper's 8 GPUs."""
    max_minutes: float | None = field(default=None, metadata={"metavar": "M", "help": "stop after M minutes (a cap; default none)"})
    """Said when it binds before max_steps (the model is then not the recipe's). Validation and
    checkpoints on the way count; the final validation and checkpoint follow."""
    clip_norm: float = field(default=0.0, metadata={"metavar": "X", "help": "clip the gradient norm (default 0: off, the paper)"})
    cooldown: float = 0.0
    """Not in the paper: decay the rate linearly to 0 over this last fraction of max_steps (0: equation 3
    alone). A fraction of steps, never of the clock: the same schedule on a fast and a slow machine."""
    precision: str = "auto"  # one of PRECISIONS: docs/precision.md
    seed: int = 1
    valid_every: int = field(default=1000, metadata={"metavar": "N", "help": (
        "validation every N steps (default 1000; 0: at the end)")})
    save_every_steps: int = field(default=0, metadata={"metavar": "N", "help": "checkpoint every N steps (default 0: off)"})
    keep_last: int | None = field(default=None, metadata={"metavar": "K", "help": (
        "checkpoints kept (default: the preset's; 0: all)")})
    """Checkpoints written at the interval kept besides the newest; unset: train.average_last (5 base,
    20 big: what `transduce average` averages)."""
    resume: bool = field(default=True, metadata={"help": "continue RUN_DIR's newest intact checkpoint (the default)"})
    """True (the default): a run directory with checkpoints is continued exactly, when its config is
    the one asked for; False: such a directory is refused (unless `restart`)."""
    restart: bool = field(default=False, metadata={"help": (
        "start over, replacing RUN_DIR's checkpoints")})
    """Start at step 0 even if RUN_DIR has checkpoints: they (and its model/) are removed only once
    the new run is set up (data read, model built), just before it writes anything."""
    init: str | None = field(default=None, metadata={"metavar": "MODEL", "help": (
        "fine-tune: start from MODEL's weights and architecture")})
    """Fine-tuning (`transduce.finetune`, not in the paper): a run that starts at step 0 starts from
    MODEL's weights, as `transduce translate` loads them (the config is MODEL's architecture); a
    fresh optimizer and schedule. A run that continues its checkpoints ignores it."""
    threads: int | None = None  # CPU threads per process (unset: cores / local processes)
    device: str = "auto"  # one of DEVICES: auto is CUDA if available, each process its local rank's GPU
    compile: bool = field(default=False, metadata={"help": "torch.compile the model"})
    progress: bool = field(default=True, metadata={"help": "no progress bar"})
    log_every: int = field(default=100, metadata={"metavar": "N", "help": "log every N steps (default 100)"})
    """Also, with several processes, the interval at which the time-based decisions (max_minutes,
    train.checkpoint_minutes) are made."""
    tensorboard: bool = field(default=True, metadata={"help": "no TensorBoard event files"})
    max_nonfinite: int = field(default=5, metadata={"metavar": "N", "help": (
        "stop after N non-finite steps in a row (default 5)")})
    """Each such step is skipped (no update); the stop comes with a checkpoint of the weights from
    before them."""

    def __post_init__(self) -> None:
        """Refuse a value out of its flag's range (where 0 means off, 0 is valid)."""
        for name, ok, what in (
            ("max_tokens", self.max_tokens is None or self.max_tokens >= 1, "at least 1"),
            ("update_freq", self.update_freq >= 1, "at least 1"),
            ("max_minutes", self.max_minutes is None or self.max_minutes > 0, "positive"),
            ("clip_norm", self.clip_norm >= 0, "at least 0 (0: off)"),
            ("cooldown", 0 <= self.cooldown <= 1, "a fraction in [0, 1] (0: off)"),
            ("valid_every", self.valid_every >= 0, "at least 0 (0: at the end only)"),
            ("save_every_steps", self.save_every_steps >= 0, "at least 0 (0: off)"),
            ("keep_last", self.keep_last is None or self.keep_last >= 0, "at least 0 (0: all)"),
            ("threads", self.threads is None or self.threads >= 1, "at least 1"),
            ("log_every", self.log_every >= 1, "at least 1"),
            ("max_nonfinite", self.max_nonfinite >= 1, "at least 1"),
        ):
            if not ok:
                raise UsageError(f"--{name.replace('_', '-')} must be {what}, not {getattr(self, name)}")

    @property
    def continues(self) -> bool:
        """Whether checkpoints already in the run directory are continued (not replaced)."""
        return self.resume and not self.restart

    def resolve(self, config: Config, world_size: int) -> TrainOptions:
        """These options with the two that default to the config filled in: the one place where
        an option falls back to `config.train`. max_tokens: train.max_tokens (per optimizer step)
        shared out over processes x update_freq, the total then recorded in config.train;
        keep_last: train.average_last."""
        t = config.train
        per_batch = self.max_tokens or t.max_tokens // (world_size * self.update_freq)
        if per_batch < 1:
            raise UsageError(f"train.max_tokens {t.max_tokens} is less than one token per micro-batch "
                             f"({world_size} processes x --update-freq {self.update_freq})")
        t.max_tokens = per_batch * world_size * self.update_freq
        return dataclasses.replace(
            self, max_tokens=per_batch,
            keep_last=t.average_last if self.keep_last is None else self.keep_last)


class BatchStream:
    """This rank's training micro-batches (5.1), epoch after epoch, as arrays of pair indices: epoch
    e's shuffled length-sorted batches (`dataset.batches`), the same list on every rank, rank r
    taking every world-th one. The position (epoch, index of the next batch) is all a checkpoint
    needs to continue the same order."""

    def __init__(self, dataset: ParallelDataset, max_tokens: int, *, seed: int, num_shards: int = 1,
                 shard_id: int = 0, epoch: int = 0, position: int = 0):
        self.dataset, self.max_tokens, self.seed = dataset, max_tokens, seed
        self.num_shards, self.shard_id = num_shards, shard_id
        self.epoch, self.position = epoch, position
        self._batches = self._load(epoch)

    def _load(self, epoch: int) -> list[np.ndarray]:
        batches = self.dataset.batches(self.max_tokens, seed=self.seed, epoch=epoch, shuffle=True,
                                       num_shards=self.num_shards, shard_id=self.shard_id)
        if not batches:
            raise DataError("the training split is empty")
        return batches

    def __len__(self) -> int:
        """Micro-batches per epoch (for this rank)."""
        return len(self._batches)

    def next(self) -> np.ndarray:
        """The next micro-batch, starting the next epoch's order where this one ends."""
        if self.position >= len(self._batches):
            self.epoch, self.position = self.epoch + 1, 0
            self._batches = self._load(self.epoch)
        batch = self._batches[self.position]
        self.position += 1
        return batch

    def take(self, n: int) -> list[tuple[np.ndarray, tuple[int, int]]]:
        """The next n micro-batches, each with where it lies: (epoch, index in the epoch)."""
        return [(self.next(), (self.epoch, self.position - 1)) for _ in range(n)]


class RunLog:
    """logs/train.jsonl (always) and TensorBoard scalars (if tensorboard is installed).
    Only rank 0 creates one."""

    def __init__(self, log_dir: Path, tensorboard: bool = True):
        log_dir.mkdir(parents=True, exist_ok=True)
        self.file = open(log_dir / "train.jsonl", "a", encoding="utf-8")
        self.tb = None
        if tensorboard:
            with contextlib.suppress(ImportError):  # tensorboard is optional
                from torch.utils.tensorboard import SummaryWriter

                self.tb = SummaryWriter(str(log_dir))

    def write(self, kind: str, step: int, **values) -> None:
        record = {"type": kind, "step": step, "time": round(time.time(), 3), **values}
        if self.file is not None:
            try:
                self.file.write(json.dumps(record) + "\n")
                self.file.flush()
            except OSError as e:  # a full disk: the log stops, training does not
                print(f"warning: {self.file.name}: {e.strerror or e}; the log stops here", file=sys.stderr)
                self.file = None
        if self.tb is not None:
            for k, v in values.items():
                if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
                    self.tb.add_scalar(f"{kind}/{k}", v, step)

    def close(self) -> None:
        if self.file is not None:
            with contextlib.suppress(OSError):
                self.file.close()
        if self.tb is not None:
            self.tb.close()


@dataclass(frozen=True)
class Run:
    """What a run fixes before its first step (`_set_up`, completed by `_open`); every phase reads
    it, none changes it."""

    config: Config
    opts: TrainOptions  # `TrainOptions.resolve`d: max_tokens is padded tokens per micro-batch per rank
    env: DistEnv
    data_dir: Path
    run_dir: Path
    precision: str
    smooth_exclude: tuple[int, ...]
    meta: dict
    train_set: ParallelDataset
    valid_set: ParallelDataset | None
    model: Transformer  # the plain module: what is validated and saved
    optimizer: torch.optim.Optimizer
    scaler: torch.amp.GradScaler | None
    signals: StopSignals | None = None  # SIGTERM / SIGINT: a request to stop after the current step
    train_model: nn.Module | None = None  # `model`, optionally compiled, wrapped in DDP for several processes
    log: RunLog | None = None  # rank 0's (None on the other ranks)
    bar: object = None  # rank 0's progress bar, when stderr is a terminal


@dataclass
class LoopState:
    """What the loop changes, step after step, and what `_finish` reports: changed by
    `transduce.train.trainer` alone (recovery reads it)."""

    step: int
    stream: BatchStream
    lr: float  # the rate of the latest step (before the first, equation 3 at the current step)
    stop: bool
    train_seconds: float  # training time of the earlier sessions (from the checkpoint)
    tokens_seen: int  # target tokens trained on, earlier sessions included
    saved_at: int  # the step of the newest checkpoint of this run (-1: none)
    first_step: int  # the step this session started at
    start: float  # the clocks (time.perf_counter): this session's start, the last checkpoint, the last log
    last_save: float
    last_log: float
    interval_sums: Tensor  # [smoothed loss, nll] summed over this rank's tokens since the last log
    interval_tokens: int = 0
    grad_norm: Tensor | None = None  # of the latest step that measured it, since the last log
    step_seconds: float = 0.0  # time in training steps in this session (no validation, no checkpoints)
    session_tokens: int = 0
    valid: dict | None = None
    validated_at: int = -1
    capped_at: int | None = None  # the step at which --max-minutes stopped the run short of max_steps
    interrupted: str | None = None  # the signal that stopped the run, agreed by every rank
    skipped_in_a_row: int = 0  # steps in a row not taken for a non-finite loss or gradient
