"""Label-smoothed cross-entropy (Section 5.4), a pure function of logits and targets."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor


def label_smoothed_nll(
    logits: Tensor, target: Tensor, epsilon: float, pad_id: int = 0, reduction: str = "sum"
) -> tuple[Tensor, Tensor]:
    """Cross-entropy against the smoothed distribution q = (1 - eps) * onehot + eps / V
    (Section 5.4, "label smoothing of value eps_ls = 0.1"; Szegedy et al. 2016).

    logits (B, T, V), target (B, T). Padding positions (target == pad_id) contribute nothing.
    Returns (loss, nll): the smoothed loss that is optimised and the plain negative
    log-likelihood of the targets (for perplexity), both summed over non-pad tokens by default
    (`reduction='sum'`), or averaged over them (`'mean'`).

    The uniform part spreads eps over all V classes including the target itself, which is what
    `torch.nn.functional.cross_entropy(label_smoothing=eps)` computes too.
    """
    # fp32 even for bf16/fp16 logits, without materialising an fp32 copy of the logits
    lprobs = F.log_softmax(logits, dim=-1, dtype=torch.float32)
    keep = target != pad_id
    nll = -lprobs.gather(-1, target.unsqueeze(-1)).squeeze(-1)  # (B, T)
    smooth = -lprobs.sum(dim=-1) / lprobs.size(-1)  # (B, T): cross-entropy against the uniform
    # distribution (sum, then divide the (B, T) result: cheaper backward than mean over V)
    loss = (1.0 - epsilon) * nll + epsilon * smooth
    # torch.where, not masked_select: no data-dependent shape, so no host-device sync on CUDA
    zero = lprobs.new_zeros(())
    loss, nll = torch.where(keep, loss, zero).sum(), torch.where(keep, nll, zero).sum()
    if reduction == "mean":
        n = keep.sum().clamp(min=1)
        loss, nll = loss / n, nll / n
    elif reduction != "sum":
        raise ValueError(f"reduction must be 'sum' or 'mean', not {reduction!r}")
    return loss, nll
