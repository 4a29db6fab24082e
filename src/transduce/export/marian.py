"""A transduce model as a Hugging Face MarianMT directory, and back.

`export_marian` writes a directory that `transformers.MarianMTModel.from_pretrained` and
`MarianTokenizer.from_pretrained` load offline; and what reading a MarianMT directory back takes
(`read_marian_config`, `MarianWeights`, `tensor_plan`; the import itself: `transduce.export.opus`,
where a round trip is bitwise identical). The special ids are the model's
(`ModelConfig.special_ids`), written as Marian's pad, eos and decoder start ids; an imported OPUS-MT
model's vocabulary files are written back as they came.

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
from typing import Callable

import torch

from ..checkpoint import atomic_dir
from ..config import Config, ModelConfig
from ..data.vocab import MarianVocab, Vocab, shares_ids
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
        pad_token_id=c.pad_id, eos_token_id=c.eos_id, decoder_start_token_id=c.bos_id, bos_token_id=c.bos_id,
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
    sd = marian_state_dict(model.float(), permute_hidden)
    with atomic_dir(out) as tmp:
        hf = transformers.MarianMTModel(marian_config(c, max_positions))
        missing, unexpected = hf.load_state_dict(sd, strict=False)
        missing = [k for k in missing if not k.endswith("embed_positions.weight")]
        if missing or unexpected:
            raise ValueError(f"MarianMTModel's parameters do not match (missing {missing[:3]}, unexpected {unexpected[:3]})")
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
        tok_config = {"tokenizer_class": "MarianTokenizer", "separate_vocabs": not shared, "model_max_length": max_positions,
                      "unk_token": "<unk>", "eos_token": "</s>", "pad_token": "<pad>"}
        (tmp / "tokenizer_config.json").write_text(json.dumps(tok_config, indent=2) + "\n", encoding="utf-8")
        info = {"format": "transduce-marian", "version": 1, "shared_vocab": shared, "hidden_permuted": permute_hidden,
                "exported_from": description, "config": config.to_dict()}
        (tmp / INFO).write_text(json.dumps(info, indent=2) + "\n", encoding="utf-8")
    return out


ACTIVATIONS = {"relu": "relu", "swish": "swish", "silu": "swish"}
"""Marian's `activation_function` names transduce runs, as `ModelConfig.activation`."""

MARIAN_DEFAULTS = {
    "vocab_size": 58101, "decoder_vocab_size": None, "d_model": 1024, "encoder_layers": 12, "decoder_layers": 12,
    "encoder_ffn_dim": 4096, "decoder_ffn_dim": 4096, "encoder_attention_heads": 16, "decoder_attention_heads": 16,
    "activation_function": "gelu", "dropout": 0.1, "attention_dropout": 0.0, "scale_embedding": False,
    "pad_token_id": 58100, "eos_token_id": 0, "decoder_start_token_id": 58100, "share_encoder_decoder_embeddings": True,
    "tie_word_embeddings": True, "normalize_before": False, "normalize_embedding": False,
    "static_position_embeddings": True, "add_bias_logits": False,
}
"""transformers' MarianConfig defaults for what a config.json may leave out (tests/test_export_marian.py holds
them equal): the import reads config.json itself, with no model built."""


