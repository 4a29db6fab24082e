"""`transduce translate`: text in, translations out, line for line (Section 6.1), through
`transduce.decoding.translate.translate_stream` (or a CTranslate2 export's); details: docs/decoding.md."""

from __future__ import annotations

import argparse
import contextlib
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterable

from .common import (
    LineStreams,
    check_decoding_args,
    decoding_options,
    exit_on_sigterm,
    fill_model_search_defaults,
    library_length_penalty,
    load_from_args,
    model_default,
    to_file,
    warner,
)
from ..defaults import ALPHA, BATCH_SIZE, BEAM, MAX_LEN_OFFSET
from .options import add_decoding_args, add_line_args, add_quiet, epilog

if TYPE_CHECKING:  # the library that imports PyTorch: imported by `run`, not by the flags (--help)
    from ..decoding.streaming import Candidate

DESCRIPTION = """\
Translate one sentence per line, --input (or stdin) to --out (or stdout), as many
lines out as in; beam search as in Section 6.1 (an imported model: as its own
generate by default). MODEL: a run directory (the average of its last checkpoints)
or a model directory.
details: transduce docs decoding (and precision)"""
EPILOG = epilog(
    "transduce translate runs/base < newstest2014.en > hyp.de",
    "transduce translate runs/base -i test.en.gz -o hyp.de --checkpoint latest",
    "transduce translate model_dir --vocab spm.model --n-best 4",
    "transduce translate runs/base --file report.docx   # writes report.de.docx",
)
PROG = "transduce translate"


def add_args(parser: argparse.ArgumentParser) -> None:
    """The options of `transduce translate`."""
    g = add_line_args(parser, "a run directory or a model directory", "translations")
    add_quiet(g, "no progress bar, no notes")
    g.add_argument("--file", "-f", type=Path, metavar="DOC", help="a document: docx pptx odt html srt txt epub")
    g.add_argument(
        "--engine",
        choices=("torch", "ct2"),
        default="torch",
        metavar="E",
        help="torch or ct2 (an `export ct2` dir; default torch)",
    )
    g.add_argument("--ct2-compute-type", metavar="TYPE", help="ct2: its precision (default: the exported)")
    decoding = add_decoding_args(parser, beam=BEAM, alpha=ALPHA, max_len_offset=MAX_LEN_OFFSET, batch_size=BATCH_SIZE)
    parser.set_defaults(
        beam=model_default(BEAM),
        length_penalty=model_default("gnmt"),  # an imported
        alpha=model_default(ALPHA),
    )  # model's own replace them (fill_model_search_defaults)
    decoding.add_argument("--n-best", type=int, metavar="K", help="the K best per line, as TSV (default: the best)")
    g.add_argument(
        "--split-sentences",
        choices=SPLIT_MODES,
        default="off",
        metavar="S",
        help="on: each of a line's sentences alone (default off)",
    )
    decoding.add_argument(
        "--shortlist", nargs="?", const="", metavar="FILE", help="faster, not exact (default MODEL's)"
    )


SPLIT_MODES = ("on", "off", "nonewlines")
"""--split-sentences: `transduce.text.sentences.MODES` (DeepL's split_sentences 1, 0, "nonewlines")."""

ENGINE_PENALTIES = {"torch": ("gnmt", "hf", "none"), "ct2": ("gnmt", "ct2", "none")}
"""The --length-penalty formulas each engine decodes with (gnmt with ct2: its hypotheses re-ranked)."""

CT2_COMPUTE_TYPES = {"fp32": "float32", "bf16": "bfloat16", "int8": "int8"}
"""--precision (--bf16, --int8) with --engine ct2: the CTranslate2 compute type it stands for."""


