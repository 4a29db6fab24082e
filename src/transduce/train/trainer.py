"""`transduce train`: the training loop of Section 5, in one place.

    transduce train --data data/wmt14-en-de --run-dir runs/base --preset base --update-freq 8
    torchrun --nproc_per_node 8 -m transduce train --data ... --run-dir ... --preset base

What the paper says, and where it is done here:

* 5.1 Training data and batching. "Each training batch contained a set of sentence pairs
  containing approximately 25000 source tokens and 25000 target tokens": `BatchStream` walks
  the token-budget batches of `transduce.data.batching` epoch after epoch. One optimizer step
  uses `update_freq` micro-batches of at most `max_tokens` padded tokens on each of
  `world_size` processes; the paper's batch is max_tokens * update_freq * world_size ~ 25000
  (8 GPUs x 3125, or one process with --update-freq 8).
* 5.2 Hardware and schedule. 8 GPUs, 100K steps (base) / 300K (big): torchrun +
  DistributedDataParallel (`setup_distributed`); each rank trains on its shard of the batches.
  config.train.max_steps and `TrainOptions.max_minutes` (--max-steps, --max-minutes) bound the run.
* 5.3 Optimizer. Adam with beta1 = 0.9, beta2 = 0.98, eps = 1e-9 (`build_optimizer`); the
  learning rate of equation 3 set before every optimizer step (`transduce.train.schedule.noam_lr`).
  Not in the paper, an option: `TrainOptions.cooldown` (--cooldown F) decays it linearly to 0
  over the last fraction F of the step budget (`cooldown_factor`).
* 5.4 Regularization. Dropout P_drop from the model config (active in `model.train()` only);
  label smoothing eps_ls = 0.1 (`transduce.train.loss.label_smoothed_nll`).
* 6.1 Checkpoints every 10 minutes (config.train.checkpoint_minutes, --save-every-minutes) or N
  steps, the last K kept for averaging (`transduce average`); what is written where:
  `transduce.checkpoint`.

Loss normalisation (documented because every toolkit does it differently): the label-smoothed
loss is summed over the non-pad target tokens of every micro-batch and divided by the number of
non-pad target tokens in the whole optimizer step, i.e. over all micro-batches of all ranks.
Each rank scales its summed loss by world_size / N_total before backward, and DDP's gradient
all-reduce averages over world_size, so the gradient is exactly d(sum of token losses) / N_total
however the step is split across ranks and accumulation steps. (N_total is known before the
forward passes: it comes from the collated batches, summed over ranks by one small all-reduce.)

The run directory's layout (config, data.json, vocabulary copies, checkpoints/, logs/, model/)
is described once, in `transduce.checkpoint`.

Only rank 0 writes. Exact resume (`TrainOptions.resume`, --resume) restores the weights, Adam's
moments, the step, the position in the epoch's batch order and every rank's RNG state (dropout),
so an interrupted and resumed run ends with the same parameters as an uninterrupted one.
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import json
import math
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
from torch import Tensor, nn

from ..checkpoint import (
    TrainingState, latest_checkpoint, list_checkpoints, load_checkpoint, prepare_run_dir, save_checkpoint, save_model,
)
from ..config import PRESETS, Config, ModelConfig, apply_overrides, get_preset
from ..data.batching import ParallelDataset, read_metadata
from ..data.vocab import BOS, PAD
from ..errors import DataError, UsageError
from ..model import Transformer, count_parameters
from ..precision import PRECISIONS, choose_precision
from .loss import label_smoothed_nll
from .schedule import cooldown_factor, noam_lr


# --- options --------------------------------------------------------------------------------------


@dataclass
class TrainOptions:
    """How to run the training (the regime itself, Section 5, is `Config.train`).

    Every field is a flag of `transduce train` (`--max-tokens` for max_tokens; a boolean that
    is on by default is turned off by `--no-NAME`), declared here once: the flag's help (and
    metavar, choices) is the field's metadata (`transduce.cli.fields`)."""

    max_tokens: int | None = field(default=None, metadata={"metavar": "N", "help": (
        "padded tokens per micro-batch per process, each side (default: train.max_tokens, "
        "25000 in the paper, divided by processes x update-freq)")})
    update_freq: int = field(default=1, metadata={"metavar": "K", "help": (
        "micro-batches accumulated per optimizer step; e.g. 8 on one device emulates the paper's 8 GPUs")})
    max_minutes: float | None = field(default=None, metadata={"metavar": "M", "help": (
        "a cap: stop after M minutes of wall-clock time (this session), saying so when it binds "
        "before --max-steps (the model is then not the recipe's)")})
    """Validation and checkpoints on the way count; the final validation and checkpoint follow."""
    clip_norm: float = field(default=0.0, metadata={"metavar": "X", "help": "clip the gradient norm (0 = off, the paper)"})
    cooldown: float = field(default=0.0, metadata={"metavar": "F", "help": (
        "not in the paper: decay the rate linearly to 0 over the last fraction F of "
        "--max-steps; 0 = equation 3 alone (default)")})
    """A fraction of max_steps, never of the clock: the schedule is the same on a fast and a slow machine."""
    precision: str = field(default="auto", metadata={"choices": PRECISIONS, "help": (
        "auto (default): bf16 where the device computes it natively and a product of the "
        "model's size is measured faster, else fp32 (the choice and its reason are printed); "
        "fp32; bf16 autocast (CPU and CUDA; warns where the CPU only emulates it); "
        "fp16 autocast + GradScaler (CUDA only)")})
    seed: int = 1
    valid_every: int = field(default=1000, metadata={"metavar": "N", "help": (
        "validation loss and perplexity every N steps (0: at the end only; default %(default)s)")})
    save_every_steps: int = field(default=0, metadata={"metavar": "N", "help": "checkpoint every N steps (0 = off)"})
    save_every_minutes: float | None = field(default=None, metadata={"metavar": "M", "help": (
        "checkpoint every M minutes (default: train.checkpoint_minutes, 10 as in the paper; 0 = off)")})
    keep_last: int | None = field(default=None, metadata={"metavar": "K", "help": (
        "checkpoints to keep (default: train.average_last, 5 base / 20 big; 0 = all)")})
    resume: bool = field(default=False, metadata={"help": (
        "continue from RUN_DIR's latest checkpoint, exactly (starts afresh if there is none)")})
    threads: int | None = field(default=None, metadata={"metavar": "N", "help": (
        "CPU threads per process (default: cores / local processes)")})
    device: str = field(default="auto", metadata={"choices": ("auto", "cpu", "cuda")})
    compile: bool = field(default=False, metadata={"help": "torch.compile the model"})
    progress: bool = field(default=True, metadata={"help": (
        "no progress bar (there is none when stderr is not a terminal)")})
    log_every: int = field(default=100, metadata={"metavar": "N", "help": "log every N steps (default %(default)s)"})
    """Also, with several processes, the interval at which the time-based decisions
    (max_minutes, save_every_minutes) are made."""
    tensorboard: bool = field(default=True, metadata={"help": "no TensorBoard event files"})


