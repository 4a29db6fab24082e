"""`transduce.fast.step.FastDecoder`: the decoder's step without its module layers computes bit for
bit what the model's `Decoder` computes, on every path where `ready.make_ready` sets it (the CPU
with and without packed weights, int8, and the device `TRANSDUCE_TEST_DEVICE` names: CUDA in
scripts/gpu_check.sh), reads its layers again when they are replaced (nothing to refresh), and
hands every case it does not cover to the `Decoder`."""

import dataclasses
import os

import pytest
import torch

from transduce.config import ModelConfig
from transduce.decoding.search import beam_search, greedy_decode
from transduce.fast import decode as kernels
from transduce.fast import int8, step as fast_step
from transduce.fast.step import FALLBACK, HANDLED, FastDecoder
from transduce.masks import padding_mask
from transduce.model import Decoder, Transformer
from transduce.decoding.ready import make_ready

from test_model import padded_batch, tiny_config

DEVICE = torch.device(os.environ.get("TRANSDUCE_TEST_DEVICE") or ("cuda" if torch.cuda.is_available() else "cpu"))
"""Where the device test runs: CUDA where there is one (scripts/gpu_check.sh runs this file there), else the CPU."""


def _model(dtype=torch.float32, device="cpu", **kw):
    torch.manual_seed(0)
    return Transformer(tiny_config(src_vocab_size=60, **kw)).eval().to(device=device, dtype=dtype)


def test_every_model_option_is_handled_by_the_step_or_handed_back():
    """A `ModelConfig` field added without a line in `HANDLED` or `FALLBACK` fails here (and, until
    it has one, every model decodes through its own step: `covers` is False)."""
    fields = {f.name for f in dataclasses.fields(ModelConfig)}
    assert fields == set(HANDLED) | set(FALLBACK), (
        fields - set(HANDLED) - set(FALLBACK),
        set(HANDLED) | set(FALLBACK) - fields,
    )
    assert not set(HANDLED) & set(FALLBACK)
    defaults = ModelConfig()
    assert all(getattr(defaults, name) == value for name, value in FALLBACK.items())  # the paper's model is covered
    assert fast_step.covers(defaults)
    for name in FALLBACK:  # every other value of a fallback option: the model's own step
        other = dict(
            word_positions=dict(word_positions=True, share_embeddings=False, tie_output=False),
            attention_window=dict(attention_window=2),
        )[name]
        assert not fast_step.covers(dataclasses.replace(defaults, **other))


def test_a_field_in_neither_table_is_not_covered(monkeypatch):
    monkeypatch.delitem(HANDLED, "d_ff")
    assert not fast_step.covers(ModelConfig())
    model = _model()
    undo = make_ready(model)
    assert type(model.decoder) is Decoder
    undo()


def _steps(model, src, step, n=6):
    """The logits of n cached decoding steps of every source through `step`, feeding back the
    argmax, with a reorder of the rows in between (what beam search does to the cache)."""
    with torch.inference_mode():
        mask = padding_mask(src, model.config.pad_id)
        cache = model.init_cache(model.encode(src, mask), mask)
        tokens, out = torch.full((src.size(0), 1), 2, device=src.device), []
        for t in range(n):
            logits = step(tokens, cache)
            out.append(logits)
            tokens = logits[:, -1].argmax(-1, keepdim=True)
            if t == 2:  # rows swap places, as hypotheses do between steps
                order = torch.arange(src.size(0), device=src.device).flip(0)
                cache.reorder(order)
                tokens = tokens[order]
        return out


def _same_as_the_model(model, src):
    """The model with its `FastDecoder` and with the `Decoder` it wraps: the same logits at every
    step and the same hypotheses, bit for bit; the flat loop ran at every step."""
    fast = model.decoder
    assert isinstance(fast, FastDecoder)
    runs = []
    original_step = FastDecoder.step
    FastDecoder.step = lambda self, t, c: runs.append(1) or original_step(self, t, c)
    try:
        lean = _steps(model, src, model.decode_step)
        assert len(runs) == len(lean)
        with torch.inference_mode():
            got = beam_search(model, src, beam_size=4, alpha=0.6, max_len_offset=6)
            greedy = greedy_decode(model, src, max_len_offset=6)
    finally:
        FastDecoder.step = original_step
    model.decoder = fast.original
    try:
        plain = _steps(model, src, model.decode_step)
        with torch.inference_mode():
            want = beam_search(model, src, beam_size=4, alpha=0.6, max_len_offset=6)
            assert greedy == greedy_decode(model, src, max_len_offset=6)
    finally:
        model.decoder = fast
    assert all(torch.equal(a, b) for a, b in zip(plain, lean))
    assert [[(h.tokens, h.score) for h in hs] for hs in got] == [[(h.tokens, h.score) for h in hs] for hs in want]