def check_args(args: argparse.Namespace) -> None:
    """Refuse, before anything loads, flags that cannot work together or an unwritable output."""
    check_decoding_args(args)
    if args.engine == "ct2" and args.precision != "auto":
        compute_type = CT2_COMPUTE_TYPES.get(args.precision)
        if compute_type is None:
            raise ValueError(
                f"--precision {args.precision} does not apply to --engine ct2: choose CTranslate2's "
                "precision with --ct2-compute-type (int8, float32, bfloat16, ...)"
            )
        if args.ct2_compute_type not in (None, compute_type):
            raise ValueError(
                f"--precision {args.precision} is --ct2-compute-type {compute_type}, not "
                f"{args.ct2_compute_type}: give one of them"
            )
        args.ct2_compute_type = compute_type
    args.penalty = library_length_penalty(args, f"--engine {args.engine}", ENGINE_PENALTIES[args.engine])
    if args.engine != "ct2" and args.ct2_compute_type is not None:
        raise ValueError("--ct2-compute-type applies to --engine ct2 only")
    if args.n_best is not None:
        if args.greedy and args.n_best != 1:
            raise ValueError("--greedy gives one hypothesis per line: --n-best must be 1")
        if not args.greedy and not 1 <= args.n_best <= args.beam:
            raise ValueError(f"--n-best must be between 1 and --beam ({args.beam})")
    if args.file is not None:
        for flag in ("input", "n_best"):
            if getattr(args, flag) is not None:
                raise ValueError(f"--{flag.replace('_', '-')} does not apply to --file (a document in, a document out)")
    if args.split_sentences != "off" and args.n_best is not None:
        raise ValueError(
            "--n-best gives a line's own hypotheses: with --split-sentences on, a line is several sentences"
        )
    if to_file(args.out):
        from ..checkpoint.files import check_output

        check_output(args.out)


def run(args: argparse.Namespace) -> int:
    """Translate --input (or stdin) into --out (or stdout). An error leaves no output file."""
    from tqdm import tqdm

    from ..decoding import translate

    warn = warner(PROG)
    fill_model_search_defaults(args)
    check_args(args)
    shortlist = _shortlist(args)
    if args.file is not None:
        return _run_file(args, warn, shortlist)
    with exit_on_sigterm(PROG), LineStreams(args) as streams, contextlib.ExitStack() as stack:
        loaded = load_from_args(args) if args.engine == "torch" else _load_ct2(args)
        if not args.quiet:
            print(f"{PROG}: model {loaded.description}", file=sys.stderr)
            print(f"{PROG}: {loaded.precision.line()}", file=sys.stderr)
            if shortlist is not None:
                print(f"{PROG}: {shortlist.describe()}", file=sys.stderr)
            if args.engine != "ct2" and not streams.interactive:
                print(f"{PROG}: {loaded.workers_line}", file=sys.stderr)
        if loaded.precision.warning:
            warn(loaded.precision.warning)
        write, flush = streams.output()
        bar = None
        if to_file(args.input) and not args.quiet and sys.stderr.isatty():
            bar = stack.enter_context(
                tqdm(total=_count_lines(Path(args.input)), desc="translate", unit=" lines", mininterval=1)
            )
        split = args.split_sentences != "off"
        options = dict(
            streams.options(),
            n_best=args.n_best or 1,
            warn=warn,
            shortlist=shortlist,
            advance=bar.update if bar is not None and not split else None,
        )

        def decode(lines):
            return translate.translate_stream(
                _model(args, loaded), loaded.src_vocab, loaded.tgt_vocab, lines, **options, length_penalty=args.penalty
            )

        stream = _split_lines(args, decode, streams.lines(), bar) if split else decode(streams.lines())
        _write(stream, args.n_best, write, flush if streams.interactive else None)
        flush()
        streams.commit()
    return 0


def _split_lines(args: argparse.Namespace, decode, lines, bar):
    """--split-sentences on: each line's sentences (`transduce.text.sentences`, the model's source
    language as its data.json names it, else English's rules) decoded as one stream, each line
    joined again with its own spaces; a candidate per line."""
    from types import SimpleNamespace

    from ..text.sentences import translate_lines_split
    from .common import model_metadata

    meta = (model_metadata(args.model_path) or {}) if args.engine == "torch" else {}
    texts = translate_lines_split(
        lambda sentences: (cands[0].text for cands in decode(sentences)),
        lines,
        meta.get("src_lang") or "en",
        args.split_sentences,
        bar.update if bar is not None else None,
    )
    return ([SimpleNamespace(text=t)] for t in texts)


