"""The decoding speed-ups of `transduce.fast.decode`: the same computation as the bare model, faster."""

import pytest
import torch
import torch.nn.functional as F

from transduce.fast import decode as kernels
from transduce.attention import step_attention as decode_attention
from transduce.fast.decode import PackedLinear, PackedWeight, can_pack
from transduce.masks import causal_mask, make_masks
from transduce.model import MultiHeadAttention, Transformer, attention_reference
from transduce.decoding.ready import make_ready

from test_model import PAD, padded_batch, tiny_config

needs_packing = pytest.mark.skipif(not can_pack(torch.float32, "cpu"), reason="no oneDNN in this torch build")


def _count_packed_calls(monkeypatch):
    calls = []
    original = PackedWeight.__call__
    monkeypatch.setattr(PackedWeight, "__call__", lambda self, x, b, *a: calls.append(1) or original(self, x, b, *a))
    return calls


@pytest.mark.parametrize("masked", [False, True])
def test_decode_attention_is_equation_1(masked):
    """A decoding step's few queries against the cached keys: the written-out equation 1."""
    torch.manual_seed(0)
    B, h, n, T, dk, dv = 3, 4, 2, 7, 8, 6
    q, k, v = torch.randn(B, h, n, dk), torch.randn(B, h, T, dk), torch.randn(B, h, T, dv)
    mask = causal_mask(n, T) & make_masks(padded_batch([7, 5, 6]), None, PAD)[0] if masked else None
    torch.testing.assert_close(
        decode_attention(q, k, v, mask), attention_reference(q, k, v, mask)[0], rtol=1e-5, atol=1e-6
    )


@pytest.mark.parametrize("keys_first", [False, True])
def test_decode_attention_one_bf16_query_either_way_is_equation_1(keys_first):
    """One bf16 query: K q^T (AMX) or q K^T (elsewhere), both equation 1."""
    torch.manual_seed(0)
    q, k, v = torch.randn(3, 4, 1, 8), torch.randn(3, 4, 7, 8), torch.randn(3, 4, 7, 6)
    got = decode_attention(q.bfloat16(), k.bfloat16(), v.bfloat16(), keys_first=keys_first).float()
    torch.testing.assert_close(got, attention_reference(q, k, v, None)[0], rtol=0.05, atol=0.03)


def test_keys_first_follows_onednns_amx_not_the_cpu_flag_alone(monkeypatch):
    """K q^T is AMX's layout: on a CPU with AMX held to AVX2 by ONEDNN_MAX_CPU_ISA (what an
    AVX2-only laptop runs, imitated), oneDNN has no AMX, so q K^T, as on that laptop."""
    from transduce.cache import cpu_keys_first
    from transduce import cpu

    monkeypatch.setattr(cpu, "cpuinfo", lambda: {"flags": "avx2 avx512_bf16 avx512_vnni amx_tile amx_bf16 amx_int8"})
    monkeypatch.delenv("DNNL_MAX_CPU_ISA", raising=False)
    try:
        for held, expected in (("AVX2", False), ("avx512_core_vnni", False), ("", True), ("AVX512_CORE_AMX", True)):
            monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", held)
            cpu_keys_first.cache_clear()
            assert cpu_keys_first() is expected, held
    finally:
        cpu_keys_first.cache_clear()


