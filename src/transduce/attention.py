"""Equation 1 (3.2.1), Attention(Q, K, V) = softmax(Q K^T / sqrt(d_k)) V, in one place: as the
paper writes it (`attention_reference`) and its faster forms, each tested against it, and the
two functions that pick one from what is computed and where (`step_attention` for a decoding
step's queries, `sequence_attention` for all others): the model's layers call those, so nothing
is set on a model to make it fast (docs/architecture.md). Shapes: q (B, h, Tq, d_k), k (B, h, Tk,
d_k), v (B, h, Tk, d_v); masks boolean, True = may attend."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor


def attention_reference(
    q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None, dropout_p: float = 0.0
) -> tuple[Tensor, Tensor]:
    """Equation 1 written out: the output (B, h, Tq, d_v) and the weights (B, h, Tq, Tk) before dropout."""
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))  # (B, h, Tq, Tk)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    weights = scores.softmax(dim=-1)
    dropped = F.dropout(weights, dropout_p) if dropout_p > 0 else weights
    return dropped @ v, weights


FUSED_MAX_HEADS = 64
"""Rows x heads up to which a step's self-attention takes the fused kernel without AMX (docs/speed.md)."""


def fused_step(rows: int, heads: int, keys_first: bool) -> bool:
    """Whether `decode_attention` gives one unmasked query per row of `rows` x `heads` to PyTorch's
    fused kernel: on one thread, with oneDNN's AMX (`keys_first`) or for at most `FUSED_MAX_HEADS`
    rows x heads (one sentence's beams), where it is the faster (docs/speed.md)."""
    return torch.get_num_threads() == 1 and (keys_first or rows * heads <= FUSED_MAX_HEADS)


def decode_attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None, keys_first: bool = False) -> Tensor:
    """A CPU decoding step's few queries: `product_attention`, or PyTorch's fused kernel for one
    unmasked query per row where `fused_step` says."""
    if q.size(2) == 1 and mask is None and fused_step(q.size(0), q.size(1), keys_first):
        return F.scaled_dot_product_attention(q, k, v)
    return product_attention(q, k, v, mask, keys_first)


def product_attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None, keys_first: bool = False) -> Tensor:
    """Plain matrix products, the scaling and softmax in fp32, no dropout. `keys_first` (where oneDNN
    runs AMX): one bf16 query's scores as K q^T, which reads the keys as stored (docs/speed.md)."""
    B, h, Tq, d = q.shape
    Tk = k.size(2)
    # 3-d batched products over B*h: a view for the cache's buffers, where a 4-d matmul copies them
    k3, v3, q3 = k.reshape(B * h, Tk, d), v.reshape(B * h, Tk, v.size(-1)), q.reshape(B * h, Tq, d)
    if Tq == 1 and k.dtype == torch.bfloat16 and keys_first:
        scores = torch.bmm(k3, q3.transpose(1, 2))
    else:
        scores = torch.bmm(q3, k3.transpose(1, 2))
    scores = scores.view(B, h, Tq, Tk).to(torch.float32).mul_(d**-0.5)  # a fresh tensor: in place is safe
    if mask is not None:
        scores.masked_fill_(~mask, float("-inf"))
    weights = scores.softmax(dim=-1).to(v.dtype).view(B * h, Tq, Tk)
    return torch.bmm(weights, v3).view(B, h, Tq, -1)


def autocast_attention(
    q: Tensor, k: Tensor, v: Tensor, attn_mask: Tensor | None = None, dropout_p: float = 0.0
) -> Tensor:
    """Training under bf16 autocast on the CPU: the scores in fp32 (as SDPA's math kernel), the
    second product in bf16; SDPA's arguments. On the CPU SDPA's flash kernel's bf16 backward is
    slow and its math kernel runs both products in fp32 (docs/speed.md, "CPU training")."""
    # fp32 copies laid out (B, h, T, d) contiguously: q and k come as views of (B, T, h, d), and a
    # copy that kept their strides would be copied again inside the batched product
    q32, k32 = (x.to(torch.float32, memory_format=torch.contiguous_format) for x in (q, k))
    with torch.autocast(q.device.type, enabled=False):
        scores = torch.matmul(q32, k32.transpose(-2, -1)).mul_(q.size(-1) ** -0.5)
    if attn_mask is not None:
        scores.masked_fill_(~attn_mask, float("-inf"))  # a fresh tensor: in place is safe
    weights = scores.softmax(dim=-1)
    if dropout_p > 0:
        weights = F.dropout(weights, dropout_p)
    return torch.matmul(weights.to(v.dtype), v)


def fold_beams(q: Tensor, group: int) -> Tensor:
    """(R, h, n, d) -> (R / group, h, group * n, d): `group` rows sharing one row of keys as its queries."""
    if group == 1:
        return q
    R, h, n, d = q.shape
    return q.view(R // group, group, h, n, d).transpose(1, 2).reshape(R // group, h, group * n, d)


def concat_heads(out: Tensor, group: int = 1) -> Tensor:
    """Concat(head_1, ..., head_h) (3.2.2), `fold_beams` undone in the same copy: -> (R, n, h * d_v)."""
    rows, h, gn, d = out.shape
    if group == 1:
        return out.transpose(1, 2).reshape(rows, gn, h * d)
    n = gn // group
    return out.view(rows, h, group, n, d).permute(0, 2, 3, 1, 4).reshape(rows * group, n, h * d)


def step_attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None, keys_first: bool = False) -> Tensor:
    """A decoding step's queries (no dropout): on the CPU `decode_attention` (`keys_first`: the
    scores as K q^T, where oneDNN runs AMX: `cache.LayerCache.keys_first` says), elsewhere
    PyTorch's fused kernel."""
    if q.device.type == "cpu":
        return decode_attention(q, k, v, mask, keys_first)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


def sequence_attention(
    q: Tensor, k: Tensor, v: Tensor, attn_mask: Tensor | None = None, dropout_p: float = 0.0
) -> Tensor:
    """Every other call (whole sequences, training): PyTorch's fused kernel, or on the CPU under
    bf16 autocast `autocast_attention` (fp32 scores, the fused kernel's bf16 backward being slow there)."""
    if (
        q.device.type == "cpu"
        and torch.is_autocast_enabled("cpu")
        and torch.get_autocast_dtype("cpu") == torch.bfloat16
    ):
        return autocast_attention(q, k, v, attn_mask, dropout_p)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, dropout_p=dropout_p)