@pytest.mark.parametrize("threads", [2, 1])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_bf16_step_attends_over_a_multiple_of_positions(dtype, threads, monkeypatch):
    """bf16 on the CPU: a step's self-attention runs over its positions rounded up to
    `POSITIONS_MULTIPLE`, those past the last zero and masked, so that oneDNN builds its kernels for a
    few shapes, not one a step (the logits bit for bit the model's: the test above); the cache keeps
    the positions decoded. fp32 (the exact path), and where PyTorch's fused kernel takes the step
    (one thread, a few rows: `attention.fused_step`), over the positions themselves."""
    n_threads = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        _attends_over_a_multiple(dtype, threads, monkeypatch)
    finally:
        torch.set_num_threads(n_threads)


def _attends_over_a_multiple(dtype, threads, monkeypatch):
    model = _model(dtype)
    make_ready(model)
    seen = []
    original = fast_step.step_attention
    monkeypatch.setattr(
        fast_step,
        "step_attention",
        lambda q, k, v, mask, kf: seen.append((k.size(2), mask)) or original(q, k, v, mask, kf),
    )
    src = padded_batch([7, 3, 5], vocab=60, seed=1)
    with torch.inference_mode():
        mask = padding_mask(src, model.config.pad_id)
        cache = model.init_cache(model.encode(src, mask), mask)
        tokens = torch.full((src.size(0), 1), 2)
        for t in range(10):
            model.decode_step(tokens, cache)
            self_attention = seen[0::2]  # each layer's self-attention, then its encoder-decoder attention
            n, step_mask = self_attention[-1]
            padded = dtype == torch.bfloat16 and threads > 1  # 3 rows x 4 heads: fused on one thread
            assert n == (
                -(-(t + 1) // fast_step.POSITIONS_MULTIPLE) * fast_step.POSITIONS_MULTIPLE if padded else t + 1
            )
            assert (step_mask is None) == (n == t + 1)
            if step_mask is not None:
                assert step_mask.flatten().tolist() == [i <= t for i in range(n)]
            layer = cache.layers[0]
            assert layer.self_k.size(2) == layer.self_v.size(2) == t + 1  # what was decoded, not the padding
    assert {n for n, _ in seen[0::2]} == ({8, 16} if dtype == torch.bfloat16 and threads > 1 else set(range(1, 11)))


@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("tied", [True, False])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fast_step_is_the_models_step_bit_for_bit(dtype, tied, norm_first):
    """On the CPU with plain F.linear layers (every torch), then with oneDNN-packed ones where this
    torch and CPU pack that dtype."""
    kw = {} if tied else dict(tie_output=False, share_embeddings=False)
    model = _model(dtype, norm_first=norm_first, attention_bias=not tied, **kw)
    src = padded_batch([7, 3, 5], vocab=60, seed=1)
    for pack in (False, True) if kernels.can_pack(dtype, "cpu") else (False,):
        undo = make_ready(model, pack=pack)
        assert isinstance(model.decoder, FastDecoder) and kernels.is_packed(model) == pack
        _same_as_the_model(model, src)
        undo()
        assert type(model.decoder) is Decoder and not kernels.is_packed(model)


@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fast_step_on_the_test_device_is_the_models_step_bit_for_bit(dtype, norm_first):
    """What `ready.make_ready` installs on `DEVICE` (no packing, no step attention off the CPU: the
    model's own SDPA) gives the model's logits and hypotheses bit for bit."""
    if dtype == torch.bfloat16 and DEVICE.type == "cuda" and not torch.cuda.is_bf16_supported():
        pytest.skip("this GPU has no bf16")
    model = _model(dtype, DEVICE, norm_first=norm_first)
    src = padded_batch([7, 3, 5], vocab=60, seed=1).to(DEVICE)
    undo = make_ready(model)
    assert isinstance(model.decoder, FastDecoder)
    _same_as_the_model(model, src)
    undo()


OTHER_VALUES = {
    "src_vocab_size": dict(src_vocab_size=70),
    "tgt_vocab_size": dict(tgt_vocab_size=50, share_embeddings=False),
    "n_layers": dict(n_layers=3),
    "d_model": dict(d_model=48),
    "d_ff": dict(d_ff=96),
    "n_heads": dict(n_heads=2),
    "d_k": dict(d_k=4),
    "d_v": dict(d_v=12),
    "dropout": dict(dropout=0.3),
    "attention_dropout": dict(attention_dropout=0.2),
    "positional": dict(positional="learned"),
    "max_positions": dict(max_positions=64, positional="learned"),
    "tie_output": dict(tie_output=False, share_embeddings=False),
    "layer_norm_eps": dict(layer_norm_eps=1e-2),
    "pad_id": dict(pad_id=1),
    "activation": dict(activation="swish"),
    "unk_id": dict(unk_id=7),
    "bos_id": dict(bos_id=8),
    "eos_id": dict(eos_id=9),
}
"""For each `HANDLED` field, a value unlike `tiny_config`'s (with what that value needs beside it);
a boolean field left out here takes the other value."""


def _other_value(name: str) -> dict:
    """The `tiny_config` keywords that set `name` to a value other than the base model's."""
    if name in OTHER_VALUES:
        return OTHER_VALUES[name]
    default = getattr(tiny_config(src_vocab_size=60), name)
    assert isinstance(default, bool), f"give HANDLED's {name!r} a value other than {default!r} in OTHER_VALUES"
    return {name: not default}


@pytest.mark.parametrize("name", sorted(HANDLED))
def test_fast_step_is_the_models_step_at_every_handled_fields_other_value(name):
    """One model per `HANDLED` field, that field (alone, or with what it needs) away from the base
    model's value, biases and LayerNorms perturbed so that each is used: fp32 logits and
    hypotheses bit for bit the model's, on the CPU with and without packed weights, and on
    `DEVICE` (CUDA in scripts/gpu_check.sh). A field added to `HANDLED` is tested here at once."""
    kw = {"src_vocab_size": 60, **_other_value(name)}
    torch.manual_seed(0)
    model = Transformer(tiny_config(**kw)).eval()
    assert getattr(model.config, name) != getattr(tiny_config(src_vocab_size=60), name), kw
    with torch.no_grad():
        for key, p in model.named_parameters():
            if "norm" in key or key.endswith("bias"):
                p.add_(torch.randn_like(p) * 0.1)
    src = padded_batch([7, 3, 5], vocab=60, seed=1)
    runs = [("cpu", pack) for pack in ((False, True) if kernels.can_pack(torch.float32, "cpu") else (False,))]
    for device, pack in runs + ([(DEVICE, False)] if DEVICE.type != "cpu" else []):
        model.to(device)
        undo = make_ready(model, pack=pack)
        assert isinstance(model.decoder, FastDecoder)
        _same_as_the_model(model, src.to(device))
        undo()


@pytest.mark.skipif(not int8.can_int8(), reason="no oneDNN int8 here")
@pytest.mark.parametrize("decoder", [True, False])  # every decoder layer in int8; the projection alone (AMX)
def test_fast_step_runs_the_int8_products_as_the_model_does(decoder):
    """Layers replaced after the `FastDecoder` was set (int8, packing, then put back) are the ones
    its next step runs: nothing to refresh."""
    model = _model()
    src = padded_batch([7, 3, 5, 6], vocab=60, seed=2)
    undo = make_ready(model)
    int8.quantize_int8(model, decoder=decoder)  # after make_ready: the step reads the int8 layers
    _same_as_the_model(model, src)
    assert sum(isinstance(c, int8.Int8Weight) for c in model.decoder.checks) == (2 * 6 if decoder else 0)
    kernels.pack_weights(model)  # the layers int8 left (make_ready's order: quantize, then pack)
    _same_as_the_model(model, src)
    assert len(model.decoder.checks) == 2 * 6
    int8.dequantize_int8(model)
    _same_as_the_model(model, src)
    assert not any(isinstance(c, int8.Int8Weight) for c in model.decoder.checks)
    undo()


@pytest.mark.skipif(not kernels.can_pack(torch.float32, "cpu"), reason="a stale packed weight needs packing")
def test_fast_step_hands_what_it_does_not_cover_to_the_model(monkeypatch):
    """Autograd, autocast, training mode, several positions at once, weights asked for: the
    `Decoder`'s own forward, so the results are the model's."""
    model = _model()
    src = padded_batch([5, 4], vocab=60, seed=3)
    make_ready(model)
    fast = model.decoder
    calls = []
    original = Decoder.forward
    monkeypatch.setattr(
        Decoder, "forward", lambda self, t, *a, **k: calls.append(t.size(1)) or original(self, t, *a, **k)
    )
    mask = padding_mask(src, 0)
    with torch.no_grad():
        cache = model.init_cache(model.encode(src, mask), mask)
    tokens = torch.full((2, 1), 2)
    with torch.inference_mode():
        model.decode_step(tokens, cache)
    assert calls == []  # covered: the flat loop
    model.decode_step(tokens, cache)  # autograd on
    with torch.inference_mode(), torch.autocast("cpu", dtype=torch.bfloat16):
        model.decode_step(tokens, cache)
    with torch.inference_mode():
        model.decode_step(torch.full((2, 3), 2), cache)  # three positions at once
        model.train()
        model.decode_step(tokens, cache)
        model.eval()
    assert calls == [1, 1, 3, 1]
    assert isinstance(fast, FastDecoder)
