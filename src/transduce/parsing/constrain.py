"""Constrained beam search for parsing: every hypothesis is a well-formed tree (not in the paper).

With `TreeConstraint`, `transduce.decoding.search.beam_search` only extends a hypothesis by a symbol that
keeps it the prefix of a well-formed linearized tree over the sentence's words (counted from the
source pieces that start a word), where the paper repairs free output afterwards. Disallowed
symbols get log-probability -inf after the softmax, as PAD and BOS do. Each hypothesis' state is
a few tensors, gathered with the hypotheses when the beam reorders them.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from .trees import UNKNOWN, is_leaf_symbol

OTHER, OPEN, CLOSE, LEAF = 0, 1, 2, 3


@dataclass
class ConstraintState:
    n_words: Tensor  # (b,) words of each sentence
    depth: Tensor  # (b, k) open constituents
    words: Tensor  # (b, k) words placed
    done: Tensor  # (b, k) the root has closed
    labels: Tensor  # (b, k, D) label id of each open constituent
    sizes: Tensor  # (b, k, D) children placed in each open constituent

    def select(self, keep: Tensor) -> "ConstraintState":
        """The sentences `keep` (indices into b)."""
        return ConstraintState(
            self.n_words[keep], self.depth[keep], self.words[keep], self.done[keep], self.labels[keep], self.sizes[keep]
        )


def leaf_symbols(tgt_vocab, tags: bool) -> Tensor:
    """(V,) bool: the target symbols that stand for a word (`XX`, or a tag with `tags`)."""
    return TreeConstraint(tgt_vocab, tags=tags).kind == LEAF


class TreeConstraint:
    """What `beam_search(constraint=...)` asks: `start`, `allowed`, `advance`."""

    def __init__(self, tgt_vocab, *, tags: bool = False, src_vocab=None, max_depth: int = 64):
        V = len(tgt_vocab)
        pieces = [tgt_vocab.sp.id_to_piece(i).lstrip("▁") for i in range(V)]
        specials = {tgt_vocab.pad, tgt_vocab.unk, tgt_vocab.bos, tgt_vocab.eos}
        kinds, labels, names = [], [], {}
        for i, p in enumerate(pieces):
            kind = {"(": OPEN, ")": CLOSE}.get(p[:1], LEAF if is_leaf_symbol(p, tags) else OTHER)
            kinds.append(OTHER if i in specials or p in UNKNOWN else kind)
            labels.append(names.setdefault(p[1:], len(names)) if kinds[-1] in (OPEN, CLOSE) else -1)
        self.eos = tgt_vocab.eos
        self.kind = torch.tensor(kinds)
        self.label = torch.tensor(labels)
        self.max_depth = max_depth
        self.src_vocab = src_vocab
        self._word_start: Tensor | None = None

    def start(self, src: Tensor, k: int) -> ConstraintState:
        """The state before the first symbol, for sources `src` (B, S) and beams of `k`."""
        if self.src_vocab is None:
            raise ValueError("TreeConstraint needs the source vocabulary to count the words")
        if self._word_start is None:
            self._word_start = self.src_vocab.word_starts()
        B, dev = src.size(0), src.device
        n_words = self._word_start.to(dev)[src].sum(1)
        zeros = torch.zeros(B, k, dtype=torch.long, device=dev)
        D = self.max_depth
        return ConstraintState(
            n_words,
            zeros.clone(),
            zeros.clone(),
            zeros.bool(),
            torch.full((B, k, D), -1, dtype=torch.long, device=dev),
            torch.zeros(B, k, D, dtype=torch.long, device=dev),
        )

    def allowed(self, s: ConstraintState) -> Tensor:
        """(b, k, V) bool: the symbols each hypothesis may take next: ``(X`` before the root has
        closed while a word is left for it; a word's symbol inside the root while words are left;
        ``)X`` for the innermost open ``(X`` once it holds something (the root's once every word
        is placed); EOS once the root has closed."""
        kind, label = self.kind.to(s.depth.device), self.label.to(s.depth.device)
        top = (s.depth - 1).clamp(min=0)[..., None]  # (b, k, 1)
        cur_label = s.labels.gather(2, top)[..., 0]
        cur_size = s.sizes.gather(2, top)[..., 0]
        left = s.n_words[:, None] - s.words
        inside = s.depth >= 1
        can_open = ~s.done & (s.depth < self.max_depth) & (left >= 1)
        can_leaf = inside & (left >= 1)
        can_close = inside & (cur_size >= 1) & ((s.depth > 1) | (left == 0))
        out = torch.zeros(*s.depth.shape, kind.numel(), dtype=torch.bool, device=s.depth.device)
        out |= (kind == OPEN) & can_open[..., None]
        out |= (kind == LEAF) & can_leaf[..., None]
        out |= (kind == CLOSE) & can_close[..., None] & (label == cur_label[..., None])
        out[..., self.eos] = s.done
        return out

    def advance(self, s: ConstraintState, parent: Tensor, token: Tensor) -> ConstraintState:
        """The new hypotheses' states: hypothesis (i, j) extends (i, parent[i, j]) by token[i, j]."""
        idx = parent[..., None].expand(-1, -1, s.labels.size(2))
        depth, words, done = s.depth.gather(1, parent), s.words.gather(1, parent), s.done.gather(1, parent)
        labels, sizes = s.labels.gather(1, idx).clone(), s.sizes.gather(1, idx).clone()
        kind, label = self.kind.to(token.device)[token], self.label.to(token.device)[token]
        is_open, is_close, is_leaf = kind == OPEN, kind == CLOSE, kind == LEAF
        # a new child (word or constituent) of the innermost open constituent
        parent_level = (depth - 1).clamp(min=0)[..., None]
        grows = ((is_open | is_leaf) & (depth >= 1))[..., None]
        sizes.scatter_add_(2, parent_level, grows.long())
        level = depth.clamp(0, self.max_depth - 1)[..., None]
        labels.scatter_(2, level, torch.where(is_open[..., None], label[..., None], labels.gather(2, level)))
        sizes.scatter_(2, level, torch.where(is_open[..., None], torch.zeros_like(level), sizes.gather(2, level)))
        depth = (depth + is_open.long() - is_close.long()).clamp(min=0)  # (a dead hypothesis, -inf, may go below)
        done = done | (is_close & (depth == 0))
        return ConstraintState(s.n_words, depth, words + is_leaf.long(), done, labels, sizes)