def config_from_marian(mc: dict, unk_id: int, output_bias: bool) -> Config:
    """A Config of a Marian model's config.json (`read_marian_config`): Hugging Face's settings (swish,
    attention biases, epsilon 1e-5, the final logits bias with `output_bias`) and Marian's special ids
    (`pad_token_id`, `eos_token_id`, the decoder's start `decoder_start_token_id`, and `unk_id`, its vocabulary's)."""
    if mc["encoder_layers"] != mc["decoder_layers"] or mc["encoder_ffn_dim"] != mc["decoder_ffn_dim"] \
            or mc["encoder_attention_heads"] != mc["decoder_attention_heads"]:
        raise ValueError("transduce's encoder and decoder have the same N, d_ff and h; this Marian model's differ")
    if mc["activation_function"] not in ACTIVATIONS:
        raise ValueError(f"transduce's FFN is ReLU (eq. 2) or swish; this Marian model uses {mc['activation_function']}")
    if mc["normalize_before"] or mc["normalize_embedding"] or not mc["static_position_embeddings"] or mc["add_bias_logits"]:
        raise ValueError("transduce runs Marian's post-norm models with static sinusoids (normalize_before, "
                         "normalize_embedding, add_bias_logits false; static_position_embeddings true)")
    shared = bool(mc["share_encoder_decoder_embeddings"])
    tgt = mc["decoder_vocab_size"] if mc["decoder_vocab_size"] is not None else mc["vocab_size"]
    eos = mc["eos_token_id"][0] if isinstance(mc["eos_token_id"], list) else mc["eos_token_id"]
    start = mc["decoder_start_token_id"] if mc["decoder_start_token_id"] is not None else mc["pad_token_id"]
    model = ModelConfig(src_vocab_size=mc["vocab_size"], tgt_vocab_size=None if shared else tgt,
                        n_layers=mc["encoder_layers"], d_model=mc["d_model"], d_ff=mc["encoder_ffn_dim"],
                        n_heads=mc["encoder_attention_heads"], dropout=float(mc["dropout"]),
                        attention_dropout=float(mc["attention_dropout"]), attention_bias=True, share_embeddings=shared,
                        tie_output=bool(mc["tie_word_embeddings"]), scale_embeddings=bool(mc["scale_embedding"]),
                        layer_norm_eps=1e-5, activation=ACTIVATIONS[mc["activation_function"]], output_bias=output_bias,
                        pad_id=int(mc["pad_token_id"]), unk_id=int(unk_id), bos_id=int(start), eos_id=int(eos))
    return Config(model=model)


MARIAN_FILES = ("config.json", "source.spm", "target.spm", "vocab.json")
"""What an import reads besides the weights: the model's config and MarianTokenizer's files."""

WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin")
"""The weights of a MarianMT directory, in the order they are looked for."""


def read_marian_config(path: Path) -> dict:
    """config.json of a MarianMT directory with MarianConfig's defaults where it says nothing (the
    decoder's start as generation_config.json says, where it does); refused in one line, saying what
    it is instead, where the directory is not a MarianMT model with its tokenizer and weights."""
    if not path.is_dir():
        raise FileNotFoundError(f"{path}: no such directory")
    config = _read_json(path / "config.json") if (path / "config.json").is_file() else {}
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
    if not any((path / name).is_file() for name in WEIGHT_FILES):
        raise DataError(f"a MarianMT model without its weights (no {' or '.join(WEIGHT_FILES)})", path)
    generation = _read_json(path / "generation_config.json") if (path / "generation_config.json").is_file() else {}
    if generation.get("decoder_start_token_id") is not None:
        config["decoder_start_token_id"] = generation["decoder_start_token_id"]
    return {**MARIAN_DEFAULTS, **{k: v for k, v in config.items() if v is not None or k == "decoder_vocab_size"}}


def check_marian_dir(path: Path) -> None:
    """`read_marian_config`'s refusals alone."""
    read_marian_config(path)


def _read_json(path: Path) -> dict:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise DataError(f"not JSON ({e})", path) from None
    return data if isinstance(data, dict) else {}


