"""A transduce model as a Hugging Face MarianMT directory (reading one back: `marian_dir`).

`export_marian` writes a directory that `transformers.MarianMTModel.from_pretrained` and
`MarianTokenizer.from_pretrained` load offline (the import of one, where a round trip is bitwise
identical: `transduce.export.opus`). The special ids are the model's
(`ModelConfig.special_ids`), written as Marian's pad, eos and decoder start ids; an imported OPUS-MT
model's vocabulary files are written back as they came.

MarianMT is the paper's architecture as Hugging Face runs it; what differs is in docs/export.md.
Marian's sinusoids are [sin | cos] halves, computed, not stored, so the export permutes the hidden
dimension instead (`hidden_permutation`): weights reading the residual stream get their columns
permuted, weights and biases writing to it their rows, LayerNorms theirs; the logits are the same.
The permutation and the names of every layer's parts (`permuters`, `layer_parts`) serve both ways.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import torch

from ..checkpoint import atomic_dir
from ..config import Config, ModelConfig
from ..data.vocab import MarianVocab, Vocab, shares_ids
from ..extras import require
from ..model import Transformer

INFO = "transduce.json"
DEFAULT_MAX_POSITIONS = 1024
"""Marian's `max_position_embeddings` (Hugging Face's default): sources and outputs up to 1024 tokens."""


def hidden_permutation(d_model: int) -> torch.Tensor:
    """perm with marian_vector = transduce_vector[perm]: transduce's interleaved dimensions
    (sin 0, cos 1, sin 2, ...) in Marian's order (sin 0, 2, 4, ... | cos 1, 3, 5, ...)."""
    return torch.cat([torch.arange(0, d_model, 2), torch.arange(1, d_model, 2)])


def permuters(perm: torch.Tensor):
    """(reads, writes): copies of a weight with `perm` applied to its columns (it reads the residual
    stream) or to its rows (a weight or bias written into it)."""
    return (lambda w: w.detach()[:, perm].contiguous()), (lambda w: w.detach()[perm].contiguous())


def layer_parts(n_layers: int):
    """(kind, transduce name, MarianMTModel name) of every part of every layer."""
    for side in ("encoder", "decoder"):
        for i in range(n_layers):
            t, m = f"{side}.layers.{i}", f"model.{side}.layers.{i}"
            yield "attention", f"{t}.self_attn", f"{m}.self_attn"
            yield "norm", f"{t}.norm1", f"{m}.self_attn_layer_norm"
            if side == "decoder":
                yield "attention", f"{t}.cross_attn", f"{m}.encoder_attn"
                yield "norm", f"{t}.norm2", f"{m}.encoder_attn_layer_norm"
            yield "ffn", f"{t}.feed_forward", m
            yield "norm", f"{t}.norm{3 if side == 'decoder' else 2}", f"{m}.final_layer_norm"


def _check_exportable(c: ModelConfig) -> None:
    if c.word_positions:
        raise ValueError("MarianMT has no word positions (model.word_positions, not in the paper)")
    if c.attention_window is not None:
        raise ValueError(
            f"MarianMT has no restricted self-attention (model.attention_window {c.attention_window}, "
            "Table 1): decode this model with transduce"
        )
    if c.norm_first:
        raise ValueError("MarianMT is post-norm (the paper's); this model is pre-norm (norm_first)")
    if c.positional != "sinusoidal":
        raise ValueError("MarianMT has fixed sinusoidal positions; this model's are learned")
    if c.head_dim_k * c.n_heads != c.d_model or c.head_dim_v * c.n_heads != c.d_model:
        raise ValueError("MarianMT needs d_k = d_v = d_model / h")


def marian_state_dict(model: Transformer, permute_hidden: bool = True) -> dict[str, torch.Tensor]:
    """The transduce model's parameters under MarianMTModel's names, the hidden dimension
    permuted (see the module docstring). `permute_hidden=False` leaves it in transduce's order:
    only to show that the permutation is needed."""
    c = model.config
    _check_exportable(c)
    d = c.d_model
    reads, writes = permuters(hidden_permutation(d) if permute_hidden else torch.arange(d))

    def zeros_or(b, n):
        return torch.zeros(n) if b is None else b.detach().clone()

    sd: dict[str, torch.Tensor] = {}

    def attention(prefix, attn):
        q, k, v = attn.in_proj.weight.split([d, d, d])
        bias = attn.in_proj.bias.split([d, d, d]) if attn.in_proj.bias is not None else (None, None, None)
        for name, w, b in zip("qkv", (q, k, v), bias):
            sd[f"{prefix}.{name}_proj.weight"] = reads(w)
            sd[f"{prefix}.{name}_proj.bias"] = zeros_or(b, d)
        sd[f"{prefix}.out_proj.weight"] = writes(attn.out_proj.weight)
        sd[f"{prefix}.out_proj.bias"] = writes(zeros_or(attn.out_proj.bias, d))

    def norm(prefix, ln):
        sd[f"{prefix}.weight"], sd[f"{prefix}.bias"] = writes(ln.weight), writes(ln.bias)

    def ffn(prefix, ff):
        sd[f"{prefix}.fc1.weight"], sd[f"{prefix}.fc1.bias"] = reads(ff.w_1.weight), ff.w_1.bias.detach().clone()
        sd[f"{prefix}.fc2.weight"], sd[f"{prefix}.fc2.bias"] = writes(ff.w_2.weight), writes(ff.w_2.bias)

    setters = {"attention": attention, "norm": norm, "ffn": ffn}
    for kind, name, marian_name in layer_parts(c.n_layers):
        setters[kind](marian_name, model.get_submodule(name))
    src_embed, tgt_embed = reads(model.encoder.embed.weight), reads(model.decoder.embed.weight)
    if c.share_embeddings:
        sd["model.shared.weight"] = src_embed
    sd["model.encoder.embed_tokens.weight"] = src_embed
    sd["model.decoder.embed_tokens.weight"] = tgt_embed
    sd["lm_head.weight"] = tgt_embed if model.output_proj is None else reads(model.output_proj.weight)
    bias = model.output_bias
    sd["final_logits_bias"] = (
        torch.zeros(1, c.target_vocab_size) if bias is None else bias.detach().reshape(1, -1).clone()
    )
    return sd


