"""The training speed-ups: `transduce.fast.train`'s dropout, and equation 1 with fp32 scores under CPU bf16 autocast
(`attention.sequence_attention`'s choice), the same math, faster."""

import pytest
import torch
import torch.nn.functional as F

from transduce import attention
from transduce.fast import train as kernels
from transduce.fast.train import BitDropout
from transduce.masks import causal_mask, make_masks
from transduce.model import Transformer, attention_reference

from test_model import PAD, padded_batch, tiny_config


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


def test_autocast_attention_is_equation_1_in_fp32():
    """Outside autocast, in fp32: equation 1, with SDPA's mask convention (True = may attend)."""
    torch.manual_seed(0)
    q, k, v = torch.randn(3, 4, 7, 8), torch.randn(3, 4, 7, 8), torch.randn(3, 4, 7, 6)
    mask = causal_mask(7, 7) & make_masks(padded_batch([7, 5, 6]), None, PAD)[0]
    for m in (None, mask):
        torch.testing.assert_close(
            attention.autocast_attention(q, k, v, m), attention_reference(q, k, v, m)[0], rtol=1e-5, atol=1e-6
        )
        torch.testing.assert_close(
            attention.autocast_attention(q, k, v, m),
            F.scaled_dot_product_attention(q, k, v, attn_mask=m),
            rtol=1e-5,
            atol=1e-6,
        )


def test_fast_attention_trains_like_the_math_kernel_under_bf16_autocast(monkeypatch):
    """A bf16 training step through `autocast_attention` (what `attention.sequence_attention` picks
    on the CPU under bf16 autocast): the loss and every gradient as with PyTorch's math kernel
    (fp32 throughout) up to bf16 rounding."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    import transduce.model

    torch.manual_seed(0)
    config = tiny_config(dropout=0.0)
    model = Transformer(config)
    src, tgt = padded_batch([7, 5, 6]), padded_batch([6, 7, 4])
    calls = []
    original = attention.autocast_attention
    monkeypatch.setattr(attention, "autocast_attention", lambda *a, **k: calls.append(1) or original(*a, **k))
    losses, grads = [], []
    sdpa = lambda q, k, v, attn_mask=None, dropout_p=0.0: F.scaled_dot_product_attention(  # noqa: E731
        q, k, v, attn_mask=attn_mask, dropout_p=dropout_p
    )
    for form in (sdpa, attention.sequence_attention):
        monkeypatch.setattr(transduce.model, "sequence_attention", form)
        model.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16), sdpa_kernel([SDPBackend.MATH]):
            logits = model(src, tgt)
        loss = F.cross_entropy(logits.float().flatten(0, 1), tgt.flatten(), ignore_index=PAD)
        loss.backward()
        losses.append(loss)
        grads.append([p.grad.clone() for p in model.parameters()])
    assert calls  # the bf16 form ran (and only in the second pass)
    torch.testing.assert_close(losses[1], losses[0], rtol=1e-2, atol=1e-2)
    for (name, _), a, b in zip(model.named_parameters(), *grads):
        torch.testing.assert_close(b, a, rtol=0.05, atol=0.02 * a.abs().max().item(), msg=name)


def test_sequence_attention_picks_the_bf16_form_under_cpu_autocast_only(monkeypatch):
    """Training in bf16 on the CPU attends through `autocast_attention`, in fp32 through SDPA: chosen
    from what is computed, nothing set on the model."""
    calls = []
    original = attention.autocast_attention
    monkeypatch.setattr(attention, "autocast_attention", lambda *a, **k: calls.append(1) or original(*a, **k))
    q = k = v = torch.randn(2, 2, 5, 4)
    attention.sequence_attention(q, k, v)
    assert calls == []
    with torch.autocast("cpu", dtype=torch.bfloat16):
        attention.sequence_attention(q, k, v)
    assert calls == [1]
