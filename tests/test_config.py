"""Presets against Table 3: each row differs from base only where the table says, and parameter
counts match the params column."""

import dataclasses

import pytest
import torch

from transduce.config import PRESETS, TABLE3_PARAMS_M, Config, ModelConfig, TrainConfig, apply_overrides, get_preset
from transduce.model import Transformer, count_parameters

# What Table 3 says each row changes (everything else is base).
TABLE3_ROWS = {
    "table3-A1": {"n_heads": 1, "d_k": 512, "d_v": 512},
    "table3-A2": {"n_heads": 4, "d_k": 128, "d_v": 128},
    "table3-A3": {"n_heads": 16, "d_k": 32, "d_v": 32},
    "table3-A4": {"n_heads": 32, "d_k": 16, "d_v": 16},
    "table3-B1": {"d_k": 16},
    "table3-B2": {"d_k": 32},
    "table3-C1": {"n_layers": 2},
    "table3-C2": {"n_layers": 4},
    "table3-C3": {"n_layers": 8},
    "table3-C4": {"d_model": 256, "d_k": 32, "d_v": 32},
    "table3-C5": {"d_model": 1024, "d_k": 128, "d_v": 128},
    "table3-C6": {"d_ff": 1024},
    "table3-C7": {"d_ff": 4096},
    "table3-D1": {"dropout": 0.0},
    "table3-D2": {"dropout": 0.2},
    "table3-D3": {"label_smoothing": 0.0},
    "table3-D4": {"label_smoothing": 0.2},
    "table3-E": {"positional": "learned"},
    "big": {"d_model": 1024, "d_ff": 4096, "n_heads": 16, "dropout": 0.3, "max_steps": 300_000, "average_last": 20},
}


def flat(config: Config) -> dict:
    return {**dataclasses.asdict(config.model), **dataclasses.asdict(config.train)}


def test_base_is_the_paper():
    c = get_preset("base")
    m, t = c.model, c.train
    assert (m.n_layers, m.d_model, m.d_ff, m.n_heads, m.head_dim_k, m.head_dim_v) == (6, 512, 2048, 8, 64, 64)
    assert (m.dropout, m.positional, m.norm_first, m.share_embeddings) == (0.1, "sinusoidal", False, True)
    assert (t.label_smoothing, t.warmup_steps, t.adam_betas, t.adam_eps) == (0.1, 4000, (0.9, 0.98), 1e-9)
    assert (t.max_steps, t.max_tokens) == (100_000, 25000)


NOT_IN_PAPER = {
    "small": {"n_layers": 3, "d_model": 256, "d_ff": 1024, "n_heads": 4},
    "multi30k": {
        "n_layers": 3,
        "d_model": 256,
        "d_ff": 1024,
        "n_heads": 4,
        "max_tokens": 2048,
        "warmup_steps": 600,
        "lr_scale": 0.4,
        "max_steps": 5200,
    },
    # Transformer-Tiny (Wu et al. 2021)
    "tiny": {
        "n_layers": 4,
        "d_model": 128,
        "d_ff": 256,
        "n_heads": 4,
        "dropout": 0.3,
        "max_tokens": 4096,
        "warmup_steps": 2000,
        "lr_scale": 2.53,
        "max_steps": 8000,
        "average_last": 10,
    },
}


def test_every_table3_row_has_a_preset():
    assert set(TABLE3_ROWS) | {"base"} | set(NOT_IN_PAPER) | set(PARSING) == set(PRESETS)


# Section 6.3 (parse-wsj: the paper's 4 layers and d_model 1024; the rest tensor2tensor's
# transformer_parsing_base) and its CPU size: what each changes from base.
PARSING = {
    "parse-wsj": {
        "n_layers": 4,
        "d_model": 1024,
        "dropout": 0.2,
        "attention_dropout": 0.2,
        "share_embeddings": False,
        "tie_output": False,
        "max_tokens": 32768,
        "warmup_steps": 16000,
        "lr_scale": 0.5,
    },
    "parse-cpu": {
        "n_layers": 4,
        "d_model": 256,
        "d_ff": 1024,
        "n_heads": 4,
        "attention_dropout": 0.1,
        "share_embeddings": False,
        "tie_output": False,
        "norm_first": True,
        "word_positions": True,
        "max_tokens": 4096,
        "warmup_steps": 600,
        "lr_scale": 0.8,
        "max_steps": 5500,
    },
}


@pytest.mark.parametrize("name", sorted(PARSING))
def test_parsing_presets(name):
    base, preset = flat(get_preset("base")), flat(get_preset(name))
    assert {k: v for k, v in preset.items() if base[k] != v} == PARSING[name]


@pytest.mark.parametrize("name", sorted(NOT_IN_PAPER))
def test_cpu_presets_are_base_made_smaller(name):
    base, small = flat(get_preset("base")), flat(get_preset(name))
    assert {k: v for k, v in small.items() if base[k] != v} == NOT_IN_PAPER[name]


def test_tiny_peaks_at_wu_et_al_learning_rate():
    from transduce.train.schedule import learning_rate

    t, m = get_preset("tiny").train, get_preset("tiny").model
    assert learning_rate(t.warmup_steps, m.d_model, t.warmup_steps, t.lr_scale) == pytest.approx(0.005, rel=1e-3)