@dataclass
class TrainResult:
    model: Transformer
    """The trained model (the plain module, on its device)."""
    step: int
    valid: dict | None
    """The last validation: loss, nll, ppl per target token."""
    run_dir: Path
    target_tokens_per_s: float


# --- distributed setup ----------------------------------------------------------------------------


@dataclass
class DistEnv:
    """This process's place in a torchrun job (a single process when not launched by torchrun)."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    local_world_size: int = 1
    device: torch.device = torch.device("cpu")
    owns_group: bool = False

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1

    def close(self) -> None:
        if self.owns_group and dist.is_initialized():
            dist.destroy_process_group()


def resolve_device(name: str, local_rank: int = 0) -> torch.device:
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda":
        if not torch.cuda.is_available():
            raise UsageError("--device cuda, but CUDA is not available")
        return torch.device("cuda", local_rank)
    if name != "cpu":
        raise UsageError(f"unknown device {name!r} (auto, cpu or cuda)")
    return torch.device("cpu")


def setup_distributed(device: str = "auto") -> DistEnv:
    """Read the variables torchrun sets (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE,
    MASTER_ADDR, MASTER_PORT) and join the process group: NCCL on CUDA, gloo on CPU (5.2).
    Multi-node works the same way (`torchrun --nnodes ... --rdzv-endpoint ...`)."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", str(world)))
    dev = resolve_device(device, local_rank)
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
    owns = False
    if world > 1 and not dist.is_initialized():
        dist.init_process_group(backend="nccl" if dev.type == "cuda" else "gloo")
        owns = True
    return DistEnv(rank, world, local_rank, local_world, dev, owns)


