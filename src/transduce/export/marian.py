"""A transduce model as a Hugging Face MarianMT directory, and back.

`export_marian` writes a directory that `transformers.MarianMTModel.from_pretrained` and
`MarianTokenizer.from_pretrained` load offline; `import_marian` reads such a directory back into
a transduce model (a round trip is bitwise identical).

MarianMT is the paper's architecture as Hugging Face runs it; what differs is in docs/export.md.
Marian's sinusoids are [sin | cos] halves, computed, not stored, so the export permutes the hidden
dimension instead (`hidden_permutation`): weights reading the residual stream get their columns
permuted, weights and biases writing to it their rows, LayerNorms theirs; the logits are the same.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import torch

from ..checkpoint import atomic_dir
from ..config import Config, ModelConfig
from ..data.vocab import BOS, EOS, PAD, UNK, MarianVocab, Vocab
from ..errors import DataError
from ..extras import require
from ..model import Transformer

INFO = "transduce.json"
DEFAULT_MAX_POSITIONS = 1024
"""Marian's `max_position_embeddings` (Hugging Face's default): sources and outputs up to 1024 tokens."""


def hidden_permutation(d_model: int) -> torch.Tensor:
    """perm with marian_vector = transduce_vector[perm]: transduce's interleaved dimensions
    (sin 0, cos 1, sin 2, ...) in Marian's order (sin 0, 2, 4, ... | cos 1, 3, 5, ...)."""
    return torch.cat([torch.arange(0, d_model, 2), torch.arange(1, d_model, 2)])


def _permuters(perm: torch.Tensor):
    """(reads, writes): copies of a weight with `perm` applied to its columns (it reads the residual
    stream) or to its rows (a weight or bias written into it)."""
    return (lambda w: w.detach()[:, perm].contiguous()), (lambda w: w.detach()[perm].contiguous())


def _layer_parts(n_layers: int):
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
        raise ValueError(f"MarianMT has no restricted self-attention (model.attention_window {c.attention_window}, "
                         "Table 1): decode this model with transduce")
    if c.norm_first:
        raise ValueError("MarianMT is post-norm (the paper's); this model is pre-norm (norm_first)")
    if c.positional != "sinusoidal":
        raise ValueError("MarianMT has fixed sinusoidal positions; this model's are learned")
    if c.head_dim_k * c.n_heads != c.d_model or c.head_dim_v * c.n_heads != c.d_model:
        raise ValueError("MarianMT needs d_k = d_v = d_model / h")
    if c.pad_id != PAD:
        raise ValueError(f"the model's pad_id is {c.pad_id}, not {PAD}")


def marian_state_dict(model: Transformer, permute_hidden: bool = True) -> dict[str, torch.Tensor]:
    """The transduce model's parameters under MarianMTModel's names, the hidden dimension
    permuted (see the module docstring). `permute_hidden=False` leaves it in transduce's order:
    only to show that the permutation is needed."""
    c = model.config
    _check_exportable(c)
    d = c.d_model
    reads, writes = _permuters(hidden_permutation(d) if permute_hidden else torch.arange(d))

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
    for kind, name, marian_name in _layer_parts(c.n_layers):
        setters[kind](marian_name, model.get_submodule(name))
    src_embed, tgt_embed = reads(model.encoder.embed.weight), reads(model.decoder.embed.weight)
    if c.share_embeddings:
        sd["model.shared.weight"] = src_embed
    sd["model.encoder.embed_tokens.weight"] = src_embed
    sd["model.decoder.embed_tokens.weight"] = tgt_embed
    sd["lm_head.weight"] = tgt_embed if model.output_proj is None else reads(model.output_proj.weight)
    bias = model.output_bias
    sd["final_logits_bias"] = torch.zeros(1, c.target_vocab_size) if bias is None else bias.detach().reshape(1, -1).clone()
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
        encoder_layers=c.n_layers, decoder_layers=c.n_layers,
        encoder_attention_heads=c.n_heads, decoder_attention_heads=c.n_heads,
        encoder_ffn_dim=c.d_ff, decoder_ffn_dim=c.d_ff,
        activation_function=c.activation,
        scale_embedding=c.scale_embeddings,
        dropout=c.dropout, attention_dropout=c.attention_dropout, activation_dropout=0.0,
        pad_token_id=PAD, eos_token_id=EOS, decoder_start_token_id=BOS, bos_token_id=BOS,
        forced_eos_token_id=None,
    )


