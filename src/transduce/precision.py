"""Choosing the arithmetic precision from the hardware: `--precision auto`.

bf16 halves the bytes moved and, on hardware that computes it natively, doubles the rate of
matrix products; where it is emulated it is far slower than fp32 (on an AMD Zen 3, AVX2 only, a
2048^2 bf16 `torch.mm` ran about 360x slower than fp32, a bf16-autocast `F.linear` about 5x).
So `auto` (the default of `train`, `translate` and `evaluate`) picks bf16 only where the device
computes it natively and a product of the model's size is measured faster than in fp32:

* CUDA: bf16 where the GPU supports it (`torch.cuda.is_bf16_supported()`, compute capability
  8.0 and newer), else fp32. fp16 is never chosen silently (it needs loss scaling).
* CPU: native bf16 means AMX (Sapphire Rapids and newer) or AVX512_BF16 (Cooper Lake, Zen 4
  and newer) on x86-64, as PyTorch reports them (and oneDNN not held below them by
  `ONEDNN_MAX_CPU_ISA`), or the BF16 extension on ARM (/proc/cpuinfo). Where the CPU lacks it,
  fp32, without a probe. Where it has it, a short timed probe decides, because for small widths
  the casts can cost more than the faster products save: for training (`choose_precision`,
  `probe_bf16_speedup`) the FFN's two products at the model's d_model and d_ff, fp32 against
  bf16 autocast, ~0.1-0.5 s; for decoding (`choose_decoding_precision`, `probe_decoding`) one
  decoder layer's products and the output projection for 128 hypotheses, as `translate` runs
  them (~0.4-1.5 s). Where the capability cannot be read (another architecture), the probe
  alone decides.

`--precision int8` (decoding only, CPU only; not exact, so plain `auto` never takes it, and
`--precision auto-int8` lets the decoding probe consider it) quantizes the linear layers' weights
to int8 per output channel and computes their products in int8 (`transduce.int8.quantize_int8`),
the rest in bf16 where the CPU has it natively, else fp32; the search's log-probabilities and
scores stay fp32.

An explicit `--precision bf16` is obeyed; on a CPU without native bf16 it comes with a warning
that names the measured slowdown. Everything here takes the capability read and the probe as
arguments, so that every branch can be tested on any machine.
"""

from __future__ import annotations

import contextlib
import os
import platform
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch
import torch.nn.functional as F

from .kernels import amx_products

PRECISIONS = ("auto", "fp32", "bf16", "fp16")
DECODING_PRECISIONS = ("auto", "auto-int8", "fp32", "bf16", "int8")
"""What `translate`, `evaluate` and `serve` offer: int8 is for decoding on the CPU only, and
`auto` chooses between the exact-enough fp32 and bf16, `auto-int8` among fp32, bf16 and int8."""


@dataclass(frozen=True)
class Capability:
    """What a device offers for bf16."""

    device: str
    """'cpu' or 'cuda'."""
    name: str
    """The processor or GPU, for messages."""
    native_bf16: bool | None
    """True: bf16 products in hardware; False: emulated; None: unknown (the probe decides)."""
    detail: str
    """The features behind native_bf16, e.g. 'avx512_bf16' or 'AVX2 only, no bf16 instructions'."""


@dataclass(frozen=True)
class Choice:
    """The precision to use and why, in words."""

    precision: str
    reason: str
    warning: str | None = None
    base: str = "fp32"
    """int8: the dtype of everything the int8 products leave as is (embeddings, LayerNorm,
    attention, the cache): bf16 where the CPU computes it natively, else fp32."""
    int8_shapes: frozenset | None = None
    """int8: the (out, in) weight shapes whose products run in int8 (measured faster there than in
    `base`: `probe_int8`); the others stay in `base`. None: every linear layer."""
    int8_source: bool = False
    """int8: whether the source side (the encoder, encoder-decoder attention's keys and values) is
    in int8 too (`transduce.int8.quantize_int8`'s `source`)."""
    int8_decoder: bool = True
    """int8: whether the decoder's linear layers are in int8 (False: the pre-softmax projection
    alone; `int8_mode` "output")."""

    def int8_options(self) -> dict:
        """The keyword arguments of `transduce.int8.quantize_int8` that this choice sets."""
        return dict(only=self.int8_shapes, source=self.int8_source, decoder=self.int8_decoder)

    def line(self) -> str:
        """One line for the user: 'precision: bf16 (...)'."""
        return f"precision: {self.precision} ({self.reason})"


