"""Translation: text in, translations out, line for line (Section 6.1's decoding).

`load_translation_model` loads what a MODEL argument names (a run directory, by default the
average of its last checkpoints, or a model directory) with the vocabulary found beside it;
`translate_stream` streams the input in length-sorted batches, so memory does not grow with it.
"""

from __future__ import annotations

import contextlib
import json
import math
import multiprocessing
import os
import signal
import sys
from dataclasses import dataclass
from itertools import islice
from pathlib import Path
from typing import Callable, Iterable, Iterator, Sequence

import torch
from tqdm import tqdm

from .data.batching import METADATA, batch_for_decoding, load_vocabs
from .data.vocab import BOS, EOS, PAD, Vocab
from .decode import Hypothesis, beam_search, greedy_decode
from .device import resolve_device
from .memory import Trimmer
from .errors import DataError
from .fast.decode import apply as apply_speedups

DEFAULT_BEAM = 4
DEFAULT_ALPHA = 0.6
DEFAULT_MAX_LEN_OFFSET = 50
DEFAULT_MAX_INPUT_TOKENS = 1024
DEFAULT_BATCH_TOKENS = 4096  # Padded source tokens per batch (sentences x longest sentence, EOS included)
DEFAULT_BATCH_SIZE = 128  # Sentences per batch at most
DEFAULT_CHUNK_LINES = 2000  # Lines read, sorted and translated at a time


Candidate = Hypothesis  # one hypothesis of one input line (`transduce.decode.Hypothesis`, with its text)


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


def pad_batch(rows: list[list[int]], pad: int = PAD) -> torch.Tensor:
    """(len(rows), longest) token ids, right-padded with `pad`."""
    out = torch.full((len(rows), max(len(r) for r in rows)), pad, dtype=torch.long)
    for i, r in enumerate(rows):
        out[i, : len(r)] = torch.tensor(r, dtype=torch.long)
    return out


def _clean(text: str) -> str:
    """Keep one translation on one line (and one TSV field)."""
    return text.replace("\r", " ").replace("\n", " ").replace("\t", " ")


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
    constraint=None,
    workers: int = 1,
) -> Iterator[list[Candidate]]:
    """Translate `lines` (any iterable); yield, for every line in order, its `n_best` best
    candidates (best first; one empty candidate for an empty line). Lines over the limit
    (`input_token_limit`) are cut and reported through `warn("SOURCE:LINE: ...")`; `advance(n)`
    is called as lines are done.

    The model runs in eval mode (restored after), with `transduce.fast.decode`'s speed-ups on the
    CPU, on its parameters' device and dtype; with fp32 weights `bf16=True` runs under bf16
    autocast. Scores are fp32 either way. `constraint` restricts the beam search (not with
    `greedy`). `workers` > 1 (CPU, Linux): batches decoded in that many forked processes
    (`Workers`), the output unchanged.
    """
    if greedy and constraint is not None:
        raise ValueError("constrained decoding is a beam search: use beam 1 instead of greedy")
    if greedy and n_best != 1:
        raise ValueError("greedy decoding gives one hypothesis per line: n_best must be 1")
    if not greedy and not 1 <= n_best <= beam:
        raise ValueError(f"n_best must be between 1 and the beam size ({beam}), not {n_best}")
    if beam < 1 or batch_tokens < 1 or batch_size < 1 or chunk_lines < 1 or workers < 1:
        raise ValueError("beam, batch_tokens, batch_size, chunk_lines and workers must be positive")
    if workers > 1 and next(model.parameters()).device.type != "cpu":
        raise ValueError("workers are for the CPU: on a GPU, decode with one process (workers=1)")
    limit = input_token_limit(model.config, max_input_tokens, max_len_offset)
    search = _Search(model, tgt_vocab, greedy, beam, alpha, max_len_offset, n_best, bf16, constraint)
    was_training = model.training
    model.eval()
    undo_speedups = apply_speedups(model)  # undoes only what it did
    pool = None
    try:
        if workers > 1:
            pool = Workers(search, workers)  # after apply_speedups: the children inherit packed weights
        yield from stream_lines(search, src_vocab, lines, limit=limit, chunk_lines=chunk_lines, batch_tokens=batch_tokens,
                                batch_size=batch_size, source_name=source_name, warn=warn, advance=advance,
                                map_batches=pool.map if pool is not None else None)
    finally:
        if pool is not None:
            pool.close()
        undo_speedups()
        model.train(was_training)


