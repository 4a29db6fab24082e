"""The options of `transduce train` (`TrainOptions`): how a run is run, the regime itself being
`Config.train`. A module of its own, importing no PyTorch, so that the command's flags (derived
from these fields, `transduce.cli.fields`) are built at once."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ..errors import UsageError

if TYPE_CHECKING:
    from ..config import Config


@dataclass
class TrainOptions:
    """How to run the training (the regime itself, Section 5, is `Config.train`). Every field is a
    flag of `transduce train` (`--no-NAME` turns off a boolean on by default), its help, metavar and
    choices the field's metadata (`transduce.cli.fields`)."""

    max_tokens: int | None = field(
        default=None, metadata={"metavar": "N", "help": ("padded tokens per micro-batch (default: the preset's)")}
    )
    """Per micro-batch per process, each side; unset: train.max_tokens (25000 in the paper) divided by
    processes x update_freq."""
    update_freq: int = field(
        default=1, metadata={"metavar": "K", "help": "micro-batches per optimizer step (default 1)"}
    )
    """8 on one device emulates the paper's 8 GPUs."""
    max_minutes: float | None = field(
        default=None, metadata={"metavar": "M", "help": "stop after M minutes (a cap; default none)"}
    )
    """Said when it binds before max_steps (the model is then not the recipe's). Validation and
    checkpoints on the way count; the final validation and checkpoint follow."""
    clip_norm: float = field(
        default=0.0, metadata={"metavar": "X", "help": "clip the gradient norm (default 0: off, the paper)"}
    )
    cooldown: float = 0.0
    """Not in the paper: decay the rate linearly to 0 over this last fraction of max_steps (0: equation 3
    alone). A fraction of steps, never of the clock: the same schedule on a fast and a slow machine."""
    precision: str = "auto"  # one of PRECISIONS: docs/precision.md
    seed: int = 1
    valid_every: int = field(
        default=1000, metadata={"metavar": "N", "help": ("validation every N steps (default 1000; 0: at the end)")}
    )
    save_every_steps: int = field(
        default=0, metadata={"metavar": "N", "help": "checkpoint every N steps (default 0: off)"}
    )
    keep_last: int | None = field(
        default=None, metadata={"metavar": "K", "help": ("checkpoints kept (default: the preset's; 0: all)")}
    )
    """Checkpoints written at the interval kept besides the newest; unset: train.average_last (5 base,
    20 big: what `transduce average` averages)."""
    resume: bool = field(default=True, metadata={"help": "continue RUN_DIR's newest intact checkpoint (the default)"})
    """True (the default): a run directory with checkpoints is continued exactly, when its config is
    the one asked for; False: such a directory is refused (unless `restart`)."""
    restart: bool = field(default=False, metadata={"help": ("start over, replacing RUN_DIR's checkpoints")})
    """Start at step 0 even if RUN_DIR has checkpoints: they (and its model/) are removed only once
    the new run is set up (data read, model built), just before it writes anything."""
    init: str | None = field(
        default=None, metadata={"metavar": "MODEL", "help": ("fine-tune: start from MODEL's weights and architecture")}
    )
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
    max_nonfinite: int = field(
        default=5, metadata={"metavar": "N", "help": ("stop after N non-finite steps in a row (default 5)")}
    )
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
            raise UsageError(
                f"train.max_tokens {t.max_tokens} is less than one token per micro-batch "
                f"({world_size} processes x --update-freq {self.update_freq})"
            )
        t.max_tokens = per_batch * world_size * self.update_freq
        return dataclasses.replace(
            self, max_tokens=per_batch, keep_last=t.average_last if self.keep_last is None else self.keep_last
        )


def lr_scale_for_peak(peak: float, d_model: int, warmup_steps: int) -> float:
    """Equation 3's factor for `train --lr PEAK`: the rate is highest at step warmup_steps, where it is
    scale * d_model^-0.5 * warmup_steps^-0.5 (Section 5.3), so scale = PEAK * sqrt(d_model * warmup_steps)."""
    return peak * (d_model * warmup_steps) ** 0.5


BASE_CPU_TOKENS_PER_S = 545.0
"""`base` training's rate in target tokens a second on two CPU cores in bf16, as docs/RESULTS.md records it:
the yardstick of `cpu_hours`."""


def cpu_hours(config: Config, threads: int) -> float:
    """About how long `config`'s whole regime (max_steps x max_tokens) trains on `threads` CPU cores:
    the base model's measured rate, scaled by model FLOPs per token and by cores. A rough guide
    (another CPU, its precision, the sentence lengths move it), for telling hours from weeks."""
    from ..config import get_preset
    from ..flops import dims, forward_flops

    def per_token(model) -> float:
        return forward_flops(dims(model), 1, 25, 25) / 25  # sentences of 25 tokens

    rate = BASE_CPU_TOKENS_PER_S * threads / 2 * per_token(get_preset("base").model) / per_token(config.model)
    return config.train.max_steps * config.train.max_tokens / rate / 3600
