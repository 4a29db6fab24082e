"""Training and decoding throughput: transduce against Hugging Face and nn.Transformer, with MFU.

    python -m benchmarks.bench                                  # small and base, fp32 and bf16
    python -m benchmarks.bench --presets small --precisions bf16 --systems transduce,hf
    python -m benchmarks.bench --decode-sentences 0 --json bench.json   # training only

Method: docs/speed.md, "What the benchmarks measure".
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch
from torch import nn

from benchmarks import decoding
from benchmarks.machine import describe
from transduce.config import get_preset
from transduce.data.datasets import fetch
from transduce.data.text import read_lines
from transduce.fast.train import keep_freed_memory
from transduce.flops import dims as model_dims, forward_flops, matmul_peak  # noqa: F401  (the one formula)
from transduce.model import Transformer
from transduce.positions import sinusoidal_positions
from transduce.train.loss import label_smoothed_nll
from transduce.train.step import prepare_for_training

REPO = Path(__file__).resolve().parents[1]

PAD, BOS = 0, 2
VOCAB = {"small": 8000, "base": 37000}
SYSTEMS = ("transduce", "hf", "torch")
NAMES = {"transduce": "transduce", "hf": "HF MarianMTModel", "torch": "nn.Transformer"}


def length_batches(items: list, max_tokens: int, size) -> list[list]:
    """`items` sorted by (target, source) length and cut into batches of at most `max_tokens` padded
    tokens per side; `size(item)` is its (source, target) length."""
    batches, cur, longest = [], [], 0
    for item in sorted(items, key=lambda x: size(x)[::-1]):
        if cur and (len(cur) + 1) * max(longest, *size(item)) > max_tokens:
            batches.append(cur)
            cur, longest = [], 0
        cur.append(item)
        longest = max(longest, *size(item))
    return batches + [cur] if cur else batches


def make_batches(vocab: int, max_tokens: int, data_dir: str | None) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(src (B, S), tgt (B, T + 1)) batches from newstest2014 En-De, hashed into `vocab` ids."""
    en = list(read_lines(fetch("wmt14-en-de", "newstest2014", "en", data_dir=data_dir)))
    de = list(read_lines(fetch("wmt14-en-de", "newstest2014", "de", data_dir=data_dir)))
    pairs = [(decoding.encode(s, vocab), [BOS] + decoding.encode(t, vocab)) for s, t in zip(en, de)]
    pairs = [p for p in pairs if len(p[0]) <= 128 and len(p[1]) <= 129]
    batches = length_batches(pairs, max_tokens, lambda p: (len(p[0]), len(p[1])))

    def pad(seqs):
        out = torch.full((len(seqs), max(map(len, seqs))), PAD, dtype=torch.long)
        for i, s in enumerate(seqs):
            out[i, : len(s)] = torch.tensor(s)
        return out

    g = torch.Generator().manual_seed(0)
    order = torch.randperm(len(batches), generator=g).tolist()  # mixed lengths, like training
    return [(pad([p[0] for p in batches[i]]), pad([p[1] for p in batches[i]])) for i in order]


def model_config(preset: str):
    """The preset's model config with the bench's vocabulary and dropout 0.1."""
    c = get_preset(preset).model
    c.src_vocab_size, c.dropout = VOCAB[preset], 0.1
    return c


class TorchTransformer(nn.Module):
    """nn.Transformer with the paper's embeddings: shared, scaled by sqrt(d_model), sinusoidal
    positions, tied pre-softmax layer."""

    def __init__(self, dm: dict, dropout: float = 0.1):
        super().__init__()
        d = dm["d"]
        self.embed = nn.Embedding(dm["V"], d, padding_idx=PAD)
        nn.init.normal_(self.embed.weight, std=d**-0.5)
        self.core = nn.Transformer(d, dm["h"], dm["N"], dm["N"], dm["f"], dropout, batch_first=True)
        self.register_buffer("pe", sinusoidal_positions(1024, d), persistent=False)
        self.scale, self.dropout = math.sqrt(d), nn.Dropout(dropout)

    def forward(self, src, tgt):
        x = self.dropout(self.embed(src) * self.scale + self.pe[: src.size(1)])
        y = self.dropout(self.embed(tgt) * self.scale + self.pe[: tgt.size(1)])
        causal = nn.Transformer.generate_square_subsequent_mask(tgt.size(1), device=tgt.device)
        out = self.core(
            x,
            y,
            tgt_mask=causal,
            src_key_padding_mask=src == PAD,
            tgt_key_padding_mask=tgt == PAD,
            memory_key_padding_mask=src == PAD,
            tgt_is_causal=True,
        )
        return out @ self.embed.weight.T


