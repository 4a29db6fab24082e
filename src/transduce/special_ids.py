"""The special ids: padding (PAD), the unknown piece (UNK), the decoder's first input (BOS, the
start token) and the end of a sentence (EOS, stored after every sentence, the last decoder output).

They belong to a vocabulary (`data.vocab.Vocab.ids`) and to the model trained on it (`ModelConfig`'s
`pad_id`, `unk_id`, `bos_id`, `eos_id`, `ModelConfig.special_ids`), and are read from there: the
masks, the loss's ignore index, batching's padding, the searches, the exports. `DEFAULT`, PAD 0,
UNK 1, BOS 2, EOS 3, is the layout of the vocabularies transduce trains (5.1) and what a model or
data directory that records no ids has; an imported model keeps its own (OPUS-MT's Marian models:
EOS 0, UNK 1, PAD the last id and also the decoder's start)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass


@dataclass(frozen=True)
class SpecialIds:
    pad: int = 0
    unk: int = 1
    bos: int = 2  # the decoder's start token (Marian's decoder_start_token_id)
    eos: int = 3

    def to_dict(self) -> dict[str, int]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, record: dict | None) -> "SpecialIds":
        """The ids a data.json or transduce.json records ({"pad": 0, ...}); an absent record or key: DEFAULT's."""
        record = record or {}
        unknown = set(record) - {f.name for f in dataclasses.fields(cls)}
        if unknown:
            raise ValueError(f"unknown special ids {sorted(unknown)} (known: pad, unk, bos, eos)")
        return cls(**{k: int(v) for k, v in record.items()})


DEFAULT = SpecialIds()
"""The layout of transduce's own vocabularies (`data.vocab.train_vocab`), and of every model and data
directory written before the ids were recorded."""

PAD, UNK, BOS, EOS = DEFAULT.pad, DEFAULT.unk, DEFAULT.bos, DEFAULT.eos
