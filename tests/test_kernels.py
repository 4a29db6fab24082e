"""The CPU speed-ups of `transduce.kernels`: the same computation as the bare model, faster."""

import pytest
import torch
import torch.nn.functional as F

from transduce import kernels
from transduce.kernels import BitDropout, PackedLinear, PackedWeight, can_pack, decode_attention
from transduce.model import MultiHeadAttention, Transformer, attention_reference, causal_mask, make_masks

from test_model import PAD, padded_batch, tiny_config

needs_packing = pytest.mark.skipif(not can_pack(torch.float32, "cpu"), reason="no oneDNN in this torch build")


def _count_packed_calls(monkeypatch):
    calls = []
    original = PackedWeight.__call__
    monkeypatch.setattr(PackedWeight, "__call__", lambda self, x, b, *a: calls.append(1) or original(self, x, b, *a))
    return calls


# -- dropout (5.4) ---------------------------------------------------------------------------


def test_bit_dropout_zeroes_p_of_the_elements_and_scales_the_rest():
    torch.manual_seed(0)
    x = torch.randn(1001, 999)  # an element count that is not a multiple of 4
    drop = BitDropout(0.1).train()
    torch.manual_seed(0)
    y = drop(x)
    kept = y != 0
    assert abs(kept.float().mean().item() - 0.9) < 0.002  # 1M Bernoulli(0.9) draws: sd 0.0003
    torch.testing.assert_close(y[kept], x[kept] * (1 / 0.9))
    torch.manual_seed(0)
    assert torch.equal(drop(x), y)  # the default generator: seeded runs repeat (exact resume)
    assert not torch.equal(drop(x), y)
    # the gradient is the same mask and scale
    x.requires_grad_(True)
    torch.manual_seed(1)
    out = drop(x)
    out.sum().backward()
    torch.testing.assert_close(x.grad, (out != 0).float() / 0.9)
    # eval mode and p = 0 are the identity; bf16 stays bf16
    assert drop.eval()(x) is x and BitDropout(0.0).train()(x) is x
    assert BitDropout(0.3).train()(x.detach().bfloat16()).dtype == torch.bfloat16
    with pytest.raises(ValueError):
        BitDropout(1.0)


@pytest.mark.parametrize("p", [0.1, 0.3, 0.5, 2**-15])
def test_bit_dropout_keeps_exactly_the_elements_whose_15_bits_reach_the_threshold(p):
    # the mask is computed by a shift, not a comparison (faster in bf16): the same elements
    x = torch.randn(3, 7, 11, dtype=torch.bfloat16)  # 231 elements: not a multiple of 4
    torch.manual_seed(5)
    y = BitDropout(p).train()(x)
    torch.manual_seed(5)
    bits = torch.empty((x.numel() + 3) // 4, dtype=torch.int64).random_()
    keep = (bits.view(torch.int16)[: x.numel()].view(x.shape) & 0x7FFF) >= round(p * 32768)
    assert torch.equal(y, x * keep.to(x.dtype).mul_(1.0 / (1.0 - p)))


def test_fast_dropout_swaps_every_dropout_and_nothing_else():
    """Training's dropout, swapped in from the outside: same p, same mode, same parameters."""
    torch.manual_seed(0)
    model = Transformer(tiny_config(dropout=0.2)).eval()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    n_dropouts = sum(isinstance(m, torch.nn.Dropout) for m in model.modules())
    assert kernels.fast_dropout(model) == n_dropouts > 0
    assert not any(isinstance(m, torch.nn.Dropout) for m in model.modules())
    swapped = [m for m in model.modules() if isinstance(m, BitDropout)]
    assert len(swapped) == n_dropouts and all(m.p == 0.2 and not m.training for m in swapped)
    assert model.state_dict().keys() == before.keys()
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())
    assert kernels.fast_dropout(model) == 0  # once only


# -- decode_attention --------------------------------------------------------------------------


