"""`transduce translate`: text in, translations out, line for line (Section 6.1's decoding).

    transduce translate runs/base < newstest2014.en > hyp.de
    transduce translate runs/base --input newstest2014.en.gz --output hyp.de --checkpoint latest
    transduce translate path/to/model_dir --vocab spm.model --beam 4 --alpha 0.6

MODEL is either

* a training run directory (`transduce train --run-dir`): its vocabulary comes from its
  data.json and the copied spm*.model files; the model is, as in every result of the paper
  (6.1), the average of its last checkpoints written at the checkpoint interval: as many as the
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
  written to a temporary file and renamed at the end, so an error leaves no partial file.

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
import contextlib
import gzip
import math
import os
import sys
from dataclasses import dataclass
from itertools import islice
from pathlib import Path
from typing import BinaryIO, Callable, Iterable, Iterator, Sequence

import torch

from .data.text import DataError, iter_lines, open_text
from .data.vocab import BOS, EOS, PAD, Vocab

DEFAULT_BEAM = 4
DEFAULT_ALPHA = 0.6
DEFAULT_MAX_LEN_OFFSET = 50
DEFAULT_MAX_INPUT_TOKENS = 1024
DEFAULT_BATCH_TOKENS = 4096
"""Padded source tokens per batch (sentences x longest sentence, EOS included). The decoder
works on beam x batch rows."""
DEFAULT_BATCH_SIZE = 128
"""Sentences per batch at most."""
DEFAULT_CHUNK_LINES = 2000
"""Lines read, sorted and translated at a time."""

PROG = "transduce translate"


# ---------------------------------------------------------------------------------------------
# The library: lines -> translations
# ---------------------------------------------------------------------------------------------


@dataclass
class Candidate:
    """One translation hypothesis of one input line."""

    text: str
    score: float
    """log P(Y|X) / lp(Y), the length-normalised score the beam ranks by (nan for greedy)."""
    logprob: float
    """log P(Y|X), EOS included (nan for greedy)."""
    tokens: list[int]
    """Target subword ids, without BOS/EOS."""


def input_token_limit(model_config, max_input_tokens: int | None = DEFAULT_MAX_INPUT_TOKENS,
                      max_len_offset: int = DEFAULT_MAX_LEN_OFFSET) -> int:
    """The most subword tokens (EOS not counted) a source line may have: `max_input_tokens`,
    and with learned positions what the table of `max_positions` allows for the source (its EOS
    included) and for the longest output (source length + max_len_offset positions)."""
    limit = max_input_tokens if max_input_tokens is not None else sys.maxsize
    if getattr(model_config, "positional", "sinusoidal") == "learned":
        limit = min(limit, model_config.max_positions - 1 - max_len_offset)
    if limit < 1:
        raise ValueError(
            f"no input fits: learned positions allow {model_config.max_positions} positions and "
            f"--max-len-offset is {max_len_offset}; lower --max-len-offset"
        )
    return limit


def _clean(text: str) -> str:
    """Keep one translation on one line (and one TSV field)."""
    return text.replace("\r", " ").replace("\n", " ").replace("\t", " ")


def _batches(items: list[tuple[int, list[int]]], batch_tokens: int, batch_size: int) -> Iterator[list[tuple[int, list[int]]]]:
    """Sort (index, ids) by length, longest first, and cut into batches of at most
    `batch_tokens` padded tokens and `batch_size` sentences (a single long sentence always
    forms a batch of its own)."""
    items = sorted(items, key=lambda it: len(it[1]), reverse=True)
    batch: list[tuple[int, list[int]]] = []
    longest = 0
    for it in items:
        n = len(it[1])
        if batch and (len(batch) + 1 > batch_size or (len(batch) + 1) * max(longest, n) > batch_tokens):
            yield batch
            batch, longest = [], 0
        batch.append(it)
        longest = max(longest, n)
    if batch:
        yield batch


def _autocast(device: torch.device, bf16: bool, dtype: torch.dtype):
    if not bf16 or dtype == torch.bfloat16:  # bf16 weights need no autocast
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=torch.bfloat16)


def translate_stream(
    model,
    src_vocab: Vocab,
    tgt_vocab: Vocab,
    lines: Iterable[str],
    *,
    beam: int = DEFAULT_BEAM,
    alpha: float = DEFAULT_ALPHA,
    max_len_offset: int = DEFAULT_MAX_LEN_OFFSET,
    n_best: int = 1,
    greedy: bool = False,
    batch_tokens: int = DEFAULT_BATCH_TOKENS,
    batch_size: int = DEFAULT_BATCH_SIZE,
    max_input_tokens: int | None = DEFAULT_MAX_INPUT_TOKENS,
    bf16: bool = False,
    chunk_lines: int = DEFAULT_CHUNK_LINES,
    source_name: str = "input",
    warn: Callable[[str], None] | None = None,
    advance: Callable[[int], None] | None = None,
) -> Iterator[list[Candidate]]:
    """Translate `lines` (any iterable, consumed `chunk_lines` at a time); yield, for every
    line in order, its `n_best` best candidates (best first; one empty candidate for an empty
    line). Lines longer than the limit (see `input_token_limit`) are truncated and reported
    through `warn("SOURCE:LINE: ...")`; `advance(n)` is called as lines are done.

    The model is put in eval mode for the duration (and restored; on the CPU its weights are
    pre-packed meanwhile, `Transformer.pack_weights`). It decodes on the device of
    its parameters and in their dtype: bf16 weights (what `--bf16` loads) run in bf16; with fp32
    weights, `bf16=True` runs the forward passes under bf16 autocast. The search's
    log-probabilities and scores are fp32 either way.
    """
    from .decode import beam_search, greedy_decode

    if greedy and n_best != 1:
        raise ValueError("greedy decoding gives one hypothesis per line: n_best must be 1")
    if not greedy and not 1 <= n_best <= beam:
        raise ValueError(f"n_best must be between 1 and the beam size ({beam}), not {n_best}")
    if beam < 1 or batch_tokens < 1 or batch_size < 1 or chunk_lines < 1:
        raise ValueError("beam, batch_tokens, batch_size and chunk_lines must be positive")
    limit = input_token_limit(model.config, max_input_tokens, max_len_offset)
    device, dtype = next(model.parameters()).device, next(model.parameters()).dtype
    pad = getattr(model.config, "pad_id", PAD)
    was_training = model.training
    model.eval()
    # CPU: weights pre-packed for oneDNN for the duration (`Transformer.pack_weights`), unless
    # the caller packed them already.
    packed_here = getattr(model, "_packed_output", False) is None and model.pack_weights()
    nan = float("nan")
    try:
        it = iter(lines)
        first_line = 1
        while chunk := list(islice(it, chunk_lines)):
            ids = src_vocab.encode_batch(chunk) if len(chunk) > 1 else [src_vocab.encode(chunk[0])]
            results: list[list[Candidate] | None] = [None] * len(chunk)
            work: list[tuple[int, list[int]]] = []
            for i, toks in enumerate(ids):
                if not toks:
                    results[i] = [Candidate("", 0.0, 0.0, [])]
                    continue
                if len(toks) > limit:
                    if warn is not None:
                        warn(f"{source_name}:{first_line + i}: {len(toks)} subword tokens, more than the limit "
                             f"of {limit}: translating the first {limit} only")
                    toks = toks[:limit]
                work.append((i, toks + [EOS]))
            if advance is not None and len(work) < len(chunk):
                advance(len(chunk) - len(work))
            for batch in _batches(work, batch_tokens, batch_size):
                S = max(len(t) for _, t in batch)
                src = torch.full((len(batch), S), pad, dtype=torch.long)
                for row, (_, toks) in enumerate(batch):
                    src[row, : len(toks)] = torch.tensor(toks, dtype=torch.long)
                src = src.to(device)
                with torch.inference_mode(), _autocast(device, bf16, dtype):
                    if greedy:
                        outs = greedy_decode(model, src, bos_id=BOS, eos_id=EOS, max_len_offset=max_len_offset)
                        cands = [[Candidate(_clean(tgt_vocab.decode(o)), nan, nan, o)] for o in outs]
                    else:
                        hyps = beam_search(model, src, beam_size=beam, alpha=alpha, max_len_offset=max_len_offset,
                                           n_best=n_best, bos_id=BOS, eos_id=EOS)
                        cands = [
                            [Candidate(_clean(tgt_vocab.decode(h.tokens)), h.score, h.logprob, h.tokens) for h in hs]
                            or [Candidate("", -math.inf, -math.inf, [])]
                            for hs in hyps
                        ]
                for (i, _), c in zip(batch, cands):
                    results[i] = c
                if advance is not None:
                    advance(len(batch))
            for r in results:
                assert r is not None
                yield r
            first_line += len(chunk)
    finally:
        if packed_here:
            model.unpack_weights()
        model.train(was_training)


def translate_lines(
    model,
    src_vocab: Vocab,
    tgt_vocab: Vocab,
    lines: Sequence[str] | Iterable[str],
    *,
    beam: int = DEFAULT_BEAM,
    alpha: float = DEFAULT_ALPHA,
    max_len_offset: int = DEFAULT_MAX_LEN_OFFSET,
    greedy: bool = False,
    batch_tokens: int = DEFAULT_BATCH_TOKENS,
    batch_size: int = DEFAULT_BATCH_SIZE,
    max_input_tokens: int | None = DEFAULT_MAX_INPUT_TOKENS,
    bf16: bool = False,
    warn: Callable[[str], None] | None = None,
    progress: bool = False,
    source_name: str = "input",
    chunk_lines: int = DEFAULT_CHUNK_LINES,
) -> list[str]:
    """Translate sentences; returns one translation per input line, in order (the best
    hypothesis; "" for an empty line). Same decoding as `transduce translate` (see
    `translate_stream` for the options). `warn` defaults to printing on stderr; warnings name
    lines as `source_name`:LINE; `progress` shows a tqdm bar."""
    lines = list(lines)
    if warn is None:
        warn = lambda msg: print(f"warning: {msg}", file=sys.stderr)  # noqa: E731
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=len(lines), desc="translate", unit=" lines", mininterval=1)
    try:
        out = [
            c[0].text
            for c in translate_stream(
                model, src_vocab, tgt_vocab, lines, beam=beam, alpha=alpha, max_len_offset=max_len_offset,
                greedy=greedy, batch_tokens=batch_tokens, batch_size=batch_size, max_input_tokens=max_input_tokens,
                bf16=bf16, chunk_lines=chunk_lines, source_name=source_name, warn=warn, advance=bar.update if bar is not None else None,
            )
        ]
    finally:
        if bar is not None:
            bar.close()
    return out


# ---------------------------------------------------------------------------------------------
# Finding the model and the vocabulary
# ---------------------------------------------------------------------------------------------


@dataclass
class LoadedModel:
    model: torch.nn.Module
    config: object
    src_vocab: Vocab
    tgt_vocab: Vocab
    description: str
    """What was loaded, for the user: e.g. 'runs/base/checkpoints/step_0100000' or
    'average of the last 5 checkpoints (step_... .. step_...)'."""
    precision: object = None
    """The `transduce.precision.Choice` it runs in (set by `load_from_args`)."""


def _find_vocabs(dirs: Sequence[Path]) -> tuple[Vocab, Vocab] | None:
    from .data.batching import METADATA, load_vocabs

    for d in dirs:
        meta = d / METADATA
        if meta.is_file():
            try:
                return load_vocabs(d)
            except DataError:  # vocabulary files not copied beside it: try the recorded data dir
                import json

                data_dir = json.loads(meta.read_text(encoding="utf-8")).get("data_dir")
                if data_dir and Path(data_dir).is_dir():
                    return load_vocabs(data_dir)
                raise
        if (d / "spm.model").is_file():
            v = Vocab(d / "spm.model")
            return v, v
    return None


def load_translation_model(
    path: str | os.PathLike,
    *,
    checkpoint: str | None = None,
    average: int | None = None,
    vocab: str | os.PathLike | None = None,
    src_vocab: str | os.PathLike | None = None,
    tgt_vocab: str | os.PathLike | None = None,
    device: str | torch.device = "cpu",
) -> LoadedModel:
    """The model and vocabularies `transduce translate MODEL` uses (see the module docstring).
    Raises FileNotFoundError, ValueError or DataError with a one-line message."""
    from .checkpoint import load_for_inference

    resolved = load_for_inference(path, checkpoint=checkpoint, average=average, device=device)
    model, config, what = resolved.model, resolved.config, resolved.description
    if vocab is not None and (src_vocab is not None or tgt_vocab is not None):
        raise ValueError("give --vocab (shared) or --src-vocab/--tgt-vocab, not both")
    if vocab is not None:
        sv = tv = Vocab(vocab)
    elif src_vocab is not None or tgt_vocab is not None:
        if src_vocab is None or tgt_vocab is None:
            raise ValueError("give both --src-vocab and --tgt-vocab")
        sv, tv = Vocab(src_vocab), Vocab(tgt_vocab)
    else:
        found = _find_vocabs(resolved.search_dirs)
        if found is None:
            raise FileNotFoundError(f"no vocabulary found beside {what} (no data.json or spm.model): "
                                    "pass --vocab SPM_MODEL")
        sv, tv = found
    mc = config.model
    if len(sv) != mc.src_vocab_size or len(tv) != mc.target_vocab_size:
        raise ValueError(
            f"vocabulary sizes ({len(sv)} source, {len(tv)} target) do not match the model's "
            f"({mc.src_vocab_size}, {mc.target_vocab_size}): wrong --vocab?"
        )
    return LoadedModel(model, config, sv, tv, what)


# ---------------------------------------------------------------------------------------------
# Reading and writing
# ---------------------------------------------------------------------------------------------


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


class AtomicOutput:
    """Write to `path` through a temporary file beside it, renamed into place by `commit()`;
    `discard()` removes it. gzip if the name ends in .gz."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self.tmp = self.path.with_name(f".{self.path.name}.tmp-{os.getpid()}")
        raw = open(self.tmp, "wb")
        self.f: BinaryIO = gzip.GzipFile(fileobj=raw, mode="wb", filename="", mtime=0) if self.path.name.endswith(".gz") else raw
        self._raw = raw

    def write(self, data: bytes) -> None:
        self.f.write(data)

    def commit(self) -> None:
        self.f.close()
        self._raw.close()
        os.replace(self.tmp, self.path)

    def discard(self) -> None:
        with contextlib.suppress(OSError):
            self.f.close()
            self._raw.close()
        self.tmp.unlink(missing_ok=True)


