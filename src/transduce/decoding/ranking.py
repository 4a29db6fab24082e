"""Each beam step's best extensions (Section 6.1's beam search, `transduce.decoding.search`): the
2k best one-token extensions of a sentence's k live hypotheses, by log-probability, found exactly
without ranking all k x V of them (`_best_extensions`: block maxima, then only the best blocks'
columns), a few sentences at a time on a CPU so that their log-probabilities stay in its cache
(`search_chunk_elements`); docs/speed.md.
"""

from __future__ import annotations

import torch
from torch import Tensor


CPU_CHUNK_ELEMENTS = 1 << 20  # Log-probabilities ranked at a time on a CPU (4 MB of fp32: a core's L2 cache)


def search_chunk_elements(device: torch.device) -> int:
    """How many log-probabilities `_best_extensions` ranks at a time on `device`, 0 for all at once:
    chunks keep them in a CPU's cache; on a GPU each chunk would add launches and a synchronisation."""
    return CPU_CHUNK_ELEMENTS if device.type == "cpu" else 0


class ProjectedRows:
    """A step's logits (R, V), not computed yet: `project(hidden[a:b])`, `rows` rows at a time, each
    part ranked as soon as it is made (`_best_extensions`), so that all R x V of them are never
    held at once (a step of 128 rows at OPUS-MT's 58k vocabulary: 30 MB, and through FBGEMM as
    much again for its int32 sums). For a projection whose kernel does as well on a few rows as on
    many (`decoding.search.projection_rows`); the same logits, row for row, where each row's do not
    depend on the others' (not so for dynamic int8, whose activations are quantized per call)."""

    def __init__(self, project, hidden: Tensor, rows: int):
        self.project, self.hidden, self.rows = project, hidden, rows

    def part(self, start: int, stop: int) -> Tensor:
        return self.project(self.hidden[start:stop])


def _best_extensions(
    logits: Tensor | ProjectedRows,
    alive_lp: Tensor,
    n: int,
    banned: list[int],
    eos_id: int,
    allowed: Tensor | None = None,
    only_eos: Tensor | None = None,
    block: int = 64,
    chunk_elements: int | None = None,
    consume: bool = False,
    forced_eos_lp: float | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """The n best one-token extensions of each sentence's live hypotheses, by log-probability.

    logits (b * r, V): the next-token logits of r hypotheses for each of b sentences (consecutive
    rows); alive_lp (b, r): their log-probabilities so far. Extending by token v scores alive_lp +
    log_softmax(logits)[v] (fp32, over all V); then excluded, without renormalising: `banned`
    (PAD, BOS), what `allowed` (b * r, V) forbids, and all but EOS where `only_eos` (b,) is set.
    Returns the n best scores (b, n), best first, the hypothesis each extends and its token.

    Exact in the scores without ranking all r * V extensions: the n best lie in the n blocks (of
    `block` tokens of one hypothesis) whose best scores are the n highest, or in the tail of V
    past the last full block; only those are ranked (ties may pick other tokens of equal score
    than a full `topk`). Sentences go about `chunk_elements` log-probabilities at a time (None:
    `search_chunk_elements(device)`). `consume=True`: fp32 `logits` are overwritten by their
    log-probabilities (the same bits, no fresh buffer every step). `forced_eos_lp`: EOS's
    log-probability where `only_eos` is set (None: its own; 0.0: generate's forced EOS).
    """
    b, r = alive_lp.shape
    if isinstance(logits, ProjectedRows):  # projected a few sentences' rows at a time, each part ranked at once
        per = max(1, logits.rows // r)
        parts = [
            _best_extensions(
                logits.part(i * r, (i + per) * r),
                alive_lp[i : i + per],
                n,
                banned,
                eos_id,
                None if allowed is None else allowed[i * r : (i + per) * r],
                None if only_eos is None else only_eos[i : i + per],
                block=block,
                chunk_elements=chunk_elements,
                consume=consume,
                forced_eos_lp=forced_eos_lp,
            )
            for i in range(0, b, per)
        ]
        return tuple(torch.cat(p) for p in zip(*parts))
    V = logits.size(-1)
    if chunk_elements is None:
        chunk_elements = search_chunk_elements(logits.device)
    per = max(1, chunk_elements // (r * V)) if chunk_elements else b  # sentences per chunk
    if b > per:
        parts = [
            _best_extensions(
                logits[i * r : (i + per) * r],
                alive_lp[i : i + per],
                n,
                banned,
                eos_id,
                None if allowed is None else allowed[i * r : (i + per) * r],
                None if only_eos is None else only_eos[i : i + per],
                block=block,
                chunk_elements=chunk_elements,
                consume=consume,
                forced_eos_lp=forced_eos_lp,
            )
            for i in range(0, b, per)
        ]
        return tuple(torch.cat(p) for p in zip(*parts))
    if consume and logits.dtype == torch.float32 and logits.is_contiguous():
        lprobs = torch.log_softmax(logits, dim=-1, dtype=torch.float32, out=logits)  # in place, row by row
    else:
        lprobs = torch.log_softmax(logits, dim=-1, dtype=torch.float32)  # (b * r, V)
    if allowed is not None:
        lprobs.masked_fill_(~allowed, float("-inf"))
    if only_eos is not None and bool(only_eos.any()):
        rows = only_eos.repeat_interleave(r)
        eos_lp = lprobs[rows, eos_id]
        lprobs[rows] = float("-inf")
        lprobs[rows, eos_id] = eos_lp if forced_eos_lp is None else forced_eos_lp
    lprobs[:, banned] = float("-inf")  # PAD and BOS are never real output tokens
    nb = V // block
    if nb * r < 4 * n:  # a small vocabulary: rank every extension
        scores = (lprobs.view(b, r, V) + alive_lp[:, :, None]).view(b, r * V)
        if r * V < n:  # fewer extensions than asked for: the rest score -inf
            scores = torch.nn.functional.pad(scores, (0, n - r * V), value=float("-inf"))
        values, i = scores.topk(n, dim=-1)
        i = i.clamp_max(r * V - 1)
        return values, i // V, i % V
    full = nb * block
    blocks = lprobs[:, :full].view(b * r, nb, block)
    best = (blocks.amax(-1).view(b, r, nb) + alive_lp[:, :, None]).view(b, r * nb).topk(n, dim=-1).indices  # (b, n)
    beam, col = best // nb, best % nb
    alive = alive_lp.gather(1, beam)  # (b, n)
    cand = (blocks[torch.arange(b, device=beam.device)[:, None] * r + beam, col] + alive[:, :, None]).view(b, n * block)
    tail = V - full
    if tail:  # the columns past the last full block: always candidates (no column twice)
        cand = torch.cat([cand, (lprobs[:, full:].view(b, r, tail) + alive_lp[:, :, None]).view(b, r * tail)], 1)
    values, i = cand.topk(n, dim=-1)
    in_blocks = i < n * block
    which = (i // block).clamp_max(n - 1)
    t = (i - n * block).clamp_min(0)  # position among the tail columns
    hyp = torch.where(in_blocks, beam.gather(1, which), t // max(tail, 1))
    token = torch.where(in_blocks, col.gather(1, which) * block + i % block, full + t % max(tail, 1))
    return values, hyp, token
