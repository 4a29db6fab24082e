"""A transduce model as a CTranslate2 model directory (decoding with it: `transduce.decoding.engines`).

`export_ct2` fills a `ctranslate2.specs.TransformerSpec` through a `Converter` of our own, one
setter per part, `build_spec` (CTranslate2's Hugging Face path would start the decoder with PAD).
Two traps (docs/export.md): CTranslate2's own sinusoids are [sin | cos] halves where 3.5's
interleave, so the position table is always written; its length penalty is |Y|^alpha, so
`length_penalty="paper"` ranks all `beam` finished hypotheses by ((5 + |Y|) / 6)^alpha (6.1).
The special tokens are the model's (`ModelConfig.special_ids`: its start token, its EOS), named by
their pieces. The directory also holds the vocabulary's files as they are and transduce.json, so
that `--engine ct2 DIR` needs nothing else.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import torch

from ..checkpoint import atomic_dir
from ..config import Config
from ..data.vocab import Vocab, copy_vocabs
from ..extras import require
from ..model import Transformer
from ..positions import sinusoidal_positions

QUANTIZATIONS = ("float32", "int8", "int8_float32")
"""float32 (exact), int8 weights (computed in int8 where the hardware can, or in float32)."""

DEFAULT_SINUSOID_POSITIONS = 1536
"""Rows of the position table of sinusoidal models: the 1024-token input limit, EOS, offsets to 511."""

INFO = "transduce.json"
"""Written beside CTranslate2's files: the transduce config, the vocabulary files, the export."""


def _np(t: torch.Tensor) -> np.ndarray:
    return t.detach().to(torch.float32).cpu().numpy().copy()


def pieces(vocab: Vocab) -> list[str]:
    """The vocabulary as CTranslate2 sees it: the sentencepiece piece of every id, in id order."""
    return [vocab.sp.id_to_piece(i) for i in range(len(vocab))]


