"""A MarianMT directory read back (what `transduce import`, `transduce.export.opus`, takes from it):
its config.json with MarianConfig's defaults where it says nothing (`read_marian_config`, refused in
one line where the directory is something else) and as a transduce `Config` (`config_from_marian`);
its weights a tensor at a time, never all at once (`MarianWeights`); the function that makes each
transduce tensor from them, the hidden dimension put back in transduce's order (`tensor_plan`, the
inverse of `marian.hidden_permutation`); whether its vocabularies are transduce's own
(`in_transduce_layout`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Callable

import torch

from ..config import Config, ModelConfig
from ..data.vocab import Vocab
from ..errors import DataError
from .marian import hidden_permutation, layer_parts, permuters


ACTIVATIONS = {"relu": "relu", "swish": "swish", "silu": "swish"}
"""Marian's `activation_function` names transduce runs, as `ModelConfig.activation`."""

MARIAN_DEFAULTS = {
    "vocab_size": 58101,
    "decoder_vocab_size": None,
    "d_model": 1024,
    "encoder_layers": 12,
    "decoder_layers": 12,
    "encoder_ffn_dim": 4096,
    "decoder_ffn_dim": 4096,
    "encoder_attention_heads": 16,
    "decoder_attention_heads": 16,
    "activation_function": "gelu",
    "dropout": 0.1,
    "attention_dropout": 0.0,
    "scale_embedding": False,
    "pad_token_id": 58100,
    "eos_token_id": 0,
    "decoder_start_token_id": 58100,
    "share_encoder_decoder_embeddings": True,
    "tie_word_embeddings": True,
    "normalize_before": False,
    "normalize_embedding": False,
    "static_position_embeddings": True,
    "add_bias_logits": False,
}
"""transformers' MarianConfig defaults for what a config.json may leave out (`decoder_vocab_size` None: the
`vocab_size`, as MarianConfig reads it), and the four keys of the older BART-based config that OPUS-MT's config.json
files still carry and MarianConfig no longer has, at the values MarianMTModel computes with, the only ones
`config_from_marian` runs (tests/test_export_marian.py holds them equal): the import reads config.json itself,
with no model built."""


def config_from_marian(mc: dict, unk_id: int, output_bias: bool) -> Config:
    """A Config of a Marian model's config.json (`read_marian_config`): Hugging Face's settings (swish,
    attention biases, epsilon 1e-5, the final logits bias with `output_bias`) and Marian's special ids
    (`pad_token_id`, `eos_token_id`, the decoder's start `decoder_start_token_id`, and `unk_id`, its vocabulary's)."""
    if (
        mc["encoder_layers"] != mc["decoder_layers"]
        or mc["encoder_ffn_dim"] != mc["decoder_ffn_dim"]
        or mc["encoder_attention_heads"] != mc["decoder_attention_heads"]
    ):
        raise ValueError("transduce's encoder and decoder have the same N, d_ff and h; this Marian model's differ")
    if mc["activation_function"] not in ACTIVATIONS:
        raise ValueError(
            f"transduce's FFN is ReLU (eq. 2) or swish; this Marian model uses {mc['activation_function']}"
        )
    if (
        mc["normalize_before"]
        or mc["normalize_embedding"]
        or not mc["static_position_embeddings"]
        or mc["add_bias_logits"]
    ):
        raise ValueError(
            "transduce runs Marian's post-norm models with static sinusoids (normalize_before, "
            "normalize_embedding, add_bias_logits false; static_position_embeddings true)"
        )
    shared = bool(mc["share_encoder_decoder_embeddings"])
    tgt = mc["decoder_vocab_size"] if mc["decoder_vocab_size"] is not None else mc["vocab_size"]
    eos = mc["eos_token_id"][0] if isinstance(mc["eos_token_id"], list) else mc["eos_token_id"]
    start = mc["decoder_start_token_id"] if mc["decoder_start_token_id"] is not None else mc["pad_token_id"]
    model = ModelConfig(
        src_vocab_size=mc["vocab_size"],
        tgt_vocab_size=None if shared else tgt,
        n_layers=mc["encoder_layers"],
        d_model=mc["d_model"],
        d_ff=mc["encoder_ffn_dim"],
        n_heads=mc["encoder_attention_heads"],
        dropout=float(mc["dropout"]),
        attention_dropout=float(mc["attention_dropout"]),
        attention_bias=True,
        share_embeddings=shared,
        tie_output=bool(mc["tie_word_embeddings"]),
        scale_embeddings=bool(mc["scale_embedding"]),
        layer_norm_eps=1e-5,
        activation=ACTIVATIONS[mc["activation_function"]],
        output_bias=output_bias,
        pad_id=int(mc["pad_token_id"]),
        unk_id=int(unk_id),
        bos_id=int(start),
        eos_id=int(eos),
    )
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
    config = read_json(path / "config.json") if (path / "config.json").is_file() else {}
    if config.get("model_type") != "marian" and "MarianMTModel" not in (config.get("architectures") or []):
        if isinstance(config.get("model"), dict):  # transduce's config.json
            kind = "run" if (path / "checkpoints").is_dir() else "model"
            raise DataError(
                f"a transduce {kind} directory, not a MarianMT one (`transduce export marian` turns it into one)", path
            )
        if (path / "model.bin").is_file():
            raise DataError("a CTranslate2 model directory, not a MarianMT one", path)
        if config.get("model_type"):
            raise DataError(f"a Hugging Face {config['model_type']!r} model, not a MarianMT one", path)
        raise DataError('not a MarianMT model directory (no config.json saying model_type "marian")', path)
    missing = [name for name in MARIAN_FILES if not (path / name).is_file()]
    if missing:
        raise DataError(
            f"a MarianMT model without {', '.join(missing)}: its tokenizer's files ("
            f"{', '.join(MARIAN_FILES[1:])}) must be beside it",
            path,
        )
    if not any((path / name).is_file() for name in WEIGHT_FILES):
        raise DataError(f"a MarianMT model without its weights (no {' or '.join(WEIGHT_FILES)})", path)
    generation = read_json(path / "generation_config.json") if (path / "generation_config.json").is_file() else {}
    if generation.get("decoder_start_token_id") is not None:
        config["decoder_start_token_id"] = generation["decoder_start_token_id"]
    return {**MARIAN_DEFAULTS, **{k: v for k, v in config.items() if v is not None or k == "decoder_vocab_size"}}


