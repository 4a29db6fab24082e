"""One optimizer step (`train_step`) and the validation loss, and what they need: the model made
ready to train on its device, the precision (fp32, bf16 or fp16 autocast), Adam (5.3). The trainer,
`transduce.synthetic` and benchmarks/bench.py all train through these."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import NamedTuple
import math

import torch
import torch.distributed as dist
from torch import Tensor, nn

from ..config import Config, ModelConfig
from ..data.batching import ParallelDataset
from ..errors import UsageError
from ..fast.train import fast_dropout
from ..memory import widen_kernel_cache
from .. import precision as hardware
from ..precision import PRECISIONS, Choice, choose_precision
from .distributed import DistEnv, all_reduce_
from .loss import label_smoothed_nll


def autocast_for(device: torch.device, precision: str):
    """A fresh autocast context for the forward pass: bf16 on CPU or CUDA, fp16 on CUDA, or
    nothing for fp32. (Adam's master weights and the loss's log-softmax stay fp32.)"""
    if precision == "fp32":
        return contextlib.nullcontext()
    dtype = torch.bfloat16 if precision == "bf16" else torch.float16
    return torch.autocast(device_type=device.type, dtype=dtype)


def resolve_precision(
    env: DistEnv, requested: str, model: ModelConfig, recorded: tuple[str, Path] | None = None
) -> str:
    """The precision this run trains in: `requested`, or for 'auto' the choice of the device's row
    of the table (`transduce.precision.choose_precision`: CPU flags, or a GPU's compute capability),
    said on one line. Rank 0 decides and every rank follows, so that a job whose ranks run on
    different hardware still trains in one precision.

    Resuming (`recorded`: the precision of the run's checkpoint, and that checkpoint), 'auto' keeps
    it rather than looking the device up again (the device or the table may have changed since; a
    resumed run then ends bitwise as if never stopped), unless this device does not compute it
    natively: then it chooses again and says so. An explicit precision is obeyed, with a note where
    it differs."""
    if requested not in PRECISIONS:
        raise UsageError(f"unknown precision {requested!r} ({', '.join(PRECISIONS)})")
    check_precision(env.device, requested)
    note = choice = None
    if recorded is not None and recorded[0] in PRECISIONS:
        kept, where = recorded
        if requested == "auto" and _computes_natively(env.device, kept):
            choice = Choice(
                kept,
                f"auto: this run's precision, recorded in its checkpoint {where.name}; "
                "kept on resuming, not chosen again",
            )
        elif requested == "auto":
            note = (
                f"note: this run trained in {kept} until {where.name}, which this {'GPU' if env.device.type == 'cuda' else 'CPU'} "
                "does not compute natively: choosing again"
            )
        elif requested != kept:
            note = f"note: this run trained in {kept} until {where.name}; it continues in {requested}, as asked"
    if choice is None:
        choice = choose_precision(requested, env.device)
    precision = choice.precision
    if env.distributed:
        code = torch.tensor([float(PRECISIONS.index(precision)) if env.is_main else 0.0], device=env.device)
        precision = PRECISIONS[int(all_reduce_(code, env, dist.ReduceOp.MAX).item())]
    if note:
        env.say(note)
    env.say(choice.line())
    if choice.warning:
        env.say(f"warning: {choice.warning}")
    check_precision(env.device, precision)
    return precision


def _computes_natively(device: torch.device, precision: str) -> bool:
    """Whether `device` computes `precision` in hardware (the capability only: no timing)."""
    if precision == "fp32":
        return True
    if precision == "fp16":
        return device.type == "cuda"
    return hardware.read_capability(device).native_bf16 is not False  # looked up now: patchable


def check_precision(device: torch.device, precision: str) -> None:
    """Refuse a precision `device` cannot train in."""
    if precision == "fp16" and device.type != "cuda":
        raise UsageError("--precision fp16 needs CUDA (it trains with a GradScaler); use bf16 on CPU")
    if precision == "bf16" and device.type == "cuda" and not torch.cuda.is_bf16_supported():
        raise UsageError("this GPU does not support bf16; use --precision fp16 or fp32")


def make_grad_scaler(device: torch.device, precision: str):
    """torch.amp.GradScaler for fp16 (None otherwise)."""
    return torch.amp.GradScaler(device.type) if precision == "fp16" else None


def prepare_for_training(model: nn.Module, device: torch.device, precision: str) -> nn.Module:
    """`model` on `device`, in training mode, with the training speed-ups of `transduce.fast.train`
    (the same math): dropout (5.4) from fewer random numbers (equation 1 with fp32 scores on the
    CPU in bf16 is `attention.sequence_attention`'s choice). The one way the trainer, `transduce.synthetic` and benchmarks/bench.py
    prepare a model; call it once, before the optimizer is built (and before the first product:
    oneDNN's kernel cache is widened for training's many shapes, `memory.widen_kernel_cache`)."""
    widen_kernel_cache()
    model = model.to(device)
    fast_dropout(model)
    return model.train()


def build_optimizer(model: nn.Module, config: Config) -> torch.optim.Adam:
    """Adam, beta1 = 0.9, beta2 = 0.98, eps = 1e-9 (5.3), fused where this torch build and the
    device support it, else the multi-tensor (foreach) version; the rate is set by `set_lr`."""
    t = config.train
    params = [p for p in model.parameters() if p.requires_grad]
    kwargs = dict(lr=0.0, betas=tuple(t.adam_betas), eps=t.adam_eps)
    try:
        return torch.optim.Adam(params, fused=True, **kwargs)
    except (RuntimeError, TypeError, ValueError):
        return torch.optim.Adam(params, **kwargs)


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    """Set every parameter group's learning rate to `lr`."""
    for group in optimizer.param_groups:
        group["lr"] = lr


def to_device(batch: dict, device: torch.device) -> dict:
    """Move a collated batch's tensors to `device` (pinned + non-blocking on CUDA)."""
    if device.type != "cuda":
        return batch
    return {k: v.pin_memory().to(device, non_blocking=True) if torch.is_tensor(v) else v for k, v in batch.items()}


class StepResult(NamedTuple):
    sums: Tensor
    """[smoothed loss, nll] summed over this rank's tokens (detached, fp32)."""
    grad_norm: Tensor
    """The global gradient norm before clipping."""
    updated: bool
    """False when the step was skipped: a non-finite loss or gradient norm (on any rank), or an
    fp16 overflow that made the GradScaler skip it and lower its scale."""


def train_step(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    micro_batches: list[dict],
    *,
    lr: float | None = None,
    label_smoothing: float,
    env: DistEnv | None = None,
    precision: str = "fp32",
    scaler=None,
    clip_norm: float = 0.0,
    pad_id: int | None = None,
    smooth_exclude: tuple[int, ...] | None = None,
) -> StepResult:
    """One optimizer step on `micro_batches` (collated batches on the model's device), read top to
    bottom: the rate `lr` (equation 3, 5.3; None: as set), then for each micro-batch forward under
    autocast, the label-smoothed loss (5.4), backward (gradients accumulate); then the gradient
    norm (clipped with `clip_norm`), the check that the loss and the norm are finite, Adam's step.

    Loss normalisation: the loss summed over the non-pad target tokens of every micro-batch is
    divided by N_total, the non-pad target tokens of all micro-batches of all ranks (known before
    the forward passes, summed by one small all-reduce). Each rank scales its sum by
    world_size / N_total and DDP's all-reduce averages over world_size, so the gradient is exactly
    d(sum of token losses) / N_total however the step is split across ranks and micro-batches.
    With DDP, gradients are all-reduced on the last micro-batch only (`no_sync()` on the others).

    A step whose loss or gradient norm is not finite is not taken: no parameter and no optimizer
    state changes (`StepResult.updated` False; one host sync per step, as a GradScaler's, and with
    several processes one small all-reduce so that all skip together).

    `pad_id` (the padding the loss ignores) and `smooth_exclude` (the classes given no smoothing
    mass) default to the model's: `config.pad_id`, and (`config.pad_id`, `config.bos_id`).
    """
    pad_id, smooth_exclude = loss_ids(model, pad_id, smooth_exclude)
    env = env or DistEnv(device=micro_batches[0]["src"].device)
    if lr is not None:
        set_lr(optimizer, lr)
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
            with autocast_for(env.device, precision):
                logits = model(batch["src"], batch["tgt_in"])  # (B, T, V)
            loss, nll = label_smoothed_nll(
                logits, batch["tgt_out"], label_smoothing, pad_id, exclude=smooth_exclude
            )  # sums, fp32
            scaled = loss * loss_scale
            (scaler.scale(scaled) if scaler is not None else scaled).backward()
        sums += torch.stack([loss.detach(), nll.detach()])

    if scaler is not None:
        scaler.unscale_(optimizer)
    params = [p for g in optimizer.param_groups for p in g["params"]]
    grad_norm = nn.utils.clip_grad_norm_(params, clip_norm) if clip_norm > 0 else gradient_norm(params)
    if scaler is not None:  # fp16: the scaler skips an overflowing step itself, and lowers its scale
        scale = scaler.get_scale()
        scaler.step(optimizer)
        scaler.update()
        updated = scaler.get_scale() >= scale
    else:
        bad = ~(torch.isfinite(grad_norm) & torch.isfinite(sums).all())
        if env.distributed:
            bad = all_reduce_(bad.float().reshape(1), env, dist.ReduceOp.MAX)
        updated = not bool(bad.item())
        if updated:
            optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return StepResult(sums, grad_norm.detach(), updated)


def loss_ids(model: nn.Module, pad_id: int | None, smooth_exclude: tuple[int, ...] | None) -> tuple[int, tuple]:
    """The loss's ignored id and unsmoothed classes: those given, else the model's (PAD; PAD and BOS, 5.4)."""
    c = getattr(getattr(model, "module", model), "_orig_mod", getattr(model, "module", model)).config  # DDP, compile
    return (
        c.pad_id if pad_id is None else pad_id,
        (c.pad_id, c.bos_id) if smooth_exclude is None else tuple(smooth_exclude),
    )


def gradient_norm(params: list[Tensor]) -> Tensor:
    """The global 2-norm of the gradients, measured only (they are not touched)."""
    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        return torch.zeros(())
    if hasattr(nn.utils, "get_total_norm"):  # torch >= 2.6
        return nn.utils.get_total_norm(grads)
    return torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g.float()) for g in grads]))


@torch.no_grad()
def evaluate(
    model: nn.Module,
    dataset: ParallelDataset,
    *,
    max_tokens: int,
    label_smoothing: float,
    env: DistEnv | None = None,
    precision: str = "fp32",
    pad_id: int | None = None,
    smooth_exclude: tuple[int, ...] | None = None,
) -> dict:
    """Loss on a whole split, in eval mode: per target token `loss` (label-smoothed, what training
    minimises), `nll` and `ppl` = exp(nll); and `tokens`. With several ranks each takes every
    world-th batch and the sums are all-reduced. `model`: the plain module, not the DDP wrapper.
    `pad_id`, `smooth_exclude`: as `train_step`'s."""
    pad_id, smooth_exclude = loss_ids(model, pad_id, smooth_exclude)
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
        sums += torch.stack(
            [loss.double(), nll.double(), torch.tensor(float(b["ntokens"]), dtype=torch.float64, device=env.device)]
        )
    all_reduce_(sums, env)
    loss, nll, tokens = sums.tolist()
    model.train(was_training)
    tokens = max(tokens, 1.0)
    return {
        "loss": loss / tokens,
        "nll": nll / tokens,
        "ppl": math.exp(min(nll / tokens, 700.0)),
        "tokens": int(tokens),
    }