class MarianWeights:
    """A MarianMT directory's weights, read a tensor at a time and never all at once: model.safetensors
    (or the shards model.safetensors.index.json names) memory-mapped anew for each tensor, so that a
    tensor's pages are let go with it, else pytorch_model.bin loaded memory-mapped by
    `torch.load(weights_only=True)` (tensors only: never unpickled code). `get` follows the names
    Marian ties (the embeddings to model.shared, the output layer to the decoder's embedding)."""

    TIED = {"model.encoder.embed_tokens.weight": ("model.shared.weight",),
            "model.decoder.embed_tokens.weight": ("model.shared.weight",),
            "lm_head.weight": ("model.decoder.embed_tokens.weight", "model.shared.weight")}

    def __init__(self, path: Path):
        from safetensors import safe_open

        self.path, self.files, self.where, self.state = path, {}, {}, {}
        try:
            if (path / "model.safetensors").is_file() or (path / "model.safetensors.index.json").is_file():
                index = path / "model.safetensors.index.json"
                shards = _read_json(index).get("weight_map", {}) if index.is_file() else None
                for name in sorted(set(shards.values())) if shards else ["model.safetensors"]:
                    with safe_open(str(path / name), framework="pt") as f:  # the header: names and shapes
                        self.files[name] = {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}
                    self.where.update(dict.fromkeys(self.files[name], name))
            else:
                file = path / "pytorch_model.bin"
                try:
                    state = torch.load(file, map_location="cpu", weights_only=True, mmap=True)
                except RuntimeError:  # the legacy (not zip) format cannot be mapped: read whole
                    state = torch.load(file, map_location="cpu", weights_only=True)
                self.state = state
                self.where = dict.fromkeys(state, "pytorch_model.bin")
        except Exception as e:  # noqa: BLE001 - safetensors' and torch's errors, in one line naming the directory
            first = next((line.strip() for line in str(e).splitlines() if line.strip()), type(e).__name__)
            raise DataError(f"cannot read its weights ({first})", path) from None

    def name(self, name: str) -> str | None:
        """The stored name of `name` (itself, or the tensor Marian ties it to), or None."""
        return next((n for n in (name, *self.TIED.get(name, ())) if n in self.where), None)

    def shape(self, name: str) -> tuple[int, ...] | None:
        """The stored shape of `name` (read from the header alone), or None where there is none."""
        stored = self.name(name)
        if stored is None:
            return None
        file = self.where[stored]
        return tuple(self.state[stored].shape) if file == "pytorch_model.bin" else self.files[file][stored]

    def get(self, name: str) -> torch.Tensor:
        stored = self.name(name)
        if stored is None:
            raise DataError(f"its weights have no {name}", self.path)
        file = self.where[stored]
        if file == "pytorch_model.bin":
            return self.state[stored]
        from safetensors import safe_open

        with safe_open(str(self.path / file), framework="pt") as f:
            return f.get_tensor(stored)

    def close(self) -> None:
        self.files.clear()
        self.state = {}


def tensor_plan(w: MarianWeights, c: ModelConfig, permuted: bool) -> dict[str, Callable[[], torch.Tensor]]:
    """Each transduce tensor (named as in model.safetensors) as a function that makes it from the
    Marian weights `w`: the hidden dimension put back in transduce's order (`permuted`), the vocabulary
    rows as they are. Biases the config has no place for must be zero (checked here)."""
    d = c.d_model
    reads, writes = _permuters(torch.argsort(hidden_permutation(d)) if permuted else torch.arange(d))
    plan: dict[str, Callable[[], torch.Tensor]] = {}
    unused: list[str] = []

    def attention(dst, src):
        plan[f"{dst}.in_proj.weight"] = lambda: torch.cat([reads(w.get(f"{src}.{n}_proj.weight")) for n in "qkv"])
        plan[f"{dst}.out_proj.weight"] = lambda: writes(w.get(f"{src}.out_proj.weight"))
        biases = [f"{src}.{n}_proj.bias" for n in "qkv"] + [f"{src}.out_proj.bias"]
        if c.attention_bias:
            plan[f"{dst}.in_proj.bias"] = lambda: torch.cat([w.get(b) for b in biases[:3]])
            plan[f"{dst}.out_proj.bias"] = lambda: writes(w.get(biases[3]))
        else:
            unused.extend(biases)

    def norm(dst, src):
        plan[f"{dst}.weight"], plan[f"{dst}.bias"] = lambda: writes(w.get(f"{src}.weight")), lambda: writes(w.get(f"{src}.bias"))

    def ffn(dst, src):
        plan[f"{dst}.w_1.weight"], plan[f"{dst}.w_1.bias"] = lambda: reads(w.get(f"{src}.fc1.weight")), lambda: w.get(f"{src}.fc1.bias")
        plan[f"{dst}.w_2.weight"], plan[f"{dst}.w_2.bias"] = lambda: writes(w.get(f"{src}.fc2.weight")), lambda: writes(w.get(f"{src}.fc2.bias"))

    setters = {"attention": attention, "norm": norm, "ffn": ffn}
    for kind, name, marian_name in _layer_parts(c.n_layers):
        setters[kind](name, marian_name)
    _check_shapes(w, c)
    plan["encoder.embed.weight"] = lambda: reads(w.get("model.encoder.embed_tokens.weight"))
    if not c.share_embeddings:
        plan["decoder.embed.weight"] = lambda: reads(w.get("model.decoder.embed_tokens.weight"))
    if not (c.share_embeddings or c.tie_output):
        plan["output_proj.weight"] = lambda: reads(w.get("lm_head.weight"))
    if c.output_bias:
        plan["output_bias"] = lambda: w.get("final_logits_bias").reshape(-1)
    else:
        unused.append("final_logits_bias")
    nonzero = [n for n in unused if w.name(n) is not None and float(w.get(n).abs().max()) != 0.0]
    if nonzero:
        raise ValueError(f"{w.path}: {nonzero[0]} is not zero, but the model's config has no place for it")
    return plan