@pytest.mark.parametrize("masked", [False, True])
def test_decode_attention_is_equation_1(masked):
    """A decoding step's few queries against the cached keys: the written-out equation 1."""
    torch.manual_seed(0)
    B, h, n, T, dk, dv = 3, 4, 2, 7, 8, 6
    q, k, v = torch.randn(B, h, n, dk), torch.randn(B, h, T, dk), torch.randn(B, h, T, dv)
    mask = causal_mask(n, T) & make_masks(padded_batch([7, 5, 6]), None, PAD)[0] if masked else None
    torch.testing.assert_close(decode_attention(q, k, v, mask), attention_reference(q, k, v, mask)[0], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("keys_first", [False, True])
def test_decode_attention_one_bf16_query_either_way_is_equation_1(monkeypatch, keys_first):
    """One bf16 query: K q^T (AMX) or q K^T (elsewhere), both equation 1."""
    from transduce import kernels

    monkeypatch.setattr(kernels, "_keys_first", lambda: keys_first)
    torch.manual_seed(0)
    q, k, v = torch.randn(3, 4, 1, 8), torch.randn(3, 4, 7, 8), torch.randn(3, 4, 7, 6)
    got = decode_attention(q.bfloat16(), k.bfloat16(), v.bfloat16()).float()
    torch.testing.assert_close(got, attention_reference(q, k, v, None)[0], rtol=0.05, atol=0.03)


def test_keys_first_follows_onednns_amx_not_the_cpu_flag_alone(monkeypatch):
    """K q^T is AMX's layout: on a CPU with AMX held to AVX2 by ONEDNN_MAX_CPU_ISA (what an
    AVX2-only laptop runs, imitated), oneDNN has no AMX, so q K^T, as on that laptop."""
    from transduce import kernels

    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: True, raising=False)
    monkeypatch.delenv("DNNL_MAX_CPU_ISA", raising=False)
    try:
        for held, expected in (("AVX2", False), ("avx512_core_vnni", False), ("", True), ("AVX512_CORE_AMX", True)):
            monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", held)
            kernels._keys_first.cache_clear()
            assert kernels._keys_first() is expected, held
    finally:
        kernels._keys_first.cache_clear()


# -- weights pre-packed for CPU inference ----------------------------------------------------


@needs_packing
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_packed_weights_give_the_same_logits_and_beam_search(monkeypatch, dtype):
    """`pack_weights` changes how the products run, not what they compute: the teacher-forced
    logits and cached decoding agree with the F.linear path (fp32 to rounding; bf16 within
    bf16 rounding), and beam search finds the same hypotheses (fp32)."""
    from transduce.decode import beam_search

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
    assert isinstance(model.output_proj, PackedLinear) and isinstance(model.decoder.layers[0].self_attn.in_proj, PackedLinear)
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
    from transduce.kernels import PackedFeedForward
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
        torch.testing.assert_close(ffn(x), fused, rtol=1e-2 if dtype == torch.bfloat16 else 1e-5, atol=1e-2 if dtype == torch.bfloat16 else 1e-5)


def test_packed_attention_without_biases():
    """3.2.2: the projections are matrices alone; packed, they compute the same."""
    mha = MultiHeadAttention(16, 2, 8, 8)
    x = torch.randn(2, 5, 16)
    kernels.pack_weights(mha)
    with torch.no_grad():
        torch.testing.assert_close(mha(x)[0], mha.out_proj(F.scaled_dot_product_attention(*mha.project_qkv(x)).transpose(1, 2).reshape(2, 5, 16)))


def test_apply_and_undo_leave_what_the_caller_set():
    """`apply` sets decode_attention and packs; its undo takes back only what it did."""
    model = Transformer(tiny_config()).eval()
    attns = [m for m in model.modules() if isinstance(m, MultiHeadAttention)]
    undo = kernels.apply(model)
    assert all(m.step_attention is decode_attention for m in attns)
    assert kernels.is_packed(model) == can_pack(torch.float32, "cpu")
    undo()
    assert all(m.step_attention is None for m in attns) and not kernels.is_packed(model)
    kernels.apply(model, pack=False)  # the caller's choice: attention only
    undo = kernels.apply(model)
    undo()
    assert all(m.step_attention is decode_attention for m in attns) and not kernels.is_packed(model)


