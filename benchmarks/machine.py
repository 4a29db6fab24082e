"""What machine a benchmark table was measured on: the CPU, its ISA features, the environment
variables that hold libraries to a lower ISA, and the ISA each library actually runs, as it reports
it itself (docs/speed.md, "Which kernels run"). `describe()` returns the lines; the speed benchmarks
print them at the top of their output and store them in their JSON.

Each library is asked in a subprocess with this environment: PyTorch's oneDNN (`ONEDNN_VERBOSE=1`),
ATen (`torch.backends.cpu.get_cpu_capability()`), PyTorch's MKL (its first `MKL_VERBOSE=1` line;
held down only by `MKL_ENABLE_INSTRUCTIONS`), and CTranslate2 (its own kernels and GEMM backends,
`CT2_VERBOSE=1`; its bundled oneDNN and MKL) loading a tiny model exported here. On AMD CPUs MKL
names no ISA, only its generic path, and CTranslate2 does not use its MKL (`CT2_USE_MKL=0` gives it
on Intel the GEMMs it has on AMD): `cpu_vendor()` says which case a machine is.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

from transduce.cpu import cpu_name, cpuinfo, proc_flags

FEATURES = ("avx2", "avx512f", "avx512_bf16", "avx512_vnni", "avx_vnni", "amx_tile", "amx_bf16", "amx_int8")
"""The /proc/cpuinfo flags that decide CPU decoding speed (bf16 and int8 products)."""

OVERRIDES = (
    "ONEDNN_MAX_CPU_ISA",
    "DNNL_MAX_CPU_ISA",
    "ATEN_CPU_CAPABILITY",
    "CT2_FORCE_CPU_ISA",
    "CT2_USE_MKL",
    "MKL_ENABLE_INSTRUCTIONS",
    "FBGEMM_ENABLE_INSTRUCTIONS",
    "ONEDNN_DEFAULT_FPMATH_MODE",
    "OMP_NUM_THREADS",
    "MKL_NUM_THREADS",
    "ONEDNN_PRIMITIVE_CACHE_CAPACITY",
)
"""Environment variables that change which kernels run."""

_ONEDNN_PROBE = (
    "import torch; from transduce import torch_ops; "
    "torch_ops.linear(torch.ones(2, 4), torch_ops.pack(torch.ones(4, 4)), None)"
)

_CT2_PROBE = """
import torch
from transduce.config import Config, ModelConfig
from transduce.data.vocab import SPECIAL_PIECES
from transduce.export.ct2 import TransduceConverter
from transduce.model import Transformer
import ctranslate2
model = Transformer(ModelConfig(src_vocab_size=16, n_layers=1, d_model=16, d_ff=32, n_heads=2)).eval()
vocab = [SPECIAL_PIECES[k] for k in ("pad", "unk", "bos", "eos")] + [f"w{{i}}" for i in range(4, 16)]
with torch.no_grad():
    TransduceConverter(model, Config(model=model.config), vocab, vocab).convert({out!r}, quantization="float32", force=True)
t = ctranslate2.Translator({out!r}, device="cpu", compute_type="int8")
t.translate_batch([["w5", "w6"]], max_decoding_length=2)
print("compute types:", sorted(ctranslate2.get_supported_compute_types("cpu")), flush=True)
"""


def cpu_vendor() -> str:
    """The CPU's vendor as /proc/cpuinfo names it ("GenuineIntel", "AuthenticAMD", ...; "unknown"
    where there is no such line, e.g. on ARM or off Linux): oneMKL names its ISA on Intel CPUs only."""
    return cpuinfo().get("vendor_id", "unknown")


def _run(code: str, env: dict) -> str:
    try:
        p = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
        return p.stdout + p.stderr
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"(failed: {e})"


def onednn_isa() -> str:
    """PyTorch's oneDNN: its version and the ISA it runs here, as it reports them."""
    out = _run(_ONEDNN_PROBE, {**os.environ, "ONEDNN_VERBOSE": "1"})
    lines = out.splitlines()
    version = next((l.split("oneDNN", 1)[1].split("(")[0].strip() for l in lines if "info,oneDNN v" in l), "?")
    isa = next((l.split("isa:", 1)[1].strip() for l in lines if ",isa:" in l), "unknown (no verbose line)")
    return f"{version}, ISA {isa}"


