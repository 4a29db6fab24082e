"""Speed-ups for training on the CPU, applied to a built `transduce.model.Transformer` from the
outside (`transduce.train.step.prepare_for_training`): the same dropout (5.4), computed faster,
and glibc's memory kept for reuse (docs/speed.md, "CPU training"); equation 1's bf16 training form
is `attention.sequence_attention`'s choice."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..memory import glibc


class BitDropout(nn.Module):
    """Dropout (5.4, Srivastava et al. 2014): in training, each element is zeroed with probability
    p and the rest scaled by 1 / (1 - p); the identity in eval mode.

    On the CPU the mask comes from 15 random bits per element, four elements per 64-bit draw of
    the default generator, instead of `bernoulli_`'s one draw per element; p is thereby rounded to
    a multiple of 2^-15 (0.1 becomes 0.1000061). Elsewhere `F.dropout`. Its random stream is not
    `nn.Dropout`'s: a seeded run repeats bit for bit only with the same choice.
    """

    def __init__(self, p: float):
        super().__init__()
        if not 0.0 <= p < 1.0:
            raise ValueError(f"dropout probability must be in [0, 1), not {p}")
        self.p = p

    def forward(self, x: Tensor) -> Tensor:
        if not self.training or self.p == 0.0:
            return x
        if x.device.type != "cpu":
            return F.dropout(x, self.p, True)
        n = x.numel()
        bits = torch.empty((n + 3) // 4, dtype=torch.int64).random_()  # 63 random bits each
        r = bits.view(torch.int16)[:n].view(x.shape) & 0x7FFF  # 15 random bits an element: 0..32767
        # keep = r >= threshold, as 1/0 in int16: r - threshold is negative exactly where the element
        # is dropped, and its arithmetic shift by 15 is then -1, else 0. The same mask as a comparison,
        # whose bool result converts to bf16 several times slower than int16 does (unvectorised).
        keep = r.sub_(round(self.p * 32768)).bitwise_right_shift_(15).add_(1)
        return x * keep.to(x.dtype).mul_(1.0 / (1.0 - self.p))

    def extra_repr(self) -> str:
        """p, as `nn.Dropout` prints it."""
        return f"p={self.p}"


def keep_freed_memory() -> bool:
    """glibc: serve every allocation from the heap and keep what is freed there for reuse, not map
    each large block afresh (a page fault at each first touch) for the same tensors every step
    (docs/speed.md, "CPU threads and workers"); the process keeps its peak memory, which the next
    step needs anyway. Returns whether it took (elsewhere nothing changes)."""
    libc, m_trim_threshold, m_mmap_max = glibc(), -1, -4  # malloc.h
    return libc is not None and bool(libc.mallopt(m_mmap_max, 0)) and bool(libc.mallopt(m_trim_threshold, 2**31 - 1))


def fast_dropout(model: nn.Module) -> int:
    """Replace every `nn.Dropout` in `model` by a `BitDropout` of the same p (in place; `state_dict`
    is unchanged), before the first step. Returns how many were replaced."""
    swaps = [
        (parent, name, child)
        for parent in model.modules()
        for name, child in parent.named_children()
        if isinstance(child, nn.Dropout)
    ]
    for parent, name, child in swaps:
        setattr(parent, name, BitDropout(child.p).train(child.training))
    return len(swaps)
