"""The FLOPs formula (transduce.flops, which benchmarks/bench.py and transduce experiment use), checked
against PyTorch's own count."""

import importlib

import pytest
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from transduce import flops
from transduce.config import ModelConfig
from transduce.model import Transformer


@pytest.fixture(scope="module")
def bench():
    return importlib.import_module("benchmarks.bench")


@pytest.mark.parametrize("d_k,d_v", [(8, 8), (4, 12)])
def test_forward_flops_match_torch_flop_counter(bench, d_k, d_v):
    """Every matrix product of a forward pass, attention included, as torch's FlopCounterMode
    counts them (2*m*n*k per product), for unequal source and target lengths and d_k != d_v."""
    c = ModelConfig(src_vocab_size=40, n_layers=2, d_model=16, d_ff=24, n_heads=2, d_k=d_k, d_v=d_v, dropout=0.0)
    model = Transformer(c).eval()
    B, S, T = 3, 7, 5
    src, tgt = torch.randint(4, 40, (B, S)), torch.randint(4, 40, (B, T))
    # the math kernel: FlopCounterMode does not count the CPU flash-attention kernel
    with torch.no_grad(), sdpa_kernel([SDPBackend.MATH]), FlopCounterMode(display=False) as counter:
        model(src, tgt)
    dm = dict(d=16, f=24, h=2, N=2, a=2 * d_k, c=2 * d_v, V=40)
    assert bench.forward_flops(dm, B, S, T) == counter.get_total_flops()
    assert flops.dims(c) == dm  # the sizes read from the config
    assert bench.forward_flops is flops.forward_flops  # one formula: the bench imports the library's
