"""Decoding: stepping the model through its cache (Section 6.1).

`greedy_decode` is the beam-1 case. Maximum output length is input length + `max_len_offset`
(the paper: 50; parsing: 300), terminating early when every sentence has emitted EOS.
"""

from __future__ import annotations

from dataclasses import dataclass

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
    cache = model.init_cache(memory, src_mask)
    alive = torch.arange(B, device=src.device)  # original row of each cache row
    last = torch.full((B, 1), bos_id, dtype=torch.long, device=src.device)
    outputs: list[list[int]] = [[] for _ in range(B)]
    for t in range(int(max_lens.max())):
        logits = model.decode_step(last, cache)[:, -1]  # (b, V)
        logits[:, [pad_id, bos_id]] = float("-inf")  # never real output tokens
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


def length_penalty(length: Tensor | float, alpha: float) -> Tensor | float:
    """GNMT's length penalty lp(Y) = ((5 + |Y|) / 6)^alpha (Wu et al. 2016), the one the paper
    cites in 6.1 (alpha = 0.6; parsing 0.3). Not |Y|^alpha, which fairseq, Marian and Hugging
    Face use. |Y| counts the tokens generated including EOS, as tensor2tensor (the paper's code)
    does."""
    return ((5.0 + length) / 6.0) ** alpha


def _top_log_probs(logits: Tensor, n: int, banned: list[int], eos_id: int, chunk: int = 16,
                   allowed: Tensor | None = None):
    """Per row of logits (rows, V): the n best log-probabilities (fp32, log-softmax over all V;
    `banned` tokens then excluded without renormalising) with their tokens, and EOS's
    log-probability. Rows go `chunk` at a time, so that the fp32 log-probabilities of a chunk
    stay in cache instead of a (rows, V) fp32 copy making a round trip through memory.
    `allowed` (rows, V) bool: a constraint's choice; the others are excluded too (EOS included)."""
    top_lp, top_token, eos_lp = [], [], []
    masks = allowed.split(chunk) if allowed is not None else [None] * len(logits.split(chunk))
    for part, mask in zip(logits.split(chunk), masks):
        lprobs = torch.log_softmax(part, dim=-1, dtype=torch.float32)
        if mask is not None:
            lprobs.masked_fill_(~mask, float("-inf"))
        eos_lp.append(lprobs[:, eos_id])
        lprobs[:, banned] = float("-inf")  # PAD and BOS are never real output tokens
        values, tokens = _topk(lprobs, n)
        top_lp.append(values)
        top_token.append(tokens)
    return torch.cat(top_lp), torch.cat(top_token), torch.cat(eos_lp)


def _topk(x: Tensor, n: int, block: int = 64) -> tuple[Tensor, Tensor]:
    """`x.topk(n, dim=-1)` for (rows, V), about 2x faster for a large V: the n largest values lie
    in the n full blocks (of `block` columns) with the largest maxima, or in the short tail when V
    is not a multiple of `block`, so only those columns are searched. Exact in the values, with n
    distinct columns per row; among equal values the columns chosen may differ from `topk`'s."""
    rows, V = x.shape
    nb = V // block
    if nb < 4 * n:
        return x.topk(n, dim=-1)
    full = nb * block
    block_max = x[:, :full].view(rows, nb, block).amax(-1)
    best_blocks = block_max.topk(n, dim=-1).indices  # (rows, n)
    cols = (best_blocks[:, :, None] * block + torch.arange(block, device=x.device)).view(rows, -1)
    if full < V:  # the tail (< block columns) is always a candidate: no column appears twice
        cols = torch.cat([cols, torch.arange(full, V, device=x.device).expand(rows, -1)], 1)
    values, i = x.gather(1, cols).topk(n, dim=-1)
    return values, cols.gather(1, i)


@dataclass
class Hypothesis:
    tokens: list[int]
    """Output token ids, without BOS and EOS."""
    score: float
    """log P(Y|X) / lp(Y): the length-normalised score the search ranks by."""
    logprob: float
    """log P(Y|X), including EOS."""