def cpu_name() -> str:
    """The CPU's model name (/proc/cpuinfo on Linux), else what `platform` says."""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace").splitlines():
            if line.split(":")[0].strip() in ("model name", "Model", "Hardware") and ":" in line:
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine() or "unknown CPU"


def _arm_features() -> set[str]:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace").splitlines():
            if line.startswith("Features"):
                return set(line.split(":", 1)[1].split())
    return set()


ONEDNN_ISAS_WITHOUT_BF16 = {"SSE41", "AVX", "AVX2", "AVX2_VNNI", "AVX512_CORE", "AVX512_CORE_VNNI"}
"""Values of oneDNN's `ONEDNN_MAX_CPU_ISA` that leave it without bf16 products: a CPU with AVX512_BF16
or AMX held to one of these (e.g. to imitate an AVX2-only machine) computes bf16 as an AVX2 one."""


def read_capability(device: torch.device | str = "cpu") -> Capability:
    """The bf16 capability of `device`, as PyTorch (and on ARM, the kernel) reports it."""
    device = torch.device(device)
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        major, minor = torch.cuda.get_device_capability(device)
        native = bool(torch.cuda.is_bf16_supported())
        return Capability("cuda", name, native, f"compute capability {major}.{minor}")
    name, machine = cpu_name(), platform.machine().lower()
    if machine in ("x86_64", "amd64", "i386", "i686"):
        cpu = getattr(torch, "cpu", None)
        amx = bool(getattr(cpu, "_is_amx_tile_supported", lambda: False)())
        avx512_bf16 = bool(getattr(cpu, "_is_avx512_bf16_supported", lambda: False)())
        held = os.environ.get("ONEDNN_MAX_CPU_ISA") or os.environ.get("DNNL_MAX_CPU_ISA") or ""
        if (amx or avx512_bf16) and held.upper() in ONEDNN_ISAS_WITHOUT_BF16:
            return Capability("cpu", name, False, f"ONEDNN_MAX_CPU_ISA={held} holds oneDNN to an ISA without bf16 "
                                                  f"instructions (the CPU has {'AMX' if amx else 'avx512_bf16'})")
        if amx or avx512_bf16:
            return Capability("cpu", name, True, " and ".join(f for f, on in (("AMX", amx), ("avx512_bf16", avx512_bf16)) if on))
        isa = torch.backends.cpu.get_cpu_capability()
        return Capability("cpu", name, False, f"{isa} only, no bf16 instructions (no AMX, no avx512_bf16)")
    if machine in ("aarch64", "arm64"):
        features = _arm_features()
        if features:
            native = "bf16" in features
            return Capability("cpu", name, native, "BF16 extension" if native else "no BF16 extension")
    return Capability("cpu", name, None, f"bf16 support of {machine or 'this CPU'} unknown")


BF16_MARGIN = 1.25
"""The measured speed-up for which `auto` gives up fp32's exactness for bf16. A margin, not 1.0: a
timed probe is noisy on a busy machine, and a choice that flips between two runs of one command
(a toy model near 1x) would give two different outputs."""


