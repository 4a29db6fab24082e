"""The masks of every attention, built in one place (docs/masks.md).

Every mask is a **boolean tensor, True = may attend**, broadcastable to the scores' shape
(B, h, T_query, T_key), the convention of `scaled_dot_product_attention` (PyTorch's
`nn.Transformer` has the opposite: docs/masks.md). `make_masks` builds a batch's:

    src_mask  (B, 1, 1, S)  = padding_mask(src, pad)                  encoder self-attn, cross-attn
    tgt_mask  (B, 1, T, T)  = causal_mask(T) & padding_mask(tgt, pad)  decoder self-attn

Query positions that are padding are never masked: their outputs are computed and ignored (the
loss skips them), so every row of the scores has an allowed key. Section 4's restricted
self-attention narrows these further (`transduce.restricted`).
"""

from __future__ import annotations

import torch
from torch import Tensor


def padding_mask(tokens: Tensor, pad_id: int) -> Tensor:
    """(B, L) tokens -> (B, 1, 1, L): True where a key position holds a real token."""
    return (tokens != pad_id)[:, None, None, :]


def causal_mask(q_len: int, k_len: int | None = None, device: torch.device | None = None) -> Tensor:
    """(1, 1, q_len, k_len): query i may attend key j iff j <= i + (k_len - q_len) (3.1: "prevent
    positions from attending to subsequent positions"); with k_len > q_len the queries are the last
    q_len of k_len positions (incremental decoding with a cache of k_len - q_len earlier ones)."""
    k_len = q_len if k_len is None else k_len
    q_pos = torch.arange(k_len - q_len, k_len, device=device)[:, None]
    k_pos = torch.arange(k_len, device=device)[None, :]
    return (k_pos <= q_pos)[None, None]


def make_masks(src: Tensor, tgt: Tensor | None, pad_id: int) -> tuple[Tensor, Tensor | None]:
    """Source mask (B, 1, 1, S) and target mask (B, 1, T, T) from padded token batches. The
    decoder's first input, its start token, is always a key, also where the start token is the
    padding id (Marian's models start with PAD; `ModelConfig.bos_id`)."""
    src_mask = padding_mask(src, pad_id)
    if tgt is None:
        return src_mask, None
    keys = padding_mask(tgt, pad_id)
    keys[..., 0] = True
    tgt_mask = causal_mask(tgt.size(1), device=tgt.device) & keys
    return src_mask, tgt_mask
