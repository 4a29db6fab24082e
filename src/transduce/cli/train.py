"""`transduce train`: its flags (TrainOptions' fields, and `CONFIG_FLAGS`, which set the preset's
TrainConfig), and one call into `transduce.train.trainer.train`."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from ..defaults import FINETUNE_LR, FINETUNE_WARMUP, PRECISIONS
from ..errors import UsageError
from ..train.options import TrainOptions, cpu_hours, lr_scale_for_peak
from ..train.signals import EXIT_INTERRUPTED
from .fields import add_field_flags, flag, from_args
from .options import add_hardware_args, add_schedule_args, epilog

if TYPE_CHECKING:  # the library that imports PyTorch: imported by `run`, not by the flags (--help)
    from ..config import Config

DESCRIPTION = """\
Train on `transduce prepare` output into RUN_DIR (Section 5: Adam, equation 3,
label smoothing, token batches). Run again: it resumes (another config refused).
details: transduce docs training (and precision, cluster)"""
EPILOG = (
    epilog(
        "transduce train --data DIR --run-dir runs/multi30k-en-de --preset multi30k",
        "transduce train --data data/mine --run-dir runs/mine --init runs/base",
        "torchrun --nproc_per_node 8 -m transduce train --data DIR --run-dir runs/base",
    )
    + "\n\nexit status: 0 done; 2 bad input; 75 stopped by a signal: run again to continue"
)

CONFIG_FLAGS = {  # flag's dest -> (the config.train field it sets, its type, metavar, help); unset: the preset's value
    "max_steps": ("max_steps", int, "N", "optimizer steps (default: the preset's; base 100K)"),
    "warmup": ("warmup_steps", int, None, None),  # declared by options.add_schedule_args
    "lr_scale": ("lr_scale", float, None, None),
    "label_smoothing": ("label_smoothing", float, "EPS", "eps_ls (default: the preset's, 0.1)"),
    "save_every_minutes": ("checkpoint_minutes", float, "M", "checkpoint every M minutes (default: the preset's, 10)"),
}
"""(The types are TrainConfig's, tests/test_flags.py checks: written here, the flags import no config.)"""

RENAMED = {  # TrainOptions field -> its flags, named as the vocabulary (cli.options.VOCABULARY) names them
    "max_tokens": ("--batch-tokens",),
    "progress": ("--quiet", "-q"),  # sets progress False
}

NO_FLAG = {"resume": True}
"""TrainOptions fields without a flag, and the value the command gives them: a run directory with
checkpoints is continued (the library's resume=False refuses one; --restart starts over)."""

SCHEDULE = ("warmup", "lr_scale", "cooldown", "seed")  # declared by options.add_schedule_args, experiment's too

GROUPS = {  # the sections of --help: TrainOptions fields and CONFIG_FLAGS, in this order
    "batching (5.1) and hardware (5.2)": ("max_tokens", "update_freq", "max_steps", "max_minutes", "compile"),
    "optimizer (5.3) and regularization (5.4)": ("label_smoothing", "clip_norm"),  # after SCHEDULE
    "validation, checkpoints (6.1), logs": (
        "valid_every",
        "save_every_steps",
        "save_every_minutes",
        "keep_last",
        "log_every",
        "tensorboard",
        "progress",
    ),
}
HARDWARE = ("device", "precision", "threads")
"""TrainOptions fields whose flags are the shared group (`options.add_hardware_args`)."""


def add_args(parser: argparse.ArgumentParser) -> None:
    """The options of `transduce train`. Regime flags default to the preset's TrainConfig."""
    g = parser.add_argument_group("input and output")
    g.add_argument("--data", type=Path, metavar="DIR", help="a `transduce prepare` output (resuming: the run's)")
    g.add_argument("--run-dir", type=Path, required=True, metavar="DIR", help="where everything the run writes goes")
    g.add_argument("--preset", metavar="NAME", help="model and regime (default base; `info --all`)")
    g.add_argument(
        "--set", action="append", default=[], metavar="S.F=V", help="override a config field, e.g. model.n_layers=3"
    )
    add_field_flags(g, TrainOptions, ["init"], RENAMED)
    add_field_flags(g, TrainOptions, ["restart"], RENAMED)
    parser.set_defaults(**NO_FLAG)
    listed = {*NO_FLAG, "restart", "init", *HARDWARE, *SCHEDULE}
    for title, names in GROUPS.items():
        g = parser.add_argument_group(title)
        if title.startswith("optimizer"):
            add_schedule_args(g)
            g.add_argument(
                "--lr",
                type=float,
                metavar="PEAK",
                help=f"peak rate at step --warmup (--init: {FINETUNE_LR:g}, warmup {FINETUNE_WARMUP})",
            )
        for name in names:
            if name in CONFIG_FLAGS:
                _, kind, metavar, help = CONFIG_FLAGS[name]
                g.add_argument(flag(name), type=kind, metavar=metavar, help=help)
            else:
                add_field_flags(g, TrainOptions, [name], RENAMED)
        if title.startswith("batching"):
            add_hardware_args(g, precisions=PRECISIONS, training=True)
        listed.update(names)
    options = {f.name for f in dataclasses.fields(TrainOptions)}
    add_field_flags(g, TrainOptions, sorted(options - listed), RENAMED)  # a new field is a flag even if not placed


def resolve_config(args: argparse.Namespace) -> tuple[Config, Path]:
    """The run's Config and data directory from the command line (and, continuing a run, the run
    dir: its data when --data is not given, its config when --preset and --set are not given; the
    trainer refuses a config that differs from the run's, `train.recovery.check_same_config`)."""
    from ..checkpoint import check_vocabulary, latest_checkpoint
    from ..config import PRESETS, unknown_preset
    from ..data.batching import read_metadata
    from ..finetune import init_config
    from ..train.recovery import run_config
    from ..train.setup import config_for_data

    if args.lr is not None and args.lr_scale is not None:
        raise UsageError("give --lr (the peak rate) or --lr-scale (equation 3's factor), not both")
    if args.lr is not None and not args.lr > 0:
        raise UsageError(f"--lr must be a positive rate, not {args.lr:g}")
    run_dir: Path = args.run_dir
    latest = None if args.restart else latest_checkpoint(run_dir)
    data_dir = args.data
    if data_dir is None:
        recorded = run_dir / "data.json"
        if not recorded.is_file():
            raise UsageError("--data DIR is required (a `transduce prepare` output directory)")
        data_dir = Path(json.loads(recorded.read_text(encoding="utf-8"))["data_dir"])
    if not data_dir.is_dir():
        raise UsageError(f"{data_dir}: no such data directory (run `transduce prepare --out {data_dir}` first)")
    if args.preset is not None and args.preset not in PRESETS:  # before anything is read: the nearest name
        raise UsageError(unknown_preset(args.preset))
    meta = read_metadata(data_dir)

    if latest is not None:
        check_vocabulary(run_dir, run_config(run_dir, latest), data_dir, meta)  # before anything in RUN_DIR is written
    if args.init is not None:  # fine-tuning: MODEL's architecture, the regime of --preset or MODEL's
        preset = config_for_data(args.preset, [], meta) if args.preset else None
        config = init_config(args.init, preset, args.set, data_dir, meta)
    elif latest is not None and not (args.preset or args.set):
        config = run_config(run_dir, latest)  # the run's own
    else:
        config = config_for_data(args.preset or "base", args.set, meta)
    t = config.train
    for dest, (name, _, _, _) in CONFIG_FLAGS.items():
        value = getattr(args, dest)
        if value is not None:
            setattr(t, name, value)
            try:
                t.check()  # the fields set before this one passed: a failure is this flag's
            except ValueError as e:
                raise UsageError(f"{flag(dest)} {value:g}: {e}") from None
    peak = args.lr
    if args.init is not None:  # a trained model's gentler schedule where the flags give none (transduce.defaults)
        if args.warmup is None:
            t.warmup_steps = FINETUNE_WARMUP
        if args.lr is None and args.lr_scale is None:
            peak = FINETUNE_LR
            print(
                f"fine-tuning at --init's default rate: peak {peak:g} at step {t.warmup_steps} (--lr PEAK to change it)",
                flush=True,
            )
    if peak is not None:  # the schedule's peak, as Hugging Face's and fairseq's --lr: equation 3 scaled to reach it
        t.lr_scale = lr_scale_for_peak(peak, config.model.d_model, t.warmup_steps)
    return config, data_dir


def say_if_sized_for_gpus(config: Config, options: TrainOptions) -> None:
    """One line where training would run on a CPU for more than a day (base: weeks): how long, and
    what to use instead."""
    import os

    import torch

    if options.device.startswith("cuda") or (options.device == "auto" and torch.cuda.is_available()):
        return
    if os.environ.get("RANK", "0") != "0":
        return
    threads = options.threads or torch.get_num_threads()
    hours = cpu_hours(config, threads)
    if hours > 24:
        t = config.train
        print(
            f"note: {t.max_steps:,} steps of {t.max_tokens:,} tokens are sized for GPUs (the paper's base: 12 hours "
            f"on 8 GPUs); on {threads} CPU threads, about {hours / 24:,.0f} days: on a CPU, --preset multi30k "
            "is the paper's architecture at laptop size (5,200 steps of 2,048 tokens: 26 to 100 minutes on 2 cores)",
            flush=True,
        )


def run(args: argparse.Namespace) -> int:
    from ..train.trainer import train

    try:
        options = from_args(TrainOptions, args)  # checks the flags' ranges
    except UsageError as e:  # named by the field: say the flag's name
        message = str(e)
        for field, names in RENAMED.items():
            message = message.replace(flag(field) + " ", names[0] + " ")
        raise UsageError(message) from None
    config, data_dir = resolve_config(args)
    say_if_sized_for_gpus(config, options)
    result = train(config, data_dir, args.run_dir, options, log_extra={"argv": sys.argv})
    return EXIT_INTERRUPTED if result.interrupted else 0
