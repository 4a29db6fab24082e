"""What the server decodes with: an `Engine` over a PyTorch model or over a CTranslate2 export,
each decoding a round's sentences with its search settings (`transduce.decoding.settings.SearchSettings`)
as `transduce translate` does (`transduce.decoding.translate.translate_stream`).

What an engine tells clients (`Engine.info`, /info, the demo page, the attention JSON) names the
model without the server's file system (`public_model`); error messages pass through `scrub`,
which keeps the last part of any absolute path.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from pathlib import PurePosixPath
from typing import Callable

from ..decoding.settings import SearchSettings
from ..defaults import BATCH_SIZE, BATCH_TOKENS, SERVE_MAX_TOKENS


class RequestError(ValueError):
    """What the request asks cannot be done (the server answers 422 with this message)."""


@dataclass
class Engine:
    """What the server decodes with: `translate(sentences, search)` -> candidates per sentence (on
    the decoding thread only), `encode(sentence)` -> source ids (for the limits), what /info shows;
    optional: `attention(source, target or None, search)` -> the attention JSON (on the decoding
    thread), `tree(source, output)` -> a parsing model's tree, `align(sources, outputs)` -> per
    pair its links (`text.markup.Link`: output characters to source characters, from the model's
    attention; on the decoding thread), which place HTML's and documents' tags (none: in proportion)."""

    translate: Callable[[list[str], SearchSettings], list]
    encode: Callable[[str], list[int]]
    info: dict
    attention: Callable[[str, str | None, SearchSettings], dict] | None = None
    tree: Callable[[str, str], object] | None = None
    encode_target: Callable[[str], list[int]] | None = None
    models: object | None = None  # several models behind one server: their `serve.models.ModelSet`
    align: Callable[[list[str], list[str]], list] | None = None


def torch_engine(
    loaded,
    *,
    batch_tokens: int = BATCH_TOKENS,
    batch_size: int = BATCH_SIZE,
    max_tokens: int = SERVE_MAX_TOKENS,
    bf16: bool = False,
) -> Engine:
    """An engine over a `LoadedModel` (made ready once, by `transduce.decoding.ready.load_for_decoding`, for the
    server's life): `translate_stream` as `transduce translate` (or `parse`) runs it."""
    from ..parsing.parse import is_parsing_model, predicts_tags
    from ..parsing.tokenize import ptb_tokenize
    from ..parsing.trees import delinearize

    parsing, tags = is_parsing_model(loaded.metadata), predicts_tags(loaded.metadata)

    def prepare(sentence: str) -> str:  # what `transduce parse` (or `translate`) feeds the model
        return " ".join(ptb_tokenize(sentence)) if parsing else sentence

    def tree(source: str, output: str):
        return delinearize(output.split(), ptb_tokenize(source), tags=tags)[0] if source.strip() else None

    def attention(source: str, target: str | None, s: SearchSettings) -> dict:
        from ..views.weights import attention_data

        try:
            _, data = attention_data(
                loaded,
                [prepare(source)],
                [target],
                beam=s.beam,
                alpha=s.alpha,
                greedy=s.greedy,
                max_len_offset=s.max_len_offset,
            )
        except ValueError as e:  # too many weights for a page, an empty sentence: the request's fault
            raise RequestError(str(e)) from None
        data["sentences"][0]["source_text"] = source
        data["model"] = public["model"]  # its name, not where it lies on the server's disk
        return data

    precision = getattr(loaded.precision, "precision", None) or (
        "bf16" if bf16 else str(next(loaded.model.parameters()).dtype).replace("torch.", "")
    )
    public = public_model(loaded.description, loaded.config, loaded.metadata, precision)
    info = {
        "engine": "torch",
        **public,
        "task": "parsing" if parsing else "translation",
        "attention": True,
        "config": asdict(loaded.config.model),
        "vocab": _vocab_info(loaded.src_vocab, loaded.tgt_vocab),
    }
    translate = decoder(
        loaded.model,
        loaded.src_vocab,
        loaded.tgt_vocab,
        batch_tokens=batch_tokens,
        batch_size=batch_size,
        max_tokens=max_tokens,
        bf16=bf16,
        prepare=prepare,
    )
    align = None
    if not parsing:  # tags placed by the encoder-decoder attention, as `transduce translate --file` places them
        from ..text.align import AttentionAligner

        align = AttentionAligner(loaded.model, loaded.src_vocab, loaded.tgt_vocab).align
    return Engine(
        translate,
        lambda x: loaded.src_vocab.encode(prepare(x)),
        info,
        attention=attention,
        tree=tree if parsing else None,
        encode_target=loaded.tgt_vocab.encode,
        align=align,
    )


def ct2_engine(
    model, *, batch_tokens: int = BATCH_TOKENS, batch_size: int = BATCH_SIZE, max_tokens: int = SERVE_MAX_TOKENS
) -> Engine:
    """An engine over a `transduce.decoding.engines.CT2Model` (CTranslate2 gives no attention weights;
    the length penalty it ranks by is the search settings': "paper" or its own, "ct2")."""
    info = {
        "engine": "ct2",
        **public_model(model.description, model.config, None, model.compute_type),
        "task": "translation",
        "attention": False,
        "config": asdict(model.config.model),
        "vocab": _vocab_info(model.src_vocab, model.tgt_vocab),
    }
    translate = decoder(
        model, model.src_vocab, model.tgt_vocab, batch_tokens=batch_tokens, batch_size=batch_size, max_tokens=max_tokens
    )
    return Engine(translate, model.src_vocab.encode, info)


def decoder(
    model,
    src_vocab,
    tgt_vocab,
    *,
    batch_tokens: int,
    batch_size: int,
    max_tokens: int,
    bf16: bool = False,
    prepare: Callable[[str], str] | None = None,
) -> Callable[[list[str], SearchSettings], list]:
    """`Engine.translate` for either engine's model: a round's sentences (each `prepare`d) decoded
    with its settings by `translate_stream`, as `transduce translate` decodes them, in one chunk."""
    from ..decoding.translate import translate_stream

    def translate(sentences: list[str], s: SearchSettings) -> list:
        lines = [prepare(x) for x in sentences] if prepare is not None else sentences
        return list(
            translate_stream(
                model,
                src_vocab,
                tgt_vocab,
                lines,
                **asdict(s),
                batch_tokens=batch_tokens,
                batch_size=batch_size,
                max_input_tokens=max_tokens,
                bf16=bf16,
                chunk_lines=max(1, len(sentences)),
            )
        )

    return translate


# -- what clients are told about the model -------------------------------------------------------

_AVERAGE = re.compile(r"average of the last (\d+) checkpoints \((\S+) \.\. (\S+)\) of (.+)")
_CT2 = re.compile(r"CTranslate2 model (.+) \(([^()]*(?:, computed [^()]*)?)\)")
# An absolute POSIX path of two parts or more (a lone /info or /translate is a route, kept)
_ABSOLUTE = re.compile(r"(?<![\w.:/~-])(?:/[^\s/'\"()<>:,;]+){2,}/?")


def scrub(text: str) -> str:
    """`text` with every absolute path replaced by its last part (`/srv/runs/m30k/model` ->
    `model`): what an error message may say to a client about the server's files."""
    return _ABSOLUTE.sub(lambda m: PurePosixPath(m.group()).name or "/", text)


def model_name(description: str) -> tuple[str, str]:
    """(name, what it is) of a loaded model from its loader's description, without the directories
    above it: (the run's name, "average of the last 5 checkpoints (..)", "final weights" or
    "checkpoint step_N"), or (a model directory's name, "model directory")."""
    if m := _AVERAGE.fullmatch(description):
        n, first, last, run = m.groups()
        what = f"checkpoint {last}" if n == "1" else f"average of the last {n} checkpoints ({first} .. {last})"
        return PurePosixPath(run).name or run, what
    if m := _CT2.fullmatch(description):
        return PurePosixPath(m.group(1)).name or "model", f"CTranslate2 export ({m.group(2)})"
    path = PurePosixPath(description)
    if path.parent.name == "checkpoints" and path.parent.parent.name:
        return path.parent.parent.name, f"checkpoint {path.name}"
    if path.name == "model" and path.parent.name:
        return path.parent.name, "final weights"
    return path.name or scrub(description), "model directory"


def parameter_count(config) -> int:
    """Parameters of a model of this configuration (built on the meta device, without initialising
    it: `checkpoint.model_dir.skeleton`, which spares the process PyTorch's Python decompositions,
    about 70 MB)."""
    from ..checkpoint.model_dir import skeleton
    from ..model import count_parameters

    return count_parameters(skeleton(config))


def _size(n: int) -> str:
    return f"{n / 1e9:.1f}B" if n >= 10**9 else f"{n / 1e6:.1f}M" if n >= 10**6 else f"{n / 1e3:.0f}K"


def public_model(description: str, config, metadata: dict | None, precision: str) -> dict:
    """What /info says of the model: its name, which weights, languages, parameters (and "size",
    e.g. "7.6M"), precision. Never a path of the server's."""
    name, detail = model_name(description)
    try:
        n = parameter_count(config)
    except Exception:  # noqa: BLE001 - a configuration the model cannot be built from: no count
        n = None
    meta = metadata or {}
    languages = {"src": meta.get("src_lang"), "tgt": meta.get("tgt_lang")} if meta.get("src_lang") else None
    return {
        "model": name,
        "model_detail": detail,
        "languages": languages,
        "parameters": n,
        "size": _size(n) if n else None,
        "precision": precision,
    }


def _vocab_info(src, tgt) -> dict:
    """The vocabularies' sizes, and whether source and target share one (no file names)."""
    shared = src is tgt or getattr(src, "path", None) == getattr(tgt, "path", None)
    return {"src_size": len(src), "tgt_size": len(tgt), "shared": shared}