def test_keep_freed_memory_takes_on_glibc_and_tensors_still_work():
    """The trainer's allocator setting (`kernels.keep_freed_memory`): on glibc it takes; large
    tensors allocated, freed and allocated again afterwards hold what is written to them."""
    import platform

    took = kernels.keep_freed_memory()
    assert isinstance(took, bool)
    if platform.system() == "Linux" and platform.libc_ver()[0] == "glibc":
        assert took
    for _ in range(3):
        x = torch.full((9_000_000,), 2.0)  # 36 MB: mapped afresh by glibc's default
        assert float(x.sum()) == 18_000_000.0
        del x


# -- equation 1 for bf16 training on the CPU -----------------------------------------------------


def test_autocast_attention_is_equation_1_in_fp32():
    """Outside autocast, in fp32: equation 1, with SDPA's mask convention (True = may attend)."""
    torch.manual_seed(0)
    q, k, v = torch.randn(3, 4, 7, 8), torch.randn(3, 4, 7, 8), torch.randn(3, 4, 7, 6)
    mask = causal_mask(7, 7) & make_masks(padded_batch([7, 5, 6]), None, PAD)[0]
    for m in (None, mask):
        torch.testing.assert_close(kernels.autocast_attention(q, k, v, m), attention_reference(q, k, v, m)[0],
                                   rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(kernels.autocast_attention(q, k, v, m),
                                   F.scaled_dot_product_attention(q, k, v, attn_mask=m), rtol=1e-5, atol=1e-6)


def test_fast_attention_trains_like_the_math_kernel_under_bf16_autocast():
    """A bf16 training step through `autocast_attention`: the loss and every gradient as with
    PyTorch's math kernel (fp32 throughout) up to bf16 rounding; decoding steps keep theirs."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    torch.manual_seed(0)
    config = tiny_config(dropout=0.0)
    ref, fast = Transformer(config), Transformer(config)
    fast.load_state_dict(ref.state_dict())
    assert kernels.fast_attention(fast) == sum(isinstance(m, MultiHeadAttention) for m in fast.modules()) > 0
    assert all(m.step_attention is None for m in fast.modules() if isinstance(m, MultiHeadAttention))
    src, tgt = padded_batch([7, 5, 6]), padded_batch([6, 7, 4])
    losses = []
    for model in (ref, fast):
        with torch.autocast("cpu", dtype=torch.bfloat16), sdpa_kernel([SDPBackend.MATH]):
            logits = model(src, tgt)
        loss = F.cross_entropy(logits.float().flatten(0, 1), tgt.flatten(), ignore_index=PAD)
        loss.backward()
        losses.append(loss)
    torch.testing.assert_close(losses[1], losses[0], rtol=1e-2, atol=1e-2)
    for (name, a), b in zip(ref.named_parameters(), fast.parameters()):
        torch.testing.assert_close(b.grad, a.grad, rtol=0.05, atol=0.02 * a.grad.abs().max().item(), msg=name)


def test_the_cpu_trainer_sets_fast_attention_for_bf16_only(tmp_path):
    from transduce.config import Config, ModelConfig, TrainConfig
    from transduce.train.trainer import TrainOptions, train
    from train_data import VOCAB, make_data

    data = make_data(tmp_path / "data")
    config = Config(model=ModelConfig(src_vocab_size=VOCAB, n_layers=1, d_model=16, d_ff=32, n_heads=2),
                    train=TrainConfig(warmup_steps=2, max_steps=2))
    for precision, expected in (("bf16", kernels.autocast_attention), ("fp32", None)):
        opts = TrainOptions(max_tokens=48, threads=1, progress=False, tensorboard=False, save_every_minutes=0,
                            keep_last=0, precision=precision)
        model = train(config, data, tmp_path / precision, opts).model
        assert all(m.sequence_attention is expected for m in model.modules() if isinstance(m, MultiHeadAttention))
