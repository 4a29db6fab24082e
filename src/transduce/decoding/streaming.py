"""Streaming text through a search, whatever the engine (`transduce.decoding.engines`): `stream_lines`, so
memory does not grow with the input (Section 6.1), and the CPU workers it can search in."""

from __future__ import annotations

import multiprocessing
import signal
import sys
from itertools import islice
from typing import Callable, Iterable, Iterator

import torch

from ..data.batching import batch_for_decoding
from ..data.vocab import Vocab
from ..defaults import MAX_INPUT_TOKENS, MAX_LEN_OFFSET
from .search import Hypothesis
from ..memory import Trimmer

Candidate = Hypothesis  # one hypothesis of one input line (`transduce.decoding.search.Hypothesis`, with its text)
BatchSearch = Callable[
    [list[list[int]]], list[list[Candidate]]
]  # a batch of source ids (with EOS) -> candidates per row


def one_line(text: str) -> str:
    """Keep one translation on one line (and one TSV field)."""
    return text.replace("\r", " ").replace("\n", " ").replace("\t", " ")


def input_token_limit(
    max_input_tokens: int | None = MAX_INPUT_TOKENS, max_len_offset: int = MAX_LEN_OFFSET, positions: int | None = None
) -> int:
    """The most subword tokens (EOS not counted) a source line may have: `max_input_tokens`, and
    with a table of `positions` (learned positions, a CTranslate2 export) what it allows for the
    source (its EOS included) and for the longest output (source length + max_len_offset)."""
    limit = max_input_tokens if max_input_tokens is not None else sys.maxsize
    if positions is not None:
        limit = min(limit, positions - 1 - max_len_offset)
    if limit < 1:
        raise ValueError(
            f"no input fits: the position table has {positions} rows and --max-len-offset is "
            f"{max_len_offset}; lower --max-len-offset"
        )
    return limit


def stream_lines(
    search: BatchSearch,
    src_vocab: Vocab,
    lines: Iterable[str],
    *,
    limit: int,
    chunk_lines: int,
    batch_tokens: int,
    batch_size: int,
    workers: int = 1,
    source_name: str = "input",
    warn: Callable[[str], None] | None = None,
    advance: Callable[[int], None] | None = None,
) -> Iterator[list[Candidate]]:
    """`chunk_lines` lines at a time, their ids with EOS (cut to `limit` with a warning through
    `warn("SOURCE:LINE: ...")`), batches of similar length, `search(sources)` on each (with
    `workers` > 1 in that many forked `Workers`, the output unchanged), the candidates yielded in
    input order (an empty line's at once: one empty candidate); `advance(n)` is called as lines
    are done."""
    model = getattr(search, "model", None)  # a PyTorch model's size chooses threads or processes
    threaded = workers > 1 and isinstance(model, torch.nn.Module) and thread_workers(model.config)
    pool = Workers(search, workers, threads_not_processes=threaded) if workers > 1 else None
    map_batches = pool.map if pool is not None else lambda batches: map(search, batches)
    it = iter(lines)
    first_line = 1
    try:
        while chunk := list(islice(it, chunk_lines)):
            ids = _source_ids(src_vocab, chunk, limit, source_name, first_line, warn)
            results: list[list[Candidate] | None] = [
                [Candidate([], 0.0, 0.0, "")] if not toks else None for toks in ids
            ]
            work = [i for i, toks in enumerate(ids) if toks]
            if advance is not None and len(work) < len(ids):
                advance(len(ids) - len(work))
            batches = [
                [work[j] for j in batch.tolist()]
                for batch in batch_for_decoding([len(ids[i]) for i in work], batch_tokens, batch_size)
            ]
            sources = ([ids[i] for i in rows] for rows in batches)
            for rows, cands in zip(batches, map_batches(sources)):
                for i, c in zip(rows, cands):
                    results[i] = c
                if advance is not None:
                    advance(len(rows))
            yield from results  # every line has its candidates by now
            first_line += len(chunk)
    finally:
        if pool is not None:
            pool.close()


def _source_ids(
    src_vocab: Vocab,
    chunk: list[str],
    limit: int,
    source_name: str,
    first_line: int,
    warn: Callable[[str], None] | None,
) -> list[list[int]]:
    """The lines' subword ids with EOS ([] for an empty line), each cut to `limit` with a warning."""
    ids = src_vocab.encode_batch(chunk) if len(chunk) > 1 else [src_vocab.encode(chunk[0])]
    out = []
    for i, toks in enumerate(ids):
        if len(toks) > limit:
            if warn is not None:
                warn(
                    f"{source_name}:{first_line + i}: {len(toks)} subword tokens, more than the limit "
                    f"of {limit}: translating the first {limit} only"
                )
            toks = toks[:limit]
        out.append(toks + [src_vocab.eos] if toks else [])
    return out


# What a forked worker runs: the search (set in the parent just before forking; inherited), and its trimmer
_WORKER_SEARCH: BatchSearch | None = None
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
THREAD_WORKERS_FROM = 20_000_000  # weights from which workers are threads of one process (docs/speed.md)


