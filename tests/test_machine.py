"""benchmarks/machine.py names the ISA each library really runs, MKL included: on an Intel CPU
PyTorch's and CTranslate2's MKL run AVX-512/AMX unless `MKL_ENABLE_INSTRUCTIONS` holds them down,
which the oneDNN and ATen variables do not, so an AVX2 imitation must be visible in the header."""

from __future__ import annotations

import platform
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import machine  # noqa: E402

AMX_LINE = ("MKL_VERBOSE oneMKL 2024.0 Update 2 Product build 20240605 for Intel(R) 64 architecture Intel(R) "
            "Advanced Vector Extensions 512 (Intel(R) AVX-512) with support for INT8, BF16, FP16 (limited) "
            "instructions, and Intel(R) Advanced Matrix Extensions (Intel(R) AMX) with INT8 and BF16, Lnx 2.60GHz "
            "lp64 gnu_thread")
AVX2_LINE = ("MKL_VERBOSE oneMKL 2025 Update 3 Product build 20251007 for Intel(R) 64 architecture Intel(R) "
             "Advanced Vector Extensions 2 (Intel(R) AVX2) enabled processors, Lnx 2.60GHz ilp64 gnu_thread")


def test_the_mkl_line_is_read_as_version_and_code_path():
    assert machine.mkl_isa_from(["noise", AMX_LINE, "MKL_VERBOSE SGEMM(N,N,64,...) 6.61ms"]) == (
        "oneMKL 2024.0 Update 2, ISA Advanced Vector Extensions 512 (AVX-512) with support for INT8, BF16, "
        "FP16 (limited) instructions, and Advanced Matrix Extensions (AMX) with INT8 and BF16")
    assert machine.mkl_isa_from([AVX2_LINE]) == (
        "oneMKL 2025 Update 3, ISA Advanced Vector Extensions 2 (AVX2) enabled processors")
    assert machine.mkl_isa_from(["MKL_VERBOSE SGEMM(N,N,64,...) 6.61ms"]) == "not called"
    assert "MKL_ENABLE_INSTRUCTIONS" in machine.OVERRIDES


@pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64") or not torch.backends.mkl.is_available(),
                    reason="PyTorch without MKL (not an x86 build)")
def test_holding_mkl_to_avx2_shows_in_the_header(monkeypatch):
    monkeypatch.setenv("MKL_ENABLE_INSTRUCTIONS", "AVX2")
    assert "(AVX2)" in machine.mkl_isa()
    lines = machine.describe()
    assert "MKL_ENABLE_INSTRUCTIONS=AVX2" in lines[2]
    assert "MKL oneMKL" in lines[3] and "(AVX2)" in lines[3]