def set_threads(env: DistEnv, threads: int | None) -> None:
    """CPU threads: as asked, else OMP_NUM_THREADS if set (torchrun sets it to 1 for several
    processes), else the available cores shared among this machine's processes."""
    if threads:
        torch.set_num_threads(threads)
    elif env.device.type == "cpu" and "OMP_NUM_THREADS" not in os.environ:
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
        torch.set_num_threads(max(1, cores // env.local_world_size))


def all_reduce_(t: Tensor, env: DistEnv, op=None) -> Tensor:
    if env.distributed:
        dist.all_reduce(t, op=op or dist.ReduceOp.SUM)
    return t


# --- precision ------------------------------------------------------------------------------------


def autocast_for(device: torch.device, precision: str):
    """A fresh autocast context for the forward pass: bf16 on CPU or CUDA, fp16 on CUDA, or
    nothing for fp32. (Adam's master weights and the loss's log-softmax stay fp32.)"""
    if precision == "fp32":
        return contextlib.nullcontext()
    dtype = torch.bfloat16 if precision == "bf16" else torch.float16
    return torch.autocast(device_type=device.type, dtype=dtype)


def attention_kernel_for(device: torch.device, precision: str):
    """The scaled-dot-product-attention kernel for training. On the CPU in bf16, PyTorch's
    flash-attention backward is several times slower than the plain ("math") kernel, which
    computes attention in fp32 (measured with torch 2.13, 186 x 22 tokens, 4 heads of 64:
    backward 53 ms flash vs 12 ms math; 50 vs 26 ms at 100 tokens), so training uses the math
    kernel there; elsewhere PyTorch chooses. The backward kernel is the one the forward chose."""
    if device.type == "cpu" and precision == "bf16":
        from torch.nn.attention import SDPBackend, sdpa_kernel

        return sdpa_kernel([SDPBackend.MATH])
    return contextlib.nullcontext()


def resolve_precision(env: DistEnv, requested: str, model: ModelConfig) -> str:
    """The precision this run trains in: `requested`, or for 'auto' the hardware's choice
    (`transduce.precision.choose_precision`), said on one line. Rank 0 decides; every rank
    follows, so that a probe's timing noise cannot split a job between two precisions."""
    if requested not in PRECISIONS:
        raise UsageError(f"unknown precision {requested!r} ({', '.join(PRECISIONS)})")
    check_precision(env.device, requested)
    choice = choose_precision(requested, env.device, d_model=model.d_model, d_ff=model.d_ff)
    precision = choice.precision
    if env.distributed:
        code = torch.tensor([float(PRECISIONS.index(precision)) if env.is_main else 0.0], device=env.device)
        precision = PRECISIONS[int(all_reduce_(code, env, dist.ReduceOp.MAX).item())]
    _say(env, choice.line())
    if choice.warning:
        _say(env, f"warning: {choice.warning}")
    check_precision(env.device, precision)
    return precision


def check_precision(device: torch.device, precision: str) -> None:
    if precision == "fp16" and device.type != "cuda":
        raise UsageError("--precision fp16 needs CUDA (it trains with a GradScaler); use bf16 on CPU")
    if precision == "bf16" and device.type == "cuda" and not torch.cuda.is_bf16_supported():
        raise UsageError("this GPU does not support bf16; use --precision fp16 or fp32")


def make_grad_scaler(device: torch.device, precision: str):
    """torch.amp.GradScaler for fp16 (None otherwise); torch >= 2.3 spells it torch.amp."""
    if precision != "fp16":
        return None
    return torch.amp.GradScaler(device.type)


# --- optimizer (5.3) ------------------------------------------------------------------------------


def build_optimizer(model: nn.Module, config: Config) -> torch.optim.Adam:
    """Adam, beta1 = 0.9, beta2 = 0.98, eps = 1e-9 (5.3), fused where this torch build and the
    device support it (one kernel for all parameters), else the multi-tensor (foreach) version.
    The learning rate is set before each step by `set_lr` (equation 3)."""
    t = config.train
    params = [p for p in model.parameters() if p.requires_grad]
    kwargs = dict(lr=0.0, betas=tuple(t.adam_betas), eps=t.adam_eps)
    try:
        return torch.optim.Adam(params, fused=True, **kwargs)
    except (RuntimeError, TypeError, ValueError):
        return torch.optim.Adam(params, **kwargs)


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    for group in optimizer.param_groups:
        group["lr"] = lr


# --- batches (5.1) --------------------------------------------------------------------------------


class BatchStream:
    """This rank's training micro-batches, epoch after epoch, as lists of pair indices.

    Epoch e's batches are `dataset.batches(max_tokens, seed=seed, epoch=e, num_shards=world,
    shard_id=rank)`: shuffled length-sorted batches, the same list on every rank, rank r taking
    every world-th one (equal counts on every rank). The position (epoch, index of the next
    batch) is all a checkpoint needs to continue the same order.
    """

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
        if self.position >= len(self._batches):
            self.epoch, self.position = self.epoch + 1, 0
            self._batches = self._load(self.epoch)
        batch = self._batches[self.position]
        self.position += 1
        return batch


def to_device(batch: dict, device: torch.device) -> dict:
    """Move a collated batch's tensors to `device` (pinned + non-blocking on CUDA)."""
    if device.type != "cuda":
        return batch
    return {k: v.pin_memory().to(device, non_blocking=True) if torch.is_tensor(v) else v for k, v in batch.items()}


# --- one optimizer step ---------------------------------------------------------------------------


def train_step(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    micro_batches: list[dict],
    *,
    label_smoothing: float,
    env: DistEnv | None = None,
    precision: str = "fp32",
    scaler=None,
    clip_norm: float = 0.0,
    want_grad_norm: bool = False,
    pad_id: int = PAD,
    smooth_exclude: tuple[int, ...] = (PAD, BOS),
) -> tuple[Tensor, Tensor | None]:
    """One optimizer step on `micro_batches` (collated batches on the model's device),
    forward + backward one at a time, gradients accumulated.

    The loss is normalised by the non-pad target tokens of all micro-batches of all ranks (see
    the module docstring), so a single process given the union of the ranks' micro-batches
    computes the same update. With DDP (`model` wrapped), gradients are all-reduced only on the
    last micro-batch (`no_sync()` on the others).

    Returns (sums, grad_norm): sums = [smoothed loss, nll] summed over this rank's tokens (a
    detached fp32 tensor: no host sync), grad_norm the global gradient norm before clipping
    (a tensor, when clipping or `want_grad_norm`; else None). The learning rate must be set.
    """
    env = env or DistEnv(device=micro_batches[0]["src"].device)
    local_tokens = sum(int(b["ntokens"]) for b in micro_batches)
    if env.distributed:
        total = torch.tensor(float(local_tokens), device=env.device)
        dist.all_reduce(total)  # N_total over all ranks (asynchronous on the GPU stream)
        loss_scale = env.world_size / total  # DDP averages over world_size: undo it
    else:
        loss_scale = 1.0 / local_tokens
    ddp = isinstance(model, nn.parallel.DistributedDataParallel)
    sums = torch.zeros(2, device=env.device)
    for i, batch in enumerate(micro_batches):
        last = i == len(micro_batches) - 1
        with model.no_sync() if ddp and not last else contextlib.nullcontext():
            with autocast_for(env.device, precision), attention_kernel_for(env.device, precision):
                logits = model(batch["src"], batch["tgt_in"])  # (B, T, V)
            loss, nll = label_smoothed_nll(logits, batch["tgt_out"], label_smoothing, pad_id, exclude=smooth_exclude)  # sums, fp32
            scaled = loss * loss_scale
            (scaler.scale(scaled) if scaler is not None else scaled).backward()
        sums += torch.stack([loss.detach(), nll.detach()])

    if scaler is not None:
        scaler.unscale_(optimizer)
    grad_norm = None
    params = [p for g in optimizer.param_groups for p in g["params"]]
    if clip_norm > 0:
        grad_norm = nn.utils.clip_grad_norm_(params, clip_norm)
    elif want_grad_norm:
        grad_norm = nn.utils.clip_grad_norm_(params, float("inf"))  # measures only
    if scaler is not None:
        scaler.step(optimizer)  # skipped if the gradients overflowed
        scaler.update()
    else:
        optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return sums, grad_norm


# --- validation -----------------------------------------------------------------------------------


@torch.no_grad()
def evaluate(
    model: nn.Module,
    dataset: ParallelDataset,
    *,
    max_tokens: int,
    label_smoothing: float,
    env: DistEnv | None = None,
    precision: str = "fp32",
    pad_id: int = PAD,
    smooth_exclude: tuple[int, ...] = (PAD, BOS),
) -> dict:
    """Loss on a whole split, in eval mode (no dropout). Returns per target token: `loss` (the
    label-smoothed loss, what training minimises), `nll` (plain negative log-likelihood) and
    `ppl` = exp(nll), the per-token perplexity; and `tokens`. With several ranks each takes
    every world-th batch (no padding, nothing counted twice) and the sums are all-reduced.

    `model` should be the plain module (not the DDP wrapper: no collectives in its forward)."""
    env = env or DistEnv(device=next(model.parameters()).device)
    was_training = model.training
    model.eval()
    longest = int(max(dataset.src_sizes.max(initial=0), dataset.tgt_sizes.max(initial=0)))
    batches = dataset.batches(max(max_tokens, longest), shuffle=False)  # evaluation splits are unfiltered
    sums = torch.zeros(3, dtype=torch.float64, device=env.device)
    for indices in batches[env.rank :: env.world_size]:
        b = to_device(dataset.collate(indices), env.device)
        with autocast_for(env.device, precision):
            logits = model(b["src"], b["tgt_in"])
        loss, nll = label_smoothed_nll(logits, b["tgt_out"], label_smoothing, pad_id, exclude=smooth_exclude)
        sums += torch.stack([loss.double(), nll.double(), torch.tensor(float(b["ntokens"]), dtype=torch.float64, device=env.device)])
    all_reduce_(sums, env)
    loss, nll, tokens = sums.tolist()
    model.train(was_training)
    tokens = max(tokens, 1.0)
    return {"loss": loss / tokens, "nll": nll / tokens, "ppl": math.exp(min(nll / tokens, 700.0)), "tokens": int(tokens)}


# --- RNG state (exact resume) ---------------------------------------------------------------------


def gather_rng_states(env: DistEnv) -> dict[str, Tensor]:
    """Every rank's torch RNG states, {"cpu/rank{r}": uint8, "cuda/rank{r}": uint8} (a
    collective: every rank must call it). Dropout draws from these."""
    states = {"cpu": torch.get_rng_state()}
    if env.device.type == "cuda":
        states["cuda"] = torch.cuda.get_rng_state(env.device)
    if not env.distributed:
        return {f"{k}/rank0": v for k, v in states.items()}
    out = {}
    for kind, state in states.items():
        t = state.to(env.device)
        gathered = [torch.empty_like(t) for _ in range(env.world_size)]
        dist.all_gather(gathered, t)
        out.update({f"{kind}/rank{r}": g.cpu() for r, g in enumerate(gathered)})
    return out


def restore_rng_states(rng: dict[str, Tensor], env: DistEnv) -> bool:
    """Set this rank's RNG states from a checkpoint; False if it holds none for this rank."""
    cpu = rng.get(f"cpu/rank{env.rank}")
    if cpu is None:
        return False
    torch.set_rng_state(cpu)
    cuda = rng.get(f"cuda/rank{env.rank}")
    if cuda is not None and env.device.type == "cuda":
        torch.cuda.set_rng_state(cuda, env.device)
    return True


def seed_dropout(seed: int, rank: int) -> None:
    """A different dropout stream per rank (the model's initialisation used `seed` itself)."""
    torch.manual_seed(seed * 1000 + 1 + rank)


# --- logging --------------------------------------------------------------------------------------


class RunLog:
    """logs/train.jsonl (always) and TensorBoard scalars (if tensorboard is installed).
    Only rank 0 creates one."""

    def __init__(self, log_dir: Path, tensorboard: bool = True):
        log_dir.mkdir(parents=True, exist_ok=True)
        self.file = open(log_dir / "train.jsonl", "a", encoding="utf-8")
        self.tb = None
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError:  # tensorboard is optional
                pass
            else:
                self.tb = SummaryWriter(str(log_dir))

    def write(self, kind: str, step: int, **values) -> None:
        record = {"type": kind, "step": step, "time": round(time.time(), 3), **values}
        self.file.write(json.dumps(record) + "\n")
        self.file.flush()
        if self.tb is not None:
            for k, v in values.items():
                if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
                    self.tb.add_scalar(f"{kind}/{k}", v, step)

    def close(self) -> None:
        self.file.close()
        if self.tb is not None:
            self.tb.close()


# --- run directory and configuration --------------------------------------------------------------


def config_for_data(preset: str, overrides: list[str], meta: dict) -> Config:
    """The preset, with the vocabulary sizes of the prepared data (a shared vocabulary ->
    share_embeddings as in 3.4; separate ones -> share_embeddings=False), then `--set` overrides."""
    try:
        config = get_preset(preset)
    except KeyError:
        raise UsageError(f"unknown preset {preset!r}; known: {', '.join(PRESETS)}") from None
    vocab = meta["vocab"]
    src_size, tgt_size = int(vocab["size"]["src"]), int(vocab["size"]["tgt"])
    shared = bool(vocab.get("shared", vocab["files"]["src"] == vocab["files"]["tgt"]))
    config.model = dataclasses.replace(
        config.model, src_vocab_size=src_size, tgt_vocab_size=None if shared else tgt_size,
        share_embeddings=config.model.share_embeddings and shared,
    )
    try:
        config = apply_overrides(config, overrides)
    except ValueError as e:
        raise UsageError(str(e)) from None
    except TypeError as e:  # a value of the wrong type, e.g. model.n_heads=many
        raise UsageError(f"bad --set value ({e}) in: {' '.join(overrides)}") from None
    if (config.model.src_vocab_size, config.model.target_vocab_size) != (src_size, tgt_size):
        raise UsageError(f"the vocabulary sizes come from the data ({src_size}, {tgt_size}); do not override them")
    return config


def resolve_batching(opts: TrainOptions, config: Config, env: DistEnv) -> int:
    """Padded tokens per micro-batch per rank; records the total per step in config.train."""
    if opts.update_freq < 1:
        raise UsageError("--update-freq must be at least 1")
    per_batch = opts.max_tokens or config.train.max_tokens // (env.world_size * opts.update_freq)
    if per_batch < 1:
        raise UsageError("--max-tokens must be positive")
    config.train.max_tokens = per_batch * env.world_size * opts.update_freq
    return per_batch


# --- the loop -------------------------------------------------------------------------------------


def train(
    config: Config,
    data_dir: str | os.PathLike,
    run_dir: str | os.PathLike,
    opts: TrainOptions | None = None,
    *,
    log_extra: dict | None = None,
) -> TrainResult:
    """Train `config` on the prepared data in `data_dir`, writing into `run_dir`.

    Launched by torchrun, joins the process group itself (see `setup_distributed`). With
    `opts.resume` and a checkpoint in `run_dir`, continues it exactly (the config must then be
    the run's own, as `transduce.cli.train.resolve_config` makes it)."""
    opts = opts or TrainOptions()
    env = setup_distributed(opts.device)
    try:
        return _train(config, Path(data_dir), Path(run_dir), opts, env, log_extra or {})
    finally:
        env.close()


def _train(config: Config, data_dir: Path, run_dir: Path, opts: TrainOptions, env: DistEnv, log_extra: dict) -> TrainResult:
    device = env.device
    set_threads(env, opts.threads)
    precision = resolve_precision(env, opts.precision, config.model)
    t = config.train
    max_tokens = resolve_batching(opts, config, env)
    save_minutes = t.checkpoint_minutes if opts.save_every_minutes is None else opts.save_every_minutes
    keep_last = t.average_last if opts.keep_last is None else opts.keep_last
    smooth_exclude = () if t.smooth_all_classes else (PAD, BOS)  # 5.4: no mass on what is never emitted

    # Data (5.1).
    meta = read_metadata(data_dir)
    train_set = ParallelDataset.load(data_dir, "train")
    valid_set = ParallelDataset.load(data_dir, "valid") if (data_dir / "valid.src.idx").is_file() else None

    # Model, optimizer (5.3), precision.
    torch.manual_seed(opts.seed)
    model = Transformer(config.model).to(device)
    optimizer = build_optimizer(model, config)
    scaler = make_grad_scaler(device, precision)

    # Fresh start or exact resume.
    latest = latest_checkpoint(run_dir) if opts.resume else None
    if latest is None and list_checkpoints(run_dir) and not opts.resume:
        raise UsageError(f"{run_dir} already has checkpoints; pass --resume to continue it, or use another --run-dir")
    step, epoch, position, train_seconds, tokens_seen = 0, 0, 0, 0.0, 0
    saved_at = -1  # the step of the newest checkpoint of this session
    if latest is not None:
        ckpt = load_checkpoint(latest, model, optimizer, device)
        s = ckpt.state
        step, train_seconds, tokens_seen, saved_at = s.step, s.train_seconds, s.target_tokens, s.step
        same_batches = (s.world_size, s.max_tokens, s.seed) == (env.world_size, max_tokens, opts.seed)
        if same_batches:
            epoch, position = s.epoch, s.position
        else:  # the saved position indexes another batch list: go on with a fresh epoch
            epoch, position = s.epoch + 1, 0
            _say(env, f"note: batching changed since the checkpoint (world size, max tokens or seed): continuing at epoch {epoch}")
        if scaler is not None and s.scaler:
            scaler.load_state_dict(s.scaler)
        if not (same_batches and restore_rng_states(ckpt.rng, env)):
            seed_dropout(opts.seed + step, env.rank)
    else:
        seed_dropout(opts.seed, env.rank)

    if env.is_main:
        prepare_run_dir(run_dir, data_dir, meta, config)
    stream = BatchStream(train_set, max_tokens, seed=opts.seed, num_shards=env.world_size, shard_id=env.rank,
                         epoch=epoch, position=position)

    # The module that trains: optionally compiled, wrapped in DDP for several processes.
    model.train()
    train_model: nn.Module = torch.compile(model) if opts.compile else model
    if env.distributed:
        DDP = nn.parallel.DistributedDataParallel
        # The only buffer is the table of fixed sinusoids, which grows on demand and may differ
        # in length between ranks: never sync it at forward (torch >= 2.12 renamed the option).
        no_buffer_sync = ({"forward_sync_buffers": False} if "forward_sync_buffers" in inspect.signature(DDP).parameters
                          else {"broadcast_buffers": False})
        train_model = DDP(train_model, device_ids=[device.index] if device.type == "cuda" else None,
                          gradient_as_bucket_view=True, **no_buffer_sync)

    log = RunLog(run_dir / "logs", opts.tensorboard) if env.is_main else None
    bar = _progress_bar(env, opts, step, t.max_steps)
    n_params = count_parameters(model)
    if not config.model.share_embeddings:  # 3.4's three-way tying needs one vocabulary: say what is shared
        _say(env, "note: separate source and target vocabularies (or model.share_embeddings=false): the source "
                  "embedding is its own matrix; the target embedding and the pre-softmax projection are "
                  + ("tied (model.tie_output)" if config.model.tie_output else "separate too (model.tie_output=false)"))
    if log is not None:
        log.write("start", step, parameters=n_params, world_size=env.world_size, device=str(device),
                  precision=precision, max_tokens_per_batch=max_tokens, update_freq=opts.update_freq,
                  batches_per_epoch=len(stream) * env.world_size, threads=torch.get_num_threads(),
                  config=config.to_dict(), options=dataclasses.asdict(opts), **log_extra)
    _say(env, f"training {n_params / 1e6:.1f}M parameters on {env.world_size} x {device} ({precision}), "
              f"step {step} -> {t.max_steps}, {max_tokens} tokens x {opts.update_freq} micro-batches x "
              f"{env.world_size} processes per step; {len(stream) * env.world_size} batches per epoch")

    def checkpoint(lr: float, on_interval: bool = True) -> None:
        rng = gather_rng_states(env)  # a collective: every rank
        if env.is_main:
            state = TrainingState(
                step=step, epoch=stream.epoch, position=stream.position, world_size=env.world_size,
                max_tokens=max_tokens, update_freq=opts.update_freq, seed=opts.seed, lr=lr,
                train_seconds=train_seconds + (time.perf_counter() - start), target_tokens=tokens_seen,
                scaler=scaler.state_dict() if scaler is not None else None,
                schedule={"kind": "noam", "d_model": config.model.d_model, "warmup_steps": t.warmup_steps, "scale": t.lr_scale,
                          "cooldown": opts.cooldown},
                optimizer={k: v for k, v in optimizer.param_groups[0].items() if k != "params"},
                on_interval=on_interval,
            )
            path = save_checkpoint(run_dir, model, config, optimizer, state, rng, keep_last)
            log.write("checkpoint", step, path=str(path))

    def validate() -> dict | None:
        if valid_set is None:
            return None
        r = evaluate(model, valid_set, max_tokens=max_tokens, label_smoothing=t.label_smoothing, env=env,
                     precision=precision, smooth_exclude=smooth_exclude)
        if log is not None:
            log.write("valid", step, **r)
        _say(env, f"step {step}: valid loss {r['loss']:.4f}, nll {r['nll']:.4f}, ppl {r['ppl']:.2f} ({r['tokens']} tokens)", bar)
        return r

    start = time.perf_counter()
    last_save = last_log = start
    first_step = step
    step_seconds, session_tokens = 0.0, 0  # time in training steps (no validation, no checkpoints), tokens
    interval_tokens, interval_sums, grad_norm = 0, torch.zeros(2, device=device), None
    lr, valid, tokens_per_s, validated_at = noam_lr(step, config.model.d_model, t.warmup_steps, t.lr_scale), None, 0.0, -1
    stop = step >= t.max_steps
    progress = step / max(t.max_steps, 1)  # share of the step budget used (for --cooldown)
    capped_at = None  # the step at which --max-minutes stopped the run short of max_steps
    while not stop:
        # One optimizer step: update_freq micro-batches on every rank (5.1), lr of eq. 3 (5.3).
        batches = [to_device(train_set.collate(stream.next()), device) for _ in range(opts.update_freq)]
        lr = noam_lr(step + 1, config.model.d_model, t.warmup_steps, t.lr_scale) * cooldown_factor(progress, opts.cooldown)
        set_lr(optimizer, lr)
        log_now = (step + 1) % opts.log_every == 0 or step + 1 == t.max_steps
        sums, norm = train_step(
            train_model, optimizer, batches, label_smoothing=t.label_smoothing, env=env, precision=precision,
            smooth_exclude=smooth_exclude,
            scaler=scaler, clip_norm=opts.clip_norm, want_grad_norm=log_now,
        )
        step += 1
        interval_sums += sums
        interval_tokens += sum(b["ntokens"] for b in batches)
        grad_norm = norm if norm is not None else grad_norm
        if bar is not None:
            bar.update(1)

        # Decisions that depend on the clock: taken by rank 0 (every step alone, at log intervals
        # with several processes, to avoid a host sync per step) and shared.
        now = time.perf_counter()
        time_up = opts.max_minutes is not None and now - start >= 60 * opts.max_minutes
        save_due = save_minutes > 0 and now - last_save >= 60 * save_minutes
        if env.distributed:
            time_up, save_due = _agree(env, [time_up, save_due]) if log_now else (False, False)
        stop = step >= t.max_steps or time_up
        progress = step / max(t.max_steps, 1)  # the cooldown follows the steps, never the clock
        if time_up and step < t.max_steps:
            capped_at = step

        if log_now or stop:
            stats = torch.cat([interval_sums.double(), torch.tensor([float(interval_tokens)], dtype=torch.float64, device=device)])
            loss_sum, nll_sum, ntok = all_reduce_(stats, env).tolist()  # the one host sync per log interval
            tokens_per_s = ntok / max(now - last_log, 1e-9)
            tokens_seen += int(ntok)
            session_tokens += int(ntok)
            step_seconds += now - last_log
            if env.is_main:
                record = dict(
                    epoch=stream.epoch, loss=loss_sum / ntok, nll=nll_sum / ntok, ppl=math.exp(min(nll_sum / ntok, 700.0)),
                    lr=lr, target_tokens_per_s=tokens_per_s, target_tokens=int(ntok),
                    elapsed_s=round(now - start, 2),
                )
                if grad_norm is not None:
                    record["grad_norm"] = float(grad_norm)
                if scaler is not None:
                    record["loss_scale"] = float(scaler.get_scale())
                log.write("train", step, **record)
                postfix = dict(loss=f"{record['loss']:.3f}", lr=f"{lr:.2e}", tok_s=f"{tokens_per_s:,.0f}")
                if bar is not None:
                    bar.set_postfix(postfix, refresh=False)
                else:
                    eta = _remaining(step, t.max_steps, now - start, session_steps=step - first_step,
                                     minutes_left=opts.max_minutes and opts.max_minutes - (now - start) / 60)
                    _say(env, f"step {step}/{t.max_steps} | epoch {stream.epoch} | loss {record['loss']:.4f} | "
                              f"ppl {record['ppl']:.2f} | lr {lr:.3e} | {tokens_per_s:,.0f} target tokens/s | {eta}")
            interval_sums.zero_()
            interval_tokens, grad_norm, last_log = 0, None, time.perf_counter()

        pause = time.perf_counter()  # validation and checkpoints do not count as training time
        if opts.valid_every and step % opts.valid_every == 0 and not stop:
            valid, validated_at = validate(), step
        if not stop and ((opts.save_every_steps and step % opts.save_every_steps == 0) or save_due):
            checkpoint(lr)
            saved_at, last_save = step, time.perf_counter()
        last_log += time.perf_counter() - pause

    # The end: validate, checkpoint, and the final model directory.
    if capped_at is not None:
        _say(env, f"note: --max-minutes {opts.max_minutes:g} stopped training at step {step} of {t.max_steps}: "
                  "this model is not the recipe's (continue with --resume to finish it)")
        if log is not None:
            log.write("capped", step, max_steps=t.max_steps, max_minutes=opts.max_minutes)
    if validated_at != step:
        valid = validate()
    if saved_at != step:
        # Forced off the interval (6.1's "last 5 at 10-minute intervals"): averaging leaves it out.
        checkpoint(lr, on_interval=bool(opts.save_every_steps) and step % opts.save_every_steps == 0)
    tokens_per_s = session_tokens / step_seconds if step_seconds > 0 else 0.0
    if env.is_main:
        save_model(model, config, run_dir / "model")
        log.write("end", step, valid=valid, target_tokens_per_s=tokens_per_s, step_seconds=round(step_seconds, 2),
                  wall_seconds=round(time.perf_counter() - start, 2))
        log.close()
    if bar is not None:
        bar.close()
    _say(env, f"done at step {step}: {tokens_per_s:,.0f} target tokens/s over {step_seconds:.1f} s of training steps; "
              f"final model in {run_dir / 'model'}")
    return TrainResult(model, step, valid, run_dir, tokens_per_s)


def _remaining(step: int, max_steps: int, step_seconds: float, session_steps: int, minutes_left: float | None) -> str:
    """'ETA 12:34' for the steps left at this session's pace (`step_seconds` of wall-clock time,
    validation and checkpoints included, for `session_steps` steps), or the --max-minutes cap if
    that comes sooner."""
    if session_steps <= 0 or step_seconds <= 0:
        return "ETA --:--"
    seconds = (max_steps - step) * step_seconds / session_steps
    capped = minutes_left is not None and minutes_left * 60 < seconds
    if capped:
        seconds = max(minutes_left * 60, 0.0)
    m, sec = divmod(int(seconds), 60)
    h, m = divmod(m, 60)
    text = f"{h}:{m:02d}:{sec:02d}" if h else f"{m:02d}:{sec:02d}"
    return f"ETA {text}" + (" (--max-minutes)" if capped else "")


def _agree(env: DistEnv, flags: list[bool]) -> list[bool]:
    """Rank 0's flags, on every rank (the other ranks contribute False)."""
    t = torch.tensor([float(f and env.is_main) for f in flags], device=env.device)
    return [bool(x) for x in all_reduce_(t, env, dist.ReduceOp.MAX).tolist()]


def _progress_bar(env: DistEnv, opts: TrainOptions, step: int, total: int):
    if not (env.is_main and opts.progress and sys.stderr.isatty()):
        return None
    from tqdm import tqdm

    return tqdm(total=total, initial=step, unit="step", dynamic_ncols=True, desc="train")


def _say(env: DistEnv, message: str, bar=None) -> None:
    if env.is_main:
        if bar is not None:
            bar.write(message)
        else:
            print(message, flush=True)