def check_marian_dir(path: Path) -> None:
    """`read_marian_config`'s refusals alone."""
    read_marian_config(path)


def read_json(path: Path) -> dict:
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

    TIED = {
        "model.encoder.embed_tokens.weight": ("model.shared.weight",),
        "model.decoder.embed_tokens.weight": ("model.shared.weight",),
        "lm_head.weight": ("model.decoder.embed_tokens.weight", "model.shared.weight"),
    }

    def __init__(self, path: Path):
        from safetensors import safe_open

        self.path, self.files, self.where, self.state = path, {}, {}, {}
        try:
            if (path / "model.safetensors").is_file() or (path / "model.safetensors.index.json").is_file():
                index = path / "model.safetensors.index.json"
                shards = read_json(index).get("weight_map", {}) if index.is_file() else None
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
    reads, writes = permuters(torch.argsort(hidden_permutation(d)) if permuted else torch.arange(d))
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
        plan[f"{dst}.weight"], plan[f"{dst}.bias"] = (
            lambda: writes(w.get(f"{src}.weight")),
            lambda: writes(w.get(f"{src}.bias")),
        )

    def ffn(dst, src):
        plan[f"{dst}.w_1.weight"], plan[f"{dst}.w_1.bias"] = (
            lambda: reads(w.get(f"{src}.fc1.weight")),
            lambda: w.get(f"{src}.fc1.bias"),
        )
        plan[f"{dst}.w_2.weight"], plan[f"{dst}.w_2.bias"] = (
            lambda: writes(w.get(f"{src}.fc2.weight")),
            lambda: writes(w.get(f"{src}.fc2.bias")),
        )

    setters = {"attention": attention, "norm": norm, "ffn": ffn}
    for kind, name, marian_name in layer_parts(c.n_layers):
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
    want = {
        "model.encoder.embed_tokens.weight": (V, d),
        "model.decoder.embed_tokens.weight": (T, d),
        "lm_head.weight": (T, d),
        "final_logits_bias": (1, T),
    }
    shapes = {
        "attention": {
            "q_proj.weight": (d, d),
            "k_proj.weight": (d, d),
            "v_proj.weight": (d, d),
            "out_proj.weight": (d, d),
            "q_proj.bias": (d,),
            "k_proj.bias": (d,),
            "v_proj.bias": (d,),
            "out_proj.bias": (d,),
        },
        "norm": {"weight": (d,), "bias": (d,)},
        "ffn": {"fc1.weight": (f, d), "fc1.bias": (f,), "fc2.weight": (d, f), "fc2.bias": (d,)},
    }
    for kind, _, marian_name in layer_parts(c.n_layers):
        want.update({f"{marian_name}.{k}": v for k, v in shapes[kind].items()})
    for name, shape in want.items():
        found = w.shape(name)
        if found is None and name not in ("lm_head.weight", "final_logits_bias"):
            raise DataError(f"its weights have no {name}", w.path)
        if found is not None and found != shape:
            raise DataError(
                f"the shapes of its weights do not fit its config.json ({name}: {list(found)}, not {list(shape)})",
                w.path,
            )


def in_transduce_layout(path: Path) -> bool:
    """Whether a MarianMT directory's vocabularies are sentencepiece models numbered as transduce's
    own are (what `transduce export marian` writes of a model transduce trained): vocab.json (and
    target_vocab.json) give every piece its sentencepiece id. Such a directory is imported with its
    sentencepiece models alone; any other keeps Marian's vocab.json (`data.vocab.MarianVocab`)."""
    sides = [
        ("source.spm", "vocab.json"),
        ("target.spm", "target_vocab.json" if (path / "target_vocab.json").is_file() else "vocab.json"),
    ]
    for spm_file, pieces_file in sides:
        try:
            v = Vocab(path / spm_file)
        except DataError:  # special ids sentencepiece does not define: OPUS-MT's
            return False
        pieces = read_json(path / pieces_file)
        if len(pieces) != len(v) or any(v.sp.piece_to_id(p) != i for p, i in pieces.items()):
            return False
    return True
