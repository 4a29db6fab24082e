"""`transduce synthetic`: the end-to-end check on a copy/reverse task (`transduce.synthetic`)."""

from __future__ import annotations

import argparse
import sys

HELP = "end-to-end check (a minute or two) on a copy/reverse task"
DESCRIPTION = """\
Train a small Transformer (N=2, d_model=128) on random sequences of 1-10 symbols to copy or
reverse, until greedy decoding gets 500 development sequences right, then greedy-decode 500
held-out sequences and report exact match. The check passes at >= 99% held-out exact match
(exit status 0) and fails below it (exit status 1, saying why)."""

PASS = 0.99
"""Held-out exact match at which the check passes: masks, shifting and decoding fit together."""


def add_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--task", choices=["copy", "reverse"], default="reverse")
    parser.add_argument("--max-steps", type=int, default=3000,
                        help="at most this many training steps; training stops earlier once greedy decoding "
                        "gets every development sequence right (checked every 100 steps) (default: 3000)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--save", metavar="DIR", help="save the trained model (safetensors + config.json)")


def run(args: argparse.Namespace) -> int:
    from ..synthetic import train_synthetic

    model, r = train_synthetic(args.task, max_steps=args.max_steps, seed=args.seed, progress=sys.stderr.isatty())
    print(f"task={r.task} steps={r.steps} train_time={r.seconds:.1f}s loss={r.final_loss:.4f} "
          f"dev_exact_match={r.dev_exact_match:.1%} exact_match={r.exact_match:.1%} on {r.n_eval} held-out sequences")
    if args.save:
        from ..checkpoint import save_model
        from ..config import Config

        save_model(model, Config(model=model.config), args.save)
        print(f"saved to {args.save}")
    if r.exact_match >= PASS:
        print(f"check passed: held-out exact match {r.exact_match:.1%} >= {PASS:.0%}")
        return 0
    why = (f"training stopped at --max-steps {args.max_steps} before every development sequence was right "
           f"({r.dev_exact_match:.1%}); give it more steps" if r.dev_exact_match < 1.0 else
           "the development sequences were all right but held-out ones are not: the model does not generalise")
    print(f"check FAILED: held-out exact match {r.exact_match:.1%} < {PASS:.0%}: {why}", file=sys.stderr)
    return 1
