"""A vocabulary shortlist: each batch searched over the target tokens its sources make likely,
not the whole vocabulary. Not in the paper, and not exact (opt-in: `transduce shortlist`, then
`translate --shortlist`); Marian's lexical shortlist and CTranslate2's vocabulary map do the same.

At OPUS-MT's size the pre-softmax projection (3.4) and the search's softmax over a 58k vocabulary
cost as much as the decoder's layers; over the few thousand tokens a batch can plausibly produce,
both shrink by that ratio. The candidates of a batch: the `frequent` most frequent target tokens,
the `per_source` target tokens most associated with each of its source tokens (the Dice
coefficient of their sentence co-occurrence in a parallel corpus), and the special ids. The
softmax is over the candidates (renormalised), as Marian's and CTranslate2's.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

import numpy as np
import torch
from torch import Tensor
from torch.nn import functional as F

FILE = "shortlist.safetensors"
"""The shortlist's file in a model directory, where `translate --shortlist` looks by default."""


@dataclass
class Shortlist:
    table: Tensor  # (source vocabulary, per_source) int32: target ids, -1 where a source id has fewer
    frequent: Tensor  # (frequent,) int32: target ids always candidates
    target_size: int  # the target vocabulary's size
    info: dict  # how it was built (written into the file's metadata)
    path: Path | None = None  # the file it was read from

    def candidates(self, sources: list[list[int]], always: Iterable[int]) -> Tensor:
        """The sorted target ids (int64) a batch of source id lists is searched over: `frequent`,
        each source id's row of `table`, and `always` (the special ids)."""
        seen = torch.tensor(sorted({t for s in sources for t in s if 0 <= t < self.table.size(0)}), dtype=torch.long)
        rows = self.table[seen].flatten() if seen.numel() else self.table[:0].flatten()
        ids = torch.cat([self.frequent, rows[rows >= 0], torch.tensor(list(always), dtype=torch.int32)])
        return torch.unique(ids).long()  # sorted

    def describe(self) -> str:
        """One line for the user: what the shortlist holds, and that it is not exact."""
        i = self.info
        return (
            f"shortlist {self.path or ''} ({i.get('frequent', self.frequent.numel())} frequent target tokens and up to "
            f"{self.table.size(1)} per source token, from {i.get('pairs', 0):,} sentence pairs): each batch "
            "searched over its candidates only (not exact)"
        ).replace("shortlist  (", "shortlist (")

    def save(self, path: str | Path) -> None:
        from safetensors.torch import save_file

        save_file(
            {"table": self.table.contiguous(), "frequent": self.frequent.contiguous()},
            str(path),
            metadata={"target_size": str(self.target_size), "info": json.dumps(self.info)},
        )

    @classmethod
    def load(cls, path: str | Path) -> "Shortlist":
        from safetensors import safe_open

        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(
                f"{path}: no shortlist (make one with `transduce shortlist MODEL --train-src FILE --train-tgt FILE`)"
            )
        with safe_open(str(path), framework="pt") as f:
            meta = f.metadata() or {}
            if "target_size" not in meta:
                raise ValueError(f"{path}: not a shortlist written by `transduce shortlist` (no target_size)")
            return cls(
                f.get_tensor("table"),
                f.get_tensor("frequent"),
                int(meta["target_size"]),
                json.loads(meta.get("info", "{}")),
                path,
            )