@pytest.mark.parametrize("name", sorted(TABLE3_ROWS))
def test_preset_differs_from_base_only_where_table3_says(name):
    base, row = flat(get_preset("base")), flat(get_preset(name))
    changed = {k: v for k, v in row.items() if base[k] != v}
    assert changed == TABLE3_ROWS[name]


@pytest.mark.parametrize("name", sorted(TABLE3_PARAMS_M))
def test_parameter_count_matches_table3(name):
    """Shared vocabulary of 37000 ("about 37000", 5.1): within 3% or 3M, whichever is larger."""
    with torch.device("meta"):
        n = count_parameters(Transformer(get_preset(name).model))
    paper = TABLE3_PARAMS_M[name] * 1e6
    assert abs(n - paper) <= max(0.03 * paper, 3e6), f"{name}: {n / 1e6:.1f}M vs Table 3 {paper / 1e6:.0f}M"


def test_presets_are_fresh_copies():
    get_preset("base").model.n_layers = 99
    assert get_preset("base").model.n_layers == 6


def test_overrides_and_errors():
    c = apply_overrides(get_preset("base"), ["model.n_layers=3", "train.warmup_steps=8000", "model.positional=learned"])
    assert (c.model.n_layers, c.train.warmup_steps, c.model.positional) == (3, 8000, "learned")
    # d_k follows d_model / h unless set explicitly
    assert apply_overrides(get_preset("base"), ["model.d_model=256"]).model.head_dim_k == 32
    with pytest.raises(ValueError, match="bad override"):
        apply_overrides(get_preset("base"), ["model.nope=1"])
    with pytest.raises(ValueError, match="positional"):
        ModelConfig(positional="rotary")
    with pytest.raises(KeyError, match="unknown preset"):
        get_preset("huge")


def test_set_values_are_read_as_the_fields_type():
    c = apply_overrides(
        get_preset("base"),
        [
            "model.norm_first=False",
            "model.share_embeddings=TRUE",
            "model.dropout=0",
            "model.attention_window=None",
            "model.d_k=null",
            "train.adam_betas=[0.9, 0.99]",
            "train.lr_scale=2",
            "train.max_tokens=4096",
            "model.positional=learned",
        ],
    )
    m, t = c.model, c.train
    assert m.norm_first is False and m.share_embeddings is True  # "False" was a truthy string: pre-norm
    assert m.dropout == 0.0 and isinstance(m.dropout, float) and m.attention_window is None and m.d_k is None
    assert t.adam_betas == (0.9, 0.99) and t.lr_scale == 2.0 and t.max_tokens == 4096 and m.positional == "learned"
    assert apply_overrides(get_preset("base"), ["model.attention_window=3"]).model.attention_window == 3


@pytest.mark.parametrize(
    "item, expected",
    [
        ("model.n_layers=abc", "bad --set model.n_layers=abc: expected an integer"),
        ("model.n_layers=2.5", "bad --set model.n_layers=2.5: expected an integer"),
        ("model.norm_first=yes", "bad --set model.norm_first=yes: expected true or false"),
        ("model.share_embeddings=maybe", "bad --set model.share_embeddings=maybe: expected true or false"),
        ("model.dropout=0.1x", "bad --set model.dropout=0.1x: expected a number"),
        ("train.lr_scale=abc", "bad --set train.lr_scale=abc: expected a number"),
        ("train.label_smoothing=abc", "bad --set train.label_smoothing=abc: expected a number"),
        ("train.max_tokens=abc", "bad --set train.max_tokens=abc: expected an integer"),
        ("train.adam_betas=0.9", "bad --set train.adam_betas=0.9: expected a list of 2 numbers"),
        ("model.attention_window=wide", "bad --set model.attention_window=wide: expected an integer or null"),
        ("train.lr_scale=-1", "train.lr_scale must be positive"),
        ("train.label_smoothing=1", "train.label_smoothing must be in [0, 1)"),
        ("train.max_tokens=0", "train.max_tokens must be at least 1"),
        ("train.warmup_steps=0", "train.warmup_steps must be at least 1"),
        ("train.max_steps=0", "train.max_steps must be at least 1"),
        ("train.adam_betas=[0.9,1.0]", "train.adam_betas must be two numbers in [0, 1)"),
        ("train.adam_eps=0", "train.adam_eps must be positive"),
        ("model.n_heads=5", "n_heads (5) must divide d_model (512)"),
        ("model.src_vocab_size=0", "vocabulary sizes must be at least 1"),
    ],
)
def test_bad_set_values_name_the_field_and_what_it_takes(item, expected):
    with pytest.raises(ValueError) as e:
        apply_overrides(get_preset("base"), [item])
    assert expected in str(e.value)


def test_heads_must_divide_d_model_unless_the_head_widths_are_given():
    with pytest.raises(ValueError, match="must divide d_model"):
        ModelConfig(d_model=128, n_heads=5)
    with pytest.raises(ValueError, match="must divide d_model"):
        ModelConfig(d_model=128, n_heads=5, d_k=25)  # d_v would still be 128 // 5
    assert ModelConfig(d_model=128, n_heads=5, d_k=25, d_v=25).head_dim_v == 25
    with pytest.raises(ValueError, match="vocabulary sizes"):
        ModelConfig(src_vocab_size=100, tgt_vocab_size=0, share_embeddings=False)
    with pytest.raises(ValueError, match="label_smoothing"):
        TrainConfig(label_smoothing=-0.1)


def test_config_json_round_trip():
    c = get_preset("table3-B1")
    assert Config.from_dict(c.to_dict()) == c
