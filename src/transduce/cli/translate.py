"""`transduce translate`: text in, translations out, line for line (Section 6.1's decoding).

    transduce translate runs/base < newstest2014.en > hyp.de
    transduce translate runs/base --input newstest2014.en.gz --output hyp.de --checkpoint latest
    transduce translate path/to/model_dir --vocab spm.model --beam 4 --alpha 0.6

MODEL is either

* a training run directory (`transduce train --run-dir`): its vocabulary comes from its
  data.json and the copied spm*.model files; the model is, as for the paper's Table 2 (6.1;
  Table 3's variations, 6.2, were measured without averaging), the average of its last checkpoints written at the checkpoint interval: as many as the
  run's train.average_last (5 base, 20 big), or all it has if fewer, computed in memory;
  `--average K` chooses K; `--checkpoint NAME|PATH` picks one checkpoint, unaveraged (a name
  under RUN_DIR/checkpoints such as step_0100000 or 100000, `latest`, `model` for the final
  weights, or any model directory); a run directory without checkpoints gives its model/; or
* a model directory (model.safetensors + config.json, e.g. RUN_DIR/checkpoints/step_*/ or the
  output of `transduce average`), with `--vocab SPM_MODEL` (or `--src-vocab/--tgt-vocab`);
  without them the vocabulary is looked for beside it (a data.json or spm.model in the
  directory, its parent or its grandparent).

Decoding is Section 6.1's: beam search with beam 4, length penalty alpha = 0.6 (GNMT's
((5+|Y|)/6)^alpha), maximum output length input length + 50 (`transduce.decode.beam_search`);
`--greedy` is the fast beam-1 path (`transduce.decode.greedy_decode`).

Input and output
----------------
One sentence per line (UTF-8, plain or gzip), from --input or stdin; one translation per line
to --output or stdout. Always as many lines out as in:

* an empty (or whitespace-only) line gives an empty line, without running the model;
* a line longer than the limit (--max-input-tokens subword tokens, default 1024; with learned
  positions also what the position table allows: max_positions - 1 - max_len_offset) is cut to
  the limit, with a warning on stderr naming the line;
* invalid UTF-8 is an error naming the file and line
  (``transduce translate: error: FILE:LINE: invalid UTF-8 ...``, exit status 2). --output is
  checked before the model loads (its directory exists and can be written to, it is not a
  directory), written to a temporary file beside it and renamed at the end, so an error,
  Ctrl-C or SIGTERM (exit status 130, 143) leaves no partial file and the old one as it was.
  As with the shell's ``>``, a symlink is followed (its target replaced, the link kept) and a
  name that is not a regular file (a FIFO, /dev/null, /dev/stdout) is written in place,
  streaming.

The input is streamed: read `--chunk-lines` lines (2000) at a time, each chunk sorted by length
and cut into batches of at most --batch-tokens padded source tokens and --batch-size sentences,
translated, put back in input order and written. Memory does not grow with the file.

N-best output (``--n-best K``): tab-separated lines, K per input line (fewer if the search
finished fewer; one line with an empty hypothesis for an empty input line), best first::

    LINE <TAB> RANK <TAB> SCORE <TAB> LOGPROB <TAB> TEXT

LINE is the 1-based input line number, RANK 1..K, SCORE is log P(Y|X) / lp(Y) (what the beam
ranks by), LOGPROB is log P(Y|X) including EOS, TEXT the detokenized hypothesis (tabs and line
breaks in it, which sentencepiece does not produce, would be replaced by spaces).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Callable, Iterable

from .. import translate
from ..data.text import iter_lines, open_text
from ..checkpoint.files import check_output
from ..translate import AtomicOutput, Candidate
from .common import (
    add_decoding_args, add_model_args, check_decoding_args, decoding_options, exit_on_sigterm, load_from_args,
)

HELP = "translate text with a trained model (beam search, 6.1)"
DESCRIPTION = __doc__
PROG = "transduce translate"


def add_args(parser: argparse.ArgumentParser) -> None:
    """The options of `transduce translate`."""
    parser.add_argument("model_path", type=Path, metavar="MODEL",
                        help="a training run directory, or a model directory (model.safetensors + config.json)")
    g = parser.add_argument_group("input and output")
    g.add_argument("--input", "-i", type=Path, metavar="FILE", help="sentences to translate, plain or .gz (default: stdin)")
    g.add_argument("--output", "-o", type=Path, metavar="FILE",
                   help="translations (default: stdout); written atomically (a FIFO or device in place), gzip "
                        "if FILE ends in .gz")
    g.add_argument("--n-best", type=int, metavar="K",
                   help="write the K best hypotheses per line as TSV: LINE, RANK, SCORE, LOGPROB, TEXT")
    g.add_argument("--quiet", "-q", action="store_true", help="no progress bar and no notes (warnings still shown)")
    g = parser.add_argument_group("engine")
    g.add_argument("--engine", choices=("torch", "ct2"), default="torch",
                   help="torch (default): transduce's own decoding; ct2: MODEL is a directory written by "
                        "`transduce export ct2`, decoded by CTranslate2 (pip install 'transduce[ct2]')")
    g.add_argument("--ct2-compute-type", metavar="TYPE",
                   help="ct2: CTranslate2's compute type, its precision (default: the exported one; int8, float32, "
                        "bfloat16, ...); --precision fp32, bf16, int8 (--bf16, --int8) stand for float32, bfloat16, "
                        "int8; --precision auto (the default) is the exported type; auto-int8 is refused")
    g.add_argument("--ct2-length-penalty", choices=("paper", "ct2"),
                   help="ct2: rank the beam's hypotheses by the paper's ((5+|Y|)/6)^alpha (default) or by CTranslate2's "
                        "|Y|^alpha (docs/export.md)")
    add_model_args(parser)
    add_decoding_args(parser)


CT2_COMPUTE_TYPES = {"fp32": "float32", "bf16": "bfloat16", "int8": "int8"}
"""--precision (--bf16, --int8) with --engine ct2: the CTranslate2 compute type it stands for."""


def _to_file(path: Path | None) -> bool:
    return path is not None and str(path) != "-"


def check_args(args: argparse.Namespace) -> None:
    """Refuse, before anything loads, flags that cannot work together and an output that
    cannot be written."""
    check_decoding_args(args)
    if args.engine == "ct2" and args.precision != "auto":
        compute_type = CT2_COMPUTE_TYPES.get(args.precision)
        if compute_type is None:
            raise ValueError(f"--precision {args.precision} does not apply to --engine ct2: choose CTranslate2's "
                             "precision with --ct2-compute-type (int8, float32, bfloat16, ...)")
        if args.ct2_compute_type not in (None, compute_type):
            raise ValueError(f"--precision {args.precision} is --ct2-compute-type {compute_type}, not "
                             f"{args.ct2_compute_type}: give one of them")
        args.ct2_compute_type = compute_type
    if args.engine != "ct2":
        for flag in ("ct2_compute_type", "ct2_length_penalty"):
            if getattr(args, flag) is not None:
                raise ValueError(f"--{flag.replace('_', '-')} applies to --engine ct2 only")
    if args.n_best is not None:
        if args.greedy and args.n_best != 1:
            raise ValueError("--greedy gives one hypothesis per line: --n-best must be 1")
        if not args.greedy and not 1 <= args.n_best <= args.beam:
            raise ValueError(f"--n-best must be between 1 and --beam ({args.beam})")
    if _to_file(args.output):
        check_output(args.output)


def run(args: argparse.Namespace) -> int:
    """Translate --input (or stdin) into --output (or stdout). An error leaves no output file."""
    from tqdm import tqdm

    def warn(msg: str) -> None:
        tqdm.write(f"{PROG}: warning: {msg}", file=sys.stderr)  # above the progress bar, if any

    check_args(args)
    out: AtomicOutput | None = None
    bar = infile = None
    with exit_on_sigterm(PROG):
        try:
            if _to_file(args.input):
                infile, name, interactive = open_text(args.input), str(args.input), False
            else:
                infile, name, interactive = sys.stdin.buffer, "<stdin>", sys.stdin.isatty()
            loaded = load_from_args(args) if args.engine == "torch" else _load_ct2(args)
            if not args.quiet:
                print(f"{PROG}: model {loaded.description}", file=sys.stderr)
                print(f"{PROG}: {loaded.precision.line()}", file=sys.stderr)
                if args.engine != "ct2" and not interactive:
                    print(f"{PROG}: {loaded.workers_line}", file=sys.stderr)
            if loaded.precision.warning:
                warn(loaded.precision.warning)
            if _to_file(args.output):
                out = AtomicOutput(args.output)
                write, flush = out.write, lambda: None
            else:
                write, flush = sys.stdout.buffer.write, sys.stdout.buffer.flush
            if _to_file(args.input) and not args.quiet and sys.stderr.isatty():
                bar = tqdm(total=_count_lines(Path(args.input)), desc="translate", unit=" lines", mininterval=1)
            options = dict(**{**decoding_options(args), "chunk_lines": 1 if interactive else args.chunk_lines,
                              "workers": 1 if interactive else args.workers},
                           n_best=args.n_best or 1, source_name=name, warn=warn, advance=bar.update if bar is not None else None)
            if args.engine == "ct2":
                stream = loaded.translate_stream(iter_lines(infile, name), **options,
                                                 length_penalty=args.ct2_length_penalty or "paper")
            else:
                stream = translate.translate_stream(loaded.model, loaded.src_vocab, loaded.tgt_vocab, iter_lines(infile, name),
                                                    **options)
            _write(stream, args.n_best, write, flush if interactive else None)
            flush()
            if out is not None:
                out.commit()
                out = None
        finally:
            if out is not None:
                out.discard()
            if bar is not None:
                bar.close()
            if infile is not None and infile is not sys.stdin.buffer:
                infile.close()
    return 0


def _load_ct2(args: argparse.Namespace):
    """--engine ct2: the exported CTranslate2 model (transduce.export.ct2)."""
    from ..export.ct2 import load_ct2

    for flag in ("checkpoint", "average", "vocab", "src_vocab", "tgt_vocab"):
        if getattr(args, flag) is not None:
            raise ValueError(f"--{flag.replace('_', '-')} does not apply to --engine ct2 (the directory holds one model "
                             "and its vocabulary)")
    args.bf16 = False
    if args.workers == "auto":
        args.workers = 1  # CTranslate2 decodes in its own worker
    return load_ct2(args.model_path, device=args.device, compute_type=args.ct2_compute_type or "default", threads=args.threads or 0)


def _write(stream: Iterable[list[Candidate]], n_best: int | None, write: Callable[[bytes], None],
           flush: Callable[[], None] | None) -> None:
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
