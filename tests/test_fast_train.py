"""The training speed-ups of `transduce.fast.train`: the same dropout and equation 1, faster."""

import pytest
import torch
import torch.nn.functional as F

from transduce.fast import train as kernels
from transduce.fast.train import BitDropout
from transduce.model import MultiHeadAttention, Transformer, attention_reference, causal_mask, make_masks

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
                    train=TrainConfig(warmup_steps=2, max_steps=2, checkpoint_minutes=0))
    for precision, expected in (("bf16", kernels.autocast_attention), ("fp32", None)):
        opts = TrainOptions(max_tokens=48, threads=1, progress=False, tensorboard=False,
                            keep_last=0, precision=precision)
        model = train(config, data, tmp_path / precision, opts).model
        assert all(m.sequence_attention is expected for m in model.modules() if isinstance(m, MultiHeadAttention))
