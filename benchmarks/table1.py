"""Table 1 of "Attention Is All You Need" (Section 4, "Why Self-Attention"), measured on this CPU.

    python benchmarks/table1.py --out DIR                 # d = 512, n = 16 ... 4096 (a few minutes)
    python benchmarks/table1.py --out DIR --max-n 1024    # a shorter range
    python benchmarks/table1.py --out DIR --quick         # n = 64 ... 1024, one repeat: seconds

Table 1 compares layer types by complexity per layer, sequential operations and maximum path
length. Each layer type here maps a sequence of n vectors of width d to n vectors of width d, batch
1, fp32, on the CPU, with torch's threads as `--threads` says:

    self-attention            transduce.model.MultiHeadAttention, h = 8, d_k = d_v = d/h (SDPA)
    restricted (masked)       the same with ModelConfig.attention_window's mask (|i - j| <= r): the
                              model's implementation, n x n scores of which all but 2r+1 per row masked
    restricted (banded)       the same projections, equation 1 over the keys within r only, in
                              blocks of r queries against their 3r neighbouring keys: O(r n d)
    recurrent                 nn.LSTM(d, d), one layer (oneDNN's kernel)
    convolution               nn.Conv1d(d, d, k = 3), padding 1
    separable                 depthwise nn.Conv1d(d, d, 3, groups=d) then pointwise nn.Conv1d(d, d, 1)

What is measured, per layer type and n (d = 512, r = 64, k = 3 unless the options say otherwise):

* FLOPs, forward and backward, counted by torch.utils.flop_counter.FlopCounterMode (2 m n k per
  product). It has no formula for two kernels these layers use, so they are registered here:
  the CPU flash-attention kernel (`_scaled_dot_product_flash_attention_for_cpu` and its backward:
  torch's own SDPA formulas; the kernel computes every masked score too) and oneDNN's LSTM layer
  (`mkldnn_rnn_layer`: 2 T B 4h (d + h) forward, twice that backward; checked against the count of
  torch's step-by-step LSTM by tests/test_table1_bench.py). Element-wise work is not counted.
* wall time, forward and backward (the backward of a random gradient of the output), each the
  fastest of several repeats after a warm-up (fewer repeats where a point takes long; the
  medians are in the JSON): the fastest, because other work on the machine only adds time.
* peak memory: the process's peak resident set (VmHWM, /proc/self/status) above its resident
  set before the forward, the peak reset before each point (/proc/self/clear_refs, "5"), with
  glibc's mmap threshold fixed at 64 KiB so that tensor memory goes back to the system when
  freed, and glibc's free heap memory given back first (malloc_trim). A separate pass after the
  timings (mapping every allocation afresh would slow them). Weights and the input are excluded.
  tracemalloc does not see torch's allocations, and torch keeps no CPU allocator statistics.
* the exponent of n: least squares of log(value) on log(n) over the larger half of the n's.
* sequential operations: the longest chain of matrix products (mm, bmm, addmm, convolution,
  attention kernels) each of which needs the result of the one before, traced op by op in a
  forward pass at two lengths (the LSTM through torch's step-by-step kernel, which shows its steps).
* maximum path length: L layers of a type stacked (d = 16, no residual), fp64, at n = --path-n:
  the fewest L for which the gradient of output position n with respect to input position 1 is
  non-zero (and of output 1 with respect to input n, for the layers that are not causal), with
  the traced chain of dependent products from input to output of that stack. A convolution of
  width k = 3 without dilation reaches one more position per layer: n - 1 layers; the paper's
  O(log_k(n)) is for dilated convolutions, measured too: causal, dilation k^l in layer l (ByteNet,
  WaveNet). (A symmetric one with dilation k^l cannot reach across: its path would leave the
  sequence; the paper's bound is the causal construction.)

A layer type stops at the first n whose forward + backward takes more than --time-limit seconds
or --memory-limit GiB (or is predicted to, from the point before): the output says so.
Writes DIR/table1.json (every point), DIR/table1.md (the tables) and DIR/table1.png (log-log time
and FLOPs against n).
"""