def export_marian(model: Transformer, config: Config, src_vocab: Vocab, tgt_vocab: Vocab, out: str | os.PathLike, *,
                  max_positions: int = DEFAULT_MAX_POSITIONS, force: bool = False, permute_hidden: bool = True,
                  description: str = "") -> Path:
    """Write a MarianMT directory with its tokenizer files, whole or not at all. Returns `out`."""
    transformers = require("transformers", "exporting to Hugging Face")
    out = Path(out)
    if out.exists() and not force:
        raise FileExistsError(f"{out}: exists (use --overwrite to replace it)")
    c = config.model
    _check_exportable(c)
    if isinstance(src_vocab, MarianVocab) or isinstance(tgt_vocab, MarianVocab):
        raise ValueError("an imported OPUS-MT model (its vocabulary renumbered): export the MarianMT directory it came from")
    sd = marian_state_dict(model.float(), permute_hidden)
    with atomic_dir(out) as tmp:
        hf = transformers.MarianMTModel(marian_config(c, max_positions))
        missing, unexpected = hf.load_state_dict(sd, strict=False)
        missing = [k for k in missing if not k.endswith("embed_positions.weight")]
        if missing or unexpected:
            raise ValueError(f"MarianMTModel's parameters do not match (missing {missing[:3]}, unexpected {unexpected[:3]})")
        hf.generation_config.decoder_start_token_id = BOS
        hf.generation_config.bad_words_ids = [[PAD], [BOS]]  # never real output tokens (as transduce.decoding.search)
        hf.generation_config.max_length = max_positions  # not generate's default 20, which cuts outputs
        hf.save_pretrained(tmp)
        shared = src_vocab is tgt_vocab or src_vocab.path == tgt_vocab.path
        shutil.copy(src_vocab.path, tmp / "source.spm")
        shutil.copy(tgt_vocab.path, tmp / "target.spm")
        for name, v in [("vocab.json", src_vocab)] + ([] if shared else [("target_vocab.json", tgt_vocab)]):
            mapping = {v.sp.id_to_piece(i): i for i in range(len(v))}
            (tmp / name).write_text(json.dumps(mapping, ensure_ascii=False, indent=1), encoding="utf-8")
        tok_config = {"tokenizer_class": "MarianTokenizer", "separate_vocabs": not shared, "model_max_length": max_positions,
                      "unk_token": "<unk>", "eos_token": "</s>", "pad_token": "<pad>"}
        (tmp / "tokenizer_config.json").write_text(json.dumps(tok_config, indent=2) + "\n", encoding="utf-8")
        info = {"format": "transduce-marian", "version": 1, "shared_vocab": shared, "hidden_permuted": permute_hidden,
                "exported_from": description, "config": config.to_dict()}
        (tmp / INFO).write_text(json.dumps(info, indent=2) + "\n", encoding="utf-8")
    return out


ACTIVATIONS = {"relu": "relu", "swish": "swish", "silu": "swish"}
"""Marian's `activation_function` names transduce runs, as `ModelConfig.activation`."""


def _config_from_marian(mc, output_bias: bool = False, extra_rows: int = 0) -> Config:
    """A Config for a Marian directory without transduce.json: Hugging Face's settings (swish,
    attention biases, epsilon 1e-5, the final logits bias where it is not zero); `extra_rows`:
    vocabulary rows transduce adds (OPUS-MT's PAD, `transduce.export.opus`)."""
    if mc.encoder_layers != mc.decoder_layers or mc.encoder_ffn_dim != mc.decoder_ffn_dim \
            or mc.encoder_attention_heads != mc.decoder_attention_heads:
        raise ValueError("transduce's encoder and decoder have the same N, d_ff and h; this Marian model's differ")
    if mc.activation_function not in ACTIVATIONS:
        raise ValueError(f"transduce's FFN is ReLU (eq. 2) or swish; this Marian model uses {mc.activation_function}")
    if getattr(mc, "normalize_before", False) or getattr(mc, "normalize_embedding", False) \
            or not getattr(mc, "static_position_embeddings", True) or getattr(mc, "add_bias_logits", False):
        raise ValueError("transduce runs Marian's post-norm models with static sinusoids (normalize_before, "
                         "normalize_embedding, add_bias_logits false; static_position_embeddings true)")
    if not extra_rows and (mc.pad_token_id != PAD or mc.eos_token_id != EOS):
        raise ValueError(f"transduce needs PAD {PAD} and EOS {EOS}; this Marian model has {mc.pad_token_id} and {mc.eos_token_id}")
    shared = mc.share_encoder_decoder_embeddings
    tgt = (mc.decoder_vocab_size if mc.decoder_vocab_size is not None else mc.vocab_size) + extra_rows
    model = ModelConfig(src_vocab_size=mc.vocab_size + extra_rows, tgt_vocab_size=None if shared else tgt,
                        n_layers=mc.encoder_layers,
                        d_model=mc.d_model, d_ff=mc.encoder_ffn_dim, n_heads=mc.encoder_attention_heads,
                        dropout=float(mc.dropout), attention_dropout=float(mc.attention_dropout), attention_bias=True,
                        share_embeddings=shared, tie_output=bool(mc.tie_word_embeddings),
                        scale_embeddings=bool(mc.scale_embedding), layer_norm_eps=1e-5, pad_id=PAD,
                        activation=ACTIVATIONS[mc.activation_function], output_bias=output_bias)
    return Config(model=model)