@needs_packing
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_packed_weights_give_the_same_logits_and_beam_search(monkeypatch, dtype):
    """`pack_weights` changes how the products run, not what they compute: the teacher-forced
    logits and cached decoding agree with the F.linear path (fp32 to rounding; bf16 within
    bf16 rounding), and beam search finds the same hypotheses (fp32)."""
    from transduce.decoding.search import beam_search

    if dtype == torch.bfloat16 and not can_pack(dtype, "cpu"):
        pytest.skip("oneDNN bf16 not supported on this CPU")
    torch.manual_seed(0)
    model = Transformer(tiny_config(src_vocab_size=60, tie_output=False, share_embeddings=False)).eval().to(dtype)
    src, tgt = padded_batch([7, 3, 5], vocab=60, seed=1), padded_batch([6, 6, 2], vocab=60, seed=2)
    with torch.inference_mode():
        plain = model(src, tgt).float()
        plain_beam = beam_search(model, src, beam_size=4, alpha=0.6, max_len_offset=6)
    calls = _count_packed_calls(monkeypatch)
    assert kernels.pack_weights(model)
    with torch.inference_mode():
        packed = model(src, tgt).float()
        packed_beam = beam_search(model, src, beam_size=4, alpha=0.6, max_len_offset=6)
    assert len(calls) > 0
    tol = dict(rtol=1e-5, atol=1e-5) if dtype == torch.float32 else dict(rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(packed, plain, **tol)
    if dtype == torch.float32:
        assert [[h.tokens for h in hs] for hs in packed_beam] == [[h.tokens for h in hs] for hs in plain_beam]
    kernels.unpack_weights(model)
    calls.clear()
    with torch.inference_mode():
        model(src, tgt)
    assert calls == []


@needs_packing
def test_packed_weights_are_never_used_stale_or_under_autograd(monkeypatch):
    """A packed copy stands for its parameter only while the parameter is unchanged, and never
    where gradients are wanted: after an in-place update (an optimizer step) or under autograd
    the model computes exactly what it computes unpacked."""
    torch.manual_seed(0)
    model = Transformer(tiny_config()).eval()
    src, tgt = padded_batch([5, 4], seed=3), padded_batch([4, 4], seed=4)
    assert kernels.pack_weights(model)
    calls = _count_packed_calls(monkeypatch)
    logits = model(src, tgt)  # autograd on: F.linear, and gradients reach every weight
    logits.float().sum().backward()
    assert calls == [] and all(p.grad is not None for p in model.parameters())
    with torch.no_grad():
        model.decoder.layers[0].feed_forward.w_1.weight.add_(0.5)  # the packed copy is stale now
        model.decoder.embed.weight.mul_(1.5)
        updated = model(src, tgt)
    used = len(calls)
    kernels.unpack_weights(model)
    with torch.no_grad():
        reference = model(src, tgt)
    torch.testing.assert_close(updated, reference, rtol=1e-5, atol=1e-5)
    assert used > 0  # the other layers still used their (valid) copies; the stale two did not


def test_pack_weights_declines_what_it_cannot_pack():
    assert not can_pack(torch.float16, "cpu")
    assert not can_pack(torch.float32, "cuda")
    model = Transformer(tiny_config()).to(torch.float16)
    assert kernels.pack_weights(model) is False and not kernels.is_packed(model)


@needs_packing
@pytest.mark.parametrize("tied", [True, False])
def test_packing_keeps_the_parameters_and_unpacking_restores_the_layers(tied):
    """Packed, the model has the same parameters under the same names (state_dict unchanged, the
    tied matrix registered once); unpacked, the very layers it had before."""
    kw = {} if tied else dict(tie_output=False, share_embeddings=False)
    model = Transformer(tiny_config(attention_bias=True, **kw)).eval()
    before = dict(model.state_dict(keep_vars=True))
    layers = dict(model.named_modules())
    assert kernels.pack_weights(model) and kernels.is_packed(model)
    assert kernels.pack_weights(model) is False  # packed already
    assert isinstance(model.output_proj, PackedLinear) and isinstance(
        model.decoder.layers[0].self_attn.in_proj, PackedLinear
    )
    after = dict(model.state_dict(keep_vars=True))
    assert after.keys() == before.keys() and all(after[k] is before[k] for k in before)
    kernels.unpack_weights(model)
    assert not kernels.is_packed(model) and (model.output_proj is None) == tied
    assert all(m is layers[name] for name, m in model.named_modules())


@needs_packing
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_packed_feed_forward_fuses_the_relu_bit_for_bit(dtype):
    """Equation 2 with max(0, .) inside the first packed product: the same bits as the layer's
    own max(0, x W_1 + b_1) W_2 + b_2 through the same packed products; unpacked, the original."""
    if dtype == torch.bfloat16 and not can_pack(dtype, "cpu"):
        pytest.skip("no oneDNN bf16 on this CPU")
    from transduce.fast.decode import PackedFeedForward
    from transduce.model import PositionwiseFeedForward

    torch.manual_seed(0)
    ffn = PositionwiseFeedForward(32, 64).to(dtype)
    holder = torch.nn.Sequential(ffn)
    x = torch.randn(5, 3, 32, dtype=dtype)
    assert kernels.pack_weights(holder) and isinstance(holder[0], PackedFeedForward)
    with torch.no_grad():
        fused = holder(x)
        w_1, w_2 = holder[0].w_1, holder[0].w_2
        separate = w_2(torch.relu(w_1(x)))
    assert torch.equal(fused, separate)
    kernels.unpack_weights(holder)
    assert holder[0] is ffn and type(ffn.w_1) is torch.nn.Linear
    with torch.no_grad():
        torch.testing.assert_close(
            ffn(x),
            fused,
            rtol=1e-2 if dtype == torch.bfloat16 else 1e-5,
            atol=1e-2 if dtype == torch.bfloat16 else 1e-5,
        )


def test_packed_attention_without_biases():
    """3.2.2: the projections are matrices alone; packed, they compute the same."""
    mha = MultiHeadAttention(16, 2, 8, 8)
    x = torch.randn(2, 5, 16)
    kernels.pack_weights(mha)
    with torch.no_grad():
        torch.testing.assert_close(
            mha(x)[0],
            mha.out_proj(F.scaled_dot_product_attention(*mha.project_qkv(x)).transpose(1, 2).reshape(2, 5, 16)),
        )


def test_make_ready_and_undo_leave_what_the_caller_set():
    """`ready.make_ready` packs and sets the flat decoder (modules standing in for modules, nothing
    set on an instance); its undo takes back only what it did."""
    from transduce.fast.step import FastDecoder
    from transduce.model import Decoder

    model = Transformer(tiny_config()).eval()
    undo = make_ready(model)
    assert isinstance(model.decoder, FastDecoder)
    assert kernels.is_packed(model) == can_pack(torch.float32, "cpu")
    assert not any(
        k in m.__dict__ for m in model.modules() for k in ("decode_step", "step_attention", "sequence_attention")
    )
    undo()
    assert type(model.decoder) is Decoder and not kernels.is_packed(model)
    make_ready(model, pack=False)  # the caller's choice: the flat decoder only
    undo = make_ready(model)
    undo()
    assert isinstance(model.decoder, FastDecoder) and not kernels.is_packed(model)