# ---------------------------------------------------------------------------------------------
# The command line
# ---------------------------------------------------------------------------------------------


def add_model_args(parser: argparse.ArgumentParser) -> None:
    """Options that choose the model and the vocabulary (shared with `transduce evaluate`)."""
    g = parser.add_argument_group("model")
    g.add_argument("--checkpoint", metavar="NAME|PATH",
                   help="one checkpoint of the run, unaveraged: step_0100000, 100000, latest, model (the final "
                        "weights), or a model directory")
    g.add_argument("--average", type=int, metavar="K",
                   help="average the last K checkpoints of the run in memory (default for a run directory: the "
                        "run's train.average_last, as in 6.1: 5 base, 20 big; or all it has, if fewer)")
    g.add_argument("--vocab", type=Path, metavar="SPM_MODEL", help="shared sentencepiece model (default: found beside the model)")
    g.add_argument("--src-vocab", type=Path, metavar="SPM_MODEL", help="separate source vocabulary")
    g.add_argument("--tgt-vocab", type=Path, metavar="SPM_MODEL", help="separate target vocabulary")
    g.add_argument("--device", default="auto", help="auto (cuda if available), cpu, cuda or cuda:N (default: auto)")
    g.add_argument("--threads", type=int, help="CPU threads (default: PyTorch's)")


