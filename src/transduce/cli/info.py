"""`transduce info`: a preset's configuration and parameter count, or the table of every preset."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from ..errors import UsageError
from .options import epilog

if TYPE_CHECKING:  # the library: imported by `run`, not by the flags (--help answers at once)
    from ..config import Config

DESCRIPTION = """\
Print a preset's model and training configuration and its parameter count, or with
--all a table of every preset (the paper's base and big, every row of Table 3, ...).
details: transduce docs cli info"""
EPILOG = epilog(
    "transduce info --preset big",
    "transduce info --all --vocab-size 8000",
    "transduce info --preset multi30k --data data/m30k --set model.n_layers=3",
)


def add_args(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("arguments")
    g.add_argument("--preset", default="base", metavar="NAME", help="a preset (default base; --all lists them)")
    g.add_argument(
        "--vocab-size", type=int, default=None, metavar="N", help="source vocabulary, shared (default: the preset's)"
    )
    g.add_argument(
        "--tgt-vocab-size", type=int, default=None, metavar="N", help="a separate target vocabulary (default: shared)"
    )
    g.add_argument("--data", metavar="DIR", help="both sizes from `transduce prepare` output")
    g.add_argument(
        "--set", action="append", default=[], metavar="S.F=V", help="override a field, e.g. model.n_layers=3"
    )
    g.add_argument("--all", action="store_true", help="a table of every preset's parameters")


def _build(name: str, args: argparse.Namespace) -> tuple[Config, int]:
    """The preset with the flags' changes, and its parameter count."""
    from ..config import apply_overrides, get_preset
    from ..serve.backend import parameter_count

    if args.data is not None:
        from ..data.batching import read_metadata
        from ..train.setup import config_for_data

        if args.vocab_size is not None or args.tgt_vocab_size is not None:
            raise UsageError("--data gives the vocabulary sizes: no --vocab-size or --tgt-vocab-size with it")
        config = config_for_data(name, args.set, read_metadata(args.data))
    else:
        config = get_preset(name)
        if args.vocab_size is not None:
            config.model.src_vocab_size = args.vocab_size
        if args.tgt_vocab_size is not None:
            config.model.tgt_vocab_size, config.model.share_embeddings = args.tgt_vocab_size, False
        config = apply_overrides(config, args.set)
    return config, parameter_count(config)


def vocabulary(config: Config) -> str:
    """The vocabulary a count assumes, in words."""
    m = config.model
    if m.tgt_vocab_size is None:
        return f"a shared vocabulary of {m.src_vocab_size:,}"
    return f"vocabularies of {m.src_vocab_size:,} (source) and {m.target_vocab_size:,} (target)"


def run(args: argparse.Namespace) -> int:
    from ..config import PRESETS, TABLE3_PARAMS_M

    if args.all:
        print(
            f"parameters at {vocabulary(_build('base', args)[0])}, for every preset "
            "(--vocab-size, --tgt-vocab-size or --data for yours)"
        )
        print(
            f"{'preset':<12} {'N':>2} {'d_model':>7} {'d_ff':>5} {'h':>3} {'d_k':>4} {'d_v':>4} "
            f"{'P_drop':>6} {'eps_ls':>6} {'positions':>10} {'params':>9} {'Table 3':>8}"
        )
        for name in PRESETS:
            c, n = _build(name, args)
            m, t = c.model, c.train
            paper = TABLE3_PARAMS_M.get(name)
            print(
                f"{name:<12} {m.n_layers:>2} {m.d_model:>7} {m.d_ff:>5} {m.n_heads:>3} {m.head_dim_k:>4} "
                f"{m.head_dim_v:>4} {m.dropout:>6} {t.label_smoothing:>6} {m.positional:>10} "
                f"{n / 1e6:>8.1f}M {f'{paper}M' if paper else '-':>8}"
            )
        return 0
    config, n = _build(args.preset, args)
    print(f"preset: {args.preset}")
    print(config.to_json())
    paper = TABLE3_PARAMS_M.get(args.preset)
    print(f"parameters: {n:,} ({n / 1e6:.1f}M) at {vocabulary(config)}" + (f"; Table 3: {paper}M" if paper else ""))
    return 0