# What a forked worker runs: the search (set in the parent just before forking; inherited), and its trimmer
_WORKER_SEARCH: Callable[[list[list[int]]], list[list[Candidate]]] | None = None
_WORKER_TRIM = Trimmer(interval=1.0)


def _worker_start(threads: int) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle: it ends the pool
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # the pool ends its workers with SIGTERM (not the parent's handler)
    torch.set_num_threads(threads)


def _worker_search(sources: list[list[int]]) -> list[list[Candidate]]:
    result = _WORKER_SEARCH(sources)
    _WORKER_TRIM(idle=False)  # at most once a second: what a batch freed goes back to the system
    return result


WORKERS_MAX_D_MODEL = 512  # up to this width one worker per CPU thread is faster (docs/speed.md)


def choose_workers(requested: int | str, device: torch.device, threads: int, d_model: int) -> tuple[int, str]:
    """(how many CPU workers decode, why in words): `requested`, or for "auto" one per CPU thread
    for models up to `WORKERS_MAX_D_MODEL` wide, else 1."""
    if requested != "auto":
        return int(requested), "as asked"
    if device.type != "cpu":
        return 1, "auto: one process on a GPU"
    if threads < 2:
        return 1, "auto: one CPU thread"
    if d_model > WORKERS_MAX_D_MODEL:
        return 1, f"auto: d_model {d_model} > {WORKERS_MAX_D_MODEL}: one process, its products on all {threads} threads"
    return threads, f"auto: CPU, d_model {d_model} <= {WORKERS_MAX_D_MODEL}: one worker per thread"


