"""Beam-search translation speed: transduce against Hugging Face `MarianMTModel` and CTranslate2,
the same model, the same work.

    python -m benchmarks.decode_speed --n-sentences 300            # a stable subset (minutes on 2 cores)
    python -m benchmarks.decode_speed                              # all 3003 sentences of newstest2014
    python -m benchmarks.decode_speed --precisions fp32 --batch-size 16 --threads 2 --json out.json
    python -m benchmarks.decode_speed --presets small,base --systems transduce,ct2 \
        --precisions fp32,bf16,int8 --n-sentences 128 --repeats 2   # against CTranslate2

Method: docs/speed.md, "What the benchmarks measure".
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

import torch

from benchmarks.decoding import (
    BEAM,
    PRECISIONS,
    SIZES,
    SYSTEMS,
    ForcedLength,
    build_ct2,
    build_marian,
    build_transduce,
    cast,
    ct2_pieces,
    encode,
    make_batches,
    marian_dims,
    pad_batch,
    prepare_transduce,
    profile_ops,
    run_ct2_group,
    run_hf,
    run_transduce,
    runs,
)
from benchmarks.machine import describe
from transduce.data.datasets import fetch
from transduce.data.text import read_lines
from transduce.model import count_parameters

_POOL_CALL = None
"""What a forked worker of `--workers` runs (the parent's `call`, inherited at the fork)."""


def _pool_start(threads: int) -> None:
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    torch.set_num_threads(threads)


def _pool_call(job: tuple) -> float:
    return _POOL_CALL(*job)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--n-sentences", type=int, default=3003, help="the first N sentences of newstest2014 (default all 3003)"
    )
    parser.add_argument("--batch-size", type=int, default=32, help="sentences per batch (default 32)")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: the cores available)")
    parser.add_argument("--presets", default="base", help="comma-separated model sizes: small, base (default base)")
    parser.add_argument(
        "--precisions",
        default="fp32,bf16",
        help="comma-separated: fp32, bf16 (bf16 weights), bf16-autocast, int8 (default fp32,bf16)",
    )
    parser.add_argument(
        "--systems",
        default="transduce,hf",
        help="comma-separated: transduce, transduce-nopack (weights not pre-packed), hf, ct2 "
        "(CTranslate2; pip install ctranslate2) (default transduce,hf)",
    )
    parser.add_argument(
        "--repeats",
        type=int,
        default=1,
        help="run every batch R times per system (alternating) and keep the fastest: "
        "steadier on a shared machine (default 1)",
    )
    parser.add_argument(
        "--workers",
        type=int,
        default=1,
        help="batches decoded at once, each with threads/workers threads: transduce and HF in forked "
        "processes, CTranslate2 with inter_threads=workers; for every system alike (default 1)",
    )
    parser.add_argument(
        "--schedule",
        choices=("stream", "groups"),
        default="stream",
        help="with --workers > 1: stream (default): every batch, longest first, to workers that each "
        "take the next one when free, the pass's wall time counts; groups: W consecutive batches "
        "at a time, each group's wall time (its slowest batch) counts",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--data-dir", help="dataset mirror (default: transduce's)")
    parser.add_argument(
        "--profile", action="store_true", help="profile one batch of each system and precision, print the top ops"
    )
    parser.add_argument(
        "--profile-batches",
        metavar="I,J,...",
        help="with --profile: the batches to profile (0-based, sorted by length; default the middle one)",
    )
    parser.add_argument("--json", metavar="FILE", help="also write the results as JSON")
    parser.add_argument(
        "--same-process",
        action="store_true",
        help="measure every system in this one process, alternating batch by batch (the default: "
        "a process each, since two OpenMP runtimes in one process slow each other's threads)",
    )
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)  # one system's process of a run
    args = parser.parse_args(argv)

    threads = args.threads or (len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count())
    if not 1 <= args.workers <= threads:
        parser.error(f"--workers must be between 1 and the threads ({threads}), not {args.workers}")
    if args.workers > 1 and args.profile:
        parser.error("--workers > 1 does not combine with --profile")
    torch.set_num_threads(threads // args.workers)
    precisions = [p for p in args.precisions.split(",") if p]
    if bad := [p for p in precisions if p not in PRECISIONS]:
        parser.error(f"unknown precision {bad[0]!r} (choose from {', '.join(PRECISIONS)})")
    systems = [s for s in args.systems.split(",") if s]
    if bad := [s for s in systems if s not in SYSTEMS]:
        parser.error(f"unknown system {bad[0]!r} (choose from {', '.join(SYSTEMS)})")
    presets = [p for p in args.presets.split(",") if p]
    if bad := [p for p in presets if p not in SIZES]:
        parser.error(f"unknown preset {bad[0]!r} (choose from {', '.join(SIZES)})")

    machine = [] if args.child else describe(ct2="ct2" in systems)  # a table is read for this machine only
    if machine:
        print("\n".join(machine), flush=True)
    path = fetch("wmt14-en-de", "newstest2014", "en", data_dir=args.data_dir)
    lines = list(read_lines(path))[: args.n_sentences]
    results = []
    for preset in presets:
        if args.same_process or args.child or len(systems) == 1:
            results += run_preset(preset, lines, path.name, args, threads, precisions, systems, parser)
        else:
            results += run_isolated(preset, args, threads, systems)
    if args.child:
        Path(args.json).write_text(json.dumps({"results": results}) + "\n")
        return 0

    name = {
        "transduce": "transduce",
        "transduce-nopack": "transduce nopack",
        "hf": "HF MarianMTModel",
        "ct2": "CTranslate2",
    }
    print(
        f"\n{'size':<6} {'system':<18} {'precision':<13} {'time s':>8} {'sent/s':>8} {'tok/s':>9} {'vs HF':>7} {'vs CT2 best':>12}"
    )
    for r in results:
        same = [x for x in results if x["preset"] == r["preset"]]
        hf = next((x for x in same if x["system"] == "hf" and x["precision"] == r["precision"]), None)
        ct2 = max((x for x in same if x["system"] == "ct2"), key=lambda x: x["sentences_per_s"], default=None)
        r["speedup_vs_hf"] = r["sentences_per_s"] / hf["sentences_per_s"] if hf else None
        r["speedup_vs_ct2_best"] = r["sentences_per_s"] / ct2["sentences_per_s"] if ct2 else None
        fmt = lambda v: f"{v:.2f}x" if v is not None else "-"  # noqa: E731
        print(
            f"{r['preset']:<6} {name[r['system']]:<18} {r['precision']:<13} {r['seconds']:>8.1f} {r['sentences_per_s']:>8.2f} "
            f"{r['target_tokens_per_s']:>9.1f} {fmt(r['speedup_vs_hf']):>7} {fmt(r['speedup_vs_ct2_best']):>12}"
        )
    if args.json:
        Path(args.json).write_text(
            json.dumps(
                {
                    "args": vars(args),
                    "machine": machine,
                    "threads": threads,
                    "workers": args.workers,
                    "torch": torch.__version__,
                    "results": results,
                },
                indent=2,
            )
            + "\n"
        )
    return 0


def run_isolated(preset: str, args, threads: int, systems: list[str]) -> list[dict]:
    """Every system in a process of its own (a fresh interpreter: CTranslate2 is never loaded in
    transduce's process, nor the other way round), `--repeats` rounds of one pass each, the
    systems' order reversed every other round so that a machine whose speed drifts slows all
    alike; each batch counts its fastest round, as in one process."""
    import subprocess
    import tempfile

    runs_: dict[tuple[str, str], list[dict]] = {}
    with tempfile.TemporaryDirectory(prefix="decode-speed-") as tmp:
        for r in range(args.repeats):
            for system in systems if r % 2 == 0 else systems[::-1]:
                out = Path(tmp) / f"{system}-{r}.json"
                cmd = [
                    sys.executable,
                    "-m",
                    __spec__.name,
                    "--child",
                    "--json",
                    str(out),
                    "--presets",
                    preset,
                    "--systems",
                    system,
                    "--precisions",
                    args.precisions,
                    "--n-sentences",
                    str(args.n_sentences),
                    "--batch-size",
                    str(args.batch_size),
                    "--threads",
                    str(threads),
                    "--workers",
                    str(args.workers),
                    "--schedule",
                    args.schedule,
                    "--repeats",
                    "1",
                    "--seed",
                    str(args.seed),
                ]
                if args.data_dir:
                    cmd += ["--data-dir", args.data_dir]
                if args.profile and r == 0:
                    cmd += ["--profile"] + (["--profile-batches", args.profile_batches] if args.profile_batches else [])
                print(f"{preset}: {system} in a process of its own, round {r + 1} of {args.repeats}", flush=True)
                subprocess.run(cmd, check=True)
                for row in json.loads(out.read_text())["results"]:
                    runs_.setdefault((row["system"], row["precision"]), []).append(row)
    results = []
    for (system, precision), rows in runs_.items():
        best = [min(times) for times in zip(*(row["batch_seconds"] for row in rows))]
        t, n, tokens = sum(best), rows[0]["sentences"], rows[0]["target_tokens"]
        results.append(
            {
                "preset": preset,
                "system": system,
                "precision": precision,
                "seconds": t,
                "sentences": n,
                "sentences_per_s": n / t,
                "target_tokens_per_s": tokens / t,
                "target_tokens": tokens,
                "batch_seconds": best,
            }
        )
    return results


def run_preset(
    preset: str, lines: list[str], source: str, args, threads: int, precisions: list[str], systems: list[str], parser
) -> list[dict]:
    """Every system in every precision on one model size; one result dict per row."""
    srcs = [encode(line, SIZES[preset]) for line in lines]
    batches = make_batches(srcs, args.batch_size)
    n = len(srcs)
    try:
        profile_batches = (
            [int(i) for i in args.profile_batches.split(",")] if args.profile_batches else [len(batches) // 2]
        )
    except ValueError:
        parser.error(f"--profile-batches: expected comma-separated batch numbers, got {args.profile_batches!r}")
    if bad := [i for i in profile_batches if not 0 <= i < len(batches)]:
        parser.error(f"--profile-batches: batch {bad[0]} does not exist (0..{len(batches) - 1})")
    tgt_tokens = sum(L * len(idx) for idx, L in batches)
    print(
        f"{preset}: {n} sentences of {source}: {sum(map(len, srcs)):,} source tokens (EOS included), "
        f"{tgt_tokens:,} forced target tokens; {len(batches)} batches of <= {args.batch_size}; "
        f"beam {BEAM}; {threads} threads, {args.workers} worker(s)"
        f"{f' ({args.schedule})' if args.workers > 1 else ''}; best of {args.repeats} "
        f"{'per pass' if args.workers > 1 and args.schedule == 'stream' else 'per batch'}; torch {torch.__version__}; "
        f"{platform.processor() or platform.machine()}",
        flush=True,
    )

    models = {}
    for system in ("transduce", "transduce-nopack"):
        if system in systems:
            t = build_transduce(args.seed, preset)
            models[system] = ForcedLength(t)
            print(f"{system}: {count_parameters(t):,} parameters", flush=True)
    if "hf" in systems:
        import transformers

        m = build_marian(args.seed, **marian_dims(preset))
        models["hf"] = m
        n_params = sum(p.numel() for p in m.parameters() if p.requires_grad)
        print(
            f"Hugging Face transformers {transformers.__version__} MarianMTModel: {n_params:,} trainable parameters, "
            f"attention: {m.config._attn_implementation}",
            flush=True,
        )
    tmp = None
    if "ct2" in systems:
        import tempfile

        import ctranslate2

        tmp = tempfile.TemporaryDirectory(prefix="decode-speed-ct2-")
        models["ct2"] = build_ct2(build_transduce(args.seed, preset), Path(tmp.name) / "model", threads, args.workers)
        vocab = ct2_pieces(SIZES[preset])
        tokens = [[vocab[i] for i in s[:-1]] for s in srcs]  # CTranslate2 appends EOS itself (add_source_eos)
        print(
            f"CTranslate2 {ctranslate2.__version__}: the transduce model (seed {args.seed}) exported float32, run as "
            f"float32 and int8 (its CPU: {ctranslate2.get_supported_compute_types('cpu')})",
            flush=True,
        )

    def call(system: str, idx: list[int], L: int, precision: str) -> float:
        if system == "ct2":
            return run_ct2_group(models["ct2"][precision], [([tokens[i] for i in idx], L)])
        src, mask = pad_batch(srcs, idx)
        if system.startswith("transduce"):
            return run_transduce(models[system], src, L, precision)
        return run_hf(models[system], src, mask, L, precision)

    results = []
    for precision in precisions:
        active = [s for s in models if runs(s, precision)]
        for system in active:
            if system.startswith("transduce"):
                prepare_transduce(models[system].model, precision, pack=system == "transduce")
            elif system == "hf":
                cast(models[system], precision)
        # Warm-up: one short batch per system (allocator, oneDNN kernels, lazy initialisation).
        for system in active:
            call(system, batches[0][0][:4], batches[0][1], precision)
        if args.profile:
            chosen = [batches[i] for i in profile_batches]
            work = [(*pad_batch(srcs, idx), L) for idx, L in chosen]
            what = ", ".join(f"{len(idx)} sentences with L={L}" for idx, L in chosen)
            for system in active:
                print(f"\n--- profile: {system} {precision}, batches {profile_batches}: {what} ---")
                if system.startswith("transduce"):
                    print(profile_ops(lambda src, _, L: run_transduce(models[system], src, L, precision), work))
                elif system == "hf":
                    print(profile_ops(lambda src, mask, L: run_hf(models[system], src, mask, L, precision), work))
        pool = None
        if args.workers > 1:
            import multiprocessing

            global _POOL_CALL
            _POOL_CALL = call  # the forked workers inherit the prepared models
            pool = multiprocessing.get_context("fork").Pool(args.workers, _pool_start, (threads // args.workers,))

        def call_group(system: str, group: list[tuple[list[int], int]]) -> float:
            """Wall time of decoding `group`'s batches at once: one batch in this process, or with
            --workers CTranslate2's workers or the forked processes of `pool`."""
            if pool is None:
                ((idx, L),) = group
                return call(system, idx, L, precision)
            if system == "ct2":
                return run_ct2_group(models["ct2"][precision], [([tokens[i] for i in idx], L) for idx, L in group])
            t0 = time.perf_counter()
            for _ in pool.imap_unordered(_pool_call, [(system, idx, L, precision) for idx, L in group], chunksize=1):
                pass
            return time.perf_counter() - t0

        def fastest(group: list, first: int, progress=None) -> dict[str, float]:
            """Each system's fastest of --repeats rounds of `group`, who goes first alternating."""
            best = {s: float("inf") for s in active}
            for r in range(args.repeats):
                for system in active if (first + r) % 2 == 0 else active[::-1]:
                    best[system] = min(best[system], call_group(system, group))
                if progress:
                    progress(r, best)
            return best

        times = {s: 0.0 for s in active}
        per_batch: dict[str, list[float]] = {s: [] for s in active}  # best time of each batch (or group)
        if pool is not None and args.schedule == "stream":
            # All batches, longest first, to W workers that each take the next one when free
            # (`translate --workers`' pool; CTranslate2's queue): the pass's wall time, best of the rounds.
            def progress(r: int, best: dict) -> None:
                print(
                    f"\r{preset} {precision}: round {r + 1}/{args.repeats} "
                    + " ".join(f"{s} {t:.1f}s" for s, t in best.items()),
                    end="",
                    file=sys.stderr,
                    flush=True,
                )

            best = fastest(sorted(batches, key=lambda b: -b[1] * len(b[0])), 0, progress)
            for system in active:
                times[system], per_batch[system] = best[system], [best[system]]
        else:  # W consecutive batches at a time (one without --workers), the group's wall time counts
            groups = [batches[i : i + args.workers] for i in range(0, len(batches), args.workers)]
            for g, group in enumerate(groups):
                best = fastest(group, g)
                for system in active:
                    times[system] += best[system]
                    per_batch[system].append(best[system])
                done = sum(len(i) for grp in groups[: g + 1] for i, _ in grp)
                print(
                    f"\r{preset} {precision}: {done}/{n} sentences "
                    + " ".join(f"{s} {t:.1f}s" for s, t in times.items()),
                    end="",
                    file=sys.stderr,
                    flush=True,
                )
        if pool is not None:
            pool.terminate()
            pool.join()
        print(file=sys.stderr)
        for system, t in times.items():
            results.append(
                {
                    "preset": preset,
                    "system": system,
                    "precision": precision,
                    "seconds": t,
                    "sentences": n,
                    "sentences_per_s": n / t,
                    "target_tokens_per_s": tgt_tokens / t,
                    "target_tokens": tgt_tokens,
                    "batch_seconds": per_batch[system],
                }
            )
    if tmp is not None:
        tmp.cleanup()
    return results


if __name__ == "__main__":
    sys.exit(main())