def probe_bf16_speedup(d_model: int = 512, d_ff: int = 2048, rows: int = 2048, device: torch.device | str = "cpu",
                       budget_s: float = 0.5) -> float:
    """fp32 time / bf16-autocast time of the FFN's two products (rows x d_model -> d_ff -> d_model,
    forward), the median of a few timed rounds within about `budget_s` seconds. > 1: bf16 is
    faster. Runs with no autograd; leaves the RNG untouched (it fills with constants)."""
    device = torch.device(device)
    x = torch.full((rows, d_model), 0.5, device=device)
    w1, w2 = torch.full((d_ff, d_model), 0.01, device=device), torch.full((d_model, d_ff), 0.01, device=device)

    def run(bf16: bool) -> None:
        ctx = torch.autocast(device.type, dtype=torch.bfloat16) if bf16 else contextlib.nullcontext()
        with torch.no_grad(), ctx:
            F.linear(F.linear(x, w1).relu_(), w2)
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    def timed(bf16: bool) -> float:
        t0 = time.perf_counter()
        run(bf16)
        return time.perf_counter() - t0

    run(False), run(True)  # warm up both (kernel selection, oneDNN primitive creation)
    times: dict[bool, list[float]] = {False: [], True: []}
    deadline = time.perf_counter() + budget_s
    while len(times[True]) < 3 or (time.perf_counter() < deadline and len(times[True]) < 15):
        for bf16 in (False, True):
            times[bf16].append(timed(bf16))
        if times[True][-1] > 10 * budget_s:  # emulated and very slow: one round says enough
            break
    med = {k: sorted(v)[len(v) // 2] for k, v in times.items()}
    return med[False] / max(med[True], 1e-12)


def choose_precision(
    requested: str,
    device: torch.device | str = "cpu",
    *,
    d_model: int = 512,
    d_ff: int = 2048,
    capability: Capability | Callable[[torch.device], Capability] | None = None,
    probe: Callable[..., float] | None = None,
) -> Choice:
    """The precision to run in: `requested` itself (with a warning where bf16 is emulated), or
    for 'auto' the hardware's choice (see the module docstring). `capability` (a Capability or a
    function of the device) and `probe` (a function returning the bf16 speedup) are injectable."""
    if requested not in PRECISIONS + ("int8",):
        raise ValueError(f"unknown precision {requested!r} ({', '.join(PRECISIONS + ('int8',))})")
    device = torch.device(device)
    if requested == "int8":
        return int8_choice(device)
    if requested == "fp32":
        return Choice("fp32", "as asked")
    if requested == "fp16":
        return Choice("fp16", "as asked")
    capability = read_capability if capability is None else capability  # looked up now: patchable
    probe = probe_bf16_speedup if probe is None else probe
    cap = capability(device) if callable(capability) else capability
    where = f"{cap.name}: {cap.detail}"
    if requested == "bf16":
        if cap.device == "cpu" and cap.native_bf16 is False:
            speedup = probe(d_model=d_model, d_ff=d_ff, device=device)
            return Choice("bf16", f"as asked; {where}",
                          warning=f"bf16 is emulated on this CPU ({where}): a product of the model's size ran "
                                  f"{1 / max(speedup, 1e-12):.1f}x slower than fp32 here; --precision auto would use fp32")
        return Choice("bf16", f"as asked; {where}")
    # auto
    if cap.device == "cuda":
        if cap.native_bf16:
            return Choice("bf16", f"auto: {where} computes bf16 natively")
        return Choice("fp32", f"auto: {where} has no bf16 (fp16 is never chosen silently)")
    if cap.native_bf16 is False:
        return Choice("fp32", f"auto: {where}")
    speedup = probe(d_model=d_model, d_ff=d_ff, device=device)
    measured = f"a product of the model's size (d_model {d_model}, d_ff {d_ff}) ran {speedup:.2f}x fp32's speed in bf16"
    if speedup >= BF16_MARGIN:
        return Choice("bf16", f"auto: {where}; {measured}")
    return Choice("fp32", f"auto: {where}; but {measured} (bf16 needs {BF16_MARGIN:g}x: fp32 is exact)")


INT8_LAYER_MARGIN = 1.05
"""How much faster than the float type a product's int8 (its input's quantization included) must
be measured for `int8_choice` to put that shape in int8: near parity the exact float product is
kept, and a choice that a noisy probe could flip is less likely."""


def probe_int8(shapes: list[tuple[int, int]], rows: int = 128, base: str = "bf16",
               budget_s: float = 0.3) -> dict[tuple[int, int], tuple[float, float]]:
    """Seconds per product for each (out, in) weight shape at `rows` input rows (32 sentences x
    beam 4), as `translate` runs it: packed in `base` (fp32 or bf16) and in int8 with its input
    quantized on the fly (`transduce.int8.Int8Weight`). Returns {shape: (base s, int8 s)}, the
    fastest of alternating rounds within about `budget_s`, every shape at its full size (a product
    over the whole vocabulary can run slower per row than a part of it: held to AVX2, int8 took
    1.51 ms per 1,000 of 37,000 rows against 0.84 at 8,000, fp32 1.46 against 1.28; docs/speed.md).
    With the threads PyTorch has now: call it with those the decoding will use."""
    from .int8 import Int8Weight
    from .kernels import PackedWeight, can_pack

    dtype = torch.bfloat16 if base == "bf16" else torch.float32
    g = torch.Generator().manual_seed(0)
    x = torch.randn(rows, max(i for _, i in shapes), generator=g).to(dtype)
    calls: dict[tuple[int, int], list] = {}
    for out, inp in shapes:
        w = torch.rand((out, inp), generator=g).sub_(0.5).mul_(inp ** -0.5).to(dtype)
        xs = x[:, :inp].contiguous()
        float_call = (lambda w=PackedWeight(w), xs=xs: w(xs, None)) if can_pack(dtype, "cpu") else (lambda w=w, xs=xs: F.linear(xs, w))
        int8_call = lambda w=Int8Weight(w), xs=xs: w(xs, None)  # noqa: E731
        calls[(out, inp)] = [float_call, int8_call]
    times = {shape: ([], []) for shape in calls}
    with torch.inference_mode():
        for f, q in calls.values():
            f(), q()  # warm up (oneDNN primitive creation)
        deadline = time.perf_counter() + budget_s
        rounds = 0
        while rounds < 3 or (time.perf_counter() < deadline and rounds < 20):
            for shape, (f, q) in calls.items():
                for i, call in enumerate((f, q)):
                    t0 = time.perf_counter()
                    call()
                    times[shape][i].append(time.perf_counter() - t0)
            rounds += 1
    return {shape: (min(t[0]), min(t[1])) for shape, t in times.items()}


INT8_LAYERS_ENV = "TRANSDUCE_INT8_LAYERS"
"""Which linear layers `--precision int8` puts in int8: "decoder" (every layer of a decoding step,
the decoder's and the pre-softmax projection; the source side, computed once per sentence, stays in
the float type), "output" (the pre-softmax projection alone), "all" (the source side too), or
"measured" (the decoding step's, only the weight shapes `probe_int8` measures at least
`INT8_LAYER_MARGIN` faster in int8 than in the float type). Unset: "output" where oneDNN computes
bf16 products on AMX (`amx_products`), else "decoder" (docs/speed.md)."""
INT8_LAYERS = ("decoder", "output", "all", "measured")

def int8_mode() -> str:
    """TRANSDUCE_INT8_LAYERS, checked (a ValueError with one line for anything else); unset, the
    default for this CPU: "output" with AMX, where bf16 products of the decoder's sizes beat int8
    ones with their quantization and only the vocabulary-sized projection gains (Xeon with AMX,
    small and base: docs/speed.md), else "decoder"."""
    mode = os.environ.get(INT8_LAYERS_ENV, "").strip().lower()
    if not mode:
        return "output" if amx_products() else "decoder"
    if mode not in INT8_LAYERS:
        raise ValueError(f"{INT8_LAYERS_ENV}={os.environ[INT8_LAYERS_ENV]!r}: use 'decoder' (the decoding step's linear "
                         "layers in int8), 'output' (the output projection alone), 'all' (the source side too) or "
                         "'measured' (only the shapes measured faster in int8); unset: 'output' with AMX, else 'decoder'")
    return mode


def int8_layers(shapes: list[tuple[int, int]], base: str, probe: Callable[..., dict] | None = None) -> tuple[frozenset | None, str]:
    """The weight shapes to put in int8 (None: all) and a phrase saying which layers. By default
    the decoding step's every linear layer, without measuring: end to end as fast as or faster
    than the measured choice below, as close to fp32, and the same output on every run, where a
    measurement near the margin flips with the machine's load (docs/speed.md).
    TRANSDUCE_INT8_LAYERS=measured: the shapes whose int8 product ran at least
    `INT8_LAYER_MARGIN` times faster than in `base` (`probe_int8`)."""
    mode = int8_mode()
    if mode == "all":
        return None, "every linear layer in int8"
    if mode == "output":
        return None, "the output projection in int8"
    if mode == "decoder" or not shapes:
        return None, f"the decoder's linear layers and the output projection in int8 (the source side in {base})"
    t = (probe_int8 if probe is None else probe)(shapes, base=base)
    chosen = frozenset(s for s in shapes if t[s][0] >= INT8_LAYER_MARGIN * t[s][1])
    def name(s):
        return f"{s[1]}->{s[0]} {t[s][0] / t[s][1]:.2f}x"
    kept = [name(s) for s in shapes if s not in chosen]
    phrase = (f"the decoder's products in int8 where measured >= {INT8_LAYER_MARGIN:g}x {base} (int8 over {base}: "
              f"{', '.join(name(s) for s in shapes if s in chosen) or 'none'}; kept in {base}: {', '.join(kept) or 'none'})")
    return (None if len(chosen) == len(shapes) else chosen), phrase


def int8_choice(device: torch.device | str = "cpu", capability: Capability | None = None, why: str = "as asked",
                shapes: list[tuple[int, int]] | None = None, probe: Callable[..., dict] | None = None) -> Choice:
    """`--precision int8`: where it runs and how, or a ValueError off the CPU (or without oneDNN's
    int8 kernels). Everything but the products in bf16 where the CPU computes bf16 natively
    (measured faster than int8 over fp32: docs/speed.md), else fp32. With the model's weight
    `shapes`, each shape's product in int8 only where measured faster (`int8_layers`)."""
    if torch.device(device).type != "cpu":
        raise ValueError(f"--precision int8 runs on the CPU only (not {device}); use --device cpu, or bf16 on a GPU")
    from .int8 import can_int8, int8_saturates

    if not can_int8():
        raise ValueError(f"--precision int8 needs PyTorch's oneDNN int8 kernels on x86-64 (this: {platform.machine()})")
    cap = read_capability("cpu") if capability is None else capability
    base = "bf16" if cap.native_bf16 else "fp32"
    bits = ("7-bit weights, 8-bit activations: this CPU's int8 products add pairs in int16" if int8_saturates()
            else "8-bit activations")
    only, layers = (None, "linear layers in int8") if shapes is None else int8_layers(shapes, base, probe)
    mode = int8_mode()
    rest = f"the rest in {base}{' (' + cap.detail + ')' if base == 'bf16' else ''}"
    if mode == "output":
        told = bool(os.environ.get(INT8_LAYERS_ENV, "").strip())
        rest += (", the decoder's other linear layers included (" + (f"{INT8_LAYERS_ENV}=output" if told else
                 f"AMX: at their sizes {base} products are faster than int8 ones with their quantization") + ")")
    return Choice("int8", f"{why}; {cap.name}: {layers} through oneDNN ({bits}), {rest}; the search in fp32", base=base,
                  int8_shapes=only, int8_source=mode == "all", int8_decoder=mode != "output")


INT8_MARGIN = 1.1
"""The measured speed-up over the better float type for which `auto-int8` takes int8."""


def _plain(w: torch.Tensor) -> Callable[..., torch.Tensor]:
    """A product with `w` through F.linear, called like a packed weight: (x, bias, act)."""
    return lambda x, b, act="none": F.linear(x, w) if act == "none" else F.linear(x, w).relu()


def probe_decoding(d_model: int = 512, d_ff: int = 2048, vocab: int = 37000, rows: int = 128,
                   precisions: tuple[str, ...] = ("fp32", "bf16", "int8"), int8_base: str = "fp32",
                   budget_s: float = 0.4, int8_decoder: bool = True) -> dict[str, float]:
    """Seconds per decoding step's products, per precision: one decoder layer's (the stacked
    [W^Q; W^K; W^V], W^O, cross-attention's query and output, the FFN's two with its ReLU) and
    the pre-softmax projection over the whole `vocab` (a part of it scaled would not do: held to
    AVX2, int8's product over 37,000 rows ran 1.8x slower per row than over 8,000, at fp32's speed,
    and a probe capped at 16,384 rows put int8 at 1.24x fp32 for base on two threads, where the
    whole decoding step gained 1.05x; docs/speed.md), for `rows` hypotheses (32 sentences x beam 4), as `translate` runs them
    (`transduce.kernels`: pre-packed fp32/bf16, or int8 over `int8_base`; with `int8_decoder`
    False, as `int8_mode` "output" runs it, int8 for the projection alone). The fastest of the
    rounds (alternating precisions) within about `budget_s`: on a busy machine the minimum is
    the steadier statistic. Weights from a private generator: the global RNG is untouched."""
    from .int8 import Int8Weight
    from .kernels import PackedWeight, can_pack

    g = torch.Generator().manual_seed(0)
    shapes = [(3 * d_model, d_model), (d_model, d_model), (d_model, d_model), (d_model, d_model),
              (d_ff, d_model), (d_model, d_ff), (vocab, d_model)]
    weights = [torch.rand(shape, generator=g).sub_(0.5).mul_(shape[1] ** -0.5) for shape in shapes]
    x32 = torch.randn(rows, d_model, generator=g)
    steps: dict[str, Callable[[], None]] = {}
    for p in precisions:
        dtype = torch.bfloat16 if p == "bf16" or (p == "int8" and int8_base == "bf16") else torch.float32
        if p == "int8":
            packed = [Int8Weight(w.to(dtype)) if int8_decoder or i == len(weights) - 1
                      else PackedWeight(w.to(dtype)) if can_pack(dtype, "cpu") else _plain(w.to(dtype))
                      for i, w in enumerate(weights)]
        elif can_pack(dtype, "cpu"):
            packed = [PackedWeight(w.to(dtype)) for w in weights]
        else:
            packed = [_plain(w.to(dtype)) for w in weights]
        x = x32.to(dtype)

        def step(packed=packed, x=x) -> None:
            for w in packed[:4]:
                w(x, None)
            packed[5](packed[4](x, None, "relu"), None)
            packed[6](x, None)

        steps[p] = step
    times: dict[str, list[float]] = {p: [] for p in precisions}
    with torch.inference_mode():
        for step in steps.values():
            step()  # warm up (oneDNN primitive creation)
        deadline = time.perf_counter() + budget_s
        while min(map(len, times.values())) < 3 or (time.perf_counter() < deadline and len(times[precisions[0]]) < 20):
            for p, step in steps.items():
                t0 = time.perf_counter()
                step()
                times[p].append(time.perf_counter() - t0)
    return {p: min(v) for p, v in times.items()}


def choose_decoding_precision(
    requested: str,
    device: torch.device | str = "cpu",
    *,
    d_model: int = 512,
    d_ff: int = 2048,
    vocab: int = 37000,
    capability: Capability | Callable[[torch.device], Capability] | None = None,
    probe: Callable[..., dict[str, float]] | None = None,
    shapes: list[tuple[int, int]] | None = None,
    int8_probe: Callable[..., dict] | None = None,
) -> Choice:
    """The precision `translate`, `evaluate` and `serve` decode in. fp32, bf16, int8 as asked
    (`choose_precision`, `int8_choice`). `auto` on the CPU: fp32 or bf16, and `auto-int8` also
    int8, by a timed probe of a decoding step's products at the model's sizes (`probe_decoding`,
    well under a second): bf16 where it runs at least `BF16_MARGIN` times fp32's speed, int8 where
    it runs at least `INT8_MARGIN` times the better float type's. On a CPU without native bf16
    (x86 without AVX512_BF16 or AMX) bf16 is not even probed: it is emulated there, some hundred
    times slower. On a GPU, `choose_precision`'s auto (int8 is CPU only). When int8 is chosen and
    the model's weight `shapes` are given (`transduce.int8.int8_shapes`), each product is put in
    int8 only where that is measured faster (`int8_layers`, with `int8_probe`)."""
    if requested not in DECODING_PRECISIONS:
        raise ValueError(f"unknown decoding precision {requested!r} ({', '.join(DECODING_PRECISIONS)})")
    device = torch.device(device)
    capability = read_capability if capability is None else capability
    if requested == "int8":
        return int8_choice(device, capability(device) if callable(capability) else capability, shapes=shapes,
                           probe=int8_probe)
    if requested in ("fp32", "bf16") or device.type != "cpu":
        return choose_precision("auto" if requested == "auto-int8" else requested, device, d_model=d_model, d_ff=d_ff,
                                capability=capability)
    cap = capability(device) if callable(capability) else capability
    from .int8 import can_int8

    candidates = ["fp32"] + (["bf16"] if cap.native_bf16 is not False else [])
    if requested == "auto-int8" and can_int8():
        candidates.append("int8")
    if candidates == ["fp32"]:  # nothing to measure: say why, without a probe's figures
        return Choice("fp32", f"auto: {cap.name}: {cap.detail}; bf16 is emulated here, so not probed"
                              f"{' (auto-int8 or int8 would consider int8)' if can_int8() else ''}")
    probe = probe_decoding if probe is None else probe
    base = "bf16" if cap.native_bf16 else "fp32"
    kw = dict(int8_decoder=int8_mode() != "output") if "int8" in candidates else {}
    t = probe(d_model=d_model, d_ff=d_ff, vocab=vocab, precisions=tuple(candidates), int8_base=base, **kw)
    speed = {p: t["fp32"] / max(t[p], 1e-12) for p in candidates}
    best = "bf16" if speed.get("bf16", 0.0) >= BF16_MARGIN else "fp32"
    if "int8" in speed and speed["int8"] >= INT8_MARGIN * speed[best]:
        best = "int8"
    measured = ", ".join(f"{p} {speed[p]:.2f}x" for p in candidates[1:])
    why = (f"auto{'-int8' if requested == 'auto-int8' else ''}: {cap.name}: {cap.detail}; a decoding step's products "
           f"(d_model {d_model}, d_ff {d_ff}, vocab {vocab:,}) ran at fp32's speed times: {measured}"
           f" (bf16 needs {BF16_MARGIN:g}x{f', int8 {INT8_MARGIN:g}x the better float' if 'int8' in speed else ''}"
           f"{'; bf16 not probed: emulated here' if cap.native_bf16 is False else ''})")
    if best == "int8":
        return int8_choice(device, cap, why, shapes=shapes, probe=int8_probe)
    return Choice(best, why)
