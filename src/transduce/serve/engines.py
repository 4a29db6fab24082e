"""What the server decodes with: an `Engine` over a PyTorch model (`transduce translate`'s own
decoding) or over a CTranslate2 export, and a request's search settings (`Search`).

An engine's `translate(sentences, search)` runs on the decoding thread only (`serve.batcher`);
`encode(sentence)` gives the source token ids the limits count. A PyTorch engine also gives the
attention weights of one sentence and a translation (`attention`: the JSON of
`transduce.views.weights`, what `transduce attention` draws), and, for a parsing model (its
data.json says "task": "parsing", Section 6.3), the tree of an output (`tree`): the sentence is
tokenized the Penn Treebank way and the output repaired into a tree over exactly its words, as
`transduce parse` does.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Callable

from ..translate import DEFAULT_ALPHA, DEFAULT_BATCH_SIZE, DEFAULT_BATCH_TOKENS, DEFAULT_BEAM, DEFAULT_MAX_LEN_OFFSET

DEFAULT_MAX_TOKENS = 256
"""Subword tokens per sentence a request may send (EOS not counted): `Limits.max_tokens`."""


@dataclass(frozen=True)
class Search:
    """A request's search settings (hashable: jobs with equal settings share a round)."""

    beam: int = DEFAULT_BEAM
    alpha: float = DEFAULT_ALPHA
    max_len_offset: int = DEFAULT_MAX_LEN_OFFSET
    n_best: int = 1
    greedy: bool = False


class RequestError(ValueError):
    """What the request asks cannot be done (the server answers 422 with this message)."""


@dataclass
class Engine:
    """What the server decodes with: `translate(sentences, search)` -> candidates per sentence
    (called on the decoding thread only), `encode(sentence)` -> source token ids (for the limits),
    and what /info shows. Optional: `attention(source, target, search)` -> the attention JSON of one
    sentence with `target` (None: the model's own translation with `search`), on the decoding
    thread; `tree(source, output)` -> the parse tree of an output (a parsing model)."""

    translate: Callable[[list[str], Search], list]
    encode: Callable[[str], list[int]]
    info: dict
    attention: Callable[[str, str | None, Search], dict] | None = None
    tree: Callable[[str, str], object] | None = None
    encode_target: Callable[[str], list[int]] | None = None


def torch_engine(loaded, *, batch_tokens: int = DEFAULT_BATCH_TOKENS, batch_size: int = DEFAULT_BATCH_SIZE,
                 max_tokens: int = DEFAULT_MAX_TOKENS, bf16: bool = False) -> Engine:
    """An engine over a `transduce.translate.LoadedModel`: `translate_stream`, exactly as
    `transduce translate` runs it (for a parsing model, exactly as `transduce parse` does)."""
    from ..parsing.parse import is_parsing_model, predicts_tags
    from ..translate import translate_stream

    parsing = is_parsing_model(loaded.metadata)
    if parsing:
        from ..parsing.tokenize import ptb_tokenize
        from ..parsing.trees import delinearize

        tags = predicts_tags(loaded.metadata)

        def prepare(sentence: str) -> str:  # what `transduce parse` feeds the model
            return " ".join(ptb_tokenize(sentence))

        def tree(source: str, output: str):
            return delinearize(output.split(), ptb_tokenize(source), tags=tags)[0] if source.strip() else None
    else:
        def prepare(sentence: str) -> str:
            return sentence

        tree = None

    def translate(sentences: list[str], s: Search) -> list:
        return list(translate_stream(
            loaded.model, loaded.src_vocab, loaded.tgt_vocab, [prepare(x) for x in sentences], beam=s.beam,
            alpha=s.alpha, max_len_offset=s.max_len_offset, n_best=s.n_best, greedy=s.greedy, batch_tokens=batch_tokens,
            batch_size=batch_size, max_input_tokens=max_tokens, bf16=bf16, chunk_lines=max(1, len(sentences)),
        ))

    def attention(source: str, target: str | None, s: Search) -> dict:
        from ..views.weights import attention_data

        try:
            _, data = attention_data(loaded, [prepare(source)], [target], beam=s.beam, alpha=s.alpha, greedy=s.greedy,
                                     max_len_offset=s.max_len_offset)
        except ValueError as e:  # too many weights for a page, an empty sentence: the request's fault
            raise RequestError(str(e)) from None
        data["sentences"][0]["source_text"] = source
        return data

    mc = loaded.config.model
    precision = getattr(loaded.precision, "precision", None) or ("bf16" if bf16 else str(next(loaded.model.parameters()).dtype).replace("torch.", ""))
    info = {"engine": "torch", "model": loaded.description, "precision": precision,
            "task": "parsing" if parsing else "translation", "attention": True,
            "config": asdict(mc), "vocab": {"src": str(loaded.src_vocab.path), "tgt": str(loaded.tgt_vocab.path),
                                            "src_size": len(loaded.src_vocab), "tgt_size": len(loaded.tgt_vocab)}}
    return Engine(translate, lambda x: loaded.src_vocab.encode(prepare(x)), info, attention=attention, tree=tree,
                  encode_target=loaded.tgt_vocab.encode)


def ct2_engine(model, *, batch_tokens: int = DEFAULT_BATCH_TOKENS, batch_size: int = DEFAULT_BATCH_SIZE,
               max_tokens: int = DEFAULT_MAX_TOKENS, length_penalty: str = "paper") -> Engine:
    """An engine over a `transduce.export.ct2.CT2Model` (no attention weights: CTranslate2 does not
    give them)."""

    def translate(sentences: list[str], s: Search) -> list:
        return list(model.translate_stream(
            sentences, beam=s.beam, alpha=s.alpha, max_len_offset=s.max_len_offset, n_best=s.n_best, greedy=s.greedy,
            batch_tokens=batch_tokens, batch_size=batch_size, max_input_tokens=max_tokens,
            chunk_lines=max(1, len(sentences)), length_penalty=length_penalty,
        ))

    info = {"engine": "ct2", "model": model.description, "precision": model.compute_type, "length_penalty": length_penalty,
            "task": "translation", "attention": False,
            "config": asdict(model.config.model), "vocab": {"src": str(model.src_vocab.path), "tgt": str(model.tgt_vocab.path),
                                                           "src_size": len(model.src_vocab), "tgt_size": len(model.tgt_vocab)}}
    return Engine(translate, model.src_vocab.encode, info)
