"""`transduce.attention`: every form of equation 1 computes what `attention_reference`, the form
the paper writes, computes: PyTorch's SDPA, the decoding forms (`decode_attention`,
`product_attention`, with the scores either way round), the training form with fp32 scores
(`autocast_attention`); and the beams folded into one row's queries come back in their rows."""

import pytest
import torch
import torch.nn.functional as F

from transduce.attention import (
    attention_reference,
    autocast_attention,
    concat_heads,
    decode_attention,
    fold_beams,
    product_attention,
)
from transduce.masks import causal_mask, padding_mask
from transduce.model import MultiHeadAttention


def _qkv(B=3, h=4, Tq=5, Tk=7, dk=8, dv=6, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (
        torch.randn(B, h, Tq, dk, generator=g),
        torch.randn(B, h, Tk, dk, generator=g),
        torch.randn(B, h, Tk, dv, generator=g),
    )


def _mask(B, Tq, Tk):
    tokens = torch.ones(B, Tk, dtype=torch.long)
    tokens[0, Tk - 2 :] = 0  # padding in the first row
    return causal_mask(Tq, Tk) & padding_mask(tokens, 0)


@pytest.mark.parametrize("masked", [False, True])
@pytest.mark.parametrize("form", ["sdpa", "decode", "product", "product-keys-first", "autocast"])
def test_every_form_is_equation_1(form, masked):
    q, k, v = _qkv()
    mask = _mask(3, 5, 7) if masked else None
    want = attention_reference(q, k, v, mask)[0]
    got = {
        "sdpa": lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=mask),
        "decode": lambda: decode_attention(q, k, v, mask),
        "product": lambda: product_attention(q, k, v, mask),
        "product-keys-first": lambda: product_attention(q, k, v, mask, keys_first=True),
        "autocast": lambda: autocast_attention(q, k, v, mask),
    }[form]()
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("keys_first", [False, True])
def test_one_bf16_query_either_way_round_is_equation_1(keys_first):
    """One bf16 query: K q^T (where oneDNN runs AMX) or q K^T, both equation 1 to bf16's precision."""
    q, k, v = _qkv(Tq=1)
    got = product_attention(q.bfloat16(), k.bfloat16(), v.bfloat16(), keys_first=keys_first).float()
    torch.testing.assert_close(got, attention_reference(q, k, v)[0], rtol=0.05, atol=0.03)


def test_autocast_form_under_bf16_autocast_is_equation_1_to_bf16s_precision():
    q, k, v = _qkv()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = autocast_attention(q.bfloat16(), k.bfloat16(), v.bfloat16(), _mask(3, 5, 7)).float()
    torch.testing.assert_close(got, attention_reference(q, k, v, _mask(3, 5, 7))[0], rtol=0.05, atol=0.03)


@pytest.mark.parametrize("group", [1, 4])
def test_folded_beams_attend_as_copied_keys_would(group):
    """A sentence's `group` beams folded into one row's queries: each beam's output, weights and
    concatenated heads are those of its own row of (copied) keys."""
    q, _, _ = _qkv(B=2 * group, Tq=1, seed=1)
    _, k, v = _qkv(B=2, Tq=1, seed=2)
    out, weights = attention_reference(fold_beams(q, group), k, v)
    copied = k.repeat_interleave(group, 0), v.repeat_interleave(group, 0)
    want_out, want_weights = attention_reference(q, *copied)
    # the model's attention, the path that returns the weights: each beam's own, in its own row
    mha = MultiHeadAttention(16, 4, 8, 6).eval()
    got_out, got_weights = mha.attend(q, k, v, None, need_weights=True)
    torch.testing.assert_close(got_weights, want_weights, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(got_out, mha.attend(q, *copied, None, need_weights=True)[0], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(
        concat_heads(out, group), want_out.transpose(1, 2).reshape(2 * group, 1, -1), rtol=1e-5, atol=1e-6
    )
