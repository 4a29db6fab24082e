"""`transduce export`: a trained model as a CTranslate2 or Hugging Face MarianMT directory, or a
MarianMT directory back as a transduce model directory.

    transduce export ct2 runs/m30k -o m30k-ct2                       # float32, exact
    transduce export ct2 runs/m30k -o m30k-ct2-int8 --quantization int8
    transduce export marian runs/m30k -o m30k-marian                 # MarianMTModel + MarianTokenizer
    transduce export from-marian m30k-marian -o m30k-back            # a transduce model directory

MODEL is what `transduce translate` takes (a run directory: the average of its last checkpoints;
a model directory, with its vocabulary found beside it or given with --vocab).

ct2: a CTranslate2 model directory (model.bin, vocabulary, config) written through
`ctranslate2.specs.TransformerSpec` by transduce's own converter, with the paper's interleaved
sinusoids as an explicit position table (CTranslate2's own table puts sin and cos in halves), the
sentencepiece model(s) and transduce.json beside it. Run it with `transduce translate --engine ct2
DIR` or `transduce serve --engine ct2 DIR`, or with ctranslate2.Translator directly (sources as
sentencepiece pieces; it adds the EOS). Note that CTranslate2's own beam search divides by
|Y|^alpha, not the paper's ((5+|Y|)/6)^alpha: see docs/export.md.

marian: a directory that `MarianMTModel.from_pretrained` and `MarianTokenizer.from_pretrained`
load offline. Marian puts the sinusoids' sin and cos in two halves; the export permutes the hidden
dimension of every weight so that the model computes the same function. Post-norm, sinusoidal
models with d_k = d_v = d_model / h only (what Marian can express).

from-marian: the inverse (bitwise identical after a round trip); writes model.safetensors +
config.json and the vocabulary (spm.model, or data.json with spm.src.model and spm.tgt.model).
MODEL must be a MarianMT directory (config.json with model_type "marian", source.spm, target.spm,
vocab.json); anything else is refused in one line saying what it is.

Needs `pip install 'transduce[ct2]'` (ctranslate2) or `pip install 'transduce[hf]'` (transformers).
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

HELP = "export a model to CTranslate2 or Hugging Face MarianMT (and import MarianMT back)"
DESCRIPTION = __doc__
FORMATS = ("ct2", "marian", "from-marian")


def add_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("format", choices=FORMATS, metavar="FORMAT",
                        help="ct2 (CTranslate2), marian (Hugging Face MarianMT) or from-marian (MarianMT -> transduce)")
    parser.add_argument("model_path", type=Path, metavar="MODEL",
                        help="a run directory or model directory (for from-marian: a MarianMT directory)")
    parser.add_argument("--out", "-o", type=Path, required=True, metavar="DIR", help="the directory to write")
    parser.add_argument("--force", action="store_true", help="replace DIR if it exists (refused where DIR is or holds the model or vocabulary being exported)")
    parser.add_argument("--quantization", choices=("float32", "int8", "int8_float32"),
                        help="ct2 only: weight type (default float32: exact; int8: int8 weights and products where "
                             "the CPU has them; int8_float32: int8 weights, float32 products)")
    parser.add_argument("--max-positions", type=int, metavar="N",
                        help="rows of the position table (ct2 default 1536; marian default 1024): the longest "
                             "source (with EOS) and the longest output")
    g = parser.add_argument_group("model", "ct2 and marian only (from-marian reads one MarianMT directory)")
    g.add_argument("--checkpoint", metavar="NAME|PATH", help="one checkpoint of the run, unaveraged")
    g.add_argument("--average", type=int, metavar="K", help="average the last K checkpoints of the run")
    g.add_argument("--vocab", type=Path, metavar="SPM_MODEL", help="shared sentencepiece model (default: found beside the model)")
    g.add_argument("--src-vocab", type=Path, metavar="SPM_MODEL", help="separate source vocabulary")
    g.add_argument("--tgt-vocab", type=Path, metavar="SPM_MODEL", help="separate target vocabulary")


def run(args: argparse.Namespace) -> int:
    from ..extras import require

    if args.max_positions is not None and args.max_positions < 2:
        raise ValueError("--max-positions must be at least 2")
    _check_options_apply(args)
    if args.out.name in ("", ".", ".."):  # the current directory or a parent: never replaced whole
        from ..errors import UsageError

        raise UsageError(f"--out {args.out}: name the new directory to write (not . or ..)")
    if args.out.exists() and not args.force:
        raise FileExistsError(f"{args.out}: exists (use --force to replace it)")
    _check_not_replacing_inputs(args)
    if args.format == "from-marian":
        require("transformers", "from-marian")
        return _from_marian(args)
    require("ctranslate2" if args.format == "ct2" else "transformers", f"export {args.format}")
    from ..translate import load_translation_model

    loaded = load_translation_model(args.model_path, checkpoint=args.checkpoint, average=args.average, vocab=args.vocab,
                                    src_vocab=args.src_vocab, tgt_vocab=args.tgt_vocab, device="cpu")
    if args.format == "ct2":
        from ..export.ct2 import export_ct2

        out = export_ct2(loaded.model, loaded.config, loaded.src_vocab, loaded.tgt_vocab, args.out,
                         quantization=args.quantization or "float32", max_positions=args.max_positions, force=args.force,
                         description=loaded.description)
        print(f"wrote {out}: CTranslate2 ({args.quantization or 'float32'}) of {loaded.description}")
    else:
        from ..export.marian import DEFAULT_MAX_POSITIONS, export_marian

        _quiet_transformers()
        out = export_marian(loaded.model, loaded.config, loaded.src_vocab, loaded.tgt_vocab, args.out,
                            max_positions=args.max_positions or DEFAULT_MAX_POSITIONS, force=args.force,
                            description=loaded.description)
        print(f"wrote {out}: MarianMT of {loaded.description}")
    return 0


def _check_options_apply(args: argparse.Namespace) -> None:
    """One line for an option the format does not use (an `export marian --quantization int8`
    would otherwise write a float32 model without a word)."""
    from ..errors import UsageError

    given = {"--quantization": args.quantization, "--max-positions": args.max_positions,
             "--checkpoint": args.checkpoint, "--average": args.average, "--vocab": args.vocab,
             "--src-vocab": args.src_vocab, "--tgt-vocab": args.tgt_vocab}
    unused = {"ct2": (), "marian": ("--quantization",), "from-marian": tuple(given)}[args.format]
    for flag in unused:
        if given[flag] is not None:
            raise UsageError(f"{flag} does not apply to `export {args.format}`")


def _check_not_replacing_inputs(args: argparse.Namespace) -> None:
    """`--force` replaces --out whole: refuse where --out is (or holds) the model being exported
    (a run directory's model/ and checkpoints/ included) or its vocabulary, which the replacement
    would delete."""
    from ..errors import UsageError

    if not args.out.exists():
        return
    out = args.out.resolve()
    inputs = [("MODEL", args.model_path), ("MODEL", args.model_path / "model"), ("MODEL", args.model_path / "checkpoints"),
              ("--checkpoint", Path(args.checkpoint) if args.checkpoint else None), ("--vocab", args.vocab),
              ("--src-vocab", args.src_vocab), ("--tgt-vocab", args.tgt_vocab)]
    for name, path in inputs:
        if path is not None and path.exists() and (out == path.resolve() or out in path.resolve().parents):
            raise UsageError(f"--out {args.out}: is or holds {name} {path}, which --force would delete; write the "
                             f"export elsewhere")


def _quiet_transformers() -> None:
    import transformers

    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()


def _from_marian(args: argparse.Namespace) -> int:
    from ..checkpoint import atomic_dir
    from ..export.marian import import_marian

    _quiet_transformers()
    model, config, sv, tv = import_marian(args.model_path)
    with atomic_dir(args.out) as out:  # renamed into place at the end
        _write_model_dir(model, config, sv, tv, out)
    print(f"wrote {args.out}: transduce model directory from {args.model_path}")
    return 0


def _write_model_dir(model, config, sv, tv, out: Path) -> None:
    from ..checkpoint import save_model

    save_model(model, config, out)
    if sv is tv:
        shutil.copy(sv.path, out / "spm.model")
    else:
        shutil.copy(sv.path, out / "spm.src.model")
        shutil.copy(tv.path, out / "spm.tgt.model")
        meta = {"format": 1, "special_ids": {"pad": 0, "unk": 1, "bos": 2, "eos": 3},
                "vocab": {"shared": False, "files": {"src": "spm.src.model", "tgt": "spm.tgt.model"},
                          "size": {"src": len(sv), "tgt": len(tv)}}}
        (out / "data.json").write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")
