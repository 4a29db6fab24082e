"""`transduce synthetic`: the end-to-end check on a copy/reverse task (`transduce.synthetic`)."""

from __future__ import annotations

import argparse
import sys

from .options import epilog

DESCRIPTION = """\
Train a small Transformer (N=2, d_model=128) to copy or reverse random sequences, then
greedy-decode 500 held-out ones: the check passes (exit status 0) at >= 99% exact match,
else fails (1, saying why): an end-to-end check of masks, shifting and decoding.
details: transduce docs cli synthetic"""
EPILOG = epilog(
    "transduce synthetic",
    "transduce synthetic --task copy --max-steps 5000 -o models/copy",
)

PASS = 0.99
"""Held-out exact match at which the check passes: masks, shifting and decoding fit together."""


def add_args(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("arguments")
    g.add_argument(
        "--task", choices=["copy", "reverse"], default="reverse", metavar="T", help="copy or reverse (default reverse)"
    )
    g.add_argument(
        "--max-steps",
        type=int,
        default=3000,
        metavar="N",
        help="at most N steps, fewer once dev is all right (default 3000)",
    )
    g.add_argument("--seed", type=int, default=0, help="seed (default 0)")
    g.add_argument("--out", "-o", metavar="DIR", help="save the trained model (a model directory)")


def run(args: argparse.Namespace) -> int:
    from ..synthetic import train_synthetic

    model, r = train_synthetic(args.task, max_steps=args.max_steps, seed=args.seed, progress=sys.stderr.isatty())
    print(
        f"task={r.task} steps={r.steps} train_time={r.seconds:.1f}s loss={r.final_loss:.4f} "
        f"dev_exact_match={r.dev_exact_match:.1%} exact_match={r.exact_match:.1%} on {r.n_eval} held-out sequences"
    )
    if args.out:
        from ..checkpoint import save_model
        from ..config import Config

        save_model(model, Config(model=model.config), args.out)
        print(f"saved to {args.out}")
    if r.exact_match >= PASS:
        print(f"check passed: held-out exact match {r.exact_match:.1%} >= {PASS:.0%}")
        return 0
    why = (
        f"training stopped at --max-steps {args.max_steps} before every development sequence was right "
        f"({r.dev_exact_match:.1%}); give it more steps"
        if r.dev_exact_match < 1.0
        else "the development sequences were all right but held-out ones are not: the model does not generalise"
    )
    print(f"check FAILED: held-out exact match {r.exact_match:.1%} < {PASS:.0%}: {why}", file=sys.stderr)
    return 1
