"""Word positions: not in the paper, an option for parsing (`ModelConfig.word_positions`), built
by `transduce.model.Transformer` as its `word_positions` attribute when on; off, the default, the
model is the paper's.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .config import ModelConfig


class WordPositions(nn.Module):
    """A learned vector per word index, added to both stacks' inputs, so that a decoder position
    finds the source word it is at by matching one vector instead of counting (parsing: the i-th
    leaf is the i-th word). Source: the word a subword belongs to (words start at `src_word_start`
    pieces); target: the word symbols (`tgt_is_word`) so far, the word the next leaf stands for.
    The symbol tables are buffers saved with the weights (`set_symbols`); indices past the table
    use its last row."""

    def __init__(self, c: ModelConfig):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(c.max_positions, c.d_model))
        nn.init.normal_(self.weight, mean=0.0, std=1.0)  # the scale of sqrt(d_model) * embeddings
        self.register_buffer("src_word_start", torch.zeros(c.src_vocab_size, dtype=torch.bool))
        self.register_buffer("tgt_is_word", torch.zeros(c.target_vocab_size, dtype=torch.bool))

    def set_symbols(self, src_word_start: Tensor, tgt_is_word: Tensor) -> None:
        if src_word_start.shape != self.src_word_start.shape or tgt_is_word.shape != self.tgt_is_word.shape:
            raise ValueError("word position tables must have one entry per vocabulary symbol")
        self.src_word_start.copy_(src_word_start)
        self.tgt_is_word.copy_(tgt_is_word)

    def _rows(self, index: Tensor) -> Tensor:
        return F.embedding(index.clamp(0, self.weight.size(0) - 1), self.weight)

    def source(self, src: Tensor) -> Tensor:
        """(B, S) -> (B, S, d_model): the vector of each subword's word (0 for the first word)."""
        return self._rows(self.src_word_start[src].long().cumsum(1) - 1)

    def target(self, tgt: Tensor, before: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """(B, T) decoder inputs -> ((B, T, d_model), (B,) words so far after the last input);
        `before`: words emitted before this chunk (incremental decoding), None for 0."""
        count = self.tgt_is_word[tgt].long().cumsum(1)
        if before is not None:
            count = count + before[:, None]
        return self._rows(count), count[:, -1]

    def decoder_input(self, tgt: Tensor, cache=None) -> Tensor:
        """What the decoder adds to its inputs (B, T): `target`'s vectors. With a decoding cache,
        the count goes on from the words before this chunk (`cache.word_count`), and advances it."""
        vectors, count = self.target(tgt, cache.word_count if cache is not None else None)
        if cache is not None:
            cache.word_count = count
        return vectors
