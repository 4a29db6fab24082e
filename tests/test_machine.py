"""benchmarks/machine.py names the ISA each library really runs, MKL included: on an Intel CPU
PyTorch's and CTranslate2's MKL run AVX-512/AMX unless `MKL_ENABLE_INSTRUCTIONS` holds them down,
which the oneDNN and ATen variables do not, so an AVX2 imitation must be visible in the header.
On other vendors' CPUs MKL names no ISA (its generic path, whatever the variable says): there the
header must say so instead of an ISA the library does not run."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from benchmarks import machine
from transduce.cpu import x86_64

AMX_LINE = (
    "MKL_VERBOSE oneMKL 2024.0 Update 2 Product build 20240605 for Intel(R) 64 architecture Intel(R) "
    "Advanced Vector Extensions 512 (Intel(R) AVX-512) with support for INT8, BF16, FP16 (limited) "
    "instructions, and Intel(R) Advanced Matrix Extensions (Intel(R) AMX) with INT8 and BF16, Lnx 2.60GHz "
    "lp64 gnu_thread"
)
AVX2_LINE = (
    "MKL_VERBOSE oneMKL 2025 Update 3 Product build 20251007 for Intel(R) 64 architecture Intel(R) "
    "Advanced Vector Extensions 2 (Intel(R) AVX2) enabled processors, Lnx 2.60GHz ilp64 gnu_thread"
)
GENERIC_LINE = (
    "MKL_VERBOSE oneMKL 2024.0 Update 2 Product build 20240605 for Intel(R) 64 architecture Intel(R) "
    "Architecture processors, Lnx 2.60GHz lp64 gnu_thread"
)  # an AMD CPU, with or without the variable

INTEL = "GenuineIntel"


def test_the_mkl_line_is_read_as_version_and_code_path():
    assert machine.mkl_isa_from(["noise", AMX_LINE, "MKL_VERBOSE SGEMM(N,N,64,...) 6.61ms"]) == (
        "oneMKL 2024.0 Update 2, ISA Advanced Vector Extensions 512 (AVX-512) with support for INT8, BF16, "
        "FP16 (limited) instructions, and Advanced Matrix Extensions (AMX) with INT8 and BF16"
    )
    assert machine.mkl_isa_from([AVX2_LINE]) == (
        "oneMKL 2025 Update 3, ISA Advanced Vector Extensions 2 (AVX2) enabled processors"
    )
    assert machine.mkl_isa_from([GENERIC_LINE]) == "oneMKL 2024.0 Update 2, generic code path (no ISA named)"
    assert machine.mkl_isa_from(["MKL_VERBOSE SGEMM(N,N,64,...) 6.61ms"]) == "not called"
    assert "MKL_ENABLE_INSTRUCTIONS" in machine.OVERRIDES


needs_mkl = pytest.mark.skipif(
    not x86_64() or not torch.backends.mkl.is_available(), reason="PyTorch without MKL (not an x86 build)"
)


def test_the_vendor_is_read_from_cpuinfo_and_named_in_the_header(monkeypatch):
    vendor = machine.cpu_vendor()
    if x86_64() and Path("/proc/cpuinfo").exists():
        assert vendor in ("GenuineIntel", "AuthenticAMD", "HygonGenuine", "CentaurHauls", "Shanghai"), vendor
    else:
        assert vendor
    monkeypatch.setattr(machine, "onednn_isa", lambda: "(not probed)")  # the header's first line alone
    monkeypatch.setattr(machine, "mkl_isa", lambda: "(not probed)")
    assert machine.describe()[0].startswith("CPU: ") and f"({vendor})" in machine.describe()[0]


@needs_mkl
def test_the_mkl_hold_and_the_code_path_mkl_reports_show_in_the_header(monkeypatch):
    """On every vendor: the variable is in the header, and MKL's own line is read (a version and
    an ISA, or the generic path where it names none), never "not called"."""
    monkeypatch.setenv("MKL_ENABLE_INSTRUCTIONS", "AVX2")
    lines = machine.describe()
    assert "MKL_ENABLE_INSTRUCTIONS=AVX2" in lines[2]
    mkl = lines[3].split("; MKL ", 1)[1]
    assert mkl.startswith("oneMKL ") and (", ISA " in mkl or mkl.endswith(", generic code path (no ISA named)")), mkl
    if machine.cpu_vendor() == "AuthenticAMD":  # MKL names its ISA on Intel CPUs only
        assert "generic code path" in mkl, mkl


@needs_mkl
@pytest.mark.skipif(
    machine.cpu_vendor() != INTEL,
    reason=f"MKL_ENABLE_INSTRUCTIONS=AVX2 shows as an AVX2 code path on Intel CPUs only; this CPU is "
    f"{machine.cpu_vendor()}, where MKL runs its generic path whatever the variable says "
    "(checked by the test above)",
)
def test_holding_mkl_to_avx2_shows_in_the_header_on_intel(monkeypatch):
    monkeypatch.setenv("MKL_ENABLE_INSTRUCTIONS", "AVX2")
    assert "(AVX2)" in machine.mkl_isa()
    lines = machine.describe()
    assert "MKL_ENABLE_INSTRUCTIONS=AVX2" in lines[2]
    assert "MKL oneMKL" in lines[3] and "(AVX2)" in lines[3]
