"""`transduce export`: a trained model as a CTranslate2 or Hugging Face MarianMT directory
(`transduce.export`; back from MarianMT: `transduce import`); what each format holds: docs/export.md."""

from __future__ import annotations

import argparse
from pathlib import Path

from ..errors import UsageError
from .options import add_model_args, epilog

DESCRIPTION = """\
Write MODEL (a run directory, averaged as translate loads it, or a model directory) as
a CTranslate2 directory (ct2) or a Hugging Face MarianMT one (marian), which `transduce
import` reads back. Needs 'transduce[ct2]' or 'transduce[hf]'.
details: transduce docs export"""
EPILOG = epilog(
    "transduce export ct2 runs/multi30k-en-de -o m30k-ct2 --quantization int8",
    "transduce export marian runs/multi30k-en-de -o m30k-marian",
)
FORMATS = ("ct2", "marian")


def add_args(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("arguments")
    g.add_argument("format", choices=FORMATS, metavar="FORMAT", help="ct2 or marian")
    g.add_argument("model_path", type=Path, metavar="MODEL", help="a run or model directory")
    g.add_argument("--out", "-o", type=Path, required=True, metavar="DIR", help="the directory to write")
    g.add_argument("--overwrite", action="store_true", help="replace DIR (never MODEL or its vocabulary)")
    g.add_argument(
        "--quantization",
        choices=("float32", "int8", "int8_float32"),
        metavar="Q",
        help="ct2: float32 (default, exact), int8, int8_float32",
    )
    g.add_argument("--max-positions", type=int, metavar="N", help="position table rows (default ct2 1536, marian 1024)")
    g = parser.add_argument_group("model")
    add_model_args(g)


def run(args: argparse.Namespace) -> int:
    from ..extras import require

    if args.max_positions is not None and args.max_positions < 2:
        raise ValueError("--max-positions must be at least 2")
    _check_options_apply(args)
    if args.out.name in ("", ".", ".."):  # the current directory or a parent: never replaced whole
        raise UsageError(f"--out {args.out}: name the new directory to write (not . or ..)")
    if args.out.exists() and not args.overwrite:
        raise FileExistsError(f"{args.out}: exists (use --overwrite to replace it)")
    _check_not_replacing_inputs(args)
    require("ctranslate2" if args.format == "ct2" else "transformers", f"export {args.format}")
    from ..decoding.ready import load_translation_model

    loaded = load_translation_model(
        args.model_path,
        checkpoint=args.checkpoint,
        average=args.average,
        vocab=args.vocab,
        src_vocab=args.src_vocab,
        tgt_vocab=args.tgt_vocab,
        device="cpu",
    )
    if args.format == "ct2":
        from ..export.ct2 import export_ct2

        out = export_ct2(
            loaded.model,
            loaded.config,
            loaded.src_vocab,
            loaded.tgt_vocab,
            args.out,
            quantization=args.quantization or "float32",
            max_positions=args.max_positions,
            force=args.overwrite,
            description=loaded.description,
        )
        print(f"wrote {out}: CTranslate2 ({args.quantization or 'float32'}) of {loaded.description}")
        from ..cpu import has_vnni

        if (args.quantization or "").startswith("int8") and not has_vnni():
            print(
                "note: this CPU has no VNNI: CTranslate2's int8 products saturate here, a trained model's "
                'quality holds but its scores move (docs/export.md, "int8 without VNNI")'
            )
    else:
        from ..export.marian import DEFAULT_MAX_POSITIONS, export_marian

        _quiet_transformers()
        out = export_marian(
            loaded.model,
            loaded.config,
            loaded.src_vocab,
            loaded.tgt_vocab,
            args.out,
            max_positions=args.max_positions or DEFAULT_MAX_POSITIONS,
            force=args.overwrite,
            description=loaded.description,
        )
        print(f"wrote {out}: MarianMT of {loaded.description}")
    return 0


def _check_options_apply(args: argparse.Namespace) -> None:
    """One line for an option the format does not use (an `export marian --quantization int8`
    would otherwise write a float32 model without a word)."""
    given = {
        "--quantization": args.quantization,
        "--max-positions": args.max_positions,
        "--checkpoint": args.checkpoint,
        "--average": args.average,
        "--vocab": args.vocab,
        "--src-vocab": args.src_vocab,
        "--tgt-vocab": args.tgt_vocab,
    }
    unused = {"ct2": (), "marian": ("--quantization",)}[args.format]
    for flag in unused:
        if given[flag] is not None:
            raise UsageError(f"{flag} does not apply to `export {args.format}`")


def _check_not_replacing_inputs(args: argparse.Namespace) -> None:
    """Refuse an --out that is (or holds) the model being exported or its vocabulary, which
    `--overwrite` would delete."""
    if not args.out.exists():
        return
    out = args.out.resolve()
    inputs = [
        ("MODEL", args.model_path),
        ("MODEL", args.model_path / "model"),
        ("MODEL", args.model_path / "checkpoints"),
        ("--checkpoint", Path(args.checkpoint) if args.checkpoint else None),
        ("--vocab", args.vocab),
        ("--src-vocab", args.src_vocab),
        ("--tgt-vocab", args.tgt_vocab),
    ]
    for name, path in inputs:
        if path is not None and path.exists() and (out == path.resolve() or out in path.resolve().parents):
            raise UsageError(
                f"--out {args.out}: is or holds {name} {path}, which --overwrite would delete; write the "
                f"export elsewhere"
            )


def _quiet_transformers() -> None:
    import transformers

    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
