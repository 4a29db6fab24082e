"""`transduce import`: a Hugging Face MarianMT model (OPUS-MT's, as Helsinki-NLP publish them, or one
`transduce export marian` wrote) as a transduce model directory, as it is: the same function from
source ids to logits, tokenized as MarianTokenizer tokenizes, nothing renumbered.

What differs from the paper's model is carried by `ModelConfig` options (docs/paper_map.md): swish
in the FFN (`activation`), attention biases (`attention_bias`), the final logits bias
(`output_bias`), LayerNorm epsilon 1e-5 (`layer_norm_eps`); Marian's [sin | cos] sinusoids by
permuting the hidden dimension (`transduce.export.marian`). The vocabulary is Marian's: its special
ids are the model's (`ModelConfig.special_ids`: OPUS-MT's EOS 0, UNK 1, and PAD, the last id, which
is also the decoder's start token; tc-big's EOS 43311 as well), and its files, vocab.json (and
target_vocab.json) and source.spm / target.spm, are copied as they are (`data.vocab.MarianVocab`
reads them). A directory `transduce export marian` wrote of a model transduce trained keeps its
sentencepiece models alone (`marian_dir.in_transduce_layout`). The weights are read memory-mapped and
written a tensor at a time (`checkpoint.save_made_tensors_as_model`): an import holds the model's
largest tensor, never a second copy of the model.

The model's generation settings (generation_config.json, or config.json: num_beams, length_penalty,
max_length, bad_words_ids, the decoder's start) and its languages (tokenizer_config.json's, or its
name's: opus-mt-en-de; a multilingual model's `>>xx<<` target tokens) go into the model directory,
generation.json and data.json (`checkpoint.generation`), which `translate` and `serve` decode with
unless told otherwise: the defaults search as `generate` does.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

import torch

from ..checkpoint import atomic_dir, save_made_tensors_as_model
from ..config import Config
from ..data.vocab import MarianVocab, Vocab, copy_vocabs
from ..checkpoint.generation import GENERATION, Generation
from ..errors import DataError, UsageError
from ..model import Transformer
from .marian import INFO
from .marian_dir import (
    MarianWeights,
    config_from_marian,
    in_transduce_layout,
    read_json,
    read_marian_config,
    tensor_plan,
)

HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")
"""A Hugging Face hub id, owner/name (Helsinki-NLP/opus-mt-en-de)."""

LANGUAGE_TOKEN = re.compile(r">>[^<>\s]+<<")
"""A multilingual OPUS-MT model's target-language tokens, `>>fra<<`, put before a source sentence."""


@dataclass
class Imported:
    """A MarianMT directory, read (`read_import`): its config, the function that makes each tensor,
    its vocabularies, and whether they are Marian's (else sentencepiece models in transduce's layout)."""

    config: Config
    plan: dict[str, Callable[[], torch.Tensor]]
    src_vocab: Vocab
    tgt_vocab: Vocab
    marian_vocab: bool


@contextlib.contextmanager
def read_import(path: Path) -> Iterator[Imported]:
    """The directory `path` read for an import, its weights open (memory-mapped) while in the block."""
    mc = read_marian_config(path)
    info = read_json(path / INFO) if (path / INFO).is_file() else None  # written by `transduce export marian`
    separate = (path / "target_vocab.json").is_file()
    if in_transduce_layout(path):
        sv = Vocab(path / "source.spm")
        tv = sv if not separate and mc["share_encoder_decoder_embeddings"] else Vocab(path / "target.spm")
    else:
        start = mc["decoder_start_token_id"] if mc["decoder_start_token_id"] is not None else mc["pad_token_id"]
        sv = MarianVocab(path / "source.spm", path / "vocab.json", start)
        tv = MarianVocab(
            path / "target.spm", path / ("target_vocab.json" if separate else "vocab.json"), start, shares=sv
        )
    weights = MarianWeights(path)
    try:
        if info is not None:
            config, permuted = Config.from_dict(info["config"]), bool(info.get("hidden_permuted", True))
        else:
            bias = (
                weights.name("final_logits_bias") is not None
                and float(weights.get("final_logits_bias").abs().max()) != 0
            )
            config, permuted = config_from_marian(mc, tv.unk, output_bias=bias), True
        _check_vocabularies(path, config, sv, tv, separate)
        yield Imported(config, tensor_plan(weights, config.model, permuted), sv, tv, isinstance(tv, MarianVocab))
    finally:
        weights.close()


