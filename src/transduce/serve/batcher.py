"""Dynamic batching: requests that arrive together are decoded together, by one thread.

Each request is a `Job` queued in arrival order. The decoding thread takes the oldest job, waits
until `max_wait` seconds after it arrived or until the jobs with its settings hold
`max_batch_tokens` source tokens, decodes all their sentences in one call of `translate`, and
hands each job its own results. Jobs with other settings wait for the next round, which starts
with the oldest job, so none starves. A cancelled job is dropped, or its results thrown away. A
failure fails only that round's jobs; should the thread itself end, every queued job fails and
later submissions are refused, so that no caller waits forever.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Callable, Hashable, Sequence

from ..defaults import BATCH_TOKENS, SERVE_MAX_QUEUE, SERVE_MAX_WAIT


log = logging.getLogger("transduce.serve")


class QueueFull(Exception):
    """The queue holds `max_queue` jobs waiting: try again later."""


class ShuttingDown(RuntimeError):
    """The server is shutting down: the job was not (or will not be) decoded."""


@dataclass(eq=False)
class Job:
    sentences: list[str]
    settings: Hashable  # Search settings; only jobs with equal settings are decoded together
    tokens: int  # Source tokens of its sentences (each with EOS): what counts against the token budget
    future: Future = field(default_factory=Future)  # one list of candidates per sentence, in order
    arrived: float = field(default_factory=time.monotonic)
    cancelled: bool = False
    call: Callable[[], object] | None = None  # run on the decoding thread instead (`Batcher.call`)


@dataclass
class Stats:
    rounds: int = 0  # Calls of `translate`: each decodes the sentences of one or more jobs
    jobs: int = 0
    sentences: int = 0
    cancelled: int = 0
    failed_rounds: int = 0


class Batcher:
    """One decoding thread over a queue of jobs. `translate(sentences, settings)`, run on that
    thread only, returns one result per sentence; `on_round(jobs, seconds, results, error)` is told
    of every round (metrics); `after_round(idle)` runs after every round and call (`idle`: no job
    waits)."""

    def __init__(
        self,
        translate: Callable[[list[str], Hashable], Sequence],
        *,
        max_batch_tokens: int = BATCH_TOKENS,
        max_wait: float = SERVE_MAX_WAIT,
        max_queue: int = SERVE_MAX_QUEUE,
        on_round: Callable[[list[Job], float, Sequence | None, BaseException | None], None] | None = None,
        after_round: Callable[[bool], None] | None = None,
    ):
        if max_batch_tokens < 1 or not 0 <= max_wait <= threading.TIMEOUT_MAX or max_queue < 1:
            raise ValueError("max_batch_tokens and max_queue must be positive, max_wait a finite number >= 0")
        self.translate, self.on_round, self.after_round = translate, on_round, after_round
        self.max_batch_tokens, self.max_wait, self.max_queue = max_batch_tokens, max_wait, max_queue
        self.stats = Stats()
        self._queue: deque[Job] = deque()
        self._cond = threading.Condition()
        self._stopping = False
        self._ended: str | None = None  # why the decoding thread ended, if it did
        self._thread: threading.Thread | None = None

    def start(self) -> "Batcher":
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="transduce-batcher", daemon=True)
            self._thread.start()
        return self

    def stop(self, timeout: float | None = 10.0) -> None:
        """Finish the round under way (waiting for it at most `timeout` seconds: a round that is
        stuck is left to its daemon thread), fail what is still queued, end the thread."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join(timeout)
        self.fail_queued(ShuttingDown("the server is shutting down"))

    def fail_queued(self, error: BaseException) -> int:
        """Fail every job still waiting with `error`; returns how many."""
        with self._cond:
            jobs = list(self._queue)
            self._queue.clear()
        _fail(jobs, error)
        return len(jobs)

    def submit(self, sentences: list[str], settings: Hashable, tokens: int) -> Job:
        """Queue a job; raises QueueFull when `max_queue` jobs are waiting, ShuttingDown once
        stopped, RuntimeError if the decoding thread has ended."""
        return self._put(Job(list(sentences), settings, tokens))

    def call(self, fn: Callable[[], object], tokens: int = 0) -> Job:
        """Queue `fn` to run on the decoding thread in its turn, a round of its own (other work on
        the model never runs beside a decoding round); its future holds what it returns."""
        return self._put(Job([], object(), tokens, call=fn))

    def _put(self, job: Job) -> Job:
        with self._cond:
            if self._stopping:
                raise ShuttingDown("the server is shutting down")
            if self._ended is not None:
                raise RuntimeError(f"the decoding thread has ended ({self._ended})")
            if len(self._queue) >= self.max_queue:
                raise QueueFull(f"{len(self._queue)} requests are waiting (the limit)")
            self._queue.append(job)
            self._cond.notify_all()
        return job

    def cancel(self, job: Job) -> None:
        """The client is gone: drop the job if it is still queued, else ignore its results."""
        with self._cond:
            job.cancelled = True
            if job in self._queue:
                self._queue.remove(job)
                self.stats.cancelled += 1
        job.future.cancel()

    @property
    def running(self) -> bool:
        """Whether the decoding thread is alive (after `stop`: a round stuck past its timeout)."""
        return self._thread is not None and self._thread.is_alive()

    @property
    def queued(self) -> int:
        with self._cond:
            return len(self._queue)

    def _take_round(self) -> list[Job] | None:
        """Wait for work, then take the oldest job and those with its settings that fit the budget."""
        with self._cond:
            while True:
                while not self._queue and not self._stopping:
                    self._cond.wait()
                if self._stopping:
                    return None
                first = self._queue[0]
                if first.call is not None:
                    self._queue.popleft()
                    return [first]
                deadline = first.arrived + self.max_wait
                while not self._stopping:
                    same = sum(j.tokens for j in self._queue if j.settings == first.settings)
                    left = deadline - time.monotonic()
                    if same >= self.max_batch_tokens or left <= 0 or first not in self._queue:
                        break
                    self._cond.wait(left)
                if self._stopping:
                    return None
                if not self._queue or self._queue[0] is not first:  # cancelled while waiting
                    continue
                taken, tokens = [], 0
                for job in (j for j in self._queue if j.settings == first.settings):
                    if taken and tokens + job.tokens > self.max_batch_tokens:
                        break
                    taken.append(job)
                    tokens += job.tokens
                for job in taken:
                    self._queue.remove(job)
                return taken

    def _run(self) -> None:
        try:
            while True:
                jobs = self._take_round()
                if jobs is None:
                    return
                try:
                    self._round(jobs)
                except BaseException as e:  # noqa: BLE001 - a fault outside `translate`: fail the round's jobs
                    _fail(jobs, e)
                    if not isinstance(e, Exception):
                        raise
                    log.exception("a decoding round failed")
                if self.after_round is not None:
                    try:
                        self.after_round(not self.queued)
                    except Exception:  # noqa: BLE001 - housekeeping must not end the decoding thread
                        log.exception("after_round failed")
        except BaseException as e:  # noqa: BLE001 - never leave a caller waiting on a dead thread
            self._ended = f"{type(e).__name__}: {e}"
            log.critical("the decoding thread ended: %s", self._ended, exc_info=e)
            self.fail_queued(RuntimeError(f"the decoding thread ended ({self._ended})"))

    def _round(self, jobs: list[Job]) -> None:
        """Decode one round (or run one call) and hand each job its results, or the round's error."""
        jobs = [j for j in jobs if not j.cancelled and j.future.set_running_or_notify_cancel()]
        if not jobs:
            return
        sentences = [s for j in jobs for s in j.sentences]
        started = time.perf_counter()
        results: Sequence | None = None
        error: BaseException | None = None
        try:
            if jobs[0].call is not None:
                value = jobs[0].call()
            else:
                results = list(self.translate(sentences, jobs[0].settings)) if sentences else []
                if len(results) != len(sentences):
                    raise RuntimeError(f"{len(results)} results for {len(sentences)} sentences")
        except BaseException as e:  # noqa: BLE001 - the round's jobs fail, the thread goes on
            error = e
        seconds = time.perf_counter() - started
        if self.on_round is not None and jobs[0].call is None:
            try:
                self.on_round(jobs, seconds, results, error)
            except Exception:  # noqa: BLE001 - a metric must not fail a round
                log.exception("on_round failed")
        if error is not None:
            self.stats.failed_rounds += 1
            log.error(
                "decoding failed for %d request(s), %d sentence(s): %s: %s",
                len(jobs),
                len(sentences),
                type(error).__name__,
                error,
                exc_info=error,
            )
            return _fail(jobs, error)
        if jobs[0].call is not None:
            return jobs[0].future.set_result(value)
        self.stats.rounds += 1
        self.stats.jobs += len(jobs)
        self.stats.sentences += len(sentences)
        start = 0
        for j in jobs:
            j.future.set_result(results[start : start + len(j.sentences)])
            start += len(j.sentences)


def _fail(jobs: list[Job], e: BaseException) -> None:
    """Fail the jobs not done yet with `e` as an Exception (a KeyboardInterrupt or SystemExit raised in
    the decoding thread becomes a RuntimeError naming it, never re-raised in the server's event loop)."""
    e = e if isinstance(e, Exception) else RuntimeError(f"{type(e).__name__} in the decoding thread: {e}")
    for j in jobs:
        if not j.future.done():
            j.future.set_exception(e)
