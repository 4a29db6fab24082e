"""Dataclass configs and the paper's named presets: `ModelConfig` (Table 3's knobs),
`TrainConfig` (Section 5's regime) and `PRESETS`, the paper's `base` and `big` and every row of
Table 3 (`table3-A1` ... `table3-E`), each differing from `base` only where the table says.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import math
import typing
from dataclasses import dataclass, field, fields
from typing import Any

from .special_ids import DEFAULT, SpecialIds


@dataclass
class ModelConfig:
    """The Transformer's architecture (Section 3; the knobs of Table 3); defaults: the base model."""

    src_vocab_size: int = 37000  # with `share_embeddings`, the one shared BPE vocabulary (5.1)
    tgt_vocab_size: int | None = None  # None: the source's vocabulary (the paper)
    n_layers: int = 6  # N: identical layers in the encoder and in the decoder (3.1)
    d_model: int = 512  # Width of every sub-layer output and of the embeddings (3.1)
    d_ff: int = 2048  # Inner width of the position-wise feed-forward network (3.3, eq. 2)
    n_heads: int = 8  # h: parallel attention heads (3.2.2)
    d_k: int | None = None  # Query/key width per head; None means d_model / h (3.2.2)
    d_v: int | None = None  # Value width per head; None means d_model / h (3.2.2)
    dropout: float = 0.1  # P_drop: applied to each sub-layer output and to embeddings + positions (5.4)
    attention_dropout: float = 0.0  # on the attention weights: not in the base model (parsing, 6.3)
    attention_bias: bool = False  # biases on W^Q, W^K, W^V and W^O: the paper's (3.2.2) have none
    positional: str = "sinusoidal"  # 'sinusoidal' (3.5) or 'learned' (Table 3 row E)
    max_positions: int = 1024  # Learned positions: table size. Sinusoids are computed for any length
    share_embeddings: bool = True  # one matrix: both embeddings and the pre-softmax projection (3.4)
    tie_output: bool = True  # separate vocabularies: the target embedding still tied to the projection
    scale_embeddings: bool = True  # Multiply embeddings by sqrt(d_model) (3.4)
    # False: the paper's post-norm, LayerNorm(x + Dropout(Sublayer(x))) (3.1).
    # True: pre-norm, x + Dropout(Sublayer(LayerNorm(x))), a deviation offered as an option
    norm_first: bool = False
    # Not in the paper (parsing, docs/parsing.md): add to both sides' inputs a learned vector for
    # the index of the word a position is at (`transduce.word_positions`). False: the paper
    word_positions: bool = False
    # r of restricted self-attention (Section 4, Table 1's fourth row): self-attention sees only
    # |i - j| <= r (the decoder: itself and the r before it). None: full, the paper's models
    attention_window: int | None = None
    layer_norm_eps: float = 1e-6  # LayerNorm epsilon (not stated in the paper; tensor2tensor's value)
    # The FFN's nonlinearity: 'relu', max(0, x) (eq. 2), or 'swish', x * sigmoid(x) (OPUS-MT's Marian models)
    activation: str = "relu"
    # A learned bias added to the logits (Marian's final_logits_bias); False: the paper's projection alone (3.4)
    output_bias: bool = False
    # The vocabulary's special ids (`transduce.special_ids`; absent from a config written before: DEFAULT's).
    pad_id: int = DEFAULT.pad  # padding: the masks are built from it, the loss ignores it
    unk_id: int = DEFAULT.unk  # the unknown piece
    bos_id: int = DEFAULT.bos  # the decoder's first input (start token); may equal pad_id (Marian's)
    eos_id: int = DEFAULT.eos  # ends every sentence: appended to sources, where the search stops

    @property
    def special_ids(self) -> SpecialIds:
        return SpecialIds(self.pad_id, self.unk_id, self.bos_id, self.eos_id)

    @property
    def target_vocab_size(self) -> int:
        return self.src_vocab_size if self.tgt_vocab_size is None else self.tgt_vocab_size

    @property
    def head_dim_k(self) -> int:
        """d_k as used: the explicit value, else d_model / h."""
        return self.d_model // self.n_heads if self.d_k is None else self.d_k

    @property
    def head_dim_v(self) -> int:
        """d_v as used: the explicit value, else d_model / h."""
        return self.d_model // self.n_heads if self.d_v is None else self.d_v

    def __post_init__(self) -> None:
        if self.activation not in ("relu", "swish"):
            raise ValueError(f"activation must be 'relu' or 'swish', not {self.activation!r}")
        if self.positional not in ("sinusoidal", "learned"):
            raise ValueError(f"positional must be 'sinusoidal' or 'learned', not {self.positional!r}")
        if self.share_embeddings and self.src_vocab_size != self.target_vocab_size:
            raise ValueError(
                "share_embeddings needs one shared vocabulary "
                f"(src_vocab_size={self.src_vocab_size}, tgt_vocab_size={self.target_vocab_size}); "
                "set share_embeddings=False for separate vocabularies"
            )
        if self.src_vocab_size < 1 or self.target_vocab_size < 1:
            raise ValueError(
                f"vocabulary sizes must be at least 1 (src_vocab_size={self.src_vocab_size}, "
                f"tgt_vocab_size={self.tgt_vocab_size})"
            )
        if self.d_model % 2:
            raise ValueError("d_model must be even for sinusoidal positions")
        for name in ("n_layers", "d_model", "d_ff", "n_heads"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive")
        if (self.d_k is None or self.d_v is None) and self.d_model % self.n_heads:
            raise ValueError(
                f"n_heads ({self.n_heads}) must divide d_model ({self.d_model}): d_k and d_v are "
                "d_model / h (3.2.2) unless given explicitly (model.d_k, model.d_v)"
            )
        for name in ("head_dim_k", "head_dim_v"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive")
        if self.attention_window is not None and (
            isinstance(self.attention_window, bool)
            or not isinstance(self.attention_window, int)
            or self.attention_window < 0
        ):
            raise ValueError(f"attention_window must be a whole number >= 0 or None, not {self.attention_window!r}")
        if not 0.0 <= self.dropout < 1.0 or not 0.0 <= self.attention_dropout < 1.0:
            raise ValueError("dropout rates must be in [0, 1)")
        ids = self.special_ids.to_dict()
        if any(not 0 <= i < min(self.src_vocab_size, self.target_vocab_size) for i in ids.values()):
            raise ValueError(
                f"special ids {ids} must be ids of both vocabularies ({self.src_vocab_size}, {self.target_vocab_size})"
            )
        if self.eos_id in (self.pad_id, self.bos_id):
            raise ValueError(f"eos_id {self.eos_id} must differ from pad_id and bos_id")


@dataclass
class TrainConfig:
    """The training regime of Section 5. Defaults are the paper's base model."""

    max_tokens: int = 25000  # source and target tokens per batch, about (5.1): all GPUs and accumulations
    adam_betas: tuple[float, float] = (0.9, 0.98)  # Adam beta1, beta2 (5.3)
    adam_eps: float = 1e-9  # Adam epsilon (5.3)
    warmup_steps: int = 4000  # warmup_steps of equation 3 (5.3)
    lr_scale: float = 1.0  # Factor on equation 3 (1.0 is the paper)
    label_smoothing: float = 0.1  # eps_ls (5.4; Table 3 row D)
    # False: eps is spread over the classes the model can emit (all but PAD and BOS). True: over
    # all V (`F.cross_entropy(label_smoothing=eps)`). The paper says only eps_ls = 0.1
    smooth_all_classes: bool = False
    max_steps: int = 100_000  # Training steps: 100K for base, 300K for big (5.2)
    checkpoint_minutes: float = 10.0  # Checkpoint interval; the paper wrote one every 10 minutes (6.1)
    average_last: int = 5  # Checkpoints averaged for evaluation: last 5 for base, 20 for big (6.1)

    def __post_init__(self) -> None:
        self.check()

    def check(self) -> None:
        """ValueError naming the first field out of its range (also after a field is set)."""
        betas = tuple(self.adam_betas)
        for name, ok, what in (
            ("max_tokens", self.max_tokens >= 1, "at least 1"),
            ("adam_betas", len(betas) == 2 and all(0 <= b < 1 for b in betas), "two numbers in [0, 1)"),
            ("adam_eps", self.adam_eps > 0, "positive"),
            ("warmup_steps", self.warmup_steps >= 1, "at least 1"),
            ("lr_scale", self.lr_scale > 0, "positive"),
            ("label_smoothing", 0 <= self.label_smoothing < 1, "in [0, 1)"),
            ("max_steps", self.max_steps >= 1, "at least 1"),
            ("checkpoint_minutes", self.checkpoint_minutes >= 0, "at least 0 (0: off)"),
            ("average_last", self.average_last >= 1, "at least 1"),
        ):
            if not ok:
                raise ValueError(f"train.{name} must be {what}, not {getattr(self, name)!r}")


@dataclass
class Config:
    """A model and the regime that trains it."""

    model: ModelConfig = field(default_factory=ModelConfig)
    train: TrainConfig = field(default_factory=TrainConfig)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Config":
        train = dict(d.get("train", {}))
        if "adam_betas" in train:
            train["adam_betas"] = tuple(train["adam_betas"])
        model = d.get("model", {})
        unknown = set(model) - {f.name for f in fields(ModelConfig)}
        if unknown:
            raise ValueError(f"unknown model config keys: {sorted(unknown)}")
        return cls(model=ModelConfig(**model), train=TrainConfig(**train))

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)


def _variant(model: dict[str, Any] | None = None, train: dict[str, Any] | None = None) -> Config:
    """`base` with the given fields changed (Table 3 lists only what differs from base)."""
    return Config(model=ModelConfig(**(model or {})), train=TrainConfig(**(train or {})))


# Named presets. Table 3's `train steps` column is 100K for every row but big (300K)
PRESETS: dict[str, Config] = {
    # Table 3, first row, and Section 6.1.
    "base": _variant(),
    # Table 3, last row: N=6, d_model=1024, d_ff=4096, h=16, P_drop=0.3, 300K steps (5.2).
    # (For En-Fr the paper used P_drop=0.1; use --set model.dropout=0.1.)
    "big": _variant(
        model=dict(d_model=1024, d_ff=4096, n_heads=16, dropout=0.3),
        train=dict(max_steps=300_000, average_last=20),
    ),
    # (A) number of heads and attention key/value dimensions, computation held constant.
    "table3-A1": _variant(model=dict(n_heads=1, d_k=512, d_v=512)),
    "table3-A2": _variant(model=dict(n_heads=4, d_k=128, d_v=128)),
    "table3-A3": _variant(model=dict(n_heads=16, d_k=32, d_v=32)),
    "table3-A4": _variant(model=dict(n_heads=32, d_k=16, d_v=16)),
    # (B) reduced attention key size d_k (d_v stays 64).
    "table3-B1": _variant(model=dict(d_k=16)),
    "table3-B2": _variant(model=dict(d_k=32)),
    # (C) bigger and smaller models.
    "table3-C1": _variant(model=dict(n_layers=2)),
    "table3-C2": _variant(model=dict(n_layers=4)),
    "table3-C3": _variant(model=dict(n_layers=8)),
    "table3-C4": _variant(model=dict(d_model=256, d_k=32, d_v=32)),
    "table3-C5": _variant(model=dict(d_model=1024, d_k=128, d_v=128)),
    "table3-C6": _variant(model=dict(d_ff=1024)),
    "table3-C7": _variant(model=dict(d_ff=4096)),
    # (D) dropout and label smoothing.
    "table3-D1": _variant(model=dict(dropout=0.0)),
    "table3-D2": _variant(model=dict(dropout=0.2)),
    "table3-D3": _variant(train=dict(label_smoothing=0.0)),
    "table3-D4": _variant(train=dict(label_smoothing=0.2)),
    # (E) learned positional embedding instead of sinusoids.
    "table3-E": _variant(model=dict(positional="learned")),
    # Not in the paper: a laptop-CPU size (the paper's architecture, smaller), for small corpora
    # such as Multi30k and for benchmarks. Everything not listed is base.
    "small": _variant(model=dict(n_layers=3, d_model=256, d_ff=1024, n_heads=4)),
    # Not in the paper: `small` as scripts/multi30k.sh trains it (equation 3 peaks at 1.0e-3),
    # chosen on the validation split, fixed in updates so that every machine trains the same model.
    "multi30k": _variant(
        model=dict(n_layers=3, d_model=256, d_ff=1024, n_heads=4),
        train=dict(max_tokens=2048, warmup_steps=600, lr_scale=0.4, max_steps=5200, average_last=5),
    ),
    # Not in the paper: Transformer-Tiny, the literature's recipe for Multi30k (Wu et al. 2021,
    # ACL), as it states it: lr_scale = 0.005 * sqrt(128 * 2000) gives their peak of 0.005, which
    # stalls the post-norm model here (docs/RESULTS.md, Table 2).
    "tiny": _variant(
        model=dict(n_layers=4, d_model=128, d_ff=256, n_heads=4, dropout=0.3),
        train=dict(max_tokens=4096, warmup_steps=2000, lr_scale=2.53, max_steps=8000, average_last=10),
    ),
    # Section 6.3, Table 4: "a 4-layer transformer with d_model = 1024" on WSJ only, separate
    # vocabularies; what the paper leaves open follows tensor2tensor's `transformer_parsing_base`
    # (its learning_rate 0.05 is lr_scale 0.5; 4096 tokens on each of 8 GPUs); steps: base's.
    "parse-wsj": _variant(
        model=dict(
            n_layers=4,
            d_model=1024,
            d_ff=2048,
            n_heads=8,
            dropout=0.2,
            attention_dropout=0.2,
            share_embeddings=False,
            tie_output=False,
        ),
        train=dict(max_tokens=8 * 4096, warmup_steps=16000, lr_scale=0.5),
    ),
    # Not in the paper: parsing on a 2-core CPU in about an hour (scripts/wsj.sh): parse-wsj's shape
    # at a quarter of its width, a regime for the 9 epochs an hour allows, pre-norm (the post-norm
    # encoder collapsed here) and word positions; why each: docs/parsing.md.
    "parse-cpu": _variant(
        model=dict(
            n_layers=4,
            d_model=256,
            d_ff=1024,
            n_heads=4,
            dropout=0.1,
            attention_dropout=0.1,
            share_embeddings=False,
            tie_output=False,
            norm_first=True,
            word_positions=True,
        ),
        train=dict(max_tokens=4096, warmup_steps=600, lr_scale=0.8, max_steps=5500, average_last=5),
    ),
}

# Table 3's params column (x 10^6), for the rows that list one
TABLE3_PARAMS_M: dict[str, float] = {
    "base": 65,
    "table3-B1": 58,
    "table3-B2": 60,
    "table3-C1": 36,
    "table3-C2": 50,
    "table3-C3": 80,
    "table3-C4": 28,
    "table3-C5": 168,
    "table3-C6": 53,
    "table3-C7": 90,
    "big": 213,
}


def closest(name: str, known: typing.Iterable[str]) -> str | None:
    """The name of `known` closest to a misspelled `name` (difflib), or None if none is close."""
    close = difflib.get_close_matches(name, list(known), n=1)
    return close[0] if close else None


def unknown_preset(name: str) -> str:
    """The one-line error for a preset that does not exist: the nearest name, or every name."""
    near = closest(name, PRESETS)
    return f"unknown preset {name!r}; " + (f"did you mean {near!r}?" if near else f"known: {', '.join(PRESETS)}")


def get_preset(name: str) -> Config:
    """A fresh copy of a named preset (mutating it does not change the preset)."""
    if name not in PRESETS:
        raise KeyError(unknown_preset(name))
    return Config.from_dict(PRESETS[name].to_dict())


def apply_overrides(config: Config, overrides: list[str]) -> Config:
    """Apply `section.field=value` overrides (``model.n_layers=3``), each read as its field's type."""
    d = config.to_dict()
    sections = {"model": ModelConfig, "train": TrainConfig}
    for item in overrides:
        key, sep, raw = item.partition("=")
        section, dot, name = key.strip().partition(".")
        if sep and dot and not (section in d and name in d[section]):  # a misspelling: the nearest field
            if section in d:
                near = closest(name, d[section])
                near = near and f"{section}.{near}"
            else:
                near = closest(key.strip(), [f"{sec}.{field}" for sec in d for field in d[sec]])
            if near is not None:
                raise ValueError(f"bad override {item!r}: no field {key.strip()}; did you mean {near}?")
        if not sep or not dot or section not in d or name not in d[section]:
            raise ValueError(
                f"bad override {item!r}: expected section.field=value with section in {sorted(d)} and a known field"
            )
        try:
            d[section][name] = parse_value(typing.get_type_hints(sections[section])[name], raw)
        except ValueError as e:
            raise ValueError(f"bad --set {section}.{name}={raw}: expected {e}") from None
    return Config.from_dict(d)


def parse_value(hint: Any, raw: str) -> Any:
    """`raw` as type `hint` (bool, int, float, str, `X | None` with null, tuple[float, ...] as a
    JSON list); ValueError saying what was expected."""
    text = raw.strip()
    options = [a for a in typing.get_args(hint) if a is not type(None)]
    if len(options) < len(typing.get_args(hint)):  # X | None
        if text.lower() in ("null", "none"):
            return None
        try:
            return parse_value(options[0], text)
        except ValueError as e:
            raise ValueError(f"{e} or null") from None
    if hint is bool:
        if text.lower() in ("true", "false"):
            return text.lower() == "true"
        raise ValueError("true or false")
    if hint in (int, float):
        try:
            value = hint(text)
        except ValueError:
            raise ValueError("an integer" if hint is int else "a number") from None
        if hint is float and not math.isfinite(value):
            raise ValueError("a finite number")
        return value
    if hint is str:
        return text
    items = typing.get_args(hint)  # tuple[float, float]
    what = f"a list of {len(items)} numbers, e.g. [0.9,0.98]"
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        raise ValueError(what) from None
    if not (
        isinstance(value, list)
        and len(value) == len(items)
        and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in value)
    ):
        raise ValueError(what)
    return tuple(float(v) for v in value)