def _check_shapes(w: MarianWeights, c: ModelConfig) -> None:
    """Every stored tensor the import reads has the shape MarianMTModel gives it for `c`, or a
    one-line DataError naming the directory (read from the headers: nothing loaded)."""
    d, f, V, T = c.d_model, c.d_ff, c.src_vocab_size, c.target_vocab_size
    want = {"model.encoder.embed_tokens.weight": (V, d), "model.decoder.embed_tokens.weight": (T, d),
            "lm_head.weight": (T, d), "final_logits_bias": (1, T)}
    shapes = {"attention": {"q_proj.weight": (d, d), "k_proj.weight": (d, d), "v_proj.weight": (d, d),
                            "out_proj.weight": (d, d), "q_proj.bias": (d,), "k_proj.bias": (d,), "v_proj.bias": (d,),
                            "out_proj.bias": (d,)},
              "norm": {"weight": (d,), "bias": (d,)},
              "ffn": {"fc1.weight": (f, d), "fc1.bias": (f,), "fc2.weight": (d, f), "fc2.bias": (d,)}}
    for kind, _, marian_name in _layer_parts(c.n_layers):
        want.update({f"{marian_name}.{k}": v for k, v in shapes[kind].items()})
    for name, shape in want.items():
        found = w.shape(name)
        if found is None and name not in ("lm_head.weight", "final_logits_bias"):
            raise DataError(f"its weights have no {name}", w.path)
        if found is not None and found != shape:
            raise DataError(f"the shapes of its weights do not fit its config.json ({name}: {list(found)}, "
                            f"not {list(shape)})", w.path)


def in_transduce_layout(path: Path) -> bool:
    """Whether a MarianMT directory's vocabularies are sentencepiece models numbered as transduce's
    own are (what `transduce export marian` writes of a model transduce trained): vocab.json (and
    target_vocab.json) give every piece its sentencepiece id. Such a directory is imported with its
    sentencepiece models alone; any other keeps Marian's vocab.json (`data.vocab.MarianVocab`)."""
    sides = [("source.spm", "vocab.json"), ("target.spm", "target_vocab.json" if (path / "target_vocab.json").is_file()
                                                       else "vocab.json")]
    for spm_file, pieces_file in sides:
        try:
            v = Vocab(path / spm_file)
        except DataError:  # special ids sentencepiece does not define: OPUS-MT's
            return False
        pieces = _read_json(path / pieces_file)
        if len(pieces) != len(v) or any(v.sp.piece_to_id(p) != i for p, i in pieces.items()):
            return False
    return True
