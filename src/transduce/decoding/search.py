"""Decoding: stepping the model through its cache (Section 6.1). `greedy_decode` is the beam-1
case, `beam_search` the paper's (`prefill`, then `beam_step` per output token, as gpt-fast names
the phases; each step's best extensions ranked by `transduce.decoding.ranking`). Output length is
at most input length + `max_len_offset` (the paper: 50).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from ..defaults import ALPHA, BEAM, MAX_LEN_OFFSET
from ..masks import padding_mask
from ..model import Transformer
from .ranking import ProjectedRows, _best_extensions


@torch.no_grad()
def greedy_decode(
    model: Transformer,
    src: Tensor,
    *,
    bos_id: int | None = None,
    eos_id: int | None = None,
    max_len_offset: int = MAX_LEN_OFFSET,
    vocab: Tensor | None = None,
) -> list[list[int]]:
    """Greedy search for a batch of right-padded sources (B, S): per sentence, the output ids
    without BOS/EOS (by default the model's, `config.bos_id`, `config.eos_id`). Finished sentences
    leave the batch and the cache. `vocab` (not in the paper): the sorted target ids `model`'s
    logits are over, a shortlist's (`transduce.decoding.shortlist`), where not the whole vocabulary."""
    pad_id, bos_id, eos_id = _special_ids(model, bos_id, eos_id)
    banned = _local(vocab, [pad_id, bos_id])
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
        logits[:, banned] = float("-inf")  # never real output tokens
        nxt = logits.argmax(dim=-1) if vocab is None else vocab[logits.argmax(dim=-1)]
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


def _local(vocab: Tensor | None, ids: list[int]) -> list[int]:
    """The columns of `ids` in logits over the sorted target ids `vocab` (all of them where None;
    an id not in `vocab` has none)."""
    if vocab is None:
        return ids
    at = torch.searchsorted(vocab, torch.tensor(ids, device=vocab.device)).clamp_max(vocab.numel() - 1)
    return [int(i) for i, x in zip(at.tolist(), ids) if int(vocab[i]) == x]


def _special_ids(model, bos_id: int | None, eos_id: int | None) -> tuple[int, int, int]:
    """(pad, start, end) of a search: the model's (`ModelConfig.special_ids`) where not given, read once per batch."""
    c = model.config
    return c.pad_id, c.bos_id if bos_id is None else bos_id, c.eos_id if eos_id is None else eos_id


LENGTH_PENALTIES = ("paper", "hf")
"""6.1's GNMT penalty, or Hugging Face generate's |Y|^alpha (not the paper: to decode as OPUS-MT's users
do; `beam_search` then also searches as generate does: only the k best extensions of a step may
finish, and the EOS forced at the length limit (OPUS-MT's forced_eos_token_id) costs nothing)."""


def length_penalty(length: Tensor | float, alpha: float, kind: str = "paper") -> Tensor | float:
    """GNMT's length penalty lp(Y) = ((5 + |Y|) / 6)^alpha (Wu et al. 2016), the one 6.1 cites
    (not fairseq's |Y|^alpha); |Y| counts the tokens generated including EOS, as tensor2tensor.
    `kind` "hf" (not the paper): |Y|^alpha, Hugging Face generate's (|Y| counting EOS there too)."""
    return length**alpha if kind == "hf" else ((5.0 + length) / 6.0) ** alpha


@dataclass
class Hypothesis:
    """One output of the search for one source sentence."""

    tokens: list[int]  # Output token ids, without BOS and EOS
    score: float  # log P(Y|X) / lp(Y): the length-normalised score the search ranks by (nan for greedy)
    logprob: float  # log P(Y|X), including EOS (nan for greedy)
    text: str = ""  # The detokenized output, once a vocabulary has decoded `tokens` (`transduce.decoding.translate`)


@torch.no_grad()
def beam_search(
    model,
    src: Tensor,
    *,
    beam_size: int = BEAM,
    alpha: float = ALPHA,
    max_len_offset: int = MAX_LEN_OFFSET,
    n_best: int = 1,
    bos_id: int | None = None,
    eos_id: int | None = None,
    early_stop: bool = True,
    constraint=None,
    penalty: str = "paper",
    vocab: Tensor | None = None,
) -> list[list[Hypothesis]]:
    """Batched beam search (Section 6.1: beam 4, alpha 0.6, "maximum output length ... input
    length + 50, but terminate early when possible"). src (B, S) right-padded. Each sentence keeps k = `beam_size` live hypotheses and up to k
    finished ones, as in tensor2tensor:

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

    `model`: `config.pad_id`, `.bos_id`, `.eos_id` (the start and end tokens unless `bos_id`, `eos_id`
    are given), `encode`, `init_cache`, `decode_step`; its cache: `repeat_rows`, `reorder`.
    Returns, per sentence, the `n_best` best finished hypotheses, best first. `early_stop=False`
    searches to the maximum length (testing that stopping early is exact). `constraint` (not in
    the paper) restricts each hypothesis's next symbols: `start(src, k)`, `allowed(state)` ->
    (b, k, V) bool, `advance(state, parent, token)`, states with `select(keep)` (e.g.
    `transduce.parsing.constrain.TreeConstraint`). `penalty`: `length_penalty`'s kind. `vocab` (not
    in the paper): the sorted target ids `model`'s logits are over, a shortlist's
    (`transduce.decoding.shortlist`), where not the whole vocabulary; the search maps its choices back.
    """
    if not 1 <= n_best <= beam_size:
        raise ValueError(f"n_best must be between 1 and beam_size ({beam_size}), not {n_best}")
    if penalty not in LENGTH_PENALTIES:
        raise ValueError(f"the length penalty must be one of {', '.join(LENGTH_PENALTIES)}, not {penalty!r}")
    if vocab is not None and constraint is not None:
        raise ValueError("a constrained search is over the whole vocabulary: no shortlist")
    _, bos_id, eos_id = _special_ids(model, bos_id, eos_id)
    beams = prefill(model, src, beam_size, max_len_offset, bos_id, eos_id, constraint)
    beams.penalty, beams.vocab = penalty, vocab
    for t in range(beams.max_len):  # t + 1 = tokens generated so far including this step's
        if not beam_step(model, beams, t, alpha, early_stop):
            break
    return beams.best(n_best)


@dataclass
class Beams:
    """A batched beam search between two steps: the live hypotheses of the sentences still
    searched (`active` maps their rows to sentences) and the k best finished hypotheses of every
    sentence."""

    k: int
    eos_id: int
    banned: list[int]  # Tokens never generated: PAD and BOS
    max_lens: Tensor  # (B,): the maximum output length of each sentence, EOS included
    cache: object
    active: Tensor  # (b,): the sentence of each row still searched
    alive_seq: Tensor  # (b, k, t + 1): BOS and the tokens of each live hypothesis
    alive_lp: Tensor  # (b, k): their log-probabilities
    fin_seq: Tensor  # (B, k, max_len + 1): the finished hypotheses, EOS-padded
    fin_score: Tensor  # (B, k): their scores (-inf: none yet)
    fin_lp: Tensor  # (B, k): their log-probabilities
    constraint: object = None  # What restricts the next symbols (see `beam_search`), or None
    cstate: object = None  # The constraint's state of each live hypothesis
    penalty: str = "paper"  # `length_penalty`'s kind
    vocab: Tensor | None = None  # The sorted target ids the logits are over (a shortlist's), or None: all

    @property
    def max_len(self) -> int:
        return self.fin_seq.size(2) - 1

    def best(self, n_best: int) -> list[list[Hypothesis]]:
        """Per sentence, the `n_best` best finished hypotheses, best first."""
        seqs = self.fin_seq[:, :n_best, 1:].tolist()  # without BOS, EOS-padded
        scores, lps = self.fin_score.tolist(), self.fin_lp.tolist()  # best first: -inf (none) last
        return [
            [
                Hypothesis(seq[: seq.index(self.eos_id)] if self.eos_id in seq else seq, scores[i][j], lps[i][j])
                for j, seq in enumerate(seqs[i])
                if scores[i][j] != float("-inf")
            ]
            for i in range(len(seqs))
        ]


def prefill(model, src: Tensor, k: int, max_len_offset: int, bos_id: int, eos_id: int, constraint=None) -> Beams:
    """Encode the sources, project the encoder-decoder keys/values into a cache, and start every
    sentence with one live hypothesis (BOS) and no finished one."""
    device, B = src.device, src.size(0)
    src_mask = padding_mask(src, model.config.pad_id)
    max_lens = (src_mask.sum(dim=(1, 2, 3)) + max_len_offset).to(device)  # (B,)
    T = int(max_lens.max())
    memory = model.encode(src, src_mask)
    cache = model.init_cache(memory, src_mask)
    alive_lp = torch.full((B, k), float("-inf"), device=device)
    alive_lp[:, 0] = 0.0  # one initial hypothesis, not k copies of it
    return Beams(
        k=k,
        eos_id=eos_id,
        banned=[model.config.pad_id, bos_id],
        max_lens=max_lens,
        cache=cache,
        active=torch.arange(B, device=device),
        alive_seq=torch.full((B, k, 1), bos_id, dtype=torch.long, device=device),
        alive_lp=alive_lp,
        fin_seq=torch.full((B, k, T + 1), eos_id, dtype=torch.long, device=device),
        fin_score=torch.full((B, k), float("-inf"), device=device),
        fin_lp=torch.full((B, k), float("-inf"), device=device),
        constraint=constraint,
        cstate=constraint.start(src, k) if constraint is not None else None,
    )


def beam_step(model, beams: Beams, t: int, alpha: float, early_stop: bool = True) -> bool:
    """Step t (t + 1 tokens generated, this one included): extend every live hypothesis, merge
    those ending in EOS into the finished ones, keep the k best others live, and drop the
    sentences that are done. Returns whether any sentence is left to search."""
    b = beams.active.numel()
    cand_lp, beam_idx, token = _extensions(model, beams, t)
    cand_seq = torch.cat([beams.alive_seq.gather(1, beam_idx[:, :, None].expand(-1, -1, t + 1)), token[:, :, None]], 2)
    is_eos = token == beams.eos_id
    # "hf" (Hugging Face generate's search): only the k best extensions may finish
    finishing = (
        is_eos if beams.penalty == "paper" else is_eos & (torch.arange(is_eos.size(1), device=is_eos.device) < beams.k)
    )
    _add_finished(beams, t, alpha, cand_lp, cand_seq, finishing)
    # Live: the k best extensions that did not end in EOS.
    live_lp = torch.where(is_eos, torch.full_like(cand_lp, float("-inf")), cand_lp)
    beams.alive_lp, live_i = live_lp.topk(beams.k, dim=-1)  # (b, k)
    beams.alive_seq = cand_seq.gather(1, live_i[:, :, None].expand(-1, -1, t + 2))
    parent = beam_idx.gather(1, live_i)  # (b, k): which old beam each new one extends
    if beams.constraint is not None:
        beams.cstate = beams.constraint.advance(beams.cstate, parent, beams.alive_seq[:, :, -1])
    return _drop_finished(beams, t, alpha, early_stop, parent, b)


def _extensions(model, beams: Beams, t: int) -> tuple[Tensor, Tensor, Tensor]:
    """One decoding step of every live hypothesis, and the 2k best extensions of each sentence:
    their log-probabilities, the beam each extends and its new token, (b, 2k) each."""
    k, active = beams.k, beams.active
    b = active.numel()
    # the k beams of a sentence are still one hypothesis at t = 0: decoded once, (B, 1); then (b*k, 1)
    tokens = beams.alive_seq[:, 0, -1:] if t == 0 else beams.alive_seq[:, :, -1].reshape(b * k, 1)
    rows = projection_rows(model)
    if rows:  # the projection made a part at a time as the ranking takes it (`ranking.ProjectedRows`)
        logits = ProjectedRows(model.logits, model.decode_hidden(tokens, beams.cache)[:, -1], rows)
    else:
        logits = model.decode_step(tokens, beams.cache)[:, -1]  # (rows, V)
    if t == 0:
        beams.cache.repeat_rows(k)  # B -> B*k rows; the source side stays one row per sentence
        alive_lp = beams.alive_lp[:, :1]
    else:
        alive_lp = beams.alive_lp
    allowed = None
    if beams.constraint is not None:
        allowed = beams.constraint.allowed(beams.cstate)  # (b, k, V)
        allowed = allowed[:, 0] if t == 0 else allowed.reshape(b * k, -1)
    at_max = t + 1 >= beams.max_lens[active]  # (b,): only EOS may follow
    n = min(2 * k, k * (model.config.target_vocab_size if rows else logits.size(-1)))
    if beams.vocab is None:
        return _best_extensions(
            logits,
            alive_lp,
            n,
            beams.banned,
            beams.eos_id,
            allowed=allowed,
            only_eos=at_max,
            consume=True,
            forced_eos_lp=None if beams.penalty == "paper" else 0.0,
        )
    (eos,) = _local(beams.vocab, [beams.eos_id])  # a shortlist always holds EOS
    lp, beam, token = _best_extensions(
        logits,
        alive_lp,
        n,
        _local(beams.vocab, beams.banned),
        eos,
        only_eos=at_max,
        consume=True,
        forced_eos_lp=None if beams.penalty == "paper" else 0.0,
    )
    return lp, beam, beams.vocab[token]


def projection_rows(model) -> int | None:
    """How many rows a `model.Transformer`'s pre-softmax projection is best given at a time, where its
    kernel says so (`rows_per_call`: FBGEMM's int8 product, as fast on 32 rows as on 128), else None:
    all of a step's rows in one product (and any other model: its own `decode_step`)."""
    proj = getattr(model, "output_proj", None)
    return getattr(proj, "rows_per_call", None) if hasattr(model, "decode_hidden") else None


def _add_finished(beams: Beams, t: int, alpha: float, cand_lp: Tensor, cand_seq: Tensor, is_eos: Tensor) -> None:
    """Merge the extensions ending in EOS into the k best finished hypotheses so far."""
    if not bool(is_eos.any()):  # none ended: nothing to merge (most steps)
        return
    active, T = beams.active, beams.max_len
    lp_t = length_penalty(float(t + 1), alpha, beams.penalty)
    eos_lp = torch.where(is_eos, cand_lp, torch.full_like(cand_lp, float("-inf")))
    new_seq = torch.nn.functional.pad(cand_seq, (0, T + 1 - (t + 2)), value=beams.eos_id)
    all_score = torch.cat([beams.fin_score[active], eos_lp / lp_t], 1)  # lp_t > 0: -inf stays -inf
    all_lp = torch.cat([beams.fin_lp[active], eos_lp], 1)
    all_seq = torch.cat([beams.fin_seq[active], new_seq], 1)
    top_score, top_i = all_score.topk(beams.k, dim=-1)
    beams.fin_score[active] = top_score
    beams.fin_lp[active] = all_lp.gather(1, top_i)
    beams.fin_seq[active] = all_seq.gather(1, top_i[:, :, None].expand(-1, -1, T + 1))


def _drop_finished(beams: Beams, t: int, alpha: float, early_stop: bool, parent: Tensor, b: int) -> bool:
    """Early termination, per sentence; the sentences left keep their rows of the cache, in the
    new beam order. Returns whether any is left."""
    k, active = beams.k, beams.active
    bound = beams.alive_lp[:, 0] / length_penalty(beams.max_lens[active].float(), alpha, beams.penalty)
    worst = beams.fin_score[active, -1]
    done = (worst > float("-inf")) & (bound < worst) & early_stop
    done |= t + 1 >= beams.max_lens[active]
    done |= beams.alive_lp[:, 0] == float("-inf")  # nothing live left
    keep = (~done).nonzero().squeeze(1)
    if keep.numel() == 0:
        return False
    rows = (keep[:, None] * k + parent[keep]).view(-1)  # cache rows to keep, in new beam order
    beams.cache.reorder(rows, same_sources=keep.numel() == b)  # no sentence left: sources unchanged
    beams.active, beams.alive_seq, beams.alive_lp = active[keep], beams.alive_seq[keep], beams.alive_lp[keep]
    if beams.constraint is not None:
        beams.cstate = beams.cstate.select(keep)
    return True
