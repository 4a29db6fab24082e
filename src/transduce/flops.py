"""Model FLOPs, counted from shapes (Table 2's "Training Cost (FLOPs)"), and the peak they are
compared with (model-FLOPs utilisation, MFU).

Table 2 estimated its cost from training time, GPUs and their sustained capacity; here it is
counted from the padded batch shapes the run trained on: every matrix product counts 2*m*n*k; a
training step is 3x the forward pass (backward = 2x forward). Forward, with source length S,
target length T, batch B, d = d_model, f = d_ff, a = h*d_k, c = h*d_v, N layers, target vocabulary V:

    encoder  B*S*N*2*(d*(2a + c) + c*d + 2*d*f) + B*N*2*(S*S*a + S*S*c)
    decoder  B*T*N*2*(d*(2a + c) + c*d + d*a + c*d + 2*d*f) + B*S*N*2*d*(a + c)
             + B*N*2*(T*T*a + T*T*c + T*S*a + T*S*c)
    output   B*T*2*d*V

(attention counted in full, causal masking not discounted; checked against PyTorch's
`FlopCounterMode` in tests/test_bench.py). One formula for the benchmark (benchmarks/bench.py)
and for the experiments (`transduce.experiment`).
"""

from __future__ import annotations

import time

import torch

from .config import ModelConfig


def dims(config: ModelConfig) -> dict:
    """The sizes `forward_flops` reads, from a model config: d, f, h, N, a = h*d_k, c = h*d_v, V."""
    return dict(
        d=config.d_model,
        f=config.d_ff,
        h=config.n_heads,
        N=config.n_layers,
        a=config.n_heads * config.head_dim_k,
        c=config.n_heads * config.head_dim_v,
        V=config.target_vocab_size,
    )


def forward_flops(dm: dict, B: int, S: int, T: int) -> int:
    """Model FLOPs of one forward pass on a padded (B, S) source and (B, T) target (see the
    module docstring); `dm` as `dims` makes it."""
    d, f, a, c, N, V = dm["d"], dm["f"], dm["a"], dm["c"], dm["N"], dm["V"]
    enc = B * S * N * 2 * (d * (2 * a + c) + c * d + 2 * d * f) + B * N * 2 * (S * S * a + S * S * c)
    dec = (
        B * T * N * 2 * (d * (2 * a + c) + c * d + d * a + c * d + 2 * d * f)
        + B * S * N * 2 * d * (a + c)
        + B * N * 2 * (T * T * a + T * T * c + T * S * a + T * S * c)
    )
    return enc + dec + B * T * 2 * d * V


def training_flops(dm: dict, B: int, S: int, T: int) -> int:
    """Model FLOPs of one training micro-batch: forward and backward, 3x the forward pass."""
    return 3 * forward_flops(dm, B, S, T)


def matmul_peak(dtype: torch.dtype, n: int = 2048, repeats: int = 5, device: str | torch.device = "cpu") -> float:
    """Best FLOP/s of an n^3 matrix product in `dtype` on `device`, measured: `torch.mm`, and on the
    CPU also the pre-packed oneDNN product (`transduce.torch_ops.linear`), faster on some CPUs: the
    peak must be the best the machine does, or MFU overstates."""
    from . import torch_ops
    from .fast.decode import can_pack

    device = torch.device(device)
    a, b = torch.randn(n, n, device=device).to(dtype), torch.randn(n, n, device=device).to(dtype)
    products = [lambda: torch.mm(a, b)]
    if device.type == "cpu" and can_pack(dtype, "cpu"):
        packed = torch_ops.pack(b.t())
        products.append(lambda: torch_ops.linear(a, packed, None))
    sync = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)
    best = 0.0
    with torch.inference_mode():
        for product in products:
            product()
            for _ in range(repeats):
                sync()
                t0 = time.perf_counter()
                product()
                sync()
                best = max(best, 2 * n**3 / (time.perf_counter() - t0))
    return best
