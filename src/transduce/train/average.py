"""`transduce average`: checkpoint averaging (Section 6.1).

"For the base models, we used a single model obtained by averaging the last 5 checkpoints,
which were written at 10-minute intervals. For the big models, we averaged the last 20
checkpoints."

    transduce average runs/base --last 5            -> runs/base/avg_last5/
    transduce average runs/big --last 20 --out runs/big/eval-model

The result is a model directory (model.safetensors + config.json) that
`transduce.checkpoint.load_model` reads. The mean is taken tensor by tensor in float64 and
rounded once to the tensors' dtype; a tied embedding is stored, and averaged, once.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from ..checkpoint import CONFIG, WEIGHTS, atomic_write_text, load_config
from ..config import Config
from .checkpointing import on_interval, CHECKPOINTS, list_checkpoints, readable


def average_checkpoints(paths: list[str | os.PathLike]) -> tuple[dict[str, torch.Tensor], Config]:
    """The elementwise mean of the weights of the model directories `paths` (same architecture),
    read straight from their model.safetensors (no model is built). Returns (tensors under the
    file's own names, the config of the last checkpoint)."""
    if not paths:
        raise ValueError("no checkpoints to average")
    total: dict[str, torch.Tensor] = {}
    dtypes: dict[str, torch.dtype] = {}
    config = None
    for path in paths:
        c = load_config(path)
        if config is not None and c.model != config.model:
            raise ValueError(f"{path}: a different model architecture than {paths[0]}")
        config = c
        tensors = load_file(str(Path(path) / WEIGHTS))
        if total and tensors.keys() != total.keys():
            raise ValueError(f"{path}: other tensors than {paths[0]}")
        for name, t in tensors.items():
            if name not in total:
                total[name], dtypes[name] = t.double(), t.dtype
            else:
                if t.shape != total[name].shape:
                    raise ValueError(f"{path}: {name} has shape {tuple(t.shape)}, not {tuple(total[name].shape)}")
                total[name] += t.double()
    assert config is not None
    return {name: (s / len(paths)).to(dtypes[name]) for name, s in total.items()}, config


def save_averaged(tensors: dict[str, torch.Tensor], config: Config, directory: str | os.PathLike) -> Path:
    """Write a model directory (model.safetensors + config.json, each through a temporary file
    and os.replace) that `transduce.checkpoint.load_model` reads."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    tmp = directory / (WEIGHTS + ".tmp")
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(tmp), metadata={"format": "pt", "transduce": "1"})
    readable(tmp)
    os.replace(tmp, directory / WEIGHTS)
    atomic_write_text(directory / CONFIG, config.to_json() + "\n")
    return directory


def last_checkpoints(run_dir: str | os.PathLike, k: int) -> list[Path]:
    """The newest `k` complete checkpoints of a run written at its checkpoint interval, oldest
    first (6.1: "the last 5 checkpoints, which were written at 10-minute intervals"). A
    checkpoint forced off the interval (the end of a run that did not end on it) is left out,
    unless the run has no other."""
    found = list_checkpoints(run_dir)
    if not found:
        raise FileNotFoundError(f"{Path(run_dir) / CHECKPOINTS}: no checkpoints")
    if k < 1:
        raise ValueError("--last must be at least 1")
    regular = [(s, p) for s, p in found if on_interval(p)]
    found = regular or found
    if len(found) < k:
        raise ValueError(f"asked for the last {k} checkpoints but {run_dir} has {len(found)} "
                         f"({', '.join(p.name for _, p in found)}); use --last {len(found)} or keep more (--keep-last)")
    return [p for _, p in found[-k:]]


def add_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_dir", type=Path, metavar="RUN_DIR", help="a `transduce train` run directory")
    parser.add_argument("--last", type=int, metavar="K",
                        help="average the last K checkpoints (default: the run's train.average_last: 5 base, 20 big)")
    parser.add_argument("--out", type=Path, metavar="DIR", help="output model directory (default: RUN_DIR/avg_lastK)")


def run(args: argparse.Namespace) -> int:
    """`transduce average`: 0 on success, 2 on bad input (reported on one line)."""
    try:
        if not args.run_dir.is_dir():
            raise FileNotFoundError(f"{args.run_dir}: no such run directory")
        k = args.last
        if k is None:  # the run's own regime: 5 for base, 20 for big
            found = list_checkpoints(args.run_dir)
            k = load_config(found[-1][1]).train.average_last if found else 5
        paths = last_checkpoints(args.run_dir, k)
        tensors, config = average_checkpoints(paths)
        out = save_averaged(tensors, config, args.out or args.run_dir / f"avg_last{k}")
    except (FileNotFoundError, ValueError) as e:
        print(f"transduce average: error: {e}", file=sys.stderr)
        return 2
    print(f"averaged {len(paths)} checkpoints ({paths[0].name} ... {paths[-1].name}) into {out}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="transduce average", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_args(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