class Workers:
    """CPU workers (Marian's and CTranslate2's inter-op workers): `n` processes forked from this
    one (the model shared copy-on-write), PyTorch's `threads` divided among them, each running
    `search` on whole batches; processes, since a decoding step holds Python's lock between
    products (docs/speed.md)."""

    def __init__(self, search: Callable[[list[list[int]]], list[list[Candidate]]], n: int, threads: int | None = None):
        if "fork" not in multiprocessing.get_all_start_methods():
            raise ValueError("workers need processes forked from this one (Linux): use one worker here")
        global _WORKER_SEARCH
        threads = threads or torch.get_num_threads()
        self.n, self._search = n, search
        _WORKER_SEARCH = search  # kept while the pool lives: a worker that dies is forked again
        try:
            self._pool = multiprocessing.get_context("fork").Pool(n, _worker_start, (max(1, threads // n),))
        except BaseException:
            _WORKER_SEARCH = None
            raise

    def map(self, batches: Iterable[list[list[int]]]) -> Iterator[list[list[Candidate]]]:
        """`search` of every batch, in order."""
        batches = list(batches)
        if len(batches) < self.n:  # a worker would idle: one process with every thread is faster
            return map(self._search, batches)
        return self._pool.imap(_worker_search, batches)

    def close(self) -> None:
        global _WORKER_SEARCH
        self._pool.terminate()
        self._pool.join()
        _WORKER_SEARCH = None


def stream_lines(search: Callable[[list[list[int]]], list[list[Candidate]]], src_vocab: Vocab, lines: Iterable[str], *,
                 limit: int, chunk_lines: int, batch_tokens: int, batch_size: int, source_name: str = "input",
                 warn: Callable[[str], None] | None = None,
                 advance: Callable[[int], None] | None = None,
                 map_batches: Callable[[Iterable[list[list[int]]]], Iterable[list[list[Candidate]]]] | None = None,
                 ) -> Iterator[list[Candidate]]:
    """Translating a stream, whatever the engine (transduce's search or CTranslate2's):
    `chunk_lines` lines at a time, their ids with EOS (cut to `limit` with a warning), batches
    of similar length, `search(sources)` on each (or `map_batches(batches)`, e.g. `Workers.map`),
    the candidates yielded in input order (an empty line's at once: one empty candidate)."""
    it = iter(lines)
    first_line = 1
    while chunk := list(islice(it, chunk_lines)):
        ids = _source_ids(src_vocab, chunk, limit, source_name, first_line, warn)
        results: list[list[Candidate] | None] = [[Candidate([], 0.0, 0.0, "")] if not toks else None for toks in ids]
        work = [i for i, toks in enumerate(ids) if toks]
        if advance is not None and len(work) < len(ids):
            advance(len(ids) - len(work))
        batches = [[work[j] for j in batch.tolist()] for batch in
                   batch_for_decoding([len(ids[i]) for i in work], batch_tokens, batch_size)]
        sources = ([ids[i] for i in rows] for rows in batches)
        for rows, cands in zip(batches, map_batches(sources) if map_batches is not None else map(search, sources)):
            for i, c in zip(rows, cands):
                results[i] = c
            if advance is not None:
                advance(len(rows))
        yield from results  # every line has its candidates by now
        first_line += len(chunk)


def _source_ids(src_vocab: Vocab, chunk: list[str], limit: int, source_name: str, first_line: int,
                warn: Callable[[str], None] | None) -> list[list[int]]:
    """The lines' subword ids with EOS ([] for an empty line), each cut to `limit` with a warning."""
    ids = src_vocab.encode_batch(chunk) if len(chunk) > 1 else [src_vocab.encode(chunk[0])]
    out = []
    for i, toks in enumerate(ids):
        if len(toks) > limit:
            if warn is not None:
                warn(f"{source_name}:{first_line + i}: {len(toks)} subword tokens, more than the limit "
                     f"of {limit}: translating the first {limit} only")
            toks = toks[:limit]
        out.append(toks + [EOS] if toks else [])
    return out


@dataclass
class _Search:
    """The search `translate_stream` runs on each batch of source ids, and the candidates it makes."""

    model: torch.nn.Module
    tgt_vocab: Vocab
    greedy: bool
    beam: int
    alpha: float
    max_len_offset: int
    n_best: int
    bf16: bool
    constraint: object = None

    def __call__(self, sources: list[list[int]]) -> list[list[Candidate]]:
        model = self.model
        param = next(model.parameters())
        src = pad_batch(sources, getattr(model.config, "pad_id", PAD)).to(param.device)
        with torch.inference_mode(), _autocast(param.device, self.bf16, param.dtype):
            if self.greedy:
                outs = greedy_decode(model, src, bos_id=BOS, eos_id=EOS, max_len_offset=self.max_len_offset)
                return [[Candidate(o, math.nan, math.nan, _clean(self.tgt_vocab.decode(o)))] for o in outs]
            hyps = beam_search(model, src, beam_size=self.beam, alpha=self.alpha, max_len_offset=self.max_len_offset,
                               n_best=self.n_best, bos_id=BOS, eos_id=EOS, constraint=self.constraint)
        for hs in hyps:
            for h in hs:
                h.text = _clean(self.tgt_vocab.decode(h.tokens))
        return [hs or [Candidate([], -math.inf, -math.inf, "")] for hs in hyps]


def translate_lines(model, src_vocab: Vocab, tgt_vocab: Vocab, lines: Sequence[str] | Iterable[str], *,
                    warn: Callable[[str], None] | None = None, progress: bool = False, **options) -> list[str]:
    """The best translation of each line, in order ("" for an empty line), as `translate_stream`
    decodes it with `options` (its keyword arguments). `warn` defaults to printing on stderr;
    `progress` shows a tqdm bar."""
    lines = list(lines)
    if warn is None:
        warn = lambda msg: print(f"warning: {msg}", file=sys.stderr)  # noqa: E731
    with tqdm(total=len(lines), desc="translate", unit=" lines", mininterval=1, disable=not progress) as bar:
        return [c[0].text for c in translate_stream(model, src_vocab, tgt_vocab, lines, warn=warn, advance=bar.update,
                                                    **options)]


@dataclass
class LoadedModel:
    model: torch.nn.Module
    config: object
    src_vocab: Vocab
    tgt_vocab: Vocab
    description: str  # What was loaded, for the user (a checkpoint, or the average of the last ones)
    precision: object = None  # its `transduce.precision.Choice`; it and the workers set by `transduce.ready`
    metadata: dict | None = None  # The data.json found beside the model (e.g. "task": "parsing"), if any
    workers: int = 1
    workers_line: str = ""  # How many CPU workers decode, and why


def _find_metadata(dirs: Sequence[Path]) -> dict | None:
    for d in dirs:
        if (d / METADATA).is_file():
            return json.loads((d / METADATA).read_text(encoding="utf-8"))
    return None


def _find_vocabs(dirs: Sequence[Path]) -> tuple[Vocab, Vocab] | None:
    for d in dirs:
        if (d / METADATA).is_file():
            try:
                return load_vocabs(d)
            except DataError:  # vocabulary files not copied beside it: try the recorded data dir
                data_dir = _find_metadata([d]).get("data_dir")
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
    """The model and vocabularies `transduce translate MODEL` uses, on `device` (a name for
    `resolve_device` or a torch.device). Raises FileNotFoundError, ValueError or DataError."""
    from .checkpoint import load_for_inference

    if isinstance(device, str):
        device = resolve_device(device)
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
    return LoadedModel(model, config, sv, tv, what, metadata=_find_metadata(resolved.search_dirs))
