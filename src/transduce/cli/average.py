"""`transduce average`: checkpoint averaging (Section 6.1), one call into `transduce.checkpoint`."""

from __future__ import annotations

import argparse
from pathlib import Path

from ..errors import UsageError
from .options import epilog

DESCRIPTION = """\
Average the last K checkpoints of a run into one model directory (Section 6.1: the last
5 for base, 20 for big), the mean taken in float64 and rounded once.
details: transduce docs training averaging"""
EPILOG = epilog(
    "transduce average runs/base --average 5         # -> runs/base/avg_last5/",
    "transduce average runs/big --average 20 -o runs/big/eval-model",
)


def add_args(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("arguments")
    g.add_argument("run_dir", type=Path, metavar="RUN_DIR", help="a `transduce train` run directory")
    g.add_argument("--average", type=int, metavar="K", help="the last K checkpoints (default: the run's, 5 / 20)")
    g.add_argument("--out", "-o", type=Path, metavar="DIR", help="model directory (default RUN_DIR/avg_lastK)")
    g.add_argument("--overwrite", action="store_true", help="write into a DIR that is not empty")


MODEL_FILES = {"config.json", "model.safetensors", "checksums.json"}
"""What a model directory written by `average` holds."""


def check_out(out: Path, run_dir: Path, overwrite: bool) -> None:
    """Refuse an --out that is the run directory or one of its checkpoints (`translate RUN_DIR`
    would then load the average) and, without `overwrite`, a directory that is not empty but an
    earlier average of the same run (`RUN_DIR/avg_lastK`)."""
    from ..checkpoint import CHECKPOINTS

    o, r = out.resolve(), run_dir.resolve()
    if o == r or o == r / CHECKPOINTS or r / CHECKPOINTS in o.parents:
        raise UsageError(
            f"--out {out} is the run directory or one of its checkpoints: write the average into a "
            f"directory of its own (default: {run_dir / 'avg_lastK'})"
        )
    if overwrite or not o.is_dir() or not any(o.iterdir()):
        return
    if o.parent == r and {p.name for p in o.iterdir()} <= MODEL_FILES:
        return  # an earlier average of this run, beside its checkpoints (RUN_DIR/avg_lastK): replaced
    raise UsageError(
        f"--out {out} is not empty: choose a new directory, or --overwrite to write the model files into it"
    )


def run(args: argparse.Namespace) -> int:
    from ..checkpoint import average_checkpoints, default_average, guarded, last_checkpoints, save_tensors_as_model

    if not args.run_dir.is_dir():
        raise FileNotFoundError(f"{args.run_dir}: no such run directory")
    if args.out is not None:
        check_out(args.out, args.run_dir, args.overwrite)
    k = args.average if args.average is not None else (default_average(args.run_dir) or 5)
    paths = last_checkpoints(args.run_dir, k, flag="--average")
    tensors, config = guarded(average_checkpoints, paths)
    out = save_tensors_as_model(tensors, config, args.out or args.run_dir / f"avg_last{k}")
    print(f"averaged {len(paths)} checkpoints ({paths[0].name} ... {paths[-1].name}) into {out}")
    return 0