def _check_vocabularies(path: Path, config: Config, sv: Vocab, tv: Vocab, separate: bool) -> None:
    """The vocabularies' sizes and ids are the config's, or a one-line DataError naming the file."""
    c = config.model
    tgt_file = path / ("target_vocab.json" if separate else "vocab.json")
    for side, v, n, file in (
        ("source", sv, c.src_vocab_size, path / "vocab.json"),
        ("target", tv, c.target_vocab_size, tgt_file),
    ):
        if len(v) != n:
            raise DataError(f"{len(v)} pieces, but config.json says the {side} vocabulary has {n}", file)
    for name in ("pad", "eos"):
        if getattr(tv.ids, name) != getattr(c, f"{name}_id"):
            raise DataError(
                f"its {name} piece is id {getattr(tv.ids, name)}, config.json's {name} id {getattr(c, f'{name}_id')}",
                tgt_file,
            )
    if sv.pad != c.pad_id:  # sources are padded, and their padding masked, by the model's one pad id
        raise DataError(
            f"its <pad> is id {sv.pad}, the target's {c.pad_id}: transduce pads both sides with one id",
            path / "vocab.json",
        )


def import_marian(path: str | os.PathLike) -> tuple[Transformer, Config, Vocab, Vocab]:
    """A MarianMT directory as a model, its config and vocabularies, in memory (`write_model_dir`
    writes one without ever holding the model twice)."""
    path = Path(path)
    with read_import(path) as imported:
        model = Transformer(imported.config.model)
        tensors = {name: make() for name, make in imported.plan.items()}
    missing, unexpected = model.load_state_dict(tensors, strict=False)
    missing = [k for k in missing if not (k == "decoder.embed.weight" and imported.config.model.share_embeddings)]
    if missing or unexpected:
        raise ValueError(
            f"{path}: the weights do not fit the model (missing {missing[:3]}, unexpected {unexpected[:3]})"
        )
    return model.eval(), imported.config, imported.src_vocab, imported.tgt_vocab


