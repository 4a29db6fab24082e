"""A transduce model as a CTranslate2 model directory, and CTranslate2 as a decoding engine.

`export_ct2` fills a `ctranslate2.specs.TransformerSpec` through a `Converter` of our own, one
setter per part, `build_spec` (CTranslate2's Hugging Face path would start the decoder with PAD).
Two traps (docs/export.md): CTranslate2's own sinusoids are [sin | cos] halves where 3.5's
interleave, so the position table is always written; its length penalty is |Y|^alpha, so
`length_penalty="paper"` ranks all `beam` finished hypotheses by ((5 + |Y|) / 6)^alpha (6.1).
The directory also holds the sentencepiece model(s) and transduce.json, so that `--engine ct2
DIR` needs nothing else.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Iterator

import numpy as np
import torch

from ..checkpoint import atomic_dir
from ..config import Config
from ..data.vocab import BOS, EOS, PAD, SPECIAL_PIECES, Vocab
from ..decode import length_penalty as paper_length_penalty
from ..extras import require
from ..model import Transformer, sinusoidal_positions
from ..translate import (
    DEFAULT_ALPHA, DEFAULT_BATCH_SIZE, DEFAULT_BATCH_TOKENS, DEFAULT_BEAM, DEFAULT_CHUNK_LINES, DEFAULT_MAX_INPUT_TOKENS,
    DEFAULT_MAX_LEN_OFFSET, Candidate, stream_lines,
)

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
    spec.position_encodings.encodings = _np(sinusoidal_positions(rows, config.d_model) if sinusoidal
                                            else stack.positions.weight)
    if stack.final_norm is not None:  # pre-norm only
        _set_layer_norm(spec.layer_norm, stack.final_norm)


def build_spec(model: Transformer, config: Config, src_pieces: list[str], tgt_pieces: list[str],
               max_positions: int | None = None):
    """The CTranslate2 TransformerSpec holding `model`: one setter per part (3.1-3.5 to its names)."""
    require("ctranslate2", "exporting to CTranslate2")
    from ctranslate2.specs import transformer_spec

    c = config.model
    if c.word_positions:
        raise ValueError("CTranslate2 has no word positions (model.word_positions, not in the paper): "
                         "decode this model with transduce")
    if c.attention_window is not None:
        raise ValueError(f"CTranslate2 has no restricted self-attention (model.attention_window {c.attention_window}, "
                         "Table 1): decode this model with transduce")
    if c.head_dim_k != c.head_dim_v:
        raise ValueError(f"CTranslate2 needs d_k == d_v (this model: d_k {c.head_dim_k}, d_v {c.head_dim_v})")
    if max_positions is None:
        max_positions = c.max_positions if c.positional == "learned" else DEFAULT_SINUSOID_POSITIONS
    if c.positional == "learned" and max_positions != c.max_positions:
        raise ValueError(f"a learned position table has {c.max_positions} rows; max_positions must be that")
    head_dim = None if c.head_dim_k * c.n_heads == c.d_model else c.head_dim_k
    encoder = transformer_spec.TransformerEncoderSpec(c.n_layers, c.n_heads, pre_norm=c.norm_first, head_dim=head_dim)
    decoder = transformer_spec.TransformerDecoderSpec(c.n_layers, c.n_heads, pre_norm=c.norm_first, head_dim=head_dim)
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
    _set_linear(spec.decoder.projection, out, None)

    spec.config.layer_norm_epsilon = c.layer_norm_eps
    spec.config.unk_token, spec.config.bos_token = SPECIAL_PIECES["unk"], SPECIAL_PIECES["bos"]
    spec.config.eos_token = SPECIAL_PIECES["eos"]
    spec.config.decoder_start_token = SPECIAL_PIECES["bos"]  # transduce's decoder starts with BOS
    spec.config.add_source_eos = True  # sources end with EOS (5.1's stored sentences)
    spec.register_source_vocabulary(src_pieces)
    spec.register_target_vocabulary(tgt_pieces)
    return spec


def TransduceConverter(*args, **kwargs):
    """A `ctranslate2.converters.Converter` for a transduce model (see `build_spec`)."""
    require("ctranslate2", "exporting to CTranslate2")
    from ctranslate2.converters.converter import Converter

    class TransduceConverter(Converter):
        def __init__(self, model: Transformer, config: Config, src_vocab: Vocab | list[str], tgt_vocab: Vocab | list[str],
                     max_positions: int | None = None):
            """The vocabularies as `Vocab`s, or as their pieces in id order (benchmarks' synthetic ones)."""
            self.model, self.config, self.max_positions = model, config, max_positions
            self.src_pieces, self.tgt_pieces = (v if isinstance(v, list) else pieces(v) for v in (src_vocab, tgt_vocab))

        def _load(self):
            with torch.no_grad():
                return build_spec(self.model, self.config, self.src_pieces, self.tgt_pieces, self.max_positions)

    return TransduceConverter(*args, **kwargs)


def export_ct2(model: Transformer, config: Config, src_vocab: Vocab, tgt_vocab: Vocab, out: str | os.PathLike, *,
               quantization: str = "float32", max_positions: int | None = None, force: bool = False,
               description: str = "") -> Path:
    """Write `model` as a CTranslate2 model directory `out`, whole or not at all. Returns `out`."""
    if quantization not in QUANTIZATIONS:
        raise ValueError(f"quantization must be one of {', '.join(QUANTIZATIONS)}, not {quantization!r}")
    out = Path(out)
    if out.exists() and not force:
        raise FileExistsError(f"{out}: exists (use --force to replace it)")
    with atomic_dir(out) as tmp:
        converter = TransduceConverter(model.float(), config, src_vocab, tgt_vocab, max_positions)
        converter.convert(str(tmp), quantization=quantization, force=True)
        shared = src_vocab.path == tgt_vocab.path or src_vocab is tgt_vocab
        files = {"src": "spm.model", "tgt": "spm.model"} if shared else {"src": "spm.src.model", "tgt": "spm.tgt.model"}
        shutil.copy(src_vocab.path, tmp / files["src"])
        if not shared:
            shutil.copy(tgt_vocab.path, tmp / files["tgt"])
        c = config.model
        rows = max_positions or (c.max_positions if c.positional == "learned" else DEFAULT_SINUSOID_POSITIONS)
        info = {"format": "transduce-ct2", "version": 1, "quantization": quantization, "max_positions": rows,
                "vocab": {"shared": shared, "files": files}, "exported_from": description, "config": config.to_dict()}
        (tmp / INFO).write_text(json.dumps(info, indent=2) + "\n", encoding="utf-8")
    return out


def is_ct2_dir(path: str | os.PathLike) -> bool:
    return (Path(path) / INFO).is_file() and (Path(path) / "model.bin").is_file()


@dataclass
class CT2Model:
    """An exported CTranslate2 model, loaded: what `--engine ct2` runs."""

    translator: object  # the ctranslate2.Translator
    config: Config
    src_vocab: Vocab
    tgt_vocab: Vocab
    description: str
    max_positions: int
    quantization: str
    compute_type: str

    def translate_stream(self, lines: Iterable[str], **options) -> Iterator[list[Candidate]]:
        return translate_stream(self, lines, **options)

    @property
    def precision(self) -> "_Precision":
        """What `transduce translate` prints about the precision (as `transduce.precision.Choice`)."""
        return _Precision(f"precision {self.compute_type} (CTranslate2; exported as {self.quantization})")


@dataclass
class _Precision:
    text: str
    warning: str | None = None

    def line(self) -> str:
        return self.text


def load_ct2(path: str | os.PathLike, *, device: str = "cpu", compute_type: str = "default",
             threads: int = 0) -> CT2Model:
    """Load a directory written by `export_ct2` (`compute_type`, `threads`: CTranslate2's)."""
    ctranslate2 = require("ctranslate2", "the ct2 engine")
    path = Path(path)
    if not is_ct2_dir(path):
        raise FileNotFoundError(f"{path}: not a CTranslate2 model written by `transduce export ct2` "
                                f"(no {INFO} and model.bin)")
    info = json.loads((path / INFO).read_text(encoding="utf-8"))
    files = info["vocab"]["files"]
    sv = Vocab(path / files["src"])
    tv = sv if files["tgt"] == files["src"] else Vocab(path / files["tgt"])
    device = str(device or "auto")
    if device == "auto":
        try:
            device = "cuda" if ctranslate2.get_cuda_device_count() > 0 else "cpu"
        except Exception:  # noqa: BLE001 - no CUDA runtime at all
            device = "cpu"
    index = int(device.split(":")[1]) if device.startswith("cuda:") else 0
    translator = ctranslate2.Translator(str(path), device=device.split(":")[0], device_index=index,
                                        compute_type=compute_type, intra_threads=threads)
    return CT2Model(translator, Config.from_dict(info["config"]), sv, tv, f"CTranslate2 model {path} ({info['quantization']}"
                    f"{'' if compute_type == 'default' else ', computed ' + compute_type})", int(info["max_positions"]),
                    info["quantization"], translator.compute_type)


def translate_stream(
    model: CT2Model,
    lines: Iterable[str],
    *,
    beam: int = DEFAULT_BEAM,
    alpha: float = DEFAULT_ALPHA,
    max_len_offset: int = DEFAULT_MAX_LEN_OFFSET,
    n_best: int = 1,
    greedy: bool = False,
    batch_tokens: int = DEFAULT_BATCH_TOKENS,
    batch_size: int = DEFAULT_BATCH_SIZE,
    max_input_tokens: int | None = DEFAULT_MAX_INPUT_TOKENS,
    chunk_lines: int = DEFAULT_CHUNK_LINES,
    length_penalty: str = "paper",
    source_name: str = "input",
    warn: Callable[[str], None] | None = None,
    advance: Callable[[int], None] | None = None,
    bf16: bool = False,
    workers: int = 1,
) -> Iterator[list[Candidate]]:
    """`transduce.translate.translate_stream` with CTranslate2 as the engine: the same input
    handling and options; `length_penalty` "paper" (default) or "ct2" (its own). `bf16` is
    ignored (the precision is the exported one or `load_ct2`'s compute_type). PAD and BOS are
    suppressed before CTranslate2's softmax, and the output limit is one per batch (greedy
    outputs are cut to each sentence's own)."""
    if greedy and n_best != 1:
        raise ValueError("greedy decoding gives one hypothesis per line: n_best must be 1")
    if not greedy and not 1 <= n_best <= beam:
        raise ValueError(f"n_best must be between 1 and the beam size ({beam}), not {n_best}")
    if workers != 1:
        raise ValueError("--workers is for transduce's engine; CTranslate2 decodes in one worker with --threads "
                         "intra-op threads")
    if length_penalty not in ("paper", "ct2"):
        raise ValueError(f"length_penalty must be 'paper' or 'ct2', not {length_penalty!r}")
    # the most subword tokens (EOS not counted) a source may have: `max_input_tokens`, and what the
    # position table allows for the source (with EOS) and the longest output
    limit = min(sys.maxsize if max_input_tokens is None else max_input_tokens,
                model.max_positions - 1 - max_len_offset)
    if limit < 1:
        raise ValueError(f"no input fits: the position table has {model.max_positions} rows and --max-len-offset "
                         f"is {max_len_offset}")
    search = _CT2Search(model, greedy, beam, alpha, max_len_offset, n_best, length_penalty)
    yield from stream_lines(search, model.src_vocab, lines, limit=limit, chunk_lines=chunk_lines,
                            batch_tokens=batch_tokens, batch_size=batch_size, source_name=source_name, warn=warn,
                            advance=advance)


@dataclass
class _CT2Search:
    """CTranslate2's search on a batch of source ids (with EOS), as `stream_lines` runs it."""

    model: CT2Model
    greedy: bool
    beam: int
    alpha: float
    max_len_offset: int
    n_best: int
    length_penalty: str

    def __call__(self, sources: list[list[int]]) -> list[list[Candidate]]:
        model, greedy, alpha = self.model, self.greedy, self.alpha
        src_pieces, tgt_pieces = pieces(model.src_vocab), pieces(model.tgt_vocab)
        tgt_ids = {p: i for i, p in enumerate(tgt_pieces)}
        eos_piece = tgt_pieces[EOS]
        suppress = [[tgt_pieces[PAD]], [tgt_pieces[BOS]]]  # never real output tokens (as transduce.decode)
        source = [[src_pieces[t] for t in toks[:-1]] for toks in sources]  # CT2 adds the EOS
        max_lens = [len(toks) + self.max_len_offset for toks in sources]  # tokens with EOS, per sentence
        lp = 0.0 if greedy or alpha == 0 else alpha
        paper = self.length_penalty == "paper"
        out = model.translator.translate_batch(
            source, beam_size=1 if greedy else self.beam,
            num_hypotheses=1 if greedy else (self.beam if paper else self.n_best),
            length_penalty=lp, return_scores=True, return_end_token=True, max_input_length=0,
            max_decoding_length=max(max_lens), min_decoding_length=0, suppress_sequences=suppress,
        )
        nan = float("nan")
        results = []
        for res, max_len in zip(out, max_lens):
            cands = []
            for hyp, score in zip(res.hypotheses, res.scores):
                ended = bool(hyp) and hyp[-1] == eos_piece
                length = len(hyp)  # |Y| with EOS when it ended with one
                toks = [tgt_ids[p] for p in (hyp[:-1] if ended else hyp)]
                text = _clean(model.tgt_vocab.decode(toks[:max_len] if greedy else toks))
                if greedy:  # the sentence's own maximum (exact for greedy)
                    cands.append(Candidate(tokens=toks[:max_len], score=nan, logprob=nan, text=text))
                    continue
                logprob = score * (length ** lp if length else 1.0)
                if paper:
                    score = logprob / paper_length_penalty(length, alpha)
                cands.append(Candidate(tokens=toks, score=score, logprob=logprob, text=text))
            if paper:
                cands.sort(key=lambda c: -c.score)
            results.append(cands[:self.n_best] or [Candidate(tokens=[], score=-math.inf, logprob=-math.inf, text="")])
        return results


def _clean(text: str) -> str:
    return text.replace("\r", " ").replace("\n", " ").replace("\t", " ")