_MKL_PROBE = "import torch; a = torch.ones(64, 64); torch.mm(a, a)"


def mkl_isa_from(lines: list[str]) -> str:
    """oneMKL's version and code path from its first `MKL_VERBOSE` line, e.g. "oneMKL 2024.0
    Update 2, ISA Advanced Vector Extensions 2 (AVX2) enabled processors", or "oneMKL 2024.0
    Update 2, generic code path (no ISA named)" where it names none ("Intel(R) Architecture
    processors", on AMD CPUs); "not called" if there is no such line."""
    line = next((l for l in lines if l.startswith("MKL_VERBOSE") and " architecture " in l), None)
    if line is None:
        return "not called"
    version = line.split("MKL_VERBOSE", 1)[1].split(" Product build")[0].strip()
    isa = line.split(" architecture ", 1)[1].rsplit(", Lnx", 1)[0].replace("Intel(R) ", "").strip()
    if isa == "Architecture processors":  # what it says on CPUs it names no ISA for (AMD's)
        return f"{version}, generic code path (no ISA named)"
    return f"{version}, ISA {isa}"


def mkl_isa() -> str:
    """PyTorch's MKL: its version and the code path it runs here, as it reports it."""
    return mkl_isa_from(_run(_MKL_PROBE, {**os.environ, "MKL_VERBOSE": "1"}).splitlines())


def ct2_isa() -> str:
    """CTranslate2's own ISA, GEMM backends, bundled oneDNN's ISA and compute types, as it reports them."""
    with tempfile.TemporaryDirectory(prefix="machine-ct2-") as tmp:
        out = _run(
            _CT2_PROBE.format(out=str(Path(tmp) / "m")),
            {**os.environ, "CT2_VERBOSE": "1", "ONEDNN_VERBOSE": "1", "DNNL_VERBOSE": "1", "MKL_VERBOSE": "1"},
        )
    lines = out.splitlines()
    own = next((l.split("Selected ISA:", 1)[1].strip() for l in lines if "Selected ISA:" in l), "?")
    gemm = "; ".join(l.split("- ", 1)[1].strip() for l in lines if "backend:" in l)
    dnnl = next((l.split("isa:", 1)[1].strip() for l in lines if ",isa:" in l), "not called")
    types = next((l.split(":", 1)[1].strip() for l in lines if l.startswith("compute types:")), "?")
    if own == "?" and types == "?":
        return "not available (" + (lines[-1] if lines else "no output") + ")"
    return f"kernels {own}; {gemm}; its oneDNN: {dnnl}; its MKL: {mkl_isa_from(lines)}; compute types {types}"


def describe(ct2: bool = False) -> list[str]:
    """The lines that say which machine and which kernels a table was measured on."""
    import torch

    name, flags = cpu_name(), [f for f in FEATURES if f in proc_flags()]
    env = [f"{k}={os.environ[k]}" for k in OVERRIDES if k in os.environ]
    lines = [
        f"CPU: {name} ({cpu_vendor()}); {os.cpu_count()} logical CPUs, {len(os.sched_getaffinity(0)) if hasattr(os, 'sched_getaffinity') else '?'} usable",
        f"ISA features (/proc/cpuinfo): {' '.join(flags) or 'none of ' + ', '.join(FEATURES)}",
        f"environment: {' '.join(env) or 'no ISA or thread overrides'}",
        f"PyTorch {torch.__version__}: ATen CPU capability {torch.backends.cpu.get_cpu_capability()}; "
        f"oneDNN {onednn_isa()}; MKL {mkl_isa()}",
    ]
    if ct2:
        try:
            import ctranslate2

            lines.append(f"CTranslate2 {ctranslate2.__version__}: {ct2_isa()}")
        except ImportError:
            lines.append("CTranslate2: not installed")
    return lines


if __name__ == "__main__":
    print("\n".join(describe(ct2=True)))