def write_model_dir(marian_dir: str | os.PathLike, out: str | os.PathLike, *, name: str | None = None) -> str:
    """A MarianMT directory as a transduce model directory at `out` (whole or not at all): its
    weights a tensor at a time, its vocabulary files as they are, data.json (the vocabulary, the
    special ids, the languages) and generation.json. `name`: the hub id it came by (for the
    languages and the record). Returns what it was, for the user."""
    marian_dir = Path(marian_dir)
    with read_import(marian_dir) as imported, atomic_dir(out) as tmp:
        c = imported.config.model
        save_made_tensors_as_model(imported.plan, imported.config, tmp)
        record = copy_vocabs(imported.src_vocab, imported.tgt_vocab, tmp)
        languages = model_languages(marian_dir, name, imported.src_vocab)
        meta = {
            "format": 1,
            **{k: v for k, v in languages.items() if k != "target_tokens"},
            "vocab": record,
            "special_ids": c.special_ids.to_dict(),
            "imported_from": name or str(marian_dir.absolute()),
        }
        (tmp / "data.json").write_text(json.dumps(meta, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
        generation = generation_settings(marian_dir, c.special_ids.pad, c.bos_id, languages)
        generation.write(tmp / GENERATION)
    kind = "Marian's vocabulary kept" if imported.marian_vocab else "its sentencepiece models in transduce's layout"
    return f"MarianMT model, {kind}; {generation.line()}"


GENERATE_DEFAULTS = {"num_beams": 1, "length_penalty": 1.0, "max_length": 20, "early_stopping": False}
"""Hugging Face generate's defaults for what the model's files leave out."""

NOT_APPLIED = {
    "no_repeat_ngram_size": 0,
    "repetition_penalty": 1.0,
    "renormalize_logits": False,
    "min_length": 0,
    "do_sample": False,
    "num_beam_groups": 1,
    "encoder_no_repeat_ngram_size": 0,
}
"""generate's settings transduce's search does not apply, at their neutral values: another value is
kept in generation.json under "not_applied" and said at import."""


def generation_settings(path: Path, pad_id: int, start_id: int, languages: dict) -> Generation:
    """The model's generation settings (generation_config.json over config.json's, generate's defaults
    for the rest) as transduce's search takes them (`checkpoint.generation.Generation`)."""
    config = read_json(path / "config.json")
    given = {
        **{k: v for k, v in config.items() if k in (*GENERATE_DEFAULTS, *NOT_APPLIED, "bad_words_ids")},
        **(read_json(path / "generation_config.json") if (path / "generation_config.json").is_file() else {}),
    }
    s = {**GENERATE_DEFAULTS, **{k: v for k, v in given.items() if v is not None}}
    bad = [list(ids) for ids in s.get("bad_words_ids") or []]
    unapplied = {k: given[k] for k, neutral in NOT_APPLIED.items() if given.get(k) not in (None, neutral)}
    if any(ids not in ([pad_id], [start_id]) for ids in bad):  # the search bans PAD and the start token, no others
        unapplied["bad_words_ids"] = bad
    return Generation(
        beam=int(s["num_beams"]),
        length_penalty=float(s["length_penalty"]),
        max_length=int(s["max_length"]),
        bad_words_ids=bad,
        src_lang=languages.get("src_lang"),
        tgt_lang=languages.get("tgt_lang"),
        target_tokens=languages.get("target_tokens", []),
        not_applied=unapplied,
    )


def model_languages(path: Path, name: str | None, src_vocab: Vocab) -> dict:
    """{"src_lang", "tgt_lang", "target_tokens"} as far as known: tokenizer_config.json's source_lang
    and target_lang, else the model's name (opus-mt-SRC-TGT, tc-big's too); a multilingual model's
    `>>xx<<` pieces."""
    tok = read_json(path / "tokenizer_config.json") if (path / "tokenizer_config.json").is_file() else {}
    found = {
        f"{k}_lang": tok[f"{full}_lang"]
        for k, full in (("src", "source"), ("tgt", "target"))
        if isinstance(tok.get(f"{full}_lang"), str)
    }
    parts = (name or path.name).rsplit("/", 1)[-1].split("-")
    if len(parts) >= 4 and parts[:2] == ["opus", "mt"]:
        found = {"src_lang": parts[-2], "tgt_lang": parts[-1], **found}
    tokens = [p for p in (src_vocab.sp.id_to_piece(i) for i in range(len(src_vocab))) if LANGUAGE_TOKEN.fullmatch(p)]
    return {**found, **({"target_tokens": tokens} if tokens else {})}


# -- a model by name: the Hugging Face hub --------------------------------------------------------


def resolve_source(source: str) -> tuple[Path, str | None]:
    """(the local MarianMT directory, the hub id or None) of `transduce import SOURCE`: a directory
    as it is; a hub id (owner/name) downloaded by huggingface_hub into its cache (or found there,
    offline). Refused in one line saying what to do where the hub cannot be reached."""
    path = Path(source).expanduser()
    if path.exists() or not HUB_ID.fullmatch(source):
        if not path.is_dir():
            raise FileNotFoundError(f"{source}: no such directory (nor a hub id such as Helsinki-NLP/opus-mt-en-de)")
        return path, None
    from ..extras import require

    hub = require("huggingface_hub", f"importing {source} from the Hugging Face hub")
    from huggingface_hub import constants

    patterns = ["*.json", "*.spm", "model.safetensors*", "pytorch_model.bin"]
    elsewhere = f"download it where the hub is reachable (hf download {source}) and pass its directory"
    try:
        listed = hub.snapshot_download(source, allow_patterns=patterns)
    except Exception as e:  # noqa: BLE001 - every hub failure, in one line with what to do
        kind = type(e).__name__
        if kind in ("RepositoryNotFoundError", "GatedRepoError", "RevisionNotFoundError"):
            raise UsageError(f"{source}: not a model the Hugging Face hub gives ({kind})") from None
        if constants.HF_HUB_OFFLINE:
            raise UsageError(
                f"{source}: not in huggingface_hub's cache, and HF_HUB_OFFLINE is set: {elsewhere}, "
                "or unset HF_HUB_OFFLINE"
            ) from None
        first = next((line.strip() for line in str(e).splitlines() if line.strip()), kind)
        raise UsageError(
            f"{source}: the Hugging Face hub cannot be reached ({first[:120]}), and the model is not in its "
            f"cache: {elsewhere} (one in the cache already: HF_HUB_OFFLINE=1)"
        ) from None
    return Path(listed), source
