"""Label-smoothed cross-entropy (Section 5.4), a pure function of logits and targets."""

from __future__ import annotations

import torch
from torch import Tensor

from .. import torch_ops
from ..special_ids import DEFAULT


def label_smoothed_nll(
    logits: Tensor,
    target: Tensor,
    epsilon: float,
    pad_id: int = DEFAULT.pad,
    reduction: str = "sum",
    exclude: tuple[int, ...] | list[int] = (),
) -> tuple[Tensor, Tensor]:
    """Cross-entropy against the smoothed distribution q = (1 - eps) * onehot + eps / K on the
    K = V - len(exclude) classes not excluded (Section 5.4, "label smoothing of value
    eps_ls = 0.1"; Szegedy et al. 2016). The uniform part includes the target itself.

    `exclude`: classes that receive no smoothing mass; the trainer passes PAD and BOS, which the
    model never emits (with `exclude=()` the mass is spread over all V classes, as
    `F.cross_entropy(label_smoothing=eps)` does). logits (B, T, V), target (B, T); padding
    positions (`pad_id`, the model's `config.pad_id`) contribute nothing. Returns (loss, nll), the
    smoothed loss that is optimised and the plain negative log-likelihood, fp32 (fp64 for fp64
    logits), summed over non-pad tokens (`reduction='sum'`) or averaged over them (`'mean'`).

    With lse = log sum_v exp(z_v), nll = lse - z_y and smooth = lse - mean_{v not excluded} z_v,
    loss = (1 - eps) nll + eps smooth, whose gradient is softmax(z) - q: computed a block of rows
    at a time in fp32 without materialising the (B, T, V) log-probabilities, on the CPU by
    `_SmoothedCrossEntropy` (blocks that stay in cache), elsewhere by `_FusedSmoothedCrossEntropy`
    (PyTorch's fused log-softmax kernels, fewer passes over memory; docs/speed.md). The two agree
    to rounding.
    """
    if reduction not in ("sum", "mean"):
        raise ValueError(f"reduction must be 'sum' or 'mean', not {reduction!r}")
    V = logits.size(-1)
    exclude = sorted(set(int(i) for i in exclude))
    if any(not 0 <= i < V for i in exclude) or len(exclude) >= V:
        raise ValueError(f"exclude must name fewer than V = {V} classes in [0, V), not {exclude}")
    target = target.reshape(-1)
    function = _SmoothedCrossEntropy if logits.device.type == "cpu" else _FusedSmoothedCrossEntropy
    loss, nll = function.apply(logits.reshape(-1, V), target, float(epsilon), pad_id, tuple(exclude))
    if reduction == "mean":
        n = (target != pad_id).sum().clamp(min=1)
        loss, nll = loss / n, nll / n
    return loss, nll


