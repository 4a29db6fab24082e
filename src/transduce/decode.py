"""Decoding: stepping the model through its cache (Section 6.1).

`greedy_decode` is the beam-1 case. Maximum output length is input length + `max_len_offset`
(the paper: 50; parsing: 300), terminating early when every sentence has emitted EOS.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .model import Transformer, padding_mask


@torch.no_grad()
def greedy_decode(
    model: Transformer,
    src: Tensor,
    *,
    bos_id: int = 2,
    eos_id: int = 3,
    max_len_offset: int = 50,
) -> list[list[int]]:
    """Greedy search for a batch of right-padded sources (B, S). Returns, per sentence, the output
    token ids without BOS/EOS. Sentences that have finished are dropped from the batch (and from
    the cache), so the work per step shrinks as they finish."""
    pad_id = model.config.pad_id
    src_mask = padding_mask(src, pad_id)
    memory = model.encode(src, src_mask)
    max_lens = src_mask.sum(dim=(1, 2, 3)) + max_len_offset  # (B,) input length + b
    B = src.size(0)
    cache = model.init_cache(memory, src_mask, capacity=min(int(max_lens.max()) + 1, 256))
    alive = torch.arange(B, device=src.device)  # original row of each cache row
    last = torch.full((B, 1), bos_id, dtype=torch.long, device=src.device)
    outputs: list[list[int]] = [[] for _ in range(B)]
    for t in range(int(max_lens.max())):
        logits = model.decode_step(last, cache)[:, -1]  # (b, V)
        nxt = logits.argmax(dim=-1)
        done = (nxt == eos_id) | (t + 1 >= max_lens[alive])
        for row, tok, d in zip(alive.tolist(), nxt.tolist(), done.tolist()):
            if tok != eos_id:
                outputs[row].append(tok)
        if done.all():
            break
        if done.any():  # drop finished sentences from the batch and the cache
            keep = (~done).nonzero().squeeze(1)
            cache.reorder(keep)
            alive, nxt = alive[keep], nxt[keep]
        last = nxt[:, None]
    return outputs