from __future__ import annotations

import argparse
import ctypes
import datetime
import gc
import json
import math
import platform
import statistics
import subprocess
import sys
import time
import warnings
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import FlopCounterMode, sdpa_backward_flop_count, sdpa_flop_count

from transduce.model import MultiHeadAttention
from transduce.restricted import window_mask

KINDS = ["self-attention", "restricted (masked)", "restricted (banded)", "recurrent", "convolution", "separable"]
PAPER = {  # Table 1: complexity per layer, sequential operations, maximum path length
    "self-attention": ("O(n²·d)", "O(1)", "O(1)"),
    "restricted (masked)": ("O(r·n·d)", "O(1)", "O(n/r)"),
    "restricted (banded)": ("O(r·n·d)", "O(1)", "O(n/r)"),
    "recurrent": ("O(n·d²)", "O(n)", "O(n)"),
    "convolution": ("O(k·n·d²)", "O(1)", "O(log_k(n))"),
    "separable": ("O(k·n·d + n·d²)", "O(1)", "O(log_k(n))"),
}


# -- the layers ---------------------------------------------------------------------------------


def banded_attention(q: Tensor, k: Tensor, v: Tensor, r: int) -> Tensor:
    """Equation 1 with each query i attending the keys j with |i - j| <= r only, in O(r n d): the
    queries in blocks of r, each block against the 3r keys around it (the block before, its own,
    the one after; those outside the window masked). q, k, v (B, h, n, d) -> (B, h, n, d_v)."""
    B, h, n, d = q.shape
    nb = -(-n // r)  # blocks of r queries
    pad = nb * r - n
    qb = F.pad(q, (0, 0, 0, pad)).view(B, h, nb, r, d)
    kw = F.pad(k, (0, 0, r, r + pad)).unfold(2, 3 * r, r)  # (B, h, nb, d, 3r): keys (b-1)r .. (b+2)r-1
    vw = F.pad(v, (0, 0, r, r + pad)).unfold(2, 3 * r, r)
    scores = qb @ kw / math.sqrt(d)  # (B, h, nb, r, 3r)
    qi = torch.arange(nb * r, device=q.device).view(nb, r, 1)  # query position
    kj = (torch.arange(nb, device=q.device) * r - r).view(nb, 1, 1) + torch.arange(3 * r, device=q.device)  # key position
    allowed = ((qi - kj).abs() <= r) & (kj >= 0) & (kj < n)
    weights = scores.masked_fill(~allowed, float("-inf")).softmax(-1)
    return (weights @ vw.transpose(-1, -2)).view(B, h, nb * r, -1)[:, :, :n]


class SelfAttention(nn.Module):
    """transduce's MultiHeadAttention as a self-attention layer: full (window None), restricted by
    the model's mask (`window_mask`), or restricted by `banded_attention` (banded=True)."""

    def __init__(self, d: int, heads: int, window: int | None = None, banded: bool = False):
        super().__init__()
        self.attn = MultiHeadAttention(d, heads, d // heads, d // heads)
        self.window, self.banded = window, banded

    def forward(self, x: Tensor) -> Tensor:
        if self.banded:
            q, k, v = self.attn.project_qkv(x)
            out = banded_attention(q, k, v, self.window)
            return self.attn.out_proj(out.transpose(1, 2).reshape(x.shape[0], x.shape[1], -1))
        mask = None if self.window is None else window_mask(x.size(1), window=self.window, device=x.device)
        return self.attn(x, mask=mask)[0]


class Recurrent(nn.Module):
    def __init__(self, d: int):
        super().__init__()
        self.lstm = nn.LSTM(d, d, batch_first=True)

    def forward(self, x: Tensor) -> Tensor:
        return self.lstm(x)[0]


class Convolution(nn.Module):
    """Conv1d over the positions ('same' padding); separable: depthwise k then pointwise 1x1;
    dilated: causal (position i reads i, i - dilation, ..., i - (k-1) dilation: ByteNet's and
    WaveNet's dilated convolutions, whose receptive field grows as k^L with dilation k^l)."""

    def __init__(self, d: int, k: int = 3, separable: bool = False, dilation: int = 1, causal: bool = False):
        super().__init__()
        self.left = dilation * (k - 1) if causal else 0  # causal: all the padding on the left
        pad = 0 if causal else k // 2
        if separable:
            self.conv = nn.Sequential(nn.Conv1d(d, d, k, padding=pad, groups=d), nn.Conv1d(d, d, 1))
        else:
            self.conv = nn.Conv1d(d, d, k, padding=pad, dilation=dilation)

    def forward(self, x: Tensor) -> Tensor:
        x = x.transpose(1, 2)
        return self.conv(F.pad(x, (self.left, 0)) if self.left else x).transpose(1, 2)


def make_layer(kind: str, d: int, heads: int = 8, r: int = 64, k: int = 3, dilation: int = 1) -> nn.Module:
    if kind == "self-attention":
        return SelfAttention(d, heads)
    if kind == "restricted (masked)":
        return SelfAttention(d, heads, window=r)
    if kind == "restricted (banded)":
        return SelfAttention(d, heads, window=r, banded=True)
    if kind == "recurrent":
        return Recurrent(d)
    if kind in ("convolution", "separable", "dilated convolution"):
        return Convolution(d, k, separable=kind == "separable", dilation=dilation, causal=kind == "dilated convolution")
    raise ValueError(f"unknown layer type {kind!r}")


# -- FLOPs ----------------------------------------------------------------------------------------


def _flash_cpu(query, key, value, *args, out_shape=None, **kwargs) -> int:
    return sdpa_flop_count(query, key, value)


def _flash_cpu_backward(grad_out, query, key, value, *args, out_shape=None, **kwargs) -> int:
    return sdpa_backward_flop_count(grad_out, query, key, value)


def _lstm_layer(input, weight0, weight1, *args, out_shape=None, **kwargs) -> int:
    four_h, d_in = weight0
    h = weight1[1]
    tokens = math.prod(input) // input[-1]
    return 2 * tokens * four_h * (d_in + h)


def _lstm_layer_backward(input, weight1, weight2, *args, out_shape=None, **kwargs) -> int:
    return 2 * _lstm_layer(input, weight1, weight2)


FLOP_FORMULAS = {
    torch.ops.aten._scaled_dot_product_flash_attention_for_cpu: _flash_cpu,
    torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward: _flash_cpu_backward,
    torch.ops.aten.mkldnn_rnn_layer: _lstm_layer,
    torch.ops.aten.mkldnn_rnn_layer_backward: _lstm_layer_backward,
}


def count_flops(layer: nn.Module, x: Tensor) -> tuple[int, int]:
    """(forward, backward) FLOPs of one pass, FlopCounterMode with FLOP_FORMULAS."""
    with FlopCounterMode(display=False, custom_mapping=FLOP_FORMULAS) as fwd:
        y = layer(x)
    with FlopCounterMode(display=False, custom_mapping=FLOP_FORMULAS) as bwd:
        y.backward(torch.randn_like(y))
    return fwd.get_total_flops(), bwd.get_total_flops()


# -- time and memory ------------------------------------------------------------------------------


def time_point(layer: nn.Module, x: Tensor, budget_s: float, max_repeats: int) -> tuple[list[float], list[float]]:
    """Forward and backward seconds of each repeat, after one warm-up; repeats until `budget_s`
    is spent (at least 2, at most max_repeats)."""
    g = torch.randn_like(layer(x).detach())
    layer(x).backward(g)  # warm-up
    fwd, bwd, started = [], [], time.perf_counter()
    while len(fwd) < max_repeats and (len(fwd) < 2 or time.perf_counter() - started < budget_s):
        t0 = time.perf_counter()
        y = layer(x)
        t1 = time.perf_counter()
        y.backward(g)
        t2 = time.perf_counter()
        fwd.append(t1 - t0)
        bwd.append(t2 - t1)
        x.grad = None
    return fwd, bwd


def _status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise OSError(f"/proc/self/status has no {field}")


def _libc():
    try:
        return ctypes.CDLL("libc.so.6")
    except OSError:
        return None


def fix_mmap_threshold(nbytes: int = 64 * 1024) -> bool:
    """glibc: allocations of nbytes or more mapped afresh and unmapped when freed (mallopt)."""
    libc = _libc()
    return bool(libc and libc.mallopt(-3, nbytes))  # M_MMAP_THRESHOLD


def release_free_memory() -> None:
    """glibc keeps freed heap memory resident and serves later allocations from it before it maps
    any: give it back (malloc_trim), so that what a point allocates shows in the resident set."""
    gc.collect()
    libc = _libc()
    if libc:
        libc.malloc_trim(0)


def peak_memory(layer: nn.Module, x: Tensor) -> int:
    """Bytes of resident memory one forward + backward adds at its peak (see the module docstring)."""
    g = torch.randn_like(layer(x).detach())
    x.grad = None
    for p in layer.parameters():
        p.grad = None
    release_free_memory()
    base = _status_kib("VmRSS")
    Path("/proc/self/clear_refs").write_text("5")  # reset the peak (VmHWM) to the current RSS
    layer(x).backward(g)
    return max(0, _status_kib("VmHWM") - base) * 1024


# -- sequential operations and path length ------------------------------------------------------------

PRODUCTS = ("mm", "bmm", "addmm", "baddbmm", "convolution", "_scaled_dot_product", "mkldnn_rnn", "linear", "matmul")


class ProductDepth(TorchDispatchMode):
    """Tracks, for every tensor an op makes, the longest chain of matrix products that led to it
    (each needing the result of the one before): an op's outputs get 1 + the deepest input if the
    op is a product, the deepest input otherwise. Inputs start at 0."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        flat = [a for a in (*args, *kwargs.values()) for a in (a if isinstance(a, (list, tuple)) else [a])]
        depth = max((getattr(a, "_depth", 0) for a in flat if isinstance(a, Tensor)), default=0)
        name = func.__name__.split(".")[0]
        depth += any(name.startswith(p) for p in PRODUCTS)
        for o in (out if isinstance(out, (list, tuple)) else [out]):
            if isinstance(o, Tensor):
                o._depth = max(depth, getattr(o, "_depth", 0))  # in place: the deeper of the two
        return out


def product_depth(module: nn.Module, x: Tensor) -> int:
    """The longest chain of dependent products from x to module(x), traced (LSTM: torch's
    step-by-step kernel, oneDNN's off, so that every step is an op)."""
    with warnings.catch_warnings():  # (the flags' setter warns about Intel GPUs' TF32)
        warnings.simplefilter("ignore")
        with torch.no_grad(), torch.backends.mkldnn.flags(enabled=False), ProductDepth():
            y = module(x)
    return getattr(y, "_depth", 0)


def path_layers(kind: str, n: int, d: int, r: int, k: int, max_layers: int, backwards: bool = False) -> dict:
    """Fewest stacked layers for output position n to depend on input position 1 (or 1 on n, with
    `backwards`), by the gradient; with the traced chain of dependent products of that stack."""
    torch.manual_seed(0)
    x = torch.randn(1, n, d, dtype=torch.float64, requires_grad=True)
    layers = [make_layer(kind, d, heads=2, r=r, k=k, dilation=k ** i if kind == "dilated convolution" else 1).double()
              for i in range(max_layers)]

    def reaches(depth: int) -> bool:
        h = x
        for layer in layers[:depth]:
            h = layer(h)
        (grad,) = torch.autograd.grad(h[0, 0 if backwards else n - 1].sum(), x)
        return bool(grad[0, n - 1 if backwards else 0].abs().max() > 0)

    lo, hi = 0, 1  # reaching is monotone in the depth: double, then bisect
    while not reaches(hi):
        if hi == max_layers:
            return {"layers": None, "products_on_path": None}  # not reached (causal, or beyond max_layers)
        lo, hi = hi, min(2 * hi, max_layers)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if reaches(mid) else (mid, hi)
    return {"layers": hi, "products_on_path": product_depth(nn.Sequential(*layers[:hi]), x.detach())}


# -- fits, tables, figure --------------------------------------------------------------------------


def exponent(ns: list[int], values: list[float]) -> float | None:
    """Least-squares slope of log(value) on log(n) over the larger half of the points (at least 3)."""
    pts = [(n, v) for n, v in zip(ns, values) if v and v > 0]
    pts = pts[len(pts) // 2:] if len(pts) >= 6 else pts[-3:]
    if len(pts) < 2:
        return None
    xs, ys = [math.log(n) for n, _ in pts], [math.log(v) for _, v in pts]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    return sum((a - mx) * (b - my) for a, b in zip(xs, ys)) / sum((a - mx) ** 2 for a in xs)


def machine() -> dict:
    name = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                 if line.startswith("model name")), platform.processor() or "unknown CPU")
    caps = torch.cpu.get_capabilities() if hasattr(torch.cpu, "get_capabilities") else {}
    isa = [f for f in ("avx2", "fma3", "avx512_f", "avx512_bw", "avx512_vnni", "avx512_bf16", "avx512_fp16",
                       "amx_tile", "amx_bf16", "amx_int8") if caps.get(f)]
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                cwd=Path(__file__).parent).stdout.strip()
    except OSError:
        commit = ""
    return {"cpu": name, "isa": isa, "torch_capability": torch.backends.cpu.get_cpu_capability(),
            "cores": caps.get("num_physical_cores"), "threads": torch.get_num_threads(), "torch": torch.__version__,
            "commit": commit, "date": datetime.date.today().isoformat(), "command": " ".join(["python", *sys.argv])}


def fmt(v, unit=""):
    if v is None:
        return "–"
    if isinstance(v, float) and unit == "":
        return f"{v:.2f}"
    return f"{v}{unit}"


def summarize(result: dict) -> dict:
    """Per layer type: the fitted exponents, and the crossover lengths (attention vs the rest)."""
    out = {}
    for kind, pts in result["points"].items():
        ns = [p["n"] for p in pts]
        out[kind] = {
            "flops_exponent": exponent(ns, [p["flops_fwd"] for p in pts]),
            "time_exponent": exponent(ns, [p["time_fwd"] + p["time_bwd"] for p in pts]),
            "time_fwd_exponent": exponent(ns, [p["time_fwd"] for p in pts]),
            "memory_exponent": exponent(ns, [p.get("memory") for p in pts]),
        }
        if kind.startswith("self") or kind.startswith("restricted"):
            out[kind]["attention_flops_exponent"] = exponent(ns, [p["flops_attention_fwd"] for p in pts])
    cross = {}
    att = {p["n"]: p["time_fwd"] + p["time_bwd"] for p in result["points"].get("self-attention", [])}
    for other in ("recurrent", "convolution", "separable", "restricted (banded)"):
        o = {p["n"]: p["time_fwd"] + p["time_bwd"] for p in result["points"].get(other, [])}
        both = sorted(set(att) & set(o))
        first = None  # the smallest n from which attention is slower at every larger n measured
        for n in reversed(both):
            if att[n] <= o[n]:
                break
            first = n
        cross[other] = first
    return {"fits": out, "attention_slower_from_n": cross}


def markdown(result: dict) -> str:
    m, s = result["machine"], result["summary"]
    lines = [f"CPU: {m['cpu']} ({m['cores']} cores; ISA: {', '.join(m['isa'])}; torch {m['torch']}, "
             f"capability {m['torch_capability']}, {m['threads']} threads), {m['date']}, commit {m['commit']}.",
             f"Command: `{m['command']}`. d = {result['d']}, r = {result['r']}, k = {result['k']}, batch 1, fp32.", "",
             "| layer type | Table 1: complexity | FLOPs exponent (fwd; eq. 1 alone) | time exponent (fwd+bwd; fwd) | "
             f"FLOPs fwd at n = {result['largest']} | time fwd+bwd | peak memory | Table 1: sequential ops | "
             "traced dependent products (n₁ → n₂) | Table 1: max path | layers needed (n→1; 1→n) | products on the path |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    seq, path = result["sequential"], result["path"]
    for kind in result["points"]:
        f, pts = s["fits"][kind], result["points"][kind]
        last = pts[-1]
        att = f.get("attention_flops_exponent")
        pl = path.get(kind.replace(" (banded)", " (masked)"), {})
        lines.append(
            f"| {kind} | {PAPER[kind][0]} | {fmt(f['flops_exponent'])}{'; ' + fmt(att) if att is not None else ''} | "
            f"{fmt(f['time_exponent'])}; {fmt(f['time_fwd_exponent'])} | {last['flops_fwd'] / 1e9:.2f} G (n = {last['n']}) | "
            f"{(last['time_fwd'] + last['time_bwd']) * 1e3:.1f} ms | "
            f"{fmt(None if last.get('memory') is None else round(last['memory'] / 2**20, 1), ' MiB')} | {PAPER[kind][1]} | "
            f"{seq[kind][0]} → {seq[kind][1]} | {PAPER[kind][2]} | {fmt(pl.get('forward', {}).get('layers'))}; "
            f"{fmt(pl.get('backward', {}).get('layers'))} | {fmt(pl.get('forward', {}).get('products_on_path'))} |")
    for kind in ("dilated convolution",):
        pl = path.get(kind, {})
        lines.append(f"| {kind} (path only) | O(k·n·d²) | | | | | | O(1) | | O(log_k(n)) | "
                     f"{fmt(pl.get('forward', {}).get('layers'))}; {fmt(pl.get('backward', {}).get('layers'))} | "
                     f"{fmt(pl.get('forward', {}).get('products_on_path'))} |")
    lines += ["", f"Sequential products traced at n₁ = {result['seq_n'][0]} and n₂ = {result['seq_n'][1]} (d = 16); "
              f"path lengths at n = {result['path_n']} (d = 16, r = {result['path_r']} for the restricted layers, "
              f"k = {result['k']}, the dilated one causal with dilation k^l in layer l), '–': never (a causal layer) or not measured.", ""]
    ns = sorted({p["n"] for pts in result["points"].values() for p in pts})
    lines += ["Forward + backward time (ms) by n:", "", "| layer type | " + " | ".join(map(str, ns)) + " |",
              "|---|" + "---|" * len(ns)]
    for kind, pts in result["points"].items():
        by = {p["n"]: (p["time_fwd"] + p["time_bwd"]) * 1e3 for p in pts}
        lines.append(f"| {kind} | " + " | ".join(f"{by[n]:.2f}" if n in by else "–" for n in ns) + " |")
    lines += ["", "The smallest n from which self-attention (forward + backward) is slower than each other layer type "
              "at every larger n measured: " + "; ".join(f"{k} from n = {fmt(v)}" for k, v in s["attention_slower_from_n"].items())
              + " ('–': not even at the largest n measured for both)."]
    if result["stopped"]:
        lines += ["", "Stopped: " + "; ".join(f"{k} after n = {v['n']} ({v['why']})" for k, v in result["stopped"].items())]
    return "\n".join(lines) + "\n"


def figure(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4.5))
    for kind, pts in result["points"].items():
        ns = [p["n"] for p in pts]
        axes[0].loglog(ns, [(p["time_fwd"] + p["time_bwd"]) * 1e3 for p in pts], "o-", label=kind, markersize=3)
        axes[1].loglog(ns, [p["flops_fwd"] for p in pts], "o-", label=kind, markersize=3)
    axes[0].set(xlabel="n (positions)", ylabel="forward + backward time (ms)", title="time per layer")
    axes[1].set(xlabel="n (positions)", ylabel="forward FLOPs (counted)", title="FLOPs per layer")
    for ax in axes:
        ax.grid(True, which="both", alpha=0.3)
    axes[0].legend(fontsize=8)
    m = result["machine"]
    fig.suptitle(f"Table 1 measured: d = {result['d']}, r = {result['r']}, k = {result['k']}, fp32, "
                 f"{m['cpu']}, {m['threads']} threads", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


# -- the run ------------------------------------------------------------------------------------------


def run(args) -> dict:
    from tqdm import tqdm

    torch.set_num_threads(args.threads)
    ns = [n for n in (64, 128, 256, 512, 1024) if n <= args.max_n] if args.quick else \
        [2**i for i in range(4, 20) if 2**i <= args.max_n]
    kinds = args.kinds or KINDS
    result = {"d": args.d, "r": args.r, "k": args.k, "ns": ns, "points": {}, "stopped": {}, "machine": machine()}
    m = result["machine"]
    print(f"CPU: {m['cpu']} | ISA: {', '.join(m['isa'])} (torch: {m['torch_capability']}) | torch {m['torch']} | "
          f"threads {m['threads']}", flush=True)
    bar = tqdm(total=len(kinds) * len(ns), desc="Table 1", unit="point", file=sys.stderr)
    for kind in kinds:
        torch.manual_seed(0)
        layer = make_layer(kind, args.d, r=args.r, k=args.k)
        pts, predicted = [], 0.0
        for n in ns:
            if predicted > args.time_limit:
                result["stopped"][kind] = {"n": pts[-1]["n"], "why": f"n = {n} predicted {predicted:.0f} s > {args.time_limit} s"}
                bar.update(len(ns) - ns.index(n))
                break
            bar.set_postfix_str(f"{kind}, n = {n}")
            x = torch.randn(1, n, args.d, requires_grad=True)
            flops_fwd, flops_bwd = count_flops(layer, x)
            q, k, v = (t.detach() for t in layer.attn.project_qkv(x)) if hasattr(layer, "attn") else (None,) * 3
            with FlopCounterMode(display=False, custom_mapping=FLOP_FORMULAS) as att:  # equation 1 alone
                if kind.startswith("self") or kind.startswith("restricted"):
                    with torch.no_grad():
                        banded_attention(q, k, v, args.r) if layer.banded else \
                            F.scaled_dot_product_attention(q, k, v, attn_mask=None if layer.window is None else
                                                           window_mask(n, window=layer.window))
            x.grad = None
            fwd, bwd = time_point(layer, x, args.budget, args.repeats)
            t_fwd, t_bwd = min(fwd), min(bwd)  # the fastest repeat: the usual defence against interference
            pts.append({"n": n, "flops_fwd": flops_fwd, "flops_bwd": flops_bwd, "flops_attention_fwd": att.get_total_flops(),
                        "time_fwd": t_fwd, "time_bwd": t_bwd, "median_fwd": statistics.median(fwd),
                        "median_bwd": statistics.median(bwd), "repeats": len(fwd)})
            bar.update()
            total = t_fwd + t_bwd
            predicted = total * 4.0  # the next n is twice this one: at most quadratic
            if total > args.time_limit:
                result["stopped"][kind] = {"n": n, "why": f"{total:.1f} s > {args.time_limit} s"}
                bar.update(len(ns) - ns.index(n) - 1)
                break
        result["points"][kind] = pts
    bar.close()

    if not args.no_memory:  # a pass of its own: mapping every allocation afresh slows the timings
        fixed = fix_mmap_threshold()
        result["memory_method"] = ("peak RSS (VmHWM after /proc/self/clear_refs) above the RSS before the pass, "
                                   + ("glibc mmap threshold fixed at 64 KiB" if fixed else "glibc's default allocator"))
        for kind in tqdm(list(result["points"]), desc="memory", unit="type", file=sys.stderr):
            torch.manual_seed(0)
            layer = make_layer(kind, args.d, r=args.r, k=args.k)
            for p in result["points"][kind]:
                p["memory"] = peak_memory(layer, torch.randn(1, p["n"], args.d, requires_grad=True))
                if p["memory"] > args.memory_limit * 2**30:
                    result["stopped"][kind] = {"n": p["n"], "why": f"{p['memory'] / 2**30:.1f} GiB > {args.memory_limit} GiB"}
                    result["points"][kind] = [q for q in result["points"][kind] if q["n"] <= p["n"]]
                    break

    result["seq_n"] = (16, 32)
    result["sequential"] = {kind: [product_depth(make_layer(kind, 16, heads=2, r=4, k=args.k), torch.randn(1, n, 16))
                                   for n in result["seq_n"]] for kind in KINDS}
    result["path_n"], result["path_r"] = args.path_n, args.path_r
    result["path"] = {}
    dilated_max = math.ceil(math.log(args.path_n, args.k)) + 2 if args.k > 1 else 1  # dilations grow as k^l
    for kind in tqdm(["self-attention", "restricted (masked)", "recurrent", "convolution", "separable",
                      "dilated convolution"], desc="path length", unit="type", file=sys.stderr):
        causal = kind in ("recurrent", "dilated convolution")
        most = dilated_max if kind == "dilated convolution" else args.path_n
        result["path"][kind] = {
            "forward": path_layers(kind, args.path_n, 16, args.path_r, args.k, most),
            "backward": path_layers(kind, args.path_n, 16, args.path_r, args.k, 1 if causal else most, backwards=True)}
    result["summary"] = summarize(result)
    result["largest"] = max(p["n"] for pts in result["points"].values() for p in pts)
    return result


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] + " Per layer type (self-attention, restricted "
                                "self-attention masked and banded, LSTM, convolution, separable convolution): counted "
                                "FLOPs, time, peak memory and their exponents in n, sequential operations and the "
                                "maximum path length. See the module docstring for how each is measured.",
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True, help="directory for table1.json, table1.md, table1.png")
    p.add_argument("--max-n", type=int, default=4096, help="largest sequence length (default 4096; n = 16, 32, ...)")
    p.add_argument("--quick", action="store_true", help="n = 64 ... 1024 at most, one timed repeat: seconds")
    p.add_argument("--d", type=int, default=512, help="width d (default 512)")
    p.add_argument("--r", type=int, default=64, help="window of restricted self-attention (default 64)")
    p.add_argument("--k", type=int, default=3, help="convolution kernel width (default 3)")
    p.add_argument("--threads", type=int, default=2, help="torch threads (default 2)")
    p.add_argument("--repeats", type=int, default=7, help="timed repeats per point at most (default 7)")
    p.add_argument("--budget", type=float, default=1.5, help="seconds of timed repeats per point (at least 2 repeats)")
    p.add_argument("--time-limit", type=float, default=20.0, help="stop a layer type past this forward+backward s")
    p.add_argument("--memory-limit", type=float, default=8.0, help="stop a layer type past this peak GiB")
    p.add_argument("--path-n", type=int, default=128, help="length for the path-length stacks (default 128)")
    p.add_argument("--path-r", type=int, default=8, help="window of the restricted stacks (default 8: n/r layers)")
    p.add_argument("--kinds", nargs="+", choices=KINDS, help="only these layer types")
    p.add_argument("--no-memory", action="store_true", help="skip the peak-memory pass")
    args = p.parse_args(argv)
    if args.quick:
        args.repeats, args.budget = min(args.repeats, 2), 0.0
        args.max_n = min(args.max_n, 1024)
    if args.max_n < 16 or args.d % 8 or min(args.r, args.k, args.threads, args.path_n, args.path_r) < 1:
        p.error("need --max-n >= 16, --d a multiple of 8 (h = 8), and positive --r, --k, --threads, --path-n, --path-r")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    result = run(args)
    (out / "table1.json").write_text(json.dumps(result, indent=1))
    (out / "table1.md").write_text(markdown(result))
    figure(result, out / "table1.png")
    print(markdown(result))
    print(f"wrote {out / 'table1.json'}, {out / 'table1.md'}, {out / 'table1.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
