"""`transduce.fast.step.FastStep`: the decoder's step without its module layers computes bit for
bit what `Transformer.decode_step` computes, on every path where `ready.make_ready` installs it (the
CPU with and without packed weights, int8, and the device `TRANSDUCE_TEST_DEVICE` names: CUDA in
scripts/gpu_check.sh), and hands every case it does not cover to the model's own step."""

import dataclasses
import os

import pytest
import torch

from transduce.config import ModelConfig
from transduce.decoding.search import _best_extensions, beam_search, greedy_decode
from transduce.fast import decode as kernels
from transduce.fast import int8, step as fast_step
from transduce.fast.step import FALLBACK, HANDLED, FastStep
from transduce.model import Transformer, padding_mask
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
    assert fields == set(HANDLED) | set(FALLBACK), (fields - set(HANDLED) - set(FALLBACK), set(HANDLED) | set(FALLBACK) - fields)
    assert not set(HANDLED) & set(FALLBACK)
    defaults = ModelConfig()
    assert all(getattr(defaults, name) == value for name, value in FALLBACK.items())  # the paper's model is covered
    assert fast_step.covers(defaults)
    for name in FALLBACK:  # every other value of a fallback option: the model's own step
        other = dict(word_positions=dict(word_positions=True, share_embeddings=False, tie_output=False),
                     attention_window=dict(attention_window=2))[name]
        assert not fast_step.covers(dataclasses.replace(defaults, **other))


def test_a_field_in_neither_table_is_not_covered(monkeypatch):
    monkeypatch.delitem(HANDLED, "d_ff")
    assert not fast_step.covers(ModelConfig())
    model = _model()
    undo = make_ready(model)
    assert "decode_step" not in model.__dict__
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
    installed = model.__dict__.pop("decode_step", None)
    fast = FastStep(model)
    plain = _steps(model, src, lambda t, c: Transformer.decode_step(model, t, c))
    lean = _steps(model, src, fast)
    assert all(torch.equal(a, b) for a, b in zip(plain, lean))
    model.decode_step = fast
    with torch.inference_mode():
        got = beam_search(model, src, beam_size=4, alpha=0.6, max_len_offset=6)
        greedy = greedy_decode(model, src, max_len_offset=6)
    del model.decode_step
    with torch.inference_mode():
        want = beam_search(model, src, beam_size=4, alpha=0.6, max_len_offset=6)
        assert greedy == greedy_decode(model, src, max_len_offset=6)
    assert [[(h.tokens, h.score) for h in hs] for hs in got] == [[(h.tokens, h.score) for h in hs] for hs in want]
    if installed is not None:
        model.decode_step = installed


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
        assert isinstance(model.decode_step, FastStep) and kernels.is_packed(model) == pack
        _same_as_the_model(model, src)
        undo()
        assert "decode_step" not in model.__dict__


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
    assert isinstance(model.decode_step, FastStep)
    _same_as_the_model(model, src)
    undo()


OTHER_VALUES = {
    "src_vocab_size": dict(src_vocab_size=70), "tgt_vocab_size": dict(tgt_vocab_size=50, share_embeddings=False),
    "n_layers": dict(n_layers=3), "d_model": dict(d_model=48), "d_ff": dict(d_ff=96), "n_heads": dict(n_heads=2),
    "d_k": dict(d_k=4), "d_v": dict(d_v=12), "dropout": dict(dropout=0.3), "attention_dropout": dict(attention_dropout=0.2),
    "positional": dict(positional="learned"), "max_positions": dict(max_positions=64, positional="learned"),
    "tie_output": dict(tie_output=False, share_embeddings=False), "layer_norm_eps": dict(layer_norm_eps=1e-2),
    "pad_id": dict(pad_id=1), "activation": dict(activation="swish"),
}
"""For each `HANDLED` field, a value unlike `tiny_config`'s (with what that value needs beside it);
a boolean field left out here takes the other value."""


def _other_value(name: str) -> dict:
    """The `tiny_config` keywords that set `name` to a value other than the base model's."""
    if name in OTHER_VALUES:
        return OTHER_VALUES[name]
    default = getattr(tiny_config(src_vocab_size=60), name)
    "unk_id": dict(unk_id=7), "bos_id": dict(bos_id=8), "eos_id": dict(eos_id=9),
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
        assert isinstance(model.decode_step, FastStep)
        _same_as_the_model(model, src.to(device))
        undo()