def marian_config(c: ModelConfig, max_positions: int = DEFAULT_MAX_POSITIONS):
    """The MarianConfig of a transduce ModelConfig."""
    transformers = require("transformers", "exporting to Hugging Face")
    return transformers.MarianConfig(
        vocab_size=c.src_vocab_size,
        decoder_vocab_size=c.target_vocab_size,
        share_encoder_decoder_embeddings=c.share_embeddings,
        tie_word_embeddings=c.share_embeddings or c.tie_output,
        max_position_embeddings=max_positions,
        d_model=c.d_model,
        encoder_layers=c.n_layers,
        decoder_layers=c.n_layers,
        encoder_attention_heads=c.n_heads,
        decoder_attention_heads=c.n_heads,
        encoder_ffn_dim=c.d_ff,
        decoder_ffn_dim=c.d_ff,
        activation_function=c.activation,
        scale_embedding=c.scale_embeddings,
        dropout=c.dropout,
        attention_dropout=c.attention_dropout,
        activation_dropout=0.0,
        pad_token_id=c.pad_id,
        eos_token_id=c.eos_id,
        decoder_start_token_id=c.bos_id,
        bos_token_id=c.bos_id,
        forced_eos_token_id=None,
    )


def export_marian(
    model: Transformer,
    config: Config,
    src_vocab: Vocab,
    tgt_vocab: Vocab,
    out: str | os.PathLike,
    *,
    max_positions: int = DEFAULT_MAX_POSITIONS,
    force: bool = False,
    permute_hidden: bool = True,
    description: str = "",
) -> Path:
    """Write a MarianMT directory with its tokenizer files, whole or not at all. Returns `out`."""
    transformers = require("transformers", "exporting to Hugging Face")
    out = Path(out)
    if out.exists() and not force:
        raise FileExistsError(f"{out}: exists (use --overwrite to replace it)")
    c = config.model
    _check_exportable(c)
    sd = marian_state_dict(model.float(), permute_hidden)
    with atomic_dir(out) as tmp:
        hf = transformers.MarianMTModel(marian_config(c, max_positions))
        missing, unexpected = hf.load_state_dict(sd, strict=False)
        missing = [k for k in missing if not k.endswith("embed_positions.weight")]
        if missing or unexpected:
            raise ValueError(
                f"MarianMTModel's parameters do not match (missing {missing[:3]}, unexpected {unexpected[:3]})"
            )
        hf.generation_config.decoder_start_token_id = c.bos_id
        hf.generation_config.bad_words_ids = [[i] for i in dict.fromkeys((c.pad_id, c.bos_id))]  # as decoding.search
        hf.generation_config.max_length = max_positions  # not generate's default 20, which cuts outputs
        hf.save_pretrained(tmp)
        shared = shares_ids(src_vocab, tgt_vocab)
        shutil.copy(src_vocab.path, tmp / "source.spm")
        shutil.copy(tgt_vocab.path, tmp / "target.spm")
        for name, v in [("vocab.json", src_vocab)] + ([] if shared else [("target_vocab.json", tgt_vocab)]):
            if isinstance(v, MarianVocab):  # an imported model's: Marian's own file, as it came
                shutil.copy(v.pieces_path, tmp / name)
                continue
            mapping = {v.sp.id_to_piece(i): i for i in range(len(v))}
            (tmp / name).write_text(json.dumps(mapping, ensure_ascii=False, indent=1), encoding="utf-8")
        tok_config = {
            "tokenizer_class": "MarianTokenizer",
            "separate_vocabs": not shared,
            "model_max_length": max_positions,
            "unk_token": "<unk>",
            "eos_token": "</s>",
            "pad_token": "<pad>",
        }
        (tmp / "tokenizer_config.json").write_text(json.dumps(tok_config, indent=2) + "\n", encoding="utf-8")
        info = {
            "format": "transduce-marian",
            "version": 1,
            "shared_vocab": shared,
            "hidden_permuted": permute_hidden,
            "exported_from": description,
            "config": config.to_dict(),
        }
        (tmp / INFO).write_text(json.dumps(info, indent=2) + "\n", encoding="utf-8")
    return out
