"""`transduce experiment`: its flags, and one call into `transduce.experiments`."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .. import experiments
from ..errors import UsageError
from ..train.signals import EXIT_INTERRUPTED

HELP = "Table 3's variants (and Table 2's cost) as one rerunnable experiment"
DESCRIPTION = experiments.__doc__
EPILOG = f"""\
variants (Table 3's rows, top to bottom; any other preset name works too):
  {', '.join(experiments.TABLE3)}

examples:
  transduce experiment --data data/m30k --out exp/t3 --updates 2000 --max-tokens 2048 --warmup 600 \\
      --lr-scale 0.4 --scale 0.25 --variants base,A1,B1,C1,D1,E
  transduce experiment --data data/wmt14-en-de --out exp/t3-full --updates 100000 --dry-run --nproc 8

Running the same command again skips the variants that are done and resumes the one that was
interrupted; another recipe in the same --out is refused (nothing trained is lost or overwritten).
exit status: 0 done; 2 bad input; {EXIT_INTERRUPTED} a run was stopped by a signal after its checkpoint
(run the command again to continue)."""


def add_args(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("input and output")
    g.add_argument("--data", type=Path, required=True, metavar="DIR",
                   help="a `transduce prepare` output directory with a validation split (the development set)")
    g.add_argument("--out", type=Path, required=True, metavar="DIR",
                   help="the experiment's directory: runs/NAME per variant, table.md/.csv/.json/.png")
    g.add_argument("--variants", default=",".join(experiments.TABLE3), metavar="LIST",
                   help="comma-separated variants (default: every row of Table 3)")

    g = parser.add_argument_group("the recipe every variant shares (in updates, never minutes)")
    g.add_argument("--updates", type=int, required=True, metavar="N",
                   help="optimizer steps of base (the paper: 100000); big trains 3x as long, as in 5.2")
    g.add_argument("--max-tokens", type=int, default=25000, metavar="N",
                   help="tokens per update, each side (default 25000, 5.1)")
    g.add_argument("--warmup", type=int, default=4000, metavar="N", help="warmup_steps of equation 3 (default 4000)")
    g.add_argument("--lr-scale", type=float, default=1.0, metavar="X", help="factor on equation 3 (default 1.0)")
    g.add_argument("--cooldown", type=float, default=0.0, metavar="F",
                   help="not in the paper: decay the rate linearly to 0 over the last fraction F (default 0)")
    g.add_argument("--save-every", type=int, default=0, metavar="N",
                   help="updates between checkpoints (default: updates / 72, the paper's 10 minutes of 12 hours)")
    g.add_argument("--seed", type=int, default=1, help="training seed (default 1)")
    g.add_argument("--scale", type=float, default=1.0, metavar="X",
                   help="widths (d_model, d_ff, d_k, d_v) times X, for a smaller machine (default 1: the paper's)")
    g.add_argument("--depth-scale", type=float, metavar="X", help="layers (N) times X, rounded (default: --scale, but at least 0.5, "
                   "so that Table 3's N = 2, 4, 6, 8 stay four depths; two variants that would become the same "
                   "model are refused)")

    g = parser.add_argument_group("measuring")
    g.add_argument("--average", action="store_true",
                   help="measure the average of the last checkpoints (6.1: 5, big 20) instead of the final model "
                        "(6.2: Table 3 used no checkpoint averaging)")
    g.add_argument("--peak-tflops", type=float, metavar="X",
                   help="the peak TFLOP/s of one device in the training precision, for MFU (default: measured here, "
                        "the best 2048^3 matmul)")

    g = parser.add_argument_group("where the runs train")
    g.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N (default auto)")
    g.add_argument("--precision", default="auto", choices=("auto", "fp32", "bf16", "fp16"),
                   help="training precision (default auto: bf16 where native and faster); decoding uses the same")
    g.add_argument("--threads", type=int, metavar="N", help="CPU threads (default: all cores)")
    g.add_argument("--update-freq", type=int, default=1, metavar="K", help="micro-batches per update (default 1)")
    g.add_argument("--no-progress", action="store_true", help="no progress bars")

    g = parser.add_argument_group("beyond one machine")
    g.add_argument("--dry-run", action="store_true",
                   help="print each variant's `transduce train` command (torchrun with --nproc > 1) and stop")
    g.add_argument("--nproc", type=int, default=1, metavar="N", help="processes (GPUs) per run, for --dry-run and --slurm")
    g.add_argument("--slurm", action="store_true",
                   help="submit each variant not yet trained as a Slurm job (submitit: pip install 'transduce[slurm]'); "
                        "then run the same command without --slurm to measure and write the table")
    g.add_argument("--slurm-partition", metavar="NAME", help="Slurm partition")
    g.add_argument("--slurm-minutes", type=int, default=24 * 60, metavar="M", help="time limit of each job (default 1440)")
    g.add_argument("--slurm-cpus", type=int, metavar="N", help="CPUs per job")


def run(args: argparse.Namespace) -> int:
    recipe = experiments.Recipe(
        updates=args.updates, max_tokens=args.max_tokens, warmup=args.warmup, lr_scale=args.lr_scale,
        cooldown=args.cooldown, save_every=args.save_every, seed=args.seed, scale=args.scale,
        depth_scale=args.depth_scale,
    )
    machine = experiments.Machine(device=args.device, precision=args.precision, threads=args.threads,
                                  update_freq=args.update_freq, nproc=args.nproc,
                                  progress=not args.no_progress and sys.stderr.isatty())
    if args.nproc < 1 or args.update_freq < 1 or (args.threads is not None and args.threads < 1):
        raise UsageError("--nproc, --update-freq and --threads must be at least 1")
    if args.nproc > 1 and not (args.dry_run or args.slurm):
        raise UsageError("--nproc is for --dry-run and --slurm (here each run trains in this process; "
                         "launch the printed torchrun lines, then run this command without --nproc to measure)")
    names = [n.strip() for n in args.variants.split(",") if n.strip()]
    if args.dry_run:
        lines = experiments.dry_run(args.data, args.out, names, recipe, machine)
        print(f"# {recipe.scale_note()}")
        for line in lines:
            print(line)
        print("# then the same `transduce experiment` command without --dry-run measures the runs and writes the table")
        return 0
    if args.slurm:
        jobs = experiments.submit_slurm(args.data, args.out, names, recipe, machine, partition=args.slurm_partition,
                                        minutes=args.slurm_minutes, cpus_per_task=args.slurm_cpus)
        for name, job in jobs.items():
            print(f"{name}: Slurm job {job.job_id}")
        print(f"{len(jobs)} jobs submitted (logs in {args.out / 'slurm'}); when they are done, run the same command "
              "without --slurm to measure the runs and write the table")
        return 0
    report = experiments.run_experiment(args.data, args.out, names, recipe, machine, average=args.average,
                                        peak_flops=args.peak_tflops * 1e12 if args.peak_tflops else None,
                                        say=lambda m: print(m, file=sys.stderr, flush=True))
    if report.interrupted:
        print(f"interrupted: run the same command again to continue ({len(report.rows)} rows done)", file=sys.stderr)
        return EXIT_INTERRUPTED
    print(f"{len(report.rows)} rows: " + ", ".join(f"{k} {v}" for k, v in report.outcomes.items()))
    for p in report.written:
        print(p)
    if not any(p.suffix == ".png" for p in report.written):
        print("table.png not drawn: the plot needs matplotlib: pip install 'transduce[views]'")
    return 0