def add_decoding_args(parser: argparse.ArgumentParser) -> None:
    """Search and batching options (shared with `transduce evaluate`)."""
    g = parser.add_argument_group("search (Section 6.1)")
    g.add_argument("--beam", type=int, default=DEFAULT_BEAM, help=f"beam size (default {DEFAULT_BEAM})")
    g.add_argument("--alpha", type=float, default=DEFAULT_ALPHA,
                   help=f"length penalty ((5+|Y|)/6)^alpha (default {DEFAULT_ALPHA})")
    g.add_argument("--max-len-offset", type=int, default=DEFAULT_MAX_LEN_OFFSET,
                   help=f"maximum output length = input length + this (default {DEFAULT_MAX_LEN_OFFSET})")
    g.add_argument("--greedy", action="store_true", help="greedy decoding (the fast beam-1 path; ignores --beam, --alpha)")
    g.add_argument("--precision", choices=("auto", "fp32", "bf16"), default="auto",
                   help="auto (default): bf16 weights where the device computes bf16 natively and a product of "
                        "the model's size is measured faster, else fp32 (the choice is printed); fp32; bf16 "
                        "(warns where the CPU only emulates it). Log-probabilities and scores stay fp32")
    g.add_argument("--bf16", action="store_const", const="bf16", dest="precision", help="the same as --precision bf16")
    g = parser.add_argument_group("batching")
    g.add_argument("--batch-tokens", type=int, default=DEFAULT_BATCH_TOKENS,
                   help=f"padded source tokens per batch at most (default {DEFAULT_BATCH_TOKENS})")
    g.add_argument("--batch-size", type=int, default=DEFAULT_BATCH_SIZE,
                   help=f"sentences per batch at most (default {DEFAULT_BATCH_SIZE})")
    g.add_argument("--max-input-tokens", type=int, default=DEFAULT_MAX_INPUT_TOKENS,
                   help=f"longer input lines are truncated, with a warning (default {DEFAULT_MAX_INPUT_TOKENS})")
    g.add_argument("--chunk-lines", type=int, default=DEFAULT_CHUNK_LINES,
                   help=f"lines read and sorted by length at a time (default {DEFAULT_CHUNK_LINES})")


