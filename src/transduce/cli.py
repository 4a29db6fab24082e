"""The `transduce` command: one entry point, thin. Each subcommand parses its flags and calls
the library functions that do the work."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

DESCRIPTION = """\
transduce: the Transformer of "Attention Is All You Need" (Vaswani et al., 2017).

Data flows one way: text -> vocabulary -> token arrays -> batches -> model -> search -> text.

subcommands:
  info        show a preset's configuration (Table 3 knobs) and its parameter count
  prepare     learn a BPE vocabulary and binarize parallel text (a named dataset or your files)
  train       train on prepared data: Adam + equation 3, label smoothing, token-budget batches,
              bf16/fp16, gradient accumulation, checkpoints, exact resume, DDP via torchrun
  average     average the last K checkpoints of a run into one model (the paper: 5 / 20)
  translate   translate a file or stdin line for line: beam 4, alpha 0.6, input + 50 (6.1)
  evaluate    score translations: sacreBLEU + chrF, the paper's tokenized compound-split BLEU,
              and Multi30k's lowercased tokenized BLEU
  synthetic   train a small model on a copy/reverse task and report greedy exact match:
              a one- to two-minute end-to-end check that masks, shifting and decoding fit together

Run `transduce SUBCOMMAND --help` for the options of each.
"""


def _add_info(sub: argparse._SubParsersAction) -> None:
    from .config import PRESETS

    p = sub.add_parser(
        "info",
        help="show a preset's configuration and parameter count",
        description="Print a preset's model and training configuration and its parameter count. "
        "Presets: the paper's base and big, and every row of Table 3 (table3-A1 ... table3-E).",
    )
    p.add_argument("--preset", default="base", choices=sorted(PRESETS), metavar="NAME",
                   help="preset name (default: base); one of: " + ", ".join(PRESETS))
    p.add_argument("--vocab-size", type=int, default=None,
                   help="shared vocabulary size (default: the preset's, 37000 as in the paper)")
    p.add_argument("--set", action="append", default=[], metavar="SECTION.FIELD=VALUE",
                   help="override a field, e.g. --set model.n_layers=3 (repeatable)")
    p.add_argument("--all", action="store_true", help="print a table of every preset's parameter count")
    p.set_defaults(func=_run_info)


def _run_info(args: argparse.Namespace) -> int:
    import torch

    from .config import PRESETS, TABLE3_PARAMS_M, apply_overrides, get_preset
    from .model import Transformer, count_parameters

    def build(name: str):
        config = get_preset(name)
        if args.vocab_size is not None:
            config.model.src_vocab_size = args.vocab_size
        config = apply_overrides(config, args.set)
        with torch.device("meta"):  # count parameters without allocating them
            n = count_parameters(Transformer(config.model))
        return config, n

    try:
        if args.all:
            print(f"{'preset':<12} {'N':>2} {'d_model':>7} {'d_ff':>5} {'h':>3} {'d_k':>4} {'d_v':>4} "
                  f"{'P_drop':>6} {'eps_ls':>6} {'positions':>10} {'params':>9} {'Table 3':>8}")
            for name in PRESETS:
                c, n = build(name)
                m, t = c.model, c.train
                paper = TABLE3_PARAMS_M.get(name)
                print(f"{name:<12} {m.n_layers:>2} {m.d_model:>7} {m.d_ff:>5} {m.n_heads:>3} {m.head_dim_k:>4} "
                      f"{m.head_dim_v:>4} {m.dropout:>6} {t.label_smoothing:>6} {m.positional:>10} "
                      f"{n / 1e6:>8.1f}M {f'{paper}M' if paper else '-':>8}")
            return 0
        config, n = build(args.preset)
    except ValueError as e:
        print(f"transduce info: error: {e}", file=sys.stderr)
        return 2
    print(f"preset: {args.preset}")
    print(config.to_json())
    paper = TABLE3_PARAMS_M.get(args.preset)
    print(f"parameters: {n:,} ({n / 1e6:.1f}M)" + (f"; Table 3: {paper}M" if paper else ""))
    return 0


def _add_synthetic(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "synthetic",
        help="end-to-end check (a minute or two) on a copy/reverse task",
        description="Train a small Transformer (N=2, d_model=128) on random sequences of 1-10 symbols "
        "to copy or reverse, until greedy decoding gets 500 development sequences right, then "
        "greedy-decode 500 held-out sequences and report exact match.",
    )
    p.add_argument("--task", choices=["copy", "reverse"], default="reverse")
    p.add_argument("--max-steps", type=int, default=3000,
                   help="at most this many training steps; training stops earlier once greedy decoding "
                   "gets every development sequence right (checked every 100 steps) (default: 3000)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--save", metavar="DIR", help="save the trained model (safetensors + config.json)")
    p.set_defaults(func=_run_synthetic)


def _run_synthetic(args: argparse.Namespace) -> int:
    from .synthetic import train_synthetic

    model, r = train_synthetic(args.task, max_steps=args.max_steps, seed=args.seed, progress=sys.stderr.isatty())
    print(f"task={r.task} steps={r.steps} train_time={r.seconds:.1f}s loss={r.final_loss:.4f} "
          f"dev_exact_match={r.dev_exact_match:.1%} exact_match={r.exact_match:.1%} on {r.n_eval} held-out sequences")
    if args.save:
        from .checkpoint import save_model
        from .config import Config

        save_model(model, Config(model=model.config), args.save)
        print(f"saved to {args.save}")
    return 0


def _add_prepare(sub: argparse._SubParsersAction) -> None:
    from .data import prepare

    p = sub.add_parser(
        "prepare",
        help="learn a BPE vocabulary and binarize parallel text",
        description=prepare.__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    prepare.add_args(p)
    p.set_defaults(func=prepare.run)


def _add_average(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "average",
        help="average the last K checkpoints of a run (6.1)",
        description="Checkpoint averaging (Section 6.1): \"For the base models, we used a single model obtained by "
        "averaging the last 5 checkpoints, which were written at 10-minute intervals. For the big models, we "
        "averaged the last 20 checkpoints.\" Writes a model directory (model.safetensors + config.json); the mean "
        "is taken in float64 and rounded once. A checkpoint forced off the run's interval (its end) is left out.",
        epilog="examples:\n  transduce average runs/base --last 5            -> runs/base/avg_last5/\n"
        "  transduce average runs/big --last 20 --out runs/big/eval-model",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("run_dir", type=Path, metavar="RUN_DIR", help="a `transduce train` run directory")
    p.add_argument("--last", type=int, metavar="K",
                   help="average the last K checkpoints (default: the run's train.average_last: 5 base, 20 big)")
    p.add_argument("--out", type=Path, metavar="DIR", help="output model directory (default: RUN_DIR/avg_lastK)")
    p.set_defaults(func=_run_average)


def _run_average(args: argparse.Namespace) -> int:
    from .checkpoint import average_checkpoints, default_average, guarded, last_checkpoints, save_tensors_as_model

    try:
        if not args.run_dir.is_dir():
            raise FileNotFoundError(f"{args.run_dir}: no such run directory")
        k = args.last if args.last is not None else (default_average(args.run_dir) or 5)
        paths = last_checkpoints(args.run_dir, k)
        tensors, config = guarded(average_checkpoints, paths)
        out = save_tensors_as_model(tensors, config, args.out or args.run_dir / f"avg_last{k}")
    except (FileNotFoundError, ValueError) as e:
        print(f"transduce average: error: {e}", file=sys.stderr)
        return 2
    print(f"averaged {len(paths)} checkpoints ({paths[0].name} ... {paths[-1].name}) into {out}")
    return 0


def _add_module_command(sub: argparse._SubParsersAction, name: str, module, help: str) -> None:
    """A subcommand whose flags and behaviour live in `module` (add_args / run)."""
    p = sub.add_parser(name, help=help, description=module.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    module.add_args(p)
    p.set_defaults(func=module.run)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="transduce", description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    from . import __version__

    parser.add_argument("--version", action="version", version=f"transduce {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="SUBCOMMAND")
    from . import evaluate, translate
    from .train import trainer

    _add_info(sub)
    _add_prepare(sub)
    _add_module_command(sub, "train", trainer, "train a model on prepared data (Section 5; torchrun for many GPUs)")
    _add_average(sub)
    _add_module_command(sub, "translate", translate, "translate text with a trained model (beam search, 6.1)")
    _add_module_command(sub, "evaluate", evaluate, "BLEU in every convention: sacreBLEU, chrF, the paper's, Multi30k's")
    _add_synthetic(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