MARIAN_FILES = ("config.json", "source.spm", "target.spm", "vocab.json")
"""What `import_marian` reads besides the weights: the model's config and MarianTokenizer's files."""


def check_marian_dir(path: Path) -> None:
    """Refuse, in one line saying what it is instead, a directory that is not a MarianMT model with
    its tokenizer (before transformers is asked to load it, which fails with a long report)."""
    if not path.is_dir():
        raise FileNotFoundError(f"{path}: no such directory")
    config = {}
    if (path / "config.json").is_file():
        try:
            config = json.loads((path / "config.json").read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, ValueError) as e:
            raise DataError(f"not JSON ({e})", path / "config.json") from None
        config = config if isinstance(config, dict) else {}
    if config.get("model_type") != "marian" and "MarianMTModel" not in (config.get("architectures") or []):
        if isinstance(config.get("model"), dict):  # transduce's config.json
            kind = "run" if (path / "checkpoints").is_dir() else "model"
            raise DataError(f"a transduce {kind} directory, not a MarianMT one "
                            "(`transduce export marian` turns it into one)", path)
        if (path / "model.bin").is_file():
            raise DataError("a CTranslate2 model directory, not a MarianMT one", path)
        if config.get("model_type"):
            raise DataError(f"a Hugging Face {config['model_type']!r} model, not a MarianMT one", path)
        raise DataError("not a MarianMT model directory (no config.json saying model_type \"marian\")", path)
    missing = [name for name in MARIAN_FILES if not (path / name).is_file()]
    if missing:
        raise DataError(f"a MarianMT model without {', '.join(missing)}: its tokenizer's files ("
                        f"{', '.join(MARIAN_FILES[1:])}) must be beside it", path)


def load_hf_marian(path: Path):
    """The MarianMTModel of a checked MarianMT directory (eager attention), its weights read from
    model.safetensors or, where that is absent, from pytorch_model.bin by `torch.load(weights_only=True)`
    (tensors only: never unpickled code). Whatever transformers refuses is one line naming `path`."""
    transformers = require("transformers", "importing from Hugging Face")
    try:
        if not (path / "model.safetensors").is_file() and (path / "pytorch_model.bin").is_file():
            state = torch.load(path / "pytorch_model.bin", map_location="cpu", weights_only=True)
            return transformers.MarianMTModel.from_pretrained(
                None, config=transformers.MarianConfig.from_pretrained(str(path)), state_dict=state,
                attn_implementation="eager")
        return transformers.MarianMTModel.from_pretrained(str(path), attn_implementation="eager")
    except Exception as e:  # noqa: BLE001 - whatever transformers says, in one line naming the directory
        text = str(e)
        if "mismatched_sizes" in text or "size mismatch" in text:  # its message points at a report it logs
            why = "the shapes of its weights do not fit its config.json"
        else:
            why = f"{type(e).__name__}: " + next((line.strip() for line in text.splitlines() if line.strip()), "")
        raise DataError(f"transformers cannot load it as a MarianMT model: {why}", path) from e