def _set_linear(spec, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
    spec.weight = _np(weight)
    if bias is not None:
        spec.bias = _np(bias)


def _set_layer_norm(spec, norm: torch.nn.LayerNorm) -> None:
    spec.gamma, spec.beta = _np(norm.weight), _np(norm.bias)


def _set_self_attention(spec, attn, norm: torch.nn.LayerNorm) -> None:
    """[W^Q; W^K; W^V] is already CTranslate2's fused QKV matrix (the same row order)."""
    _set_layer_norm(spec.layer_norm, norm)
    _set_linear(spec.linear[0], attn.in_proj.weight, attn.in_proj.bias)
    _set_linear(spec.linear[1], attn.out_proj.weight, attn.out_proj.bias)


def _set_cross_attention(spec, attn, norm: torch.nn.LayerNorm) -> None:
    """Queries from the decoder (the Q rows), keys and values from the encoder (K, V rows)."""
    _set_layer_norm(spec.layer_norm, norm)
    b = attn.in_proj.bias
    _set_linear(spec.linear[0], attn.in_proj.weight[attn.q_rows], None if b is None else b[attn.q_rows])
    _set_linear(spec.linear[1], attn.in_proj.weight[attn.kv_rows], None if b is None else b[attn.kv_rows])
    _set_linear(spec.linear[2], attn.out_proj.weight, attn.out_proj.bias)


def _set_ffn(spec, ffn, norm: torch.nn.LayerNorm) -> None:
    _set_layer_norm(spec.layer_norm, norm)
    _set_linear(spec.linear_0, ffn.w_1.weight, ffn.w_1.bias)
    _set_linear(spec.linear_1, ffn.w_2.weight, ffn.w_2.bias)


def _set_stack_inputs(spec, stack, config, rows: int) -> None:
    embeddings = spec.embeddings[0] if isinstance(spec.embeddings, list) else spec.embeddings
    embeddings.weight = _np(stack.embed.weight)
    spec.scale_embeddings = bool(config.scale_embeddings)  # True: x sqrt(d_model) (3.4)
    # the positions as an explicit table: 3.5's sinusoids, or the learned table
    sinusoidal = config.positional == "sinusoidal"
    spec.position_encodings.encodings = _np(
        sinusoidal_positions(rows, config.d_model) if sinusoidal else stack.positions.weight
    )
    if stack.final_norm is not None:  # pre-norm only
        _set_layer_norm(spec.layer_norm, stack.final_norm)


def build_spec(
    model: Transformer, config: Config, src_pieces: list[str], tgt_pieces: list[str], max_positions: int | None = None
):
    """The CTranslate2 TransformerSpec holding `model`: one setter per part (3.1-3.5 to its names)."""
    require("ctranslate2", "exporting to CTranslate2")
    from ctranslate2.specs import transformer_spec

    c = config.model
    if c.word_positions:
        raise ValueError(
            "CTranslate2 has no word positions (model.word_positions, not in the paper): "
            "decode this model with transduce"
        )
    if c.attention_window is not None:
        raise ValueError(
            f"CTranslate2 has no restricted self-attention (model.attention_window {c.attention_window}, "
            "Table 1): decode this model with transduce"
        )
    if c.head_dim_k != c.head_dim_v:
        raise ValueError(f"CTranslate2 needs d_k == d_v (this model: d_k {c.head_dim_k}, d_v {c.head_dim_v})")
    if max_positions is None:
        max_positions = c.max_positions if c.positional == "learned" else DEFAULT_SINUSOID_POSITIONS
    if c.positional == "learned" and max_positions != c.max_positions:
        raise ValueError(f"a learned position table has {c.max_positions} rows; max_positions must be that")
    head_dim = None if c.head_dim_k * c.n_heads == c.d_model else c.head_dim_k
    from ctranslate2.specs.common_spec import Activation

    act = {"relu": Activation.RELU, "swish": Activation.SWISH}[c.activation]  # swish: OPUS-MT's (not the paper)
    encoder = transformer_spec.TransformerEncoderSpec(
        c.n_layers, c.n_heads, pre_norm=c.norm_first, head_dim=head_dim, activation=act
    )
    decoder = transformer_spec.TransformerDecoderSpec(
        c.n_layers, c.n_heads, pre_norm=c.norm_first, head_dim=head_dim, activation=act
    )
    spec = transformer_spec.TransformerSpec(encoder, decoder)

    _set_stack_inputs(spec.encoder, model.encoder, c, max_positions)
    for layer_spec, layer in zip(spec.encoder.layer, model.encoder.layers):
        _set_self_attention(layer_spec.self_attention, layer.self_attn, layer.norm1)
        _set_ffn(layer_spec.ffn, layer.feed_forward, layer.norm2)

    _set_stack_inputs(spec.decoder, model.decoder, c, max_positions)
    for layer_spec, layer in zip(spec.decoder.layer, model.decoder.layers):
        _set_self_attention(layer_spec.self_attention, layer.self_attn, layer.norm1)
        _set_cross_attention(layer_spec.attention, layer.cross_attn, layer.norm2)
        _set_ffn(layer_spec.ffn, layer.feed_forward, layer.norm3)
    out = model.decoder.embed.weight if model.output_proj is None else model.output_proj.weight
    _set_linear(spec.decoder.projection, out, model.output_bias)  # output_bias: Marian's (not the paper)

    spec.config.layer_norm_epsilon = c.layer_norm_eps
    ids = c.special_ids
    spec.config.unk_token, spec.config.bos_token = tgt_pieces[ids.unk], tgt_pieces[ids.bos]
    spec.config.eos_token = tgt_pieces[ids.eos]
    spec.config.decoder_start_token = tgt_pieces[ids.bos]  # the model's start token (Marian's: its PAD)
    spec.config.add_source_eos = True  # sources end with EOS (5.1's stored sentences)
    spec.register_source_vocabulary(src_pieces)
    spec.register_target_vocabulary(tgt_pieces)
    return spec


def TransduceConverter(*args, **kwargs):
    """A `ctranslate2.converters.Converter` for a transduce model (see `build_spec`)."""
    require("ctranslate2", "exporting to CTranslate2")
    from ctranslate2.converters.converter import Converter

    class TransduceConverter(Converter):
        def __init__(
            self,
            model: Transformer,
            config: Config,
            src_vocab: Vocab | list[str],
            tgt_vocab: Vocab | list[str],
            max_positions: int | None = None,
        ):
            """The vocabularies as `Vocab`s, or as their pieces in id order (benchmarks' synthetic ones)."""
            self.model, self.config, self.max_positions = model, config, max_positions
            self.src_pieces, self.tgt_pieces = (v if isinstance(v, list) else pieces(v) for v in (src_vocab, tgt_vocab))

        def _load(self):
            with torch.no_grad():
                return build_spec(self.model, self.config, self.src_pieces, self.tgt_pieces, self.max_positions)

    return TransduceConverter(*args, **kwargs)


def export_ct2(
    model: Transformer,
    config: Config,
    src_vocab: Vocab,
    tgt_vocab: Vocab,
    out: str | os.PathLike,
    *,
    quantization: str = "float32",
    max_positions: int | None = None,
    force: bool = False,
    description: str = "",
) -> Path:
    """Write `model` as a CTranslate2 model directory `out`, whole or not at all. Returns `out`."""
    if quantization not in QUANTIZATIONS:
        raise ValueError(f"quantization must be one of {', '.join(QUANTIZATIONS)}, not {quantization!r}")
    from ..fast.step import FastDecoder

    if isinstance(model.decoder, FastDecoder):  # its weights packed or quantized, the originals let go
        raise ValueError(
            "the model is made ready for decoding: export it as loaded (decoding.ready.load_translation_model)"
        )
    out = Path(out)
    if out.exists() and not force:
        raise FileExistsError(f"{out}: exists (use --overwrite to replace it)")
    with atomic_dir(out) as tmp:
        converter = TransduceConverter(model.float(), config, src_vocab, tgt_vocab, max_positions)
        converter.convert(str(tmp), quantization=quantization, force=True)
        record = copy_vocabs(src_vocab, tgt_vocab, tmp)
        c = config.model
        rows = max_positions or (c.max_positions if c.positional == "learned" else DEFAULT_SINUSOID_POSITIONS)
        info = {
            "format": "transduce-ct2",
            "version": 1,
            "quantization": quantization,
            "max_positions": rows,
            "vocab": record,
            "exported_from": description,
            "config": config.to_dict(),
        }
        (tmp / INFO).write_text(json.dumps(info, indent=2) + "\n", encoding="utf-8")
    return out


def is_ct2_dir(path: str | os.PathLike) -> bool:
    return (Path(path) / INFO).is_file() and (Path(path) / "model.bin").is_file()