def _shortlist(args: argparse.Namespace):
    """--shortlist [FILE]: the shortlist `transduce shortlist` wrote (FILE, else MODEL's), read
    before the model loads; None without the flag."""
    if args.shortlist is None:
        return None
    from ..decoding.shortlist import FILE, Shortlist

    return Shortlist.load(Path(args.shortlist) if args.shortlist else Path(args.model_path) / FILE)


def _run_file(args: argparse.Namespace, warn, shortlist=None) -> int:
    """--file: the document read (an unknown or broken file refused before the model loads), its
    sentences translated as one batch, its tags placed by the model's attention (with --engine
    ct2, which gives none, in proportion), written to --out whole or not at all."""
    from ..decoding import translate
    from ..documents import Translator, format_of, output_name, read, translate_document
    from .attention import write_bytes
    from .common import model_metadata

    doc = read(args.file.read_bytes(), format_of(args.file), str(args.file))
    meta = (model_metadata(args.model_path) or {}) if args.engine == "torch" else {}
    out = args.out or output_name(args.file, meta.get("tgt_lang"))
    loaded = load_from_args(args) if args.engine == "torch" else _load_ct2(args)
    if not args.quiet:
        print(f"{PROG}: model {loaded.description}", file=sys.stderr)
        print(f"{PROG}: {args.file} to {out}", file=sys.stderr)

    def batch(sentences: list[str]) -> list[str]:
        from tqdm import tqdm

        options = dict(
            decoding_options(args),
            warn=warn,
            source_name=str(args.file),
            length_penalty=args.penalty,
            shortlist=shortlist,
        )
        with tqdm(
            total=len(sentences),
            desc="translate",
            unit=" sentences",
            mininterval=1,
            disable=args.quiet or not sys.stderr.isatty(),
        ) as bar:
            stream = translate.translate_stream(
                _model(args, loaded), loaded.src_vocab, loaded.tgt_vocab, sentences, **options, advance=bar.update
            )
            return [cands[0].text for cands in stream]

    align = None
    if args.engine == "torch":
        from ..text.align import AttentionAligner

        align = AttentionAligner(loaded.model, loaded.src_vocab, loaded.tgt_vocab).align
    write_bytes(out, translate_document(doc, Translator(batch, align), meta.get("src_lang") or "en"))
    return 0


def _model(args: argparse.Namespace, loaded):
    """What `translate_stream` decodes with: the PyTorch model, or the CTranslate2 export itself."""
    return loaded if args.engine == "ct2" else loaded.model


def _load_ct2(args: argparse.Namespace):
    """--engine ct2: the exported CTranslate2 model (`transduce.decoding.engines.load_ct2`)."""
    from ..decoding.engines import load_ct2

    for flag in ("checkpoint", "average", "vocab", "src_vocab", "tgt_vocab"):
        if getattr(args, flag) is not None:
            raise ValueError(
                f"--{flag.replace('_', '-')} does not apply to --engine ct2 (the directory holds one model "
                "and its vocabulary)"
            )
    args.bf16 = False
    if args.workers == "auto":
        args.workers = 1  # CTranslate2 decodes in its own worker
    return load_ct2(
        args.model_path, device=args.device, compute_type=args.ct2_compute_type or "default", threads=args.threads or 0
    )


def _write(
    stream: Iterable[list[Candidate]],
    n_best: int | None,
    write: Callable[[bytes], None],
    flush: Callable[[], None] | None,
) -> None:
    """One line per input line (the best text), or with `n_best` the TSV lines of the N-best
    output; `flush` after each input line, if given (an interactive session)."""
    for line_no, cands in enumerate(stream, start=1):
        if n_best is None:
            write((cands[0].text + "\n").encode("utf-8"))
        else:
            for rank, c in enumerate(cands, start=1):
                write(f"{line_no}\t{rank}\t{c.score:.6f}\t{c.logprob:.6f}\t{c.text}\n".encode("utf-8"))
        if flush is not None:
            flush()


def _count_lines(path: Path) -> int | None:
    """Lines of a plain file (for the progress bar's total); None for gzip."""
    with open(path, "rb") as f:
        if f.read(2) == b"\x1f\x8b":
            return None
        f.seek(0)
        n, last = 0, b"\n"
        for block in iter(lambda: f.read(1 << 20), b""):
            n += block.count(b"\n")
            last = block[-1:]
    return n + (last != b"\n")
