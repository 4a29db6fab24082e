"""`transduce experiment`: its flags, and one call into `transduce.experiments`."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..errors import UsageError
from ..train.signals import EXIT_INTERRUPTED
from ..defaults import PRECISIONS, TABLE3
from .options import add_hardware_args, add_quiet, add_schedule_args, epilog

DESCRIPTION = """\
Table 3's variants (and Table 2's cost) as one rerunnable experiment: each variant a
`transduce train` run in --out, then dev perplexity, dev BLEU, FLOPs, MFU; a table and a
plot. Run it again to resume; another recipe in the same --out is refused.
details: transduce docs experiments"""
EPILOG = (
    epilog(
        "transduce experiment --data data/m30k --out exp/t3 --max-steps 2000 \\",
        "    --update-tokens 2048 --warmup 600 --scale 0.25 --variants base,A1,B1,C1",
        "transduce experiment --data data/wmt14 -o exp/t3 --max-steps 100000 --dry-run",
    )
    + f"""

exit status: 0 done; 2 bad input; {EXIT_INTERRUPTED} a run stopped by a signal: run it again"""
)


def add_args(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("input and output")
    g.add_argument("--data", type=Path, required=True, metavar="DIR", help="`transduce prepare` output, with valid")
    g.add_argument("--out", "-o", type=Path, required=True, metavar="DIR", help="the experiment's directory")
    g.add_argument(
        "--variants",
        default=",".join(TABLE3),
        metavar="LIST",
        help="Table 3's rows or presets (default: all of Table 3)",
    )

    g = parser.add_argument_group("the recipe every variant shares (in steps, never minutes)")
    g.add_argument(
        "--max-steps", type=int, required=True, metavar="N", help="optimizer steps of base (the paper 100000; big 3x)"
    )
    g.add_argument(
        "--update-tokens",
        type=int,
        default=25000,
        metavar="N",
        help="tokens per optimizer update, each side (default 25000)",
    )
    add_schedule_args(g, default=("4000", "1.0"))
    g.add_argument(
        "--save-every-steps", type=int, default=0, metavar="N", help="checkpoint interval (default: steps / 72, as 6.1)"
    )
    g.add_argument("--scale", type=float, default=1.0, metavar="X", help="widths times X (default 1: the paper's)")
    g.add_argument("--depth-scale", type=float, metavar="X", help="layers times X (default: --scale, >= 0.5)")

    g = parser.add_argument_group("measuring, and where the runs train")
    g.add_argument("--score-averaged", action="store_true", help="measure averaged checkpoints (not Table 3's way)")
    g.add_argument("--peak-tflops", type=float, metavar="X", help="a device's peak, for MFU (default: measured)")
    add_hardware_args(g, precisions=PRECISIONS, training=True)
    g.add_argument("--update-freq", type=int, default=1, metavar="K", help="micro-batches per update (default 1)")
    add_quiet(g, "no progress bars")
    g.add_argument("--dry-run", action="store_true", help="print each variant's train command and stop")
    g.add_argument("--nproc", type=int, default=1, metavar="N", help="processes per run (--dry-run, --slurm)")
    g.add_argument("--slurm", action="store_true", help="submit each variant as a Slurm job")
    g.add_argument("--slurm-partition", metavar="NAME", help="Slurm partition")
    g.add_argument("--slurm-minutes", type=int, default=24 * 60, metavar="M", help="job time limit (default 1440)")
    g.add_argument("--slurm-cpus", type=int, metavar="N", help="CPUs per job")


def run(args: argparse.Namespace) -> int:
    from .. import experiments

    schedule = {name: getattr(args, name) for name in ("warmup", "lr_scale") if getattr(args, name) is not None}
    recipe = experiments.Recipe(
        updates=args.max_steps,
        max_tokens=args.update_tokens,
        cooldown=args.cooldown,
        save_every=args.save_every_steps,
        seed=args.seed,
        scale=args.scale,
        depth_scale=args.depth_scale,
        **schedule,
    )  # unset: the paper's (Table 3's presets')
    machine = experiments.Machine(
        device=args.device,
        precision=args.precision,
        threads=args.threads,
        update_freq=args.update_freq,
        nproc=args.nproc,
        progress=not args.quiet and sys.stderr.isatty(),
    )
    if args.nproc < 1 or args.update_freq < 1 or (args.threads is not None and args.threads < 1):
        raise UsageError("--nproc, --update-freq and --threads must be at least 1")
    if args.nproc > 1 and not (args.dry_run or args.slurm):
        raise UsageError(
            "--nproc is for --dry-run and --slurm (here each run trains in this process; "
            "launch the printed torchrun lines, then run this command without --nproc to measure)"
        )
    names = [n.strip() for n in args.variants.split(",") if n.strip()]
    if args.dry_run:
        lines = experiments.dry_run(args.data, args.out, names, recipe, machine)
        print(f"# {recipe.scale_note()}")
        for line in lines:
            print(line)
        print("# then the same `transduce experiment` command without --dry-run measures the runs and writes the table")
        return 0
    if args.slurm:
        jobs = experiments.submit_slurm(
            args.data,
            args.out,
            names,
            recipe,
            machine,
            partition=args.slurm_partition,
            minutes=args.slurm_minutes,
            cpus_per_task=args.slurm_cpus,
        )
        for name, job in jobs.items():
            print(f"{name}: Slurm job {job.job_id}")
        print(
            f"{len(jobs)} jobs submitted (logs in {args.out / 'slurm'}); when they are done, run the same command "
            "without --slurm to measure the runs and write the table"
        )
        return 0
    report = experiments.run_experiment(
        args.data,
        args.out,
        names,
        recipe,
        machine,
        average=args.score_averaged,
        peak_flops=args.peak_tflops * 1e12 if args.peak_tflops else None,
        say=lambda m: print(m, file=sys.stderr, flush=True),
    )
    if report.interrupted:
        print(f"interrupted: run the same command again to continue ({len(report.rows)} rows done)", file=sys.stderr)
        return EXIT_INTERRUPTED
    print(f"{len(report.rows)} rows: " + ", ".join(f"{k} {v}" for k, v in report.outcomes.items()))
    for p in report.written:
        print(p)
    if not any(p.suffix == ".png" for p in report.written):
        print("table.png not drawn: the plot needs matplotlib: pip install 'transduce[views]'")
    return 0
