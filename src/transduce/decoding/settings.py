"""A search's settings (Section 6.1), one frozen type for every engine and the server: the beam,
alpha and the length penalty it divides by, the output limit, the n-best, greedy or not."""

from __future__ import annotations

from dataclasses import dataclass

from ..defaults import ALPHA, BEAM, MAX_LEN_OFFSET

# The length penalties a search can rank by: the paper's ((5+|Y|)/6)^alpha (6.1, `search.length_penalty`),
# Hugging Face generate's (transduce's engine only), CTranslate2's own |Y|^alpha (its engine only)
LENGTH_PENALTIES = ("paper", "hf", "ct2")


@dataclass(frozen=True, kw_only=True)
class SearchSettings:
    """How a batch is searched: hashable, so that the server decodes requests with equal settings
    together. Checked when made: an n-best the search cannot give is refused."""

    beam: int = BEAM
    alpha: float = ALPHA
    length_penalty: str = "paper"  # LENGTH_PENALTIES; anything but "paper" is not the paper's (docs/paper_map.md)
    max_len_offset: int = MAX_LEN_OFFSET  # the longest output: input length + this (6.1: 50)
    n_best: int = 1  # hypotheses per sentence, best first
    greedy: bool = False  # greedy decoding (beam and alpha unused)

    def __post_init__(self):
        if self.beam < 1:
            raise ValueError(f"the beam size must be at least 1, not {self.beam}")
        if self.greedy and self.n_best != 1:
            raise ValueError("greedy decoding gives one hypothesis per line: n_best must be 1")
        if not self.greedy and not 1 <= self.n_best <= self.beam:
            raise ValueError(f"n_best must be between 1 and the beam size ({self.beam}), not {self.n_best}")
        if self.length_penalty not in LENGTH_PENALTIES:
            raise ValueError(
                f"length_penalty must be one of {', '.join(LENGTH_PENALTIES)}, not {self.length_penalty!r}"
            )
