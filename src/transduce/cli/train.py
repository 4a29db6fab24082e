"""`transduce train`: its flags, and one call into `transduce.train.trainer.train`.

The flags of `TrainOptions` come from its fields (`transduce.cli.fields`); the few that set a
field of the preset's `TrainConfig` are the table `CONFIG_FLAGS`.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

from ..checkpoint import check_vocabulary, latest_checkpoint, load_config
from ..config import PRESETS, Config, TrainConfig
from ..data.batching import read_metadata
from ..errors import UsageError
from ..train import trainer
from ..train.signals import EXIT_INTERRUPTED
from ..train.trainer import TrainOptions, config_for_data, train
from .fields import add_field_flags, field_type, flag, from_args

HELP = "train a model on prepared data (Section 5; torchrun for many GPUs)"
DESCRIPTION = trainer.__doc__
EPILOG = """\
exit status: 0 done; 2 bad input, or a stop that kept a resumable state (another trainer holds
RUN_DIR, a checkpoint could not be written, too many non-finite steps in a row: the message says
which); 75 stopped by SIGTERM or SIGINT after writing a checkpoint: continue with --resume (a
second signal exits at once). A damaged latest checkpoint is set aside and --resume continues from
the newest intact one. Under Slurm: docs/cluster.md."""

CONFIG_FLAGS = {  # flag's dest -> (the config.train field it sets, metavar, help); unset: the preset's value
    "max_steps": ("max_steps", "N", "optimizer steps (default: train.max_steps, 100K base, 300K big)"),
    "warmup": ("warmup_steps", "N", "warmup_steps of equation 3 (default: train.warmup_steps, 4000)"),
    "lr_scale": ("lr_scale", "X", "factor on equation 3 (default: train.lr_scale, 1.0)"),
    "label_smoothing": ("label_smoothing", "EPS", "eps_ls (default: train.label_smoothing, 0.1)"),
    "save_every_minutes": ("checkpoint_minutes", None, None),  # also a TrainOptions field, whose flag it is
}

GROUPS = {  # the sections of --help: TrainOptions fields and CONFIG_FLAGS, in this order
    "batching (5.1) and hardware (5.2)":
        ("max_tokens", "update_freq", "max_steps", "max_minutes", "device", "precision", "threads", "compile"),
    "optimizer (5.3) and regularization (5.4)": ("warmup", "lr_scale", "label_smoothing", "cooldown", "clip_norm", "seed"),
    "validation, checkpoints (6.1), logs":
        ("valid_every", "save_every_steps", "save_every_minutes", "keep_last", "log_every", "tensorboard", "progress"),
}


def add_args(parser: argparse.ArgumentParser) -> None:
    """The options of `transduce train`. Regime flags default to the preset's TrainConfig."""
    g = parser.add_argument_group("input and output")
    g.add_argument("--data", type=Path, metavar="DIR", help="a `transduce prepare` output directory "
                   "(with --resume, defaults to the one recorded in RUN_DIR/data.json; another must have the "
                   "run's vocabulary)")
    g.add_argument("--run-dir", type=Path, required=True, metavar="DIR",
                   help="where config, vocabulary, checkpoints, logs and the final model go")
    g.add_argument("--preset", metavar="NAME", help=f"model and regime (default: base); one of: {', '.join(PRESETS)}")
    g.add_argument("--set", action="append", default=[], metavar="SECTION.FIELD=VALUE",
                   help="override a config field, e.g. --set model.n_layers=3 (repeatable)")
    add_field_flags(g, TrainOptions, ["resume"])
    options = {f.name for f in dataclasses.fields(TrainOptions)}
    listed = {"resume"}
    for title, names in GROUPS.items():
        g = parser.add_argument_group(title)
        for name in names:
            if name in options:
                add_field_flags(g, TrainOptions, [name])
            else:
                field, metavar, help = CONFIG_FLAGS[name]
                g.add_argument(flag(name), type=field_type(TrainConfig, field), metavar=metavar, help=help)
        listed.update(names)
    add_field_flags(g, TrainOptions, sorted(options - listed))  # a new field is a flag even if not placed


def resolve_config(args: argparse.Namespace) -> tuple[Config, Path]:
    """The run's Config and data directory from the command line (and, resuming, the run dir)."""
    run_dir: Path = args.run_dir
    resuming = args.resume and latest_checkpoint(run_dir) is not None
    data_dir = args.data
    if data_dir is None:
        recorded = run_dir / "data.json"
        if not (args.resume and recorded.is_file()):
            raise UsageError("--data DIR is required (a `transduce prepare` output directory)")
        data_dir = Path(json.loads(recorded.read_text(encoding="utf-8"))["data_dir"])
    if not data_dir.is_dir():
        raise UsageError(f"{data_dir}: no such data directory (run `transduce prepare --out {data_dir}` first)")
    meta = read_metadata(data_dir)

    if resuming:
        config = load_config(latest_checkpoint(run_dir))
        check_vocabulary(run_dir, config, data_dir, meta)  # before anything in RUN_DIR is written
        if args.preset or args.set:  # allowed only if they describe the same model
            requested = config_for_data(args.preset or "base", args.set, meta)
            if requested.model != config.model:
                raise UsageError("--preset/--set describe a different model than the run being resumed "
                                 f"({run_dir / 'config.json'}); drop them or use another --run-dir")
            config.train = requested.train
    else:
        config = config_for_data(args.preset or "base", args.set, meta)
    t = config.train
    for dest, (name, _, _) in CONFIG_FLAGS.items():
        value = getattr(args, dest)
        if value is not None:
            setattr(t, name, value)
            try:
                t.check()  # the fields set before this one passed: a failure is this flag's
            except ValueError as e:
                raise UsageError(f"{flag(dest)} {value:g}: {e}") from None
    return config, data_dir


def run(args: argparse.Namespace) -> int:
    options = from_args(TrainOptions, args)  # checks the flags' ranges
    config, data_dir = resolve_config(args)
    result = train(config, data_dir, args.run_dir, options, log_extra={"argv": sys.argv})
    return EXIT_INTERRUPTED if result.interrupted else 0
