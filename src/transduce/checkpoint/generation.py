"""A model's own generation settings: how its makers decode it (Hugging Face generate's num_beams and
length_penalty), and its languages, brought with it by `transduce import` (generation.json beside
the model; `transduce.export.opus`). `translate` and `serve` decode an imported model with them
unless told otherwise (`Generation.search`): beam search with generate's |Y|^alpha length penalty
and its search (`decoding.search.beam_search(penalty="hf")`), so that the defaults give what `generate`
gives. Its max_length is kept, not applied: transduce's limit is the source's length +
max_len_offset (6.1), the same outputs wherever generate's end within it."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Sequence

GENERATION = "generation.json"


@dataclass(frozen=True)
class Generation:
    beam: int = 1  # num_beams (1: greedy)
    length_penalty: float = 1.0  # generate's alpha in |Y|^alpha
    max_length: int = 20  # generate's limit on the output, its start token included (kept, not applied)
    bad_words_ids: list = field(default_factory=list)  # what generate never emits (transduce's search: PAD and BOS)
    src_lang: str | None = None
    tgt_lang: str | None = None
    target_tokens: list = field(default_factory=list)  # a multilingual model's `>>xx<<` tokens
    not_applied: dict = field(default_factory=dict)  # generate's settings transduce's search does not apply

    def search(self) -> dict:
        """The search settings (`translate_stream`'s keywords) that decode as `generate` does."""
        return {"beam": self.beam, "greedy": self.beam == 1, "alpha": self.length_penalty, "length_penalty": "hf"}

    def line(self) -> str:
        """What an import prints: the settings taken, and those not applied."""
        how = "greedy" if self.beam == 1 else f"beam {self.beam}, length penalty hf:{self.length_penalty:g}"
        langs = f"{self.src_lang or '?'} -> {self.tgt_lang or '?'}" + (
            f" ({len(self.target_tokens)} target tokens)" if self.target_tokens else ""
        )
        rest = (
            f"; not applied: {', '.join(f'{k} {v}' for k, v in self.not_applied.items())}" if self.not_applied else ""
        )
        return f"decoded as generate: {how}; {langs}{rest}"

    def write(self, path: Path) -> None:
        Path(path).write_text(
            json.dumps({"format": 1, **asdict(self)}, indent=2, ensure_ascii=False) + "\n", encoding="utf-8"
        )

    @classmethod
    def read(cls, path: Path) -> "Generation":
        data = json.loads(Path(path).read_text(encoding="utf-8"))
        data.pop("format", None)
        return cls(**{k: v for k, v in data.items() if k in cls.__dataclass_fields__})


def find_generation(dirs: Sequence[Path]) -> Generation | None:
    """The generation.json of the first of `dirs` that has one (a model's directory, its run's), or None."""
    for d in dirs:
        if (Path(d) / GENERATION).is_file():
            try:
                return Generation.read(Path(d) / GENERATION)
            except (ValueError, TypeError) as e:
                from ..errors import DataError

                raise DataError(f"not a generation.json transduce wrote ({e})", Path(d) / GENERATION) from None
    return None
