"""The GPU path measured in one run: training throughput and MFU of `base` and `big`, and beam-4
decoding against Hugging Face `generate` (docs/speed.md, "The GPU command"); `--dry` runs every
part tiny on the CPU, to check the plumbing before GPU minutes.

    python -m benchmarks.gpu --out results/                 # on a CUDA machine (minutes)
    python -m benchmarks.gpu --out dry-run --dry            # the same code, tiny, on the CPU

Method: docs/speed.md, "What the benchmarks measure".
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import math
import platform
import sys
import time
import traceback
from pathlib import Path
from unittest import mock

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from benchmarks import decoding
from benchmarks.bench import TorchTransformer, forward_flops, forward_logits, length_batches
from benchmarks.decoding import BOS, EOS, PAD, VOCAB
from transduce.decoding import ranking
from transduce.decoding import search as decode
from transduce.config import Config, get_preset
from transduce.device import setup_cuda
from transduce.fast import step as fast_step
from transduce.flops import dims
from transduce.model import Transformer
from transduce.decoding.ready import make_ready
from transduce.train import loss as loss_module
from transduce.train.step import build_optimizer, make_grad_scaler, set_lr, train_step

NOMINAL_BF16_PEAK = {"H100": 989e12, "H200": 989e12, "A100": 312e12, "L40S": 362e12, "A10": 125e12}
"""Dense bf16 tensor-core peaks (SXM parts; NVIDIA's data sheets, without sparsity)."""
SETTINGS = ("bf16", "bf16-blocked-loss", "bf16-torch-default", "bf16-math", "fp16", "bf16-compile")


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def measured_peak(device: torch.device, n: int) -> float:
    a, b = (torch.randn(n, n, device=device, dtype=torch.bfloat16) for _ in range(2))
    for _ in range(3):
        a @ b
    sync(device)
    t0 = time.perf_counter()
    for _ in range(10):
        a @ b
    sync(device)
    return 10 * 2 * n**3 / (time.perf_counter() - t0)


def lengths(n: int, g: torch.Generator, mean: float = 27.0) -> list[int]:
    x = torch.exp(torch.randn(n, generator=g) * 0.55 + math.log(mean) - 0.55**2 / 2)
    return x.round().clamp(3, 120).long().tolist()


def training_batches(max_tokens: int, n_batches: int, seed: int = 0) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(src (B, S), tgt (B, T + 1) with BOS) batches of about max_tokens padded tokens per side."""
    g = torch.Generator().manual_seed(seed)
    pairs = [(s, max(2, round(s * 1.1))) for s in lengths(max(64, n_batches * max_tokens // 20), g)]
    batches = length_batches(pairs, max_tokens, lambda p: (p[0], p[1] + 1))
    order = torch.randperm(len(batches), generator=g).tolist()[:n_batches]
    out = []
    for b in [batches[i] for i in order]:
        S, T = max(p[0] for p in b), max(p[1] for p in b) + 1
        src = torch.full((len(b), S), PAD)
        tgt = torch.full((len(b), T), PAD)
        for r, (s, t) in enumerate(b):
            src[r, :s] = torch.randint(4, VOCAB, (s,), generator=g)
            src[r, s - 1] = EOS
            tgt[r, 0] = BOS
            tgt[r, 1 : t + 1] = torch.randint(4, VOCAB, (t,), generator=g)
            tgt[r, t] = EOS
        out.append((src, tgt))
    return out


def preset_config(preset: str, dry: bool) -> Config:
    config = get_preset(preset)
    config.model.src_vocab_size = VOCAB
    if dry:  # the same code paths, tiny
        config.model.n_layers, config.model.d_model, config.model.d_ff, config.model.n_heads = 1, 64, 128, 4
    return config


def attention_kernels(which: str):
    """SDPA's allowed backends: "ours" (what `transduce.device.setup_cuda` set for the process),
    "all" (every backend, in PyTorch's own order) or "math"."""
    if which == "ours":
        return contextlib.nullcontext()
    if which == "math":
        return sdpa_kernel([SDPBackend.MATH])
    return sdpa_kernel(
        [SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]
    )


def blocked_loss():
    """The CPU's blocked label-smoothed loss on the GPU too, for the duration (`bf16-blocked-loss`)."""
    return mock.patch.object(loss_module, "_FusedSmoothedCrossEntropy", loss_module._SmoothedCrossEntropy)


def on_device(batches, device: torch.device):
    """The batches in turn, endlessly, on `device`: (src, tgt_in, tgt_out, non-pad target tokens)."""
    for src, tgt in itertools.cycle(batches):
        src, tgt = src.to(device, non_blocking=True), tgt.to(device, non_blocking=True)
        yield src, tgt[:, :-1], tgt[:, 1:], int((tgt[:, 1:] != PAD).sum())


def train_throughput(
    preset: str,
    setting: str,
    batches,
    device: torch.device,
    *,
    steps: int,
    warmup: int,
    dry: bool,
    profile_to: Path | None = None,
) -> dict:
    config = preset_config(preset, dry)
    torch.manual_seed(0)
    model = Transformer(config.model).to(device).train()
    opt = build_optimizer(model, config)
    precision = "fp16" if setting == "fp16" else "bf16"
    scaler = make_grad_scaler(device, precision)
    compiled = setting == "bf16-compile"
    run_model = torch.compile(model, dynamic=True, backend="eager" if dry else "inductor") if compiled else model
    kernels_ = {"bf16-math": "math", "bf16-torch-default": "all"}.get(setting, "ours")
    loss_context = blocked_loss if setting == "bf16-blocked-loss" else contextlib.nullcontext
    dm = dims(config.model)
    it = on_device(batches, device)

    def step() -> tuple[int, int]:
        src, tgt_in, tgt_out, ntok = next(it)
        set_lr(opt, 1e-4)
        with attention_kernels(kernels_), loss_context():
            train_step(
                run_model,
                opt,
                [{"src": src, "tgt_in": tgt_in, "tgt_out": tgt_out, "ntokens": ntok}],
                label_smoothing=0.1,
                precision=precision,
                scaler=scaler,
                pad_id=PAD,
            )
        return ntok, 3 * forward_flops(dm, src.size(0), src.size(1), tgt_in.size(1))

    r = timed_steps(
        step, device, steps=steps, warmup=warmup, profile_to=profile_to, title=f"transduce {preset} {setting}"
    )
    return {
        "preset": preset,
        "setting": setting,
        **r,
        "compile_s": r["first_step_s"] if compiled else None,
        "params": sum(p.numel() for p in model.parameters()),
    }


def profile_table(fn, device: torch.device, rows: int = 30) -> str:
    """torch.profiler's top operators of one call of `fn`, by device time on CUDA (self CPU time on
    the CPU), with the share of the call's wall time the GPU was busy: where the time goes when MFU is low."""
    try:
        from torch.profiler import ProfilerActivity, profile

        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
        sync(device)
        t0 = time.perf_counter()
        with profile(activities=activities) as prof:
            fn()
            sync(device)
        wall = time.perf_counter() - t0
        events = prof.key_averages()
        key = "self_device_time_total" if device.type == "cuda" else "self_cpu_time_total"
        busy = sum(getattr(e, key, 0) for e in events) / 1e6
        head = (
            f"wall {wall * 1e3:.1f} ms (profiled); {'GPU busy' if device.type == 'cuda' else 'operator time'} "
            f"{busy * 1e3:.1f} ms ({100 * busy / wall:.0f}%); {sum(e.count for e in events)} operator calls\n"
        )
        return head + events.table(sort_by=key, row_limit=rows)
    except Exception as e:  # noqa: BLE001 - a profile must never cost the figure measured before it
        return f"profiling failed: {e!r}\n{traceback.format_exc()[-2000:]}"


def timed_steps(step, device: torch.device, *, steps: int, warmup: int, profile_to: Path | None, title: str) -> dict:
    """`warmup` untimed calls of `step` (the first timed alone: compiling), `steps` timed ones, then one
    profiled into `profile_to` if given; `step` returns (target tokens, model FLOPs)."""
    t0 = time.perf_counter()
    step()
    sync(device)
    first = time.perf_counter() - t0
    for _ in range(warmup - 1):
        step()
    sync(device)
    tokens = flops = 0
    t0 = time.perf_counter()
    for _ in range(steps):
        n, f = step()
        tokens, flops = tokens + n, flops + f
    sync(device)
    dt = time.perf_counter() - t0
    mem = torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else None
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    if profile_to is not None:
        profile_to.write_text(f"# one training step: {title}\n" + profile_table(step, device))
    return {
        "tokens_per_s": tokens / dt,
        "flops_per_s": flops / dt,
        "steps": steps,
        "seconds": dt,
        "first_step_s": first,
        "max_memory_gib": mem,
        "batch_tokens": tokens / steps,
    }


def peer_throughput(
    preset: str,
    system: str,
    batches,
    device: torch.device,
    *,
    steps: int,
    warmup: int,
    dry: bool,
    kernels_: str = "all",
    profile_to: Path | None = None,
) -> dict:
    """A peer's training step on the same batches: autocast bf16, label smoothing 0.1 through the
    same loss function, fused Adam; the peer's own attention (SDPA in both), with every backend
    allowed in PyTorch's order (`kernels_="all"`: as the peer ships) or as transduce sets it ("ours")."""
    dm = dims(preset_config(preset, dry).model)
    torch.manual_seed(0)
    if system == "hf":
        model = decoding.build_marian(0, d_model=dm["d"], layers=dm["N"], heads=dm["h"], ffn=dm["f"], vocab=VOCAB)
    else:
        model = TorchTransformer(dm)
    model = model.to(device).train()
    opt = torch.optim.Adam(
        model.parameters(), lr=1e-4, betas=(0.9, 0.98), eps=1e-9, fused=device.type in ("cuda", "cpu")
    )
    it = on_device(batches, device)

    def step() -> tuple[int, int]:
        src, tgt_in, tgt_out, ntok = next(it)
        with torch.autocast(device.type, dtype=torch.bfloat16), attention_kernels(kernels_):
            logits = forward_logits(system, model, src, tgt_in)
        loss, _ = loss_module.label_smoothed_nll(logits.float(), tgt_out, 0.1, PAD)
        (loss / ntok).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return ntok, 3 * forward_flops(dm, src.size(0), src.size(1), tgt_in.size(1))

    name = f"{system} bf16" + ("" if kernels_ == "all" else " no-cuDNN")
    r = timed_steps(step, device, steps=steps, warmup=warmup, profile_to=profile_to, title=f"{name}, {preset}")
    return {
        "preset": preset,
        "setting": name,
        "system": system,
        **r,
        "compile_s": None,
        "params": sum(p.numel() for p in model.parameters()),
    }


PAPER_TABLE2 = {"base": (100_000, 12 * 3600, 3.3e18), "big": (300_000, 3.5 * 86400, 2.3e19)}
"""Steps (5.2), training time on 8 P100s (5.2) and Table 2's training cost, FLOPs."""


def table2_projection(report: dict) -> list[dict]:
    """Table 2's cost column from the measured bf16 steps (see the module docstring)."""
    rows = []
    for preset, (steps, paper_s, paper_flops) in PAPER_TABLE2.items():
        cands = [r for r in report["train"] if r["preset"] == preset and r["setting"] in ("bf16", "bf16-compile")]
        if not cands:
            continue
        r = max(cands, key=lambda r: r["tokens_per_s"])
        step_s = 25_000 / r["tokens_per_s"]
        flops_per_step = r["flops_per_s"] / r["tokens_per_s"] * 25_000
        rows.append(
            {
                "preset": preset,
                "setting": r["setting"],
                "steps": steps,
                "step_s_one_gpu": step_s,
                "flops_per_step": flops_per_step,
                "total_flops": flops_per_step * steps,
                "hours_one_gpu": steps * step_s / 3600,
                "hours_8_gpus": steps * step_s / 8 / 3600,
                "paper_hours_8_p100": paper_s / 3600,
                "paper_flops": paper_flops,
            }
        )
    return rows


@contextlib.contextmanager
def decode_variant(model: Transformer, variant: str):
    """transduce's search as it ships (`transduce`: on a GPU the log-probabilities ranked all at
    once, the step `fast.step.FastDecoder`), or a variant: `transduce-chunked` ranks them in the CPU's
    chunks (`ranking.CPU_CHUNK_ELEMENTS`), `transduce-modules` steps through the model's modules."""
    with contextlib.ExitStack() as undo:
        if variant == "transduce-chunked":
            best = decode._best_extensions
            undo.enter_context(
                mock.patch.object(
                    decode,
                    "_best_extensions",
                    lambda *a, **kw: best(*a, **{**kw, "chunk_elements": ranking.CPU_CHUNK_ELEMENTS}),
                )
            )
        elif variant == "transduce-modules" and isinstance(model.decoder, fast_step.FastDecoder):
            fast_step.uninstall(model)
            undo.callback(fast_step.install, model)
        yield


DECODE_SYSTEMS = ("transduce", "transduce-chunked", "transduce-modules", "hf")


def decode_compare(
    device: torch.device, n: int, batch_size: int, dry: bool, profile_to: Path | None = None
) -> list[dict]:
    c = preset_config("base", dry).model
    g = torch.Generator().manual_seed(1)
    srcs = [torch.randint(4, VOCAB, (s - 1,), generator=g).tolist() + [EOS] for s in lengths(n, g)]
    batches = decoding.make_batches(srcs, batch_size)
    torch.manual_seed(0)
    forced = decoding.ForcedLength(Transformer(c).eval().to(device))
    marian = decoding.build_marian(
        0, d_model=c.d_model, layers=c.n_layers, heads=c.n_heads, ffn=c.d_ff, vocab=VOCAB
    ).to(device)
    rows = []
    for precision in ("fp32", "bf16"):
        decoding.cast(forced.model, precision)
        decoding.cast(marian, precision)
        undo = make_ready(forced.model)  # on a GPU, the flat decoding step only
        times, failed = dict.fromkeys(DECODE_SYSTEMS, 0.0), {}

        def call(system: str, idx: list[int], L: int) -> float:
            src, mask = decoding.pad_batch(srcs, idx)
            src, mask = src.to(device), mask.to(device)
            sync(device)
            if system == "hf":
                return decoding.run_hf(marian, src, mask, L, "fp32")
            with decode_variant(forced.model, system):
                return decoding.run_transduce(forced, src, L, "fp32")

        def outputs(system: str) -> list:  # the first batch's hypotheses
            src, _ = decoding.pad_batch(srcs, batches[0][0])
            forced.length = batches[0][1]
            with decode_variant(forced.model, system), torch.inference_mode():
                return [
                    (h[0].tokens, round(h[0].score, 4))
                    for h in decode.beam_search(
                        forced,
                        src.to(device),
                        beam_size=decoding.BEAM,
                        alpha=decoding.ALPHA,
                        max_len_offset=decoding.MAX_LEN_OFFSET,
                        bos_id=BOS,
                        eos_id=EOS,
                    )
                ]

        def attempt(system: str, fn):  # a variant that fails leaves the comparison, not the run
            try:
                return fn()
            except Exception as e:  # noqa: BLE001
                failed[system] = f"{e!r} {traceback.format_exc()[-1500:]}"
                times.pop(system, None)
                print(f"decode {system} {precision}: FAILED {e!r}", flush=True)

        for system in list(times):  # warm-up
            attempt(system, lambda: call(system, batches[0][0][:4], batches[0][1]))
        reference = outputs("transduce")
        same = {s: attempt(s, lambda: outputs(s) == reference) for s in list(times) if s.startswith("transduce-")}
        if profile_to is not None:  # one full batch of each system, before the timed ones
            for system in list(times):
                f = profile_to / f"profile_decode_{system}_{precision}.txt"
                f.write_text(
                    f"# one decoding batch ({len(batches[0][0])} sentences, {batches[0][1]} steps): {system} "
                    f"{precision}\n" + profile_table(lambda: call(system, batches[0][0], batches[0][1]), device)
                )
        for b, (idx, L) in enumerate(batches):  # the systems in turn, each batch starting one further
            k = b % len(DECODE_SYSTEMS)
            for system in DECODE_SYSTEMS[k:] + DECODE_SYSTEMS[:k]:
                if system in times:
                    dt = attempt(system, lambda: call(system, idx, L))
                    if system in times:
                        times[system] += dt
        undo()
        tokens = sum(L * len(idx) for idx, L in batches)
        for system in DECODE_SYSTEMS:
            if system in failed:
                rows.append({"system": system, "precision": precision, "error": failed[system]})
                continue
            t = times[system]
            rows.append(
                {
                    "system": system,
                    "precision": precision,
                    "sentences": n,
                    "seconds": t,
                    "sentences_per_s": n / t,
                    "target_tokens_per_s": tokens / t,
                }
            )
            if system != "hf" and "hf" in times:
                rows[-1]["speedup_vs_hf"] = times["hf"] / t
            if system in same:
                rows[-1]["same_hypotheses"] = same[system]
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True, type=Path, help="directory for gpu.json and gpu.md")
    p.add_argument("--dry", action="store_true", help="tiny, on the CPU: checks that every part runs")
    p.add_argument("--presets", default="base,big")
    p.add_argument("--settings", default=",".join(SETTINGS), help=f"comma-separated: {', '.join(SETTINGS)}")
    p.add_argument("--peers", default="hf,torch", help="training peers, comma-separated: hf, torch (default both)")
    p.add_argument(
        "--max-tokens", type=int, default=25000, help="padded tokens per batch and side (default 25000, 5.1)"
    )
    p.add_argument("--steps", type=int, default=20, help="timed training steps per setting (default 20)")
    p.add_argument("--warmup", type=int, default=5, help="untimed steps first (default 5)")
    p.add_argument(
        "--profile",
        action="store_true",
        help="also write torch.profiler's top operators (GPU time on CUDA) of one step of each eager bf16 "
        "training setting and peer, and of one decoding batch per system and precision, to "
        "--out/profile_*.txt",
    )
    p.add_argument("--decode-sentences", type=int, default=1024, help="sentences decoded per system (0: no decoding)")
    p.add_argument("--decode-batch", type=int, default=128, help="sentences per decoding batch (default 128)")
    args = p.parse_args(argv)
    if args.dry:
        args.max_tokens, args.steps, args.warmup = min(args.max_tokens, 400), 2, 2
        args.decode_sentences, args.decode_batch = min(args.decode_sentences, 8), min(args.decode_batch, 4)
    device = torch.device("cpu" if args.dry or not torch.cuda.is_available() else "cuda")
    if device.type == "cpu" and not args.dry:
        p.error("no CUDA device here: use --dry for the CPU check")
    args.out.mkdir(parents=True, exist_ok=True)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu"
    report: dict = {
        "device": name,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "args": {k: str(v) for k, v in vars(args).items()},
        "train": [],
        "decode": [],
        "errors": [],
    }
    if device.type == "cuda":
        setup_cuda()  # as every transduce command does on a GPU
        torch.backends.cuda.matmul.allow_tf32 = True  # fp32 rows only (decoding): TF32 tensor cores
        report["capability"] = ".".join(map(str, torch.cuda.get_device_capability(device)))
    report["bf16_peak_nominal"] = next((v for k, v in NOMINAL_BF16_PEAK.items() if k in name), None)
    report["bf16_peak_measured"] = measured_peak(device, 512 if args.dry else 8192)
    print(
        f"{name}: torch {torch.__version__}, bf16 peak measured {report['bf16_peak_measured'] / 1e12:.1f} TFLOP/s, "
        f"nominal {report['bf16_peak_nominal'] and report['bf16_peak_nominal'] / 1e12} TFLOP/s",
        flush=True,
    )

    def save() -> None:
        (args.out / "gpu.json").write_text(json.dumps(report, indent=2) + "\n")
        (args.out / "gpu.md").write_text(markdown(report))

    def failed(part: str, e: Exception) -> None:
        report["errors"].append({"part": part, "error": repr(e), "traceback": traceback.format_exc()[-3000:]})
        print(f"{part}: FAILED {e!r}", flush=True)

    batches = training_batches(args.max_tokens, 40 if not args.dry else 4)
    presets = [x for x in args.presets.split(",") if x]
    settings = [x for x in args.settings.split(",") if x]
    # (preset, transduce setting or peer): eager ones first, then decoding, compiling last (the slowest
    # part, and the one a time limit cut short can spare).
    jobs = [(pr, ("transduce", st, "ours")) for pr in presets for st in settings if "compile" not in st]
    jobs += [
        (pr, (sy, f"{sy} bf16", k)) for pr in presets for sy in args.peers.split(",") if sy for k in ("all", "ours")
    ]

    def train_job(preset: str, system: str, setting: str, kernels_: str) -> None:
        try:
            prof = None
            if args.profile and setting in ("bf16", "bf16-blocked-loss", f"{system} bf16") and kernels_ == "ours":
                prof = (
                    args.out
                    / f"profile_train_{preset}_{system}{'_blocked-loss' if setting == 'bf16-blocked-loss' else ''}.txt"
                )
            kw = dict(steps=args.steps, warmup=args.warmup, dry=args.dry, profile_to=prof)
            if system == "transduce":
                r = train_throughput(preset, setting, batches, device, **kw)
            else:
                r = peer_throughput(preset, system, batches, device, kernels_=kernels_, **kw)
        except Exception as e:  # noqa: BLE001 - one failing setting must not cost the others
            failed(f"train {preset} {setting}", e)
            save()
            return
        measured = report["bf16_peak_measured"]
        r.update(
            mfu_nominal=r["flops_per_s"] / (report["bf16_peak_nominal"] or measured),
            mfu_measured_peak=r["flops_per_s"] / measured,
            system=system,
        )
        report["train"].append(r)
        print(
            f"train {preset:<5} {r['setting']:<22} {r['tokens_per_s']:>10,.0f} tgt tok/s  MFU {100 * r['mfu_nominal']:5.1f}% "
            f"(of measured peak {100 * r['mfu_measured_peak']:5.1f}%)  {r['batch_tokens']:,.0f} tgt tok/step"
            + (f"  compile+first step {r['compile_s']:.0f} s" if r["compile_s"] else ""),
            flush=True,
        )
        report["table2"] = table2_projection(report)
        save()
        if device.type == "cuda":
            torch.cuda.empty_cache()

    for preset, (system, setting, kernels_) in jobs:
        train_job(preset, system, setting, kernels_)
    try:
        if args.decode_sentences > 0:
            report["decode"] = decode_compare(
                device,
                args.decode_sentences,
                args.decode_batch,
                args.dry,
                profile_to=args.out if args.profile else None,
            )
        for r in report["decode"]:
            if "error" not in r:
                print(
                    f"decode base {r['precision']:<5} {r['system']:<17} {r['sentences_per_s']:>9.1f} sentences/s",
                    flush=True,
                )
    except Exception as e:  # noqa: BLE001
        failed("decode", e)
    save()
    for preset, setting in [(pr, st) for pr in presets for st in settings if "compile" in st]:
        train_job(preset, "transduce", setting, "ours")
    save()
    print(markdown(report))
    return 1 if report["errors"] else 0


def markdown(report: dict) -> str:
    lines = [
        f"# GPU figures: {report['device']} (torch {report['torch']}, CUDA {report['cuda']})",
        "",
        f"bf16 peak: measured {report['bf16_peak_measured'] / 1e12:.1f} TFLOP/s (8192^3 product), nominal "
        f"{(report['bf16_peak_nominal'] or 0) / 1e12:.0f} TFLOP/s",
        "",
        "| preset | setting | target tokens/s | vs best peer | MFU (nominal peak) | MFU (measured peak) | tgt tokens/step | first step s | max GiB |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in report["train"]:
        peers = [
            q["tokens_per_s"]
            for q in report["train"]
            if q["preset"] == r["preset"] and q.get("system", "transduce") != "transduce"
        ]
        ratio = (
            f"{r['tokens_per_s'] / max(peers):.2f}x" if peers and r.get("system", "transduce") == "transduce" else "-"
        )
        lines.append(
            f"| {r['preset']} | {r['setting']} | {r['tokens_per_s']:,.0f} | {ratio} | {100 * r['mfu_nominal']:.1f}% | "
            f"{100 * r['mfu_measured_peak']:.1f}% | {r['batch_tokens']:,.0f} | {r['first_step_s']:.1f} | "
            f"{r['max_memory_gib'] if r['max_memory_gib'] is None else round(r['max_memory_gib'], 1)} |"
        )
    if report.get("table2"):
        lines += [
            "",
            "Table 2's training cost, projected from the measured bf16 step at 25,000 target tokens per step "
            "(8 GPUs: perfect data parallelism assumed):",
            "",
            "| preset | setting | s/step, 1 GPU | FLOPs/step | steps | total FLOPs | hours, 1 GPU | hours, 8 GPUs | paper: 8 P100s | paper FLOPs |",
            "|---|---|---|---|---|---|---|---|---|---|",
        ]
        for t in report["table2"]:
            lines.append(
                f"| {t['preset']} | {t['setting']} | {t['step_s_one_gpu']:.3f} | {t['flops_per_step']:.2e} | {t['steps']:,} | "
                f"{t['total_flops']:.2e} | {t['hours_one_gpu']:.1f} | {t['hours_8_gpus']:.2f} | "
                f"{t['paper_hours_8_p100']:.0f} h | {t['paper_flops']:.1e} |"
            )
    lines += [
        "",
        "| decoding (base, beam 4, forced lengths) | precision | sentences/s | target tokens/s | vs HF | first batch's hypotheses as transduce's |",
        "|---|---|---|---|---|---|",
    ]
    for r in report["decode"]:
        if "error" in r:
            lines.append(f"| {r['system']} | {r['precision']} | failed: {r['error'].splitlines()[0][:120]} | | | |")
            continue
        sp = f"{r['speedup_vs_hf']:.2f}x" if "speedup_vs_hf" in r else "-"
        same = {True: "same", False: "differ"}.get(r.get("same_hypotheses"), "-")
        lines.append(
            f"| {r['system']} | {r['precision']} | {r['sentences_per_s']:.1f} | {r['target_tokens_per_s']:,.0f} | {sp} | {same} |"
        )
    if report["errors"]:
        lines += ["", "Errors:", *[f"- {e['part']}: {e['error']}" for e in report["errors"]]]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
