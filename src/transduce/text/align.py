"""Word alignment from the model's own attention, for `markup`'s tags: teacher-force each (source,
output) pair through the model (`views.weights.compute_attention`) and align each output token with
the source token its encoder-decoder attention (3.2.3) weighs most, averaged over the heads of
one layer: by default the next-to-last of a model of 4 layers or more (Garg et al., 2019, found it
aligns best in the base model), the last of a smaller one (a 2-layer model's first layer does not
align: tests/test_text_align.py); any layer is an option. Links are character spans, so that a caller needs no tokenizer: (t0, t1, s0, s1) says that
the output's characters [t0, t1) (one subword token) are aligned with the source's [s0, s1).
"""

from __future__ import annotations

import unicodedata
from typing import Sequence

import torch

from ..views.weights import compute_attention

Link = tuple[int, int, int, int]

BATCH = 16  # sentence pairs in one teacher-forced pass


def piece_spans(vocab, text: str, ids: Sequence[int]) -> list[tuple[int, int]]:
    """The characters of `text` each subword id of `vocab.encode(text)` stands for: its piece (the
    word-start mark "▁" dropped) found in order, each character compared in NFKC form (as
    sentencepiece normalizes); a piece not found (<unk>) covers the next character, a bare "▁"
    none."""
    norm, origin = "", []
    for i, c in enumerate(text):
        n = unicodedata.normalize("NFKC", c)
        norm += n
        origin += [i] * len(n)
    origin.append(len(text))
    spans, at = [], 0
    for i in ids:
        core = vocab.sp.id_to_piece(int(i)).replace("\u2581", " ").strip()
        while at < len(norm) and norm[at].isspace():
            at += 1
        if not core:  # a bare word-start mark: no character of its own
            spans.append((origin[at], origin[at]))
        elif norm.startswith(core, at):
            spans.append((origin[at], origin[at + len(core)]))
            at += len(core)
        else:
            end = min(at + 1, len(norm))
            spans.append((origin[at], origin[end]))
            at = end
    return spans


class AttentionAligner:
    """`align(sources, outputs)` of `markup.Translator` for a model and its vocabularies."""

    def __init__(self, model, src_vocab, tgt_vocab, layer: int | None = None):
        n = model.config.n_layers
        self.layer = (n - 2 if n >= 4 else n - 1) if layer is None else layer
        if not -n <= self.layer < n:
            raise ValueError(f"layer {layer} is not a layer of a model of {n} decoder layers (0 .. {n - 1})")
        self.model, self.src_vocab, self.tgt_vocab = model, src_vocab, tgt_vocab

    def align(self, sources: Sequence[str], outputs: Sequence[str]) -> list[list[Link]]:
        if len(sources) != len(outputs):
            raise ValueError(f"{len(sources)} sources and {len(outputs)} outputs: give one output per source")
        src_ids = [self.src_vocab.encode(s) for s in sources]
        tgt_ids = [self.tgt_vocab.encode(o) for o in outputs]
        links: list[list[Link]] = [[] for _ in sources]
        todo = [i for i in range(len(sources)) if src_ids[i] and tgt_ids[i]]
        for k in range(0, len(todo), BATCH):
            chunk = todo[k : k + BATCH]
            batch = compute_attention(self.model, [src_ids[i] for i in chunk], [tgt_ids[i] for i in chunk])
            weights = batch.weights["decoder_cross"][self.layer]  # (B, h, T, S): row j predicts target token j
            for b, i in enumerate(chunk):
                S, T = len(src_ids[i]), len(tgt_ids[i])
                best = weights[b, :, :T, :S].mean(0).argmax(-1).tolist()  # EOS's column left out
                src_spans = piece_spans(self.src_vocab, sources[i], src_ids[i])
                tgt_spans = piece_spans(self.tgt_vocab, outputs[i], tgt_ids[i])
                links[i] = [(*tgt_spans[j], *src_spans[best[j]]) for j in range(T)]
        return links


class ModelTranslator(AttentionAligner):
    """`markup.Translator` for a transduce model: `translate` through
    `decoding.translate.translate_lines` with `options` (beam, alpha, ...; its defaults, the
    paper's), `align` through the model's attention (`AttentionAligner`)."""

    def __init__(self, model, src_vocab, tgt_vocab, layer: int | None = None, **options):
        super().__init__(model, src_vocab, tgt_vocab, layer)
        self.options = options

    @classmethod
    def from_loaded(cls, loaded, layer: int | None = None, **options) -> "ModelTranslator":
        """For a `decoding.ready.LoadedModel` (`load_for_decoding`)."""
        return cls(loaded.model, loaded.src_vocab, loaded.tgt_vocab, layer, **options)

    def translate(self, sentences: Sequence[str]) -> list[str]:
        from ..decoding.translate import translate_lines

        with torch.inference_mode():
            return translate_lines(self.model, self.src_vocab, self.tgt_vocab, list(sentences), **self.options)