@pytest.mark.skipif(not int8.can_int8(), reason="no oneDNN int8 here")
@pytest.mark.parametrize("decoder", [True, False])  # every decoder layer in int8; the projection alone (AMX)
def test_fast_step_runs_the_int8_products_as_the_model_does(decoder):
    model = _model()
    src = padded_batch([7, 3, 5, 6], vocab=60, seed=2)
    undo = make_ready(model)
    int8.quantize_int8(model, decoder=decoder)  # after make_ready: the step is rebuilt on the int8 layers
    step = model.decode_step
    assert isinstance(step, FastStep) and sum(isinstance(c, int8.Int8Weight) for c in step.checks) == (
        2 * 6 + 1 if decoder else 1)
    _same_as_the_model(model, src)
    kernels.pack_weights(model)  # the layers int8 left (make_ready's order: quantize, then pack)
    assert len(model.decode_step.checks) == 2 * 6 + 1
    _same_as_the_model(model, src)
    int8.dequantize_int8(model)
    assert not any(isinstance(c, int8.Int8Weight) for c in model.decode_step.checks)
    undo()


@pytest.mark.skipif(not kernels.can_pack(torch.float32, "cpu"), reason="a stale packed weight needs packing")
def test_fast_step_hands_what_it_does_not_cover_to_the_model(monkeypatch):
    """Autograd, autocast, training mode, several positions at once, a stale packed weight: the
    model's own step, so the results are the model's (here: F.linear for the changed weight)."""
    model = _model()
    src = padded_batch([5, 4], vocab=60, seed=3)
    make_ready(model)
    fast = model.decode_step
    calls = []
    original = Transformer.decode_step
    monkeypatch.setattr(Transformer, "decode_step", lambda self, t, c: calls.append(t.size(1)) or original(self, t, c))
    mask = padding_mask(src, 0)
    with torch.no_grad():
        cache = model.init_cache(model.encode(src, mask), mask)
    tokens = torch.full((2, 1), 2)
    with torch.inference_mode():
        fast(tokens, cache)
    assert calls == []  # covered: no call to the model's step
    fast(tokens, cache)  # autograd on
    with torch.inference_mode(), torch.autocast("cpu", dtype=torch.bfloat16):
        fast(tokens, cache)
    with torch.inference_mode():
        fast(torch.full((2, 3), 2), cache)  # three positions at once
        model.train()
        fast(tokens, cache)
        model.eval()
    assert calls == [1, 1, 3, 1]
    calls.clear()
    with torch.no_grad():
        model.decoder.layers[1].feed_forward.w_2.weight.mul_(2.0)  # the packed copy is stale now
    assert not fast.usable(tokens)
    plain = _steps(model, src, lambda t, c: original(model, t, c))
    lean = _steps(model, src, fast)
    assert calls and all(torch.equal(a, b) for a, b in zip(plain, lean))


def test_apply_installs_the_step_only_where_it_covers_the_model():
    for kw in (dict(attention_window=2), dict(word_positions=True, share_embeddings=False, tie_output=False)):
        model = _model(**kw)
        undo = make_ready(model)
        assert "decode_step" not in model.__dict__
        undo()
    model = _model()
    undo = make_ready(model)
    again = make_ready(model)  # applied twice: one step, and the inner undo leaves it
    step = model.decode_step
    again()
    assert model.decode_step is step
    undo()
    assert "decode_step" not in model.__dict__


def test_one_query_on_one_thread_is_equation_1():
    """`decode_attention` hands one unmasked query per row on one thread to PyTorch's fused
    kernel: still equation 1."""
    from transduce.fast.decode import decode_attention
    from transduce.model import attention_reference

    torch.manual_seed(0)
    q, k, v = torch.randn(6, 4, 1, 16), torch.randn(6, 4, 9, 16), torch.randn(6, 4, 9, 16)
    threads = torch.get_num_threads()
    try:
        for n in (1, 2):
            torch.set_num_threads(n)
            torch.testing.assert_close(decode_attention(q, k, v), attention_reference(q, k, v, None)[0], rtol=1e-5, atol=1e-6)
    finally:
        torch.set_num_threads(threads)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_consumed_logits_give_the_same_extensions(dtype):
    """`consume=True` overwrites fp32 logits by their log-probabilities: the same candidates."""
    torch.manual_seed(0)
    logits = (torch.randn(8 * 4, 3000) * 4).to(dtype)
    alive = -torch.rand(8, 4) * 3
    want = _best_extensions(logits.clone(), alive, 8, [0, 2], 3)
    given = logits.clone()
    got = _best_extensions(given, alive, 8, [0, 2], 3, consume=True, chunk_elements=2 * 4 * 3000)
    assert all(torch.equal(a, b) for a, b in zip(got, want))
    assert torch.equal(given, logits) == (dtype != torch.float32)  # bf16 logits are left as they were
