"""Restricted self-attention (Section 4, Table 1's fourth row), an option off by default
(`ModelConfig.attention_window` r): each position attends only to the positions within r of it,
and in the decoder to itself and the r before it. Masks in the convention of `transduce.masks`
(True = may attend); `Encoder` and `Decoder` narrow their self-attention masks with `within_window`;
encoder-decoder attention stays full. Measured beside the other layer types: docs/table1.md."""

from __future__ import annotations

import torch
from torch import Tensor


def window_mask(q_len: int, k_len: int | None = None, window: int = 0, device: torch.device | None = None) -> Tensor:
    """(1, 1, q_len, k_len): query i may attend key j iff |i + (k_len - q_len) - j| <= window
    (offsets as in `causal_mask`)."""
    k_len = q_len if k_len is None else k_len
    q_pos = torch.arange(k_len - q_len, k_len, device=device)[:, None]
    k_pos = torch.arange(k_len, device=device)[None, :]
    return ((q_pos - k_pos).abs() <= window)[None, None]


def within_window(
    mask: Tensor | None, window: int | None, q_len: int, k_len: int, device: torch.device | None = None
) -> Tensor | None:
    """A self-attention mask restricted to `window_mask` (unchanged where `window` is None, the
    paper). A query whose window holds no key `mask` allows (only a padding query, whose output
    is ignored) keeps its row of `mask`, so that no row of the scores is empty."""
    if window is None:
        return mask
    band = window_mask(q_len, k_len, window, device)
    if mask is None:
        return band
    restricted = mask & band
    return restricted | (mask & ~restricted.any(-1, keepdim=True))
