"""benchmarks/table1.py (Table 1, measured): the banded restricted attention is the model's masked
one, the FLOP formulas it registers agree with PyTorch's own counts of the same work, and a quick
run gives Table 1's shape: exponents of n (attention's equation 1 quadratic, the others linear),
sequential operations (constant, the LSTM's growing with n) and path lengths (1, n/r, n, k^L)."""

import importlib
import json
import math

import pytest
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from transduce.model import MultiHeadAttention
from transduce.restricted import window_mask


@pytest.fixture(scope="module")
def table1():
    return importlib.import_module("benchmarks.table1")


@pytest.mark.parametrize("n,r", [(50, 4), (64, 16), (10, 16), (33, 1)])
def test_banded_attention_is_the_masked_one(table1, n, r):
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 3, n, 8, dtype=torch.float64) for _ in range(3))
    masked = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=window_mask(n, window=r))
    torch.testing.assert_close(table1.banded_attention(q, k, v, r), masked)


def test_registered_flop_formulas_match_pytorchs_counts(table1):
    """The CPU flash-attention kernel against the math backend's products (its backward computes
    Q K^T once more: torch's formula for flash attention counts it); oneDNN's LSTM layer
    against torch's step-by-step LSTM (oneDNN off), forward and backward."""
    torch.manual_seed(0)
    x = torch.randn(2, 24, 32, requires_grad=True)
    attn = MultiHeadAttention(32, 4, 8, 8)
    lstm = torch.nn.LSTM(32, 16, batch_first=True)

    def counts(f, **flags):
        with FlopCounterMode(display=False, custom_mapping=table1.FLOP_FORMULAS) as fwd:
            y = f()
        with FlopCounterMode(display=False, custom_mapping=table1.FLOP_FORMULAS) as bwd:
            y.sum().backward()
        return fwd.get_total_flops(), bwd.get_total_flops()

    flash = counts(lambda: attn(x)[0])
    with sdpa_kernel([SDPBackend.MATH]):
        math_ = counts(lambda: attn(x)[0])
    qk = 2 * 2 * 4 * 24 * 24 * 8  # one n x n x d_k product of every head
    assert flash[0] == math_[0] == 2 * 2 * 24 * 32 * 32 * 4 + 2 * qk
    assert flash[1] == math_[1] + qk  # the flash kernel's backward computes the scores again
    onednn = counts(lambda: lstm(x)[0])
    with torch.backends.mkldnn.flags(enabled=False):
        stepwise = counts(lambda: lstm(x)[0])
    assert onednn[0] == stepwise[0] == 2 * 2 * 24 * 64 * (32 + 16)
    assert onednn[1] == 2 * onednn[0] and abs(stepwise[1] - onednn[1]) <= 0.05 * onednn[1]


def test_quick_run_has_table1s_shape(table1, tmp_path, capsys):
    out = tmp_path / "t1"
    assert (
        table1.main(["--out", str(out), "--quick", "--d", "64", "--threads", "1", "--path-n", "64", "--max-n", "512"])
        == 0
    )
    printed = capsys.readouterr().out
    assert printed.startswith("CPU: ") and "threads 1" in printed.splitlines()[0]
    result = json.loads((out / "table1.json").read_text())
    assert (out / "table1.png").read_bytes()[:4] == b"\x89PNG" and "| self-attention | O(n²·d) |" in (
        out / "table1.md"
    ).read_text()
    fits = result["summary"]["fits"]
    assert abs(fits["self-attention"]["attention_flops_exponent"] - 2) < 0.02  # equation 1: n² d
    assert abs(fits["restricted (masked)"]["attention_flops_exponent"] - 2) < 0.02  # masked: still n² d
    assert abs(fits["restricted (banded)"]["attention_flops_exponent"] - 1) < 0.02  # r n d
    assert fits["self-attention"]["flops_exponent"] > 1.5  # with the projections' n d², still above 1
    for kind in ("restricted (banded)", "recurrent", "convolution", "separable"):
        assert abs(fits[kind]["flops_exponent"] - 1) < 0.02, kind
    for kind, pts in result["points"].items():
        assert [p["n"] for p in pts] == [64, 128, 256, 512] and all(p["memory"] > 0 for p in pts), kind

    seq = result["sequential"]  # dependent products at n = 16 and 32
    for kind in ("self-attention", "restricted (masked)", "restricted (banded)", "convolution", "separable"):
        assert seq[kind][0] == seq[kind][1] <= 4, kind
    assert seq["recurrent"] == [16, 32]

    path, n, r = result["path"], 64, 8
    assert path["self-attention"]["forward"]["layers"] == path["self-attention"]["backward"]["layers"] == 1
    assert path["restricted (masked)"]["forward"]["layers"] == math.ceil((n - 1) / r)
    assert path["recurrent"]["forward"] == {"layers": 1, "products_on_path": n}  # one layer, n steps
    assert path["recurrent"]["backward"]["layers"] is None  # causal: output 1 never sees input n
    assert path["convolution"]["forward"]["layers"] == path["separable"]["backward"]["layers"] == n - 1
    assert path["dilated convolution"]["forward"]["layers"] == math.ceil(math.log(n, 3))