@torch.no_grad()
def beam_search(
    model,
    src: Tensor,
    *,
    beam_size: int = 4,
    alpha: float = 0.6,
    max_len_offset: int = 50,
    n_best: int = 1,
    bos_id: int = 2,
    eos_id: int = 3,
    early_stop: bool = True,
    constraint=None,
) -> list[list[Hypothesis]]:
    """Batched beam search (Section 6.1): "beam search with a beam size of 4 and length penalty
    alpha = 0.6 ... maximum output length ... input length + 50, but terminate early when
    possible."

    src (B, S) right-padded. Each sentence keeps `beam_size` live hypotheses and up to
    `beam_size` finished ones, as in tensor2tensor's beam search:

    * each step extends every live hypothesis by every token and keeps the 2k best extensions by
      log-probability, so that k of them can still be live if the others end in EOS;
    * extensions ending in EOS join the finished set, scored log P / lp(|Y|);
    * the maximum output length (tokens generated including EOS) is the source length (its real
      tokens, including its EOS) + `max_len_offset`; at that length only EOS may follow;
    * a sentence stops early when k hypotheses have finished and no live one can still beat the
      worst of them: the best a live hypothesis can reach is its current log-probability (it can
      only fall) over the largest penalty, lp(max length), for alpha >= 0;
    * finished sentences leave the batch (and the cache), so later steps do less work;
    * PAD and BOS are never generated (their probability mass is not renormalised away).

    `model` needs `config.pad_id`, `encode(src, src_mask)`, `init_cache(memory, src_mask)`
    and `decode_step(tokens, cache)` (logits); the cache needs `repeat_rows(k)` and
    `reorder(index, same_sources)`.
    Returns, per sentence, the `n_best` best finished hypotheses, best first.
    `early_stop=False` searches to the maximum length (for testing that stopping early is exact).
    `constraint`: an object that restricts the symbols each hypothesis may take next, with
    `start(src, k)`, `allowed(state)` -> (b, k, V) bool and `advance(state, parent, token)`, and
    states with `select(keep)` (e.g. `transduce.parsing.constrain.TreeConstraint`: only
    well-formed trees; not in the paper). None: the paper's free search.
    """
    if not 1 <= n_best <= beam_size:
        raise ValueError(f"n_best must be between 1 and beam_size ({beam_size}), not {n_best}")
    k, device = beam_size, src.device
    B = src.size(0)
    src_mask = padding_mask(src, model.config.pad_id)
    max_lens = (src_mask.sum(dim=(1, 2, 3)) + max_len_offset).to(device)  # (B,)
    T = int(max_lens.max())
    memory = model.encode(src, src_mask)
    cache = model.init_cache(memory, src_mask)

    # Live hypotheses of the sentences still searched (`active` maps rows to sentences).
    active = torch.arange(B, device=device)
    alive_seq = torch.full((B, k, 1), bos_id, dtype=torch.long, device=device)
    alive_lp = torch.full((B, k), float("-inf"), device=device)
    alive_lp[:, 0] = 0.0  # one initial hypothesis, not k copies of it
    # Finished hypotheses of every sentence.
    fin_seq = torch.full((B, k, T + 1), eos_id, dtype=torch.long, device=device)
    fin_score = torch.full((B, k), float("-inf"), device=device)
    fin_lp = torch.full((B, k), float("-inf"), device=device)
    banned = [model.config.pad_id, bos_id]
    cstate = constraint.start(src, k) if constraint is not None else None

    for t in range(T):  # t + 1 = tokens generated so far including this step's
        b = active.numel()
        allowed = None
        if t == 0:  # the k beams of a sentence are still one hypothesis: decode it once
            logits = model.decode_step(alive_seq[:, 0, -1:], cache)[:, -1]  # (B, V)
            cache.repeat_rows(k)  # B -> B*k rows; the source side stays one row per sentence
            if constraint is not None:
                allowed = constraint.allowed(cstate)[:, 0]  # (B, V)
        else:
            logits = model.decode_step(alive_seq[:, :, -1].reshape(b * k, 1), cache)[:, -1]  # (b*k, V)
            if constraint is not None:
                allowed = constraint.allowed(cstate).reshape(b * k, -1)  # (b*k, V)
        # The best 2k extensions of a sentence are among the 2k best tokens of each of its beams:
        # only those are ranked (exact; a top-k over k*V would cost more).
        n = min(2 * k, logits.size(-1))
        top_lp, top_token, eos_lp = _top_log_probs(logits, n, banned, eos_id, allowed=allowed)  # (rows, n), (rows, n), (rows,)
        at_max = t + 1 >= max_lens[active]  # (b,): only EOS may follow
        if at_max.any():
            rows_at_max = at_max if t == 0 else at_max.repeat_interleave(k)
            only_eos = torch.full_like(top_lp, float("-inf"))
            only_eos[:, 0] = eos_lp
            top_lp = torch.where(rows_at_max[:, None], only_eos, top_lp)
            top_token = torch.where(rows_at_max[:, None], torch.full_like(top_token, eos_id), top_token)
        if t == 0:
            top_lp, top_token = top_lp.repeat_interleave(k, dim=0), top_token.repeat_interleave(k, dim=0)
        cand = (alive_lp[:, :, None] + top_lp.view(b, k, n)).view(b, k * n)  # (b, k*n)
        cand_lp, cand_idx = cand.topk(min(2 * k, k * n), dim=-1)  # (b, 2k)
        beam_idx, token = cand_idx // n, top_token.view(b, k * n).gather(1, cand_idx)
        cand_seq = torch.cat([alive_seq.gather(1, beam_idx[:, :, None].expand(-1, -1, t + 1)), token[:, :, None]], 2)
        is_eos = token == eos_id

        # Finished: merge the EOS extensions into the k best finished so far.
        lp_t = length_penalty(float(t + 1), alpha)
        new_score = torch.where(is_eos, cand_lp / lp_t, torch.full_like(cand_lp, float("-inf")))
        pad_len = T + 1 - (t + 2)
        new_seq = torch.nn.functional.pad(cand_seq, (0, pad_len), value=eos_id)
        all_score = torch.cat([fin_score[active], new_score], 1)
        all_lp = torch.cat([fin_lp[active], torch.where(is_eos, cand_lp, torch.full_like(cand_lp, float("-inf")))], 1)
        all_seq = torch.cat([fin_seq[active], new_seq], 1)
        top_score, top_i = all_score.topk(k, dim=-1)
        fin_score[active] = top_score
        fin_lp[active] = all_lp.gather(1, top_i)
        fin_seq[active] = all_seq.gather(1, top_i[:, :, None].expand(-1, -1, T + 1))

        # Live: the k best extensions that did not end in EOS.
        live_lp = torch.where(is_eos, torch.full_like(cand_lp, float("-inf")), cand_lp)
        alive_lp, live_i = live_lp.topk(k, dim=-1)  # (b, k)
        alive_seq = cand_seq.gather(1, live_i[:, :, None].expand(-1, -1, t + 2))
        parent = beam_idx.gather(1, live_i)  # (b, k): which old beam each new one extends
        if constraint is not None:
            cstate = constraint.advance(cstate, parent, alive_seq[:, :, -1])

        # Early termination, per sentence.
        bound = alive_lp[:, 0] / length_penalty(max_lens[active].float(), alpha)
        done = (fin_score[active, -1] > float("-inf")) & (bound < fin_score[active, -1]) & early_stop
        done |= t + 1 >= max_lens[active]
        done |= alive_lp[:, 0] == float("-inf")  # nothing live left
        keep = (~done).nonzero().squeeze(1)
        if keep.numel() == 0:
            break
        rows = (keep[:, None] * k + parent[keep]).view(-1)  # cache rows to keep, in new beam order
        cache.reorder(rows, same_sources=keep.numel() == b)  # no sentence left: sources unchanged
        active, alive_seq, alive_lp = active[keep], alive_seq[keep], alive_lp[keep]
        if constraint is not None:
            cstate = cstate.select(keep)

    results: list[list[Hypothesis]] = []
    for i in range(B):
        hyps = []
        for j in range(n_best):
            if fin_score[i, j] == float("-inf"):
                break
            seq = fin_seq[i, j, 1:].tolist()  # drop BOS
            seq = seq[: seq.index(eos_id)] if eos_id in seq else seq
            hyps.append(Hypothesis(seq, fin_score[i, j].item(), fin_lp[i, j].item()))
        results.append(hyps)
    return results