def thread_workers(config) -> bool:
    """Whether a model of `config` (a `ModelConfig`) decodes in worker threads rather than forked
    processes: a large model's step is its products (which let go of Python's lock), and threads
    hold it once where processes each count it (the OPUS-MT models); a small model's step is as much
    Python as products, which threads would take turns at."""
    d, layers = config.d_model, config.n_layers
    weights = layers * (4 * d * d + 2 * d * config.d_ff) * 2 + layers * 4 * d * d + config.target_vocab_size * d
    return weights >= THREAD_WORKERS_FROM


def choose_workers(
    requested: int | str, device: torch.device, threads: int, d_model: int, one_process: str = ""
) -> tuple[int, str]:
    """(how many CPU workers decode, why in words): `requested`, or for "auto" one per CPU thread
    for models up to `WORKERS_MAX_D_MODEL` wide, else 1; 1 where `one_process` gives a reason
    (`one_process_reason`)."""
    if requested != "auto":
        return int(requested), "as asked"
    if device.type != "cpu":
        return 1, "auto: one process on a GPU"
    if threads < 2:
        return 1, "auto: one CPU thread"
    if one_process:
        return 1, f"auto: {one_process}: one process, its products on all {threads} threads"
    if d_model > WORKERS_MAX_D_MODEL:
        return 1, f"auto: d_model {d_model} > {WORKERS_MAX_D_MODEL}: one process, its products on all {threads} threads"
    return threads, f"auto: CPU, d_model {d_model} <= {WORKERS_MAX_D_MODEL}: one worker per thread"


def one_process_reason(config, precision: str, int8_kernel: str | None) -> str:
    """Why a model of `config` (a `ModelConfig`) decodes faster in one process of all the threads
    than in one-thread workers, or "": at OPUS-MT's sizes (`thread_workers`) in fp32, and in int8
    through FBGEMM, a product scales over the threads; int8 through oneDNN does not (docs/speed.md,
    "CPU threads")."""
    if not thread_workers(config):
        return ""
    if precision == "fp32":
        return "fp32 at this size"
    if precision == "int8" and int8_kernel == "fbgemm":
        return "int8 through FBGEMM at this size"
    return ""


class Workers:
    """CPU workers (Marian's and CTranslate2's inter-op workers), each running `search` on whole
    batches, PyTorch's `threads` divided among them: `n` processes forked from this one (the model,
    made ready before, shared copy-on-write), since a small model's step holds Python's lock between
    products, or, with `threads_not_processes` (a large model: `thread_workers`), `n` threads of
    this process, which hold the model once and share each batch, a part each (docs/speed.md)."""

    def __init__(self, search: BatchSearch, n: int, threads: int | None = None, threads_not_processes: bool = False):
        global _WORKER_SEARCH
        threads = threads or torch.get_num_threads()
        self.n, self._search, self._threads = n, search, None
        if threads_not_processes:
            from concurrent.futures import ThreadPoolExecutor

            self._threads = threads
            torch.set_num_threads(max(1, threads // n))  # the process's, for the duration: each worker's products
            self._pool = ThreadPoolExecutor(n, thread_name_prefix="transduce-worker")
            return
        if "fork" not in multiprocessing.get_all_start_methods():
            raise ValueError("workers need processes forked from this one (Linux): use one worker here")
        _WORKER_SEARCH = search  # kept while the pool lives: a worker that dies is forked again
        try:
            self._pool = multiprocessing.get_context("fork").Pool(n, _worker_start, (max(1, threads // n),))
        except BaseException:
            _WORKER_SEARCH = None
            raise

    def map(self, batches: Iterable[list[list[int]]]) -> Iterator[list[list[Candidate]]]:
        """`search` of every batch, in order."""
        batches = list(batches)
        if self._threads is not None:
            if sum(map(len, batches)) < self.n:  # a worker would idle: one thread with every thread's products
                return self._alone(batches)
            return self._shared(batches)
        if len(batches) < self.n:  # a worker would idle: one process with every thread is faster
            return map(self._search, batches)
        return self._pool.imap(_worker_search, batches)

    def _shared(self, batches: list) -> Iterator[list[list[Candidate]]]:
        """Each batch cut into `n` consecutive parts, one per worker thread, decoded at once: one
        batch's cache and logits in flight, not `n` batches' (docs/speed.md, "Memory at OPUS-MT's size")."""
        counts, parts = [], []
        for batch in batches:
            per = -(-len(batch) // min(self.n, len(batch)))
            counts.append(len(range(0, len(batch), per)))
            parts += [batch[i : i + per] for i in range(0, len(batch), per)]
        results = self._pool.map(self._search, parts)
        for count in counts:
            yield [c for _ in range(count) for c in next(results)]

    def _alone(self, batches: list) -> Iterator[list[list[Candidate]]]:
        n = torch.get_num_threads()
        torch.set_num_threads(self._threads)
        try:
            yield from [self._search(b) for b in batches]
        finally:
            torch.set_num_threads(n)

    def close(self) -> None:
        global _WORKER_SEARCH
        if self._threads is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            torch.set_num_threads(self._threads)
            return
        self._pool.terminate()
        self._pool.join()
        _WORKER_SEARCH = None
