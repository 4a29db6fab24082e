"""What a training run holds, shared by the trainer's phases and by `transduce.train.recovery`:
the options of `transduce train` (`TrainOptions`, at home in `transduce.train.options`), the
batches in order (5.1), the log, what a run fixes before its
first step (`Run`) and what the loop changes step after step (`LoopState`)."""

from __future__ import annotations

import contextlib
import json
import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import Tensor, nn

from ..config import Config
from ..data.batching import ParallelDataset
from ..errors import DataError
from ..model import Transformer
from .distributed import DistEnv
from .options import TrainOptions  # noqa: F401  (its home: light, for the flags of `transduce train`)
from .signals import StopSignals


class BatchStream:
    """This rank's training micro-batches (5.1), epoch after epoch, as arrays of pair indices: epoch
    e's shuffled length-sorted batches (`dataset.batches`), the same list on every rank, rank r
    taking every world-th one. The position (epoch, index of the next batch) is all a checkpoint
    needs to continue the same order."""

    def __init__(
        self,
        dataset: ParallelDataset,
        max_tokens: int,
        *,
        seed: int,
        num_shards: int = 1,
        shard_id: int = 0,
        epoch: int = 0,
        position: int = 0,
    ):
        self.dataset, self.max_tokens, self.seed = dataset, max_tokens, seed
        self.num_shards, self.shard_id = num_shards, shard_id
        self.epoch, self.position = epoch, position
        self._batches = self._load(epoch)

    def _load(self, epoch: int) -> list[np.ndarray]:
        batches = self.dataset.batches(
            self.max_tokens,
            seed=self.seed,
            epoch=epoch,
            shuffle=True,
            num_shards=self.num_shards,
            shard_id=self.shard_id,
        )
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