def transduce_tensors(hf, c: ModelConfig, permuted: bool, path: Path) -> dict[str, torch.Tensor]:
    """The MarianMTModel's weights under transduce's names, the hidden dimension put back in
    transduce's order (`permuted`), vocabulary rows in Marian's order."""
    sd = {k: v.detach() for k, v in hf.state_dict().items()}
    d = c.d_model
    reads, writes = _permuters(torch.argsort(hidden_permutation(d)) if permuted else torch.arange(d))
    tensors: dict[str, torch.Tensor] = {}

    def attention(dst, src):
        w = torch.cat([reads(sd[f"{src}.{n}_proj.weight"]) for n in "qkv"])
        tensors[f"{dst}.in_proj.weight"] = w
        tensors[f"{dst}.out_proj.weight"] = writes(sd[f"{src}.out_proj.weight"])
        biases = [sd[f"{src}.{n}_proj.bias"] for n in "qkv"] + [sd[f"{src}.out_proj.bias"]]
        if c.attention_bias:
            tensors[f"{dst}.in_proj.bias"] = torch.cat(biases[:3])
            tensors[f"{dst}.out_proj.bias"] = writes(biases[3])
        elif any(float(b.abs().max()) != 0.0 for b in biases):
            raise ValueError(f"{path}: {src} has non-zero attention biases, but the model's config has none")

    def norm(dst, src):
        tensors[f"{dst}.weight"], tensors[f"{dst}.bias"] = writes(sd[f"{src}.weight"]), writes(sd[f"{src}.bias"])

    def ffn(dst, src):
        tensors[f"{dst}.w_1.weight"], tensors[f"{dst}.w_1.bias"] = reads(sd[f"{src}.fc1.weight"]), sd[f"{src}.fc1.bias"].clone()
        tensors[f"{dst}.w_2.weight"], tensors[f"{dst}.w_2.bias"] = writes(sd[f"{src}.fc2.weight"]), writes(sd[f"{src}.fc2.bias"])

    setters = {"attention": attention, "norm": norm, "ffn": ffn}
    for kind, name, marian_name in _layer_parts(c.n_layers):
        setters[kind](name, marian_name)
    tensors["encoder.embed.weight"] = reads(sd["model.encoder.embed_tokens.weight"])
    tensors["decoder.embed.weight"] = reads(sd["model.decoder.embed_tokens.weight"])
    if not (c.share_embeddings or c.tie_output):
        tensors["output_proj.weight"] = reads(sd["lm_head.weight"])
    if c.output_bias:
        tensors["output_bias"] = sd["final_logits_bias"].reshape(-1).clone()
    elif float(hf.final_logits_bias.abs().max()) != 0.0:
        raise ValueError(f"{path}: final_logits_bias is not zero, but the model's config has no output_bias")
    return tensors


def import_marian(path: str | os.PathLike) -> tuple[Transformer, Config, Vocab, Vocab]:
    """A MarianMT directory (whose vocabulary follows transduce's) as a model, config and vocabularies."""
    path = Path(path)
    check_marian_dir(path)
    hf = load_hf_marian(path)
    mc = hf.config
    info = json.loads((path / INFO).read_text(encoding="utf-8")) if (path / INFO).is_file() else None
    config = Config.from_dict(info["config"]) if info else _config_from_marian(mc, float(hf.final_logits_bias.abs().max()) != 0)
    c = config.model
    _check_exportable(c)
    sv = Vocab(path / "source.spm")
    tv = Vocab(path / "target.spm")
    _check_vocab_layout(path / "vocab.json", sv)
    if (path / "target_vocab.json").is_file():
        _check_vocab_layout(path / "target_vocab.json", tv)
    elif c.share_embeddings:
        tv = sv
    permuted = info.get("hidden_permuted", True) if info else True
    tensors = transduce_tensors(hf, c, permuted, path)
    model = Transformer(c)
    missing, unexpected = model.load_state_dict(tensors, strict=False)
    if missing or unexpected:
        raise ValueError(f"{path}: the weights do not fit the model (missing {missing[:3]}, unexpected {unexpected[:3]})")
    return model.eval(), config, sv, tv


def _check_vocab_layout(vocab_json: Path, vocab: Vocab) -> None:
    """Marian's vocab.json must number every piece as the sentencepiece model does."""
    mapping = json.loads(vocab_json.read_text(encoding="utf-8"))
    wrong = [p for p, i in mapping.items() if vocab.sp.piece_to_id(p) != i]
    if wrong or len(mapping) != len(vocab):
        raise ValueError(f"{vocab_json}: its ids are not the sentencepiece model's (e.g. {wrong[:1]}): "
                         "not a vocabulary in transduce's layout")
    for name, i in (("<pad>", PAD), ("<unk>", UNK), ("<s>", BOS), ("</s>", EOS)):
        if mapping.get(name) != i:
            raise ValueError(f"{vocab_json}: {name} is not id {i}")