def build(system: str, preset: str) -> nn.Module:
    torch.manual_seed(0)
    dm = model_dims(model_config(preset))
    if system == "transduce":
        return Transformer(model_config(preset))
    if system == "hf":
        return decoding.build_marian(0, d_model=dm["d"], layers=dm["N"], heads=dm["h"], ffn=dm["f"], vocab=dm["V"])
    return TorchTransformer(dm)


def forward_logits(system: str, model: nn.Module, src: torch.Tensor, tgt_in: torch.Tensor) -> torch.Tensor:
    if system == "hf":
        return model(
            input_ids=src,
            attention_mask=(src != PAD).long(),
            decoder_input_ids=tgt_in,
            decoder_attention_mask=(tgt_in != PAD).long(),
            use_cache=False,
        ).logits
    return model(src, tgt_in)


PRODUCT_OPS = {
    "aten::mm",
    "aten::addmm",
    "aten::bmm",
    "mkldnn::_linear_pointwise",
    "aten::_scaled_dot_product_flash_attention_for_cpu",
    "aten::_scaled_dot_product_flash_attention_for_cpu_backward",
}
"""What `--profile` counts as products: with the rest of a step free, a step costs at least these."""


def train_throughput(
    system: str,
    preset: str,
    precision: str,
    batches,
    *,
    steps: int,
    warmup: int,
    repeats: int,
    compile: bool = False,
    profile: bool = False,
) -> dict:
    model = build(system, preset).train()
    if system == "transduce":
        model = prepare_for_training(model, torch.device("cpu"), precision)  # as the trainer does
    if compile and system == "transduce":
        model = torch.compile(model, dynamic=True)
    opt = torch.optim.Adam(model.parameters(), lr=1e-4, betas=(0.9, 0.98), eps=1e-9, fused=True)
    dm = model_dims(model_config(preset))

    def amp():
        return torch.autocast("cpu", dtype=torch.bfloat16) if precision == "bf16" else contextlib.nullcontext()

    it = iter(batches * (1 + (warmup + steps * repeats) // len(batches)))

    def step() -> tuple[int, int]:
        src, tgt = next(it)
        tgt_in, tgt_out = tgt[:, :-1], tgt[:, 1:]
        with amp():
            logits = forward_logits(system, model, src, tgt_in)
        loss, _ = label_smoothed_nll(logits, tgt_out, 0.1, PAD)
        (loss / int((tgt_out != PAD).sum())).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return int((tgt_out != PAD).sum()), forward_flops(dm, src.size(0), src.size(1), tgt_in.size(1))

    t0 = time.perf_counter()
    step()  # the first step compiles, with --compile
    compile_s = time.perf_counter() - t0 if compile and system == "transduce" else None
    for _ in range(warmup - 1):
        step()
    if profile:
        from torch.profiler import ProfilerActivity, profile as torch_profile

        with torch_profile(activities=[ProfilerActivity.CPU]) as prof:
            step()
        print(f"--- profile: one training step, {system} {preset} {precision} ---")
        events = prof.key_averages()
        print(events.table(sort_by="self_cpu_time_total", row_limit=20))
        share = sum(e.self_cpu_time_total for e in events if e.key in PRODUCT_OPS) / sum(
            e.self_cpu_time_total for e in events
        )
        print(
            f"matrix products and attention kernels: {100 * share:.0f}% of the step's operator time (the bound on "
            f"what speeding up everything else can gain: {1 / share:.2f}x)",
            flush=True,
        )
    rates, flops_rates, per_token = [], [], []
    for _ in range(repeats):
        tokens = flops = 0
        t0 = time.perf_counter()
        for _ in range(steps):
            n, f = step()
            tokens, flops = tokens + n, flops + 3 * f
        dt = time.perf_counter() - t0
        rates.append(tokens / dt)
        flops_rates.append(flops / dt)
        per_token.append(flops / tokens)
    return {
        "tokens_per_s": statistics.median(rates),
        "flops_per_s": statistics.median(flops_rates),
        "flops_per_token": statistics.median(per_token),
        "rounds": rates,
        "params": sum(p.numel() for p in model.parameters() if p.requires_grad),
        "first_step_s": compile_s,
    }


def git_commit() -> str:
    try:
        return subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True, check=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--presets", default="small,base", help="comma-separated: small, base (default both)")
    p.add_argument("--precisions", default="fp32,bf16", help="comma-separated: fp32, bf16 (default both)")
    p.add_argument("--systems", default="transduce,hf,torch", help="comma-separated: transduce, hf, torch")
    p.add_argument("--max-tokens", type=int, default=4096, help="padded tokens per batch and side (default 4096)")
    p.add_argument("--steps", type=int, default=5, help="training steps per timed round (default 5)")
    p.add_argument("--repeats", type=int, default=3, help="timed rounds; the median counts (default 3)")
    p.add_argument("--warmup", type=int, default=2, help="untimed training steps first (default 2)")
    p.add_argument(
        "--decode-sentences",
        type=int,
        default=64,
        help="beam-4 decoding of the first N sentences of newstest2014 (0: skip; default 64)",
    )
    p.add_argument(
        "--compile",
        action="store_true",
        help="torch.compile transduce's model (dynamic shapes); the first step's time is reported apart",
    )
    p.add_argument(
        "--profile", action="store_true", help="print torch.profiler's top ops for one training step of each"
    )
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: the cores available)")
    p.add_argument(
        "--freed-memory",
        choices=("keep", "return"),
        default="keep",
        help="keep: glibc keeps freed memory for reuse, as transduce's CPU trainer sets it "
        "(transduce.fast.train.keep_freed_memory), for every system of the run; return: glibc's default "
        "(large blocks mapped afresh and returned when freed) (default keep)",
    )
    p.add_argument("--data-dir", help="dataset mirror (default: transduce's)")
    p.add_argument("--json", metavar="FILE", help="also write the results as JSON")
    args = p.parse_args(argv)

    threads = args.threads or len(os.sched_getaffinity(0))
    torch.set_num_threads(threads)
    presets = [x for x in args.presets.split(",") if x]
    precisions = [x for x in args.precisions.split(",") if x]
    systems = [x for x in args.systems.split(",") if x]
    for name, values, allowed in (
        ("preset", presets, VOCAB),
        ("precision", precisions, ("fp32", "bf16")),
        ("system", systems, SYSTEMS),
    ):
        if bad := [v for v in values if v not in allowed]:
            p.error(f"unknown {name} {bad[0]!r} (choose from {', '.join(allowed)})")

    print(
        f"transduce bench: commit {git_commit()}, torch {torch.__version__}, {threads} threads, "
        f"{platform.processor() or platform.machine()}",
        flush=True,
    )
    machine = describe()  # the CPU, its ISA features and each library's: a table is read for this machine only
    print("\n".join(machine), flush=True)
    if args.freed_memory == "keep" and keep_freed_memory():  # process-wide: every system alike
        print(
            "allocator: freed memory kept for reuse, as transduce's CPU trainer does (keep_freed_memory), "
            "for every system measured",
            flush=True,
        )
    peaks = {pr: matmul_peak(torch.bfloat16 if pr == "bf16" else torch.float32) for pr in precisions}
    for pr, v in peaks.items():
        print(f"matmul peak ({pr}, 2048^3, best of torch.mm and oneDNN packed): {v / 1e9:.1f} GFLOP/s", flush=True)

    results = []
    for preset in presets:
        batches = make_batches(VOCAB[preset], args.max_tokens, args.data_dir)
        for precision in precisions:
            for system in systems:
                r = train_throughput(
                    system,
                    preset,
                    precision,
                    batches,
                    steps=args.steps,
                    warmup=args.warmup,
                    repeats=args.repeats,
                    compile=args.compile,
                    profile=args.profile,
                )
                r.update(
                    kind="train",
                    system=system,
                    preset=preset,
                    precision=precision,
                    mfu=r["flops_per_s"] / peaks[precision],
                )
                results.append(r)
                print(
                    f"train  {preset:<6} {precision:<5} {NAMES[system]:<17} {r['tokens_per_s']:>9,.0f} tgt tok/s  "
                    f"{r['flops_per_s'] / 1e9:>6.1f} GFLOP/s  MFU {100 * r['mfu']:>4.1f}%  "
                    f"({r['flops_per_token'] / 1e6:.1f} MFLOP/token, {r['params'] / 1e6:.1f}M params)"
                    + (f", compile + first step {r['first_step_s']:.0f} s" if r["first_step_s"] else ""),
                    flush=True,
                )
            if args.decode_sentences > 0:
                dec = [s for s in systems if s in ("transduce", "hf")]
                d = decode(preset, precision, dec, args.decode_sentences, args.data_dir)
                for system, sps in d.items():
                    results.append(
                        {
                            "kind": "decode",
                            "system": system,
                            "preset": preset,
                            "precision": precision,
                            "sentences_per_s": sps,
                        }
                    )
                    print(
                        f"decode {preset:<6} {precision:<5} {NAMES[system]:<17} {sps:>9.2f} sentences/s (beam 4)",
                        flush=True,
                    )

    print(f"\n{'':7}{'preset':<7}{'precision':<10}{'system':<18}{'result':>22}{'vs HF':>8}{'MFU':>7}")
    for r in results:
        key = "tokens_per_s" if r["kind"] == "train" else "sentences_per_s"
        hf = next(
            (
                x
                for x in results
                if x["kind"] == r["kind"]
                and x["system"] == "hf"
                and x["preset"] == r["preset"]
                and x["precision"] == r["precision"]
            ),
            None,
        )
        r["speedup_vs_hf"] = r[key] / hf[key] if hf else None
        unit = "tgt tok/s" if r["kind"] == "train" else "sent/s"
        mfu = f"{100 * r['mfu']:.1f}%" if "mfu" in r else "-"
        sp = f"{r['speedup_vs_hf']:.2f}x" if hf else "-"
        print(
            f"{r['kind']:<7}{r['preset']:<7}{r['precision']:<10}{NAMES[r['system']]:<18}"
            f"{r[key]:>12,.1f} {unit:<9}{sp:>8}{mfu:>7}"
        )
    if args.json:
        Path(args.json).write_text(
            json.dumps(
                {
                    "args": vars(args),
                    "machine": machine,
                    "threads": threads,
                    "commit": git_commit(),
                    "matmul_peak_flops": peaks,
                    "results": results,
                },
                indent=2,
            )
            + "\n"
        )
    return 0


def decode(preset: str, precision: str, systems: list[str], n: int, data_dir: str | None) -> dict:
    """Beam-4 sentences/s of each system on the first n sentences of newstest2014 (decode_speed's
    forced equal lengths); bf16 = bf16 weights for both."""
    vocab = VOCAB[preset]
    lines = list(read_lines(fetch("wmt14-en-de", "newstest2014", "en", data_dir=data_dir)))[:n]
    srcs = [decoding.encode(s, vocab) for s in lines]
    batches = decoding.make_batches(srcs, 32)
    out = {}
    for system in systems:
        if system == "transduce":
            m = decoding.ForcedLength(Transformer(model_config(preset)).eval())
            decoding.prepare_transduce(m.model, precision)  # as `translate --precision P` makes it ready
        else:
            m = decoding.cast(build("hf", preset).eval(), precision)
        total = 0.0
        for i, (idx, L) in enumerate(batches):
            src, mask = decoding.pad_batch(srcs, idx)
            if system == "transduce":
                dt = decoding.run_transduce(m, src, L, "fp32")
            else:
                dt = decoding.run_hf(m, src, mask, L, "fp32")
            total += dt if i > 0 or len(batches) == 1 else 0.0  # the first batch warms up
        counted = sum(len(idx) for idx, _ in (batches[1:] if len(batches) > 1 else batches))
        out[system] = counted / total
    return out


if __name__ == "__main__":
    sys.exit(main())
