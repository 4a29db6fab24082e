"""Section 3.5, positional encoding: added to the input embeddings at the bottoms of the encoder
and decoder stacks, of dimension d_model so that the two can be summed.
The paper's fixed sinusoids (`sinusoidal_positions`, a table of them: `SinusoidalPositions`), and
the learned positional embeddings it compared them with (`LearnedPositions`, Table 3 row E;
`ModelConfig.positional`). `transduce.model` builds one per stack; the parser's word positions
(not in the paper) are `transduce.word_positions`.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn


def sinusoidal_positions(length: int, d_model: int, offset: int = 0) -> Tensor:
    """Section 3.5: PE(pos, 2i) = sin(pos / 10000^(2i/d_model)), PE(pos, 2i+1) = cos(same),
    for pos in [offset, offset + length). Returns (length, d_model), float32, computed on the CPU
    (also where a model is built on another default device)."""
    pos = torch.arange(offset, offset + length, dtype=torch.float64, device="cpu")[:, None]
    two_i = torch.arange(0, d_model, 2, dtype=torch.float64, device="cpu")[None, :]
    angle = pos / torch.pow(10000.0, two_i / d_model)
    pe = torch.empty(length, d_model, dtype=torch.float64, device="cpu")
    pe[:, 0::2] = torch.sin(angle)  # even dimensions
    pe[:, 1::2] = torch.cos(angle)  # odd dimensions
    return pe.float()


class SinusoidalPositions(nn.Module):
    """3.5's fixed sinusoids: a table of max_positions rows, computed once; longer sequences' per call."""

    def __init__(self, d_model: int, max_positions: int = 1024):
        super().__init__()
        self.d_model = d_model
        self.register_buffer("table", sinusoidal_positions(max_positions, d_model), persistent=False)

    def forward(self, length: int, offset: int = 0) -> Tensor:
        if offset + length <= self.table.size(0):
            return self.table[offset : offset + length]
        return sinusoidal_positions(length, self.d_model, offset).to(self.table)  # the table's device, dtype


class LearnedPositions(nn.Module):
    """Learned positional embeddings (Table 3 row E), one vector per position < max_positions."""

    def __init__(self, d_model: int, max_positions: int = 1024):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(max_positions, d_model))
        nn.init.normal_(self.weight, mean=0.0, std=d_model**-0.5)

    def forward(self, length: int, offset: int = 0) -> Tensor:
        if offset + length > self.weight.size(0):
            raise ValueError(
                f"sequence of {offset + length} positions exceeds the learned position table "
                f"({self.weight.size(0)}); raise model.max_positions"
            )
        return self.weight[offset : offset + length]
