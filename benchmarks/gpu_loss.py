"""The label-smoothed loss through PyTorch's fused log-softmax kernels: an experiment for the next
GPU lease (`benchmarks/gpu.py --settings bf16-lsm-loss`), not part of transduce until a lease has
measured it.

Why: in 2026-11-27's profile of one base bf16 step on an H200 (docs/RESULTS.md) the elementwise
passes and reductions over the (tokens x 37,000) logits took some 35 of the step's 62 ms of
kernel time. `transduce.train.loss._SmoothedCrossEntropy` was written for the CPU: blocks that
stay in cache, each taken through ~11 single-purpose passes (copy to fp32, sum, max, subtract,
exp, sum; then copy, subtract, exp, multiply, subtract, scatter, mask, copy back): on a GPU every
pass goes to memory: counting each read or write of the fp32 logits as one, about 21.5 a step. `LogSoftmaxSmoothedCE` computes
the same loss and gradient with the fused kernels: forward `log_softmax` (reads the bf16 logits,
writes fp32) and one sum; backward the gradient with respect to the log-probabilities written
once (-eps/K on the classes that are not excluded, minus (1 - eps) at the target, zero on padding
rows) and `_log_softmax_backward_data` (grad - softmax * rowsum(grad)), the log-probabilities
recomputed rather than kept: about 13.5 (bf16 logits are converted to fp32 in a pass of
their own before each log-softmax: PyTorch fuses the conversion for fp16 only). On the CPU it is slower than the blocked loss
(3,000 x 37,000 bf16 logits, 2 threads: 246 against 172 ms, 2026-11-27), so the CPU keeps that.

The same arithmetic to rounding (tests/test_gpu_bench.py compares loss, nll and gradient).
"""

from __future__ import annotations

import contextlib

import torch
from torch import Tensor

from transduce.train import loss as loss_module
from transduce.train.loss import _row_blocks


class LogSoftmaxSmoothedCE(torch.autograd.Function):
    """Summed label-smoothed loss and nll of (N, V) logits, fp32; the drop-in for
    `transduce.train.loss._SmoothedCrossEntropy` (same arguments, same results)."""

    @staticmethod
    def forward(ctx, logits: Tensor, target: Tensor, epsilon: float, pad_id: int, exclude: tuple[int, ...]):
        N, V = logits.shape
        dtype = torch.promote_types(logits.dtype, torch.float32)
        nll, smooth = torch.empty(N, dtype=dtype, device=logits.device), torch.empty(N, dtype=dtype, device=logits.device)
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
            grad[sl] = torch._log_softmax_backward_data(g, z, 1, dtype)
        return grad, None, None, None, None


@contextlib.contextmanager
def lsm_loss():
    """Train with `LogSoftmaxSmoothedCE` in place of the blocked loss, for the duration."""
    blocked = loss_module._SmoothedCrossEntropy
    loss_module._SmoothedCrossEntropy = LogSoftmaxSmoothedCE
    try:
        yield
    finally:
        loss_module._SmoothedCrossEntropy = blocked