def build(
    pairs: Iterable[tuple[list[int], list[int]]],
    source_size: int,
    target_size: int,
    *,
    per_source: int = 64,
    frequent: int = 256,
    chunk: int = 20_000,
) -> Shortlist:
    """The shortlist of a parallel corpus of id lists (source, target). A pair counts once per
    sentence: c(s), c(t), c(s, t) are numbers of sentence pairs; a source id's row holds the
    `per_source` targets t (not among the `frequent`) with the highest 2 c(s, t) / (c(s) + c(t))."""
    cs, ct = np.zeros(source_size, np.int64), np.zeros(target_size, np.int64)
    codes, counts, buffer, n = [], [], [], 0

    def flush():
        if buffer:
            c, k = np.unique(np.concatenate(buffer), return_counts=True)
            codes.append(c)
            counts.append(k)
            buffer.clear()

    for src, tgt in pairs:
        s, t = np.unique(np.asarray(src, np.int64)), np.unique(np.asarray(tgt, np.int64))
        s, t = s[(s >= 0) & (s < source_size)], t[(t >= 0) & (t < target_size)]
        cs[s] += 1
        ct[t] += 1
        buffer.append((s[:, None] * target_size + t[None, :]).ravel())
        n += 1
        if n % chunk == 0:
            flush()
    flush()
    if not n:
        raise ValueError("a shortlist needs sentence pairs: none were given")
    code, count = np.concatenate(codes), np.concatenate(counts)
    code, inverse = np.unique(code, return_inverse=True)
    count = np.bincount(inverse, weights=count).astype(np.int64)
    top = np.argsort(-ct, kind="stable")[:frequent]  # ties: the lower id first
    s, t = code // target_size, code % target_size
    keep = ~np.isin(t, top)
    s, t, count = s[keep], t[keep], count[keep]
    dice = 2.0 * count / (cs[s] + ct[t])
    order = np.lexsort((t, -dice, s))  # by source id, then best first (ties: the lower id)
    s, t = s[order], t[order]
    start = np.searchsorted(s, s, side="left")
    rank = np.arange(s.size) - start
    chosen = rank < per_source
    table = np.full((source_size, per_source), -1, np.int32)
    table[s[chosen], rank[chosen]] = t[chosen]
    info = {"pairs": n, "per_source": per_source, "frequent": int(top.size)}
    return Shortlist(torch.from_numpy(table), torch.from_numpy(top.astype(np.int32)), target_size, info)


def restricted_logits(model, ids: Tensor):
    """fn(x) = the logits of `model`'s pre-softmax projection (3.4, with the logits bias where the
    model has one) for the target ids `ids` only, (..., len(ids)): int8 rows where the model's
    projection is int8 from the tied embedding's rows (`fast.int8`), else the float rows of the
    embedding matrix or the projection. Made once per batch."""
    from ..fast.int8 import Int8Embeddings, Int8Linear

    proj, embed = model.output_proj, model.decoder.embed
    bias = model.output_bias
    if isinstance(proj, Int8Linear) and isinstance(embed, Int8Embeddings):  # int8 rows, the bias inside
        bias = proj.bias
        layer = Int8Linear.from_rows(embed.q[ids], embed.scales[ids], embed.dtype, None if bias is None else bias[ids])
        layer.packed[None].out_dtype = torch.float32
        return layer
    tied = model.config.share_embeddings or model.config.tie_output
    weight = getattr(embed if tied else proj, "weight", None)  # the embedding matrix (3.4), or the projection's own
    if weight is None:
        raise ValueError(
            "this model's pre-softmax projection keeps no float rows to shortlist (untied, and packed for "
            "decoding only: load it with keep=True)"
        )
    w = weight.detach()[ids]
    b = None if bias is None else bias.detach()[ids]

    def project(x: Tensor) -> Tensor:  # as `Transformer.logits`: the product, then the bias
        logits = F.linear(x, w)
        return logits if b is None else logits + b

    return project


@dataclass
class Shortlisted:
    """`model` as a search sees it for one batch, over the target ids `ids` only: `decode_step`
    gives (B, n, len(ids)) logits; the search maps its choices back (`ids[local]`)."""

    model: torch.nn.Module
    ids: Tensor

    def __post_init__(self):
        self.project = restricted_logits(self.model, self.ids)
        self.config = self.model.config

    def encode(self, src: Tensor, src_mask: Tensor | None = None) -> Tensor:
        return self.model.encode(src, src_mask)

    def init_cache(self, memory: Tensor, src_mask: Tensor):
        return self.model.init_cache(memory, src_mask)

    def decode_step(self, tgt: Tensor, cache) -> Tensor:
        return self.project(self.model.decode_hidden(tgt, cache))