def _row_blocks(logits: Tensor, dtype: torch.dtype) -> tuple[range, int, Tensor]:
    """Row starts and size of blocks small enough for their fp32 copy to stay in the CPU's cache
    (4 MiB), or larger on a GPU (fewer kernel launches), and one work buffer that every block
    reuses: every op below works in place in it, because fresh megabytes per block cost page
    faults that took longer than the arithmetic."""
    elements = 2**20 if logits.device.type == "cpu" else 2**25
    rows = min(logits.size(0), max(1, elements // max(1, logits.size(1))))
    return range(0, logits.size(0), rows), rows, torch.empty(rows, logits.size(1), dtype=dtype, device=logits.device)


class _SmoothedCrossEntropy(torch.autograd.Function):
    """Summed label-smoothed loss and nll of (N, V) logits, fp32, and their exact gradient."""

    @staticmethod
    def forward(ctx, logits: Tensor, target: Tensor, epsilon: float, pad_id: int, exclude: tuple[int, ...]):
        N, V = logits.shape
        dtype = torch.promote_types(logits.dtype, torch.float32)  # bf16/fp16 -> fp32; fp64 stays
        lse = torch.empty(N, dtype=dtype, device=logits.device)
        target_logit, mean_logit = torch.empty_like(lse), torch.empty_like(lse)
        starts, rows, buf = _row_blocks(logits, dtype)
        for s in starts:
            sl = slice(s, s + rows)
            z = buf[: logits[sl].size(0)]
            z.copy_(logits[sl])
            target_logit[sl] = z.gather(1, target[sl, None]).squeeze(1)
            total = z.sum(dim=-1)
            if exclude:
                total -= z[:, list(exclude)].sum(dim=-1)
            mean_logit[sl] = total.div_(V - len(exclude))
            m = z.amax(dim=-1, keepdim=True)
            lse[sl] = z.sub_(m).exp_().sum(dim=-1).log_().add_(m.squeeze(1))  # log sum exp, stably
        keep = target != pad_id
        nll = lse - target_logit
        loss = (1.0 - epsilon) * nll + epsilon * (lse - mean_logit)
        # torch.where, not masked_select: no data-dependent shape, so no host-device sync on CUDA
        zero = lse.new_zeros(())
        ctx.save_for_backward(logits, target, lse, keep)
        ctx.epsilon, ctx.exclude = epsilon, exclude
        return torch.where(keep, loss, zero).sum(), torch.where(keep, nll, zero).sum()

    @staticmethod
    def backward(ctx, grad_loss: Tensor, grad_nll: Tensor):
        logits, target, lse, keep = ctx.saved_tensors
        eps, exclude = ctx.epsilon, list(ctx.exclude)
        K = logits.size(1) - len(exclude)
        # d loss / dz = softmax(z) - (1 - eps) onehot - eps / K [not excluded];
        # d nll / dz = softmax(z) - onehot
        a = (grad_loss + grad_nll).to(lse.dtype)  # the softmax's coefficient
        b = (grad_loss * (1.0 - eps) + grad_nll).to(lse.dtype)  # the one-hot's
        c = (grad_loss * (eps / K)).to(lse.dtype)  # the uniform's
        grad = torch.empty_like(logits)
        starts, rows, buf = _row_blocks(logits, lse.dtype)
        for s in starts:
            sl = slice(s, s + rows)
            g = buf[: logits[sl].size(0)]
            g.copy_(logits[sl]).sub_(lse[sl, None]).exp_().mul_(a).sub_(c)
            if exclude:
                g[:, exclude] += c  # no uniform share on the excluded classes
            g.scatter_add_(1, target[sl, None], (-b).expand(g.size(0), 1))
            g.mul_(keep[sl, None])  # padding positions: no gradient
            grad[sl] = g
        return grad, None, None, None, None


class _FusedSmoothedCrossEntropy(torch.autograd.Function):
    """`_SmoothedCrossEntropy`'s loss, nll and gradient through PyTorch's fused log-softmax kernels,
    for devices other than the CPU, where every pass over the (N, V) logits goes to memory: forward
    `log_softmax` and a sum; backward the gradient with respect to the log-probabilities written
    once (-eps/K on the classes not excluded, minus (1 - eps) more at the target, zero on padding
    rows) and `_log_softmax_backward_data` (g - softmax * rowsum(g)), the log-probabilities
    recomputed rather than kept: fewer passes than the blocked loss (docs/speed.md, "The GPU
    command"), which is the faster on the CPU."""

    @staticmethod
    def forward(ctx, logits: Tensor, target: Tensor, epsilon: float, pad_id: int, exclude: tuple[int, ...]):
        N, V = logits.shape
        dtype = torch.promote_types(logits.dtype, torch.float32)
        nll, smooth = (
            torch.empty(N, dtype=dtype, device=logits.device),
            torch.empty(N, dtype=dtype, device=logits.device),
        )
        starts, rows, z_buf = _row_blocks(logits, dtype)
        excluded, K = list(exclude), V - len(exclude)
        for s in starts:
            sl = slice(s, s + rows)
            z = z_buf[: logits[sl].size(0)]
            torch.log_softmax(logits[sl], -1, dtype=dtype, out=z)  # log-probabilities, one pass
            nll[sl] = z.gather(1, target[sl, None]).squeeze(1).neg_()
            total = z.sum(dim=-1)
            if excluded:
                total -= z[:, excluded].sum(dim=-1)
            smooth[sl] = total.div_(-K)  # lse - mean of the logits not excluded
        keep = target != pad_id
        loss = (1.0 - epsilon) * nll + epsilon * smooth
        zero = nll.new_zeros(())
        ctx.save_for_backward(logits, target, keep)
        ctx.epsilon, ctx.exclude = epsilon, exclude
        return torch.where(keep, loss, zero).sum(), torch.where(keep, nll, zero).sum()

    @staticmethod
    def backward(ctx, grad_loss: Tensor, grad_nll: Tensor):
        logits, target, keep = ctx.saved_tensors
        eps, excluded = ctx.epsilon, list(ctx.exclude)
        K = logits.size(1) - len(excluded)
        dtype = torch.promote_types(logits.dtype, torch.float32)
        # d/d log-probabilities: -(b onehot + c [not excluded]) on kept rows; log-softmax's backward
        # adds softmax * (b + c K) = softmax * (grad_loss + grad_nll), as the blocked loss has it
        b = (grad_loss * (1.0 - eps) + grad_nll).to(dtype) * keep.to(dtype)
        c = (grad_loss * (eps / K)).to(dtype) * keep.to(dtype)
        grad = torch.empty_like(logits)
        starts, rows, z_buf = _row_blocks(logits, dtype)
        g_buf = torch.empty_like(z_buf)
        for s in starts:
            sl = slice(s, s + rows)
            z, g = z_buf[: logits[sl].size(0)], g_buf[: logits[sl].size(0)]
            torch.log_softmax(logits[sl], -1, dtype=dtype, out=z)
            g.copy_(c[sl, None].neg().expand_as(g))
            if excluded:
                g[:, excluded] = 0
            g.scatter_add_(1, target[sl, None], b[sl, None].neg())
            # input_dtype fp32, as g and z: CUDA fuses the cast for fp16 only and rejects bf16 there
            grad[sl] = torch_ops.log_softmax_backward(g, z, 1, dtype)
        return grad, None, None, None, None