def add_args(parser: argparse.ArgumentParser) -> None:
    """The options of `transduce translate`."""
    parser.add_argument("model_path", type=Path, metavar="MODEL",
                        help="a training run directory, or a model directory (model.safetensors + config.json)")
    g = parser.add_argument_group("input and output")
    g.add_argument("--input", "-i", type=Path, metavar="FILE", help="sentences to translate, plain or .gz (default: stdin)")
    g.add_argument("--output", "-o", type=Path, metavar="FILE",
                   help="translations (default: stdout); written atomically, gzip if FILE ends in .gz")
    g.add_argument("--n-best", type=int, metavar="K",
                   help="write the K best hypotheses per line as TSV: LINE, RANK, SCORE, LOGPROB, TEXT")
    g.add_argument("--quiet", "-q", action="store_true", help="no progress bar and no notes (warnings still shown)")
    add_model_args(parser)
    add_decoding_args(parser)


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dev = torch.device(name)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda, but CUDA is not available")
    return dev


def check_decoding_args(args: argparse.Namespace) -> None:
    for name in ("beam", "batch_tokens", "batch_size", "max_input_tokens", "chunk_lines"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be at least 1")
    if args.max_len_offset < 0:
        raise ValueError("--max-len-offset must not be negative")
    if args.precision == "bf16":
        dev = resolve_device(args.device)
        if dev.type == "cuda" and not torch.cuda.is_bf16_supported():
            raise ValueError("this GPU does not support bf16")


def load_from_args(args: argparse.Namespace) -> LoadedModel:
    if args.threads:
        torch.set_num_threads(args.threads)
    loaded = load_translation_model(
        args.model_path, checkpoint=args.checkpoint, average=args.average, vocab=args.vocab,
        src_vocab=args.src_vocab, tgt_vocab=args.tgt_vocab, device=resolve_device(args.device),
    )
    from .precision import choose_precision

    mc = loaded.config.model
    loaded.precision = choose_precision(args.precision, next(loaded.model.parameters()).device,
                                        d_model=mc.d_model, d_ff=mc.d_ff)
    args.bf16 = loaded.precision.precision == "bf16"
    if args.bf16:
        loaded.model.to(torch.bfloat16)  # bf16 weights: no per-step casts (faster than autocast)
    return loaded


def run(args: argparse.Namespace) -> int:
    """`transduce translate`: 0 on success, 2 on bad input or options (one line on stderr)."""
    from tqdm import tqdm

    out: AtomicOutput | None = None
    bar = None
    infile: BinaryIO | None = None

    def warn(msg: str) -> None:
        tqdm.write(f"{PROG}: warning: {msg}", file=sys.stderr)  # above the progress bar, if any

    try:
        check_decoding_args(args)
        if args.n_best is not None:
            if args.greedy and args.n_best != 1:
                raise ValueError("--greedy gives one hypothesis per line: --n-best must be 1")
            if not args.greedy and not 1 <= args.n_best <= args.beam:
                raise ValueError(f"--n-best must be between 1 and --beam ({args.beam})")
        if args.output is not None and str(args.output) != "-" and not args.output.absolute().parent.is_dir():
            raise DataError("no such directory", args.output.absolute().parent)
        if args.input is not None and str(args.input) != "-":
            infile = open_text(args.input)
            name = str(args.input)
            interactive = False
        else:
            infile = sys.stdin.buffer
            name = "<stdin>"
            interactive = sys.stdin.isatty()
        loaded = load_from_args(args)
        if not args.quiet:
            print(f"{PROG}: model {loaded.description}", file=sys.stderr)
            print(f"{PROG}: {loaded.precision.line()}", file=sys.stderr)
        if loaded.precision.warning:
            warn(loaded.precision.warning)
        if args.output is not None and str(args.output) != "-":
            out = AtomicOutput(args.output)
            write, flush = out.write, lambda: None
        else:
            write, flush = sys.stdout.buffer.write, sys.stdout.buffer.flush
        if args.input is not None and not args.quiet and sys.stderr.isatty():
            bar = tqdm(total=_count_lines(Path(args.input)), desc="translate", unit=" lines", mininterval=1)
        n_best = args.n_best or 1
        stream = translate_stream(
            loaded.model, loaded.src_vocab, loaded.tgt_vocab, iter_lines(infile, name),
            beam=args.beam, alpha=args.alpha, max_len_offset=args.max_len_offset, n_best=n_best,
            greedy=args.greedy, batch_tokens=args.batch_tokens, batch_size=args.batch_size,
            max_input_tokens=args.max_input_tokens, bf16=args.bf16,
            chunk_lines=1 if interactive else args.chunk_lines, source_name=name, warn=warn,
            advance=bar.update if bar is not None else None,
        )
        for line_no, cands in enumerate(stream, start=1):
            if args.n_best is None:
                write((cands[0].text + "\n").encode("utf-8"))
            else:
                for rank, c in enumerate(cands, start=1):
                    write(f"{line_no}\t{rank}\t{c.score:.6f}\t{c.logprob:.6f}\t{c.text}\n".encode("utf-8"))
            if interactive:
                flush()
        flush()
        if out is not None:
            out.commit()
            out = None
    except (DataError, FileNotFoundError, ValueError) as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # e.g. `| head`: the reader is gone, stop quietly
        with contextlib.suppress(OSError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except OSError as e:
        where = f"{e.filename}: " if getattr(e, "filename", None) else ""
        print(f"{PROG}: error: {where}{e.strerror or e}", file=sys.stderr)
        return 2
    finally:
        if out is not None:
            out.discard()
        if bar is not None:
            bar.close()
        if infile is not None and infile is not sys.stdin.buffer:
            infile.close()
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_args(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
