"""Stopping on request: SIGTERM (Slurm, `docker stop`, systemd, Kubernetes) and SIGINT (Ctrl-C) end
a training run at a step boundary, with a checkpoint, instead of killing it between two (docs/cluster.md).

The first signal only sets `StopSignals.requested`: the step finishes, the trainer writes a
checkpoint (at the same step on every rank) and exits with `EXIT_INTERRUPTED`; the same command run again goes on.
A second signal ends the process at once, as its default action would (a checkpoint being written
is abandoned whole). Except within `SAME_REQUEST_S` seconds of the first, where it cannot be a
person's second press: a signal of the other kind, or any in a torchrun worker, which is often
sent the same signal twice at once (torchrun forwards it to its workers, and Slurm or systemd
signal every process of the job as well).
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time

EXIT_INTERRUPTED = 75
"""The exit status of a run stopped by a signal after writing its checkpoint (sysexits' EX_TEMPFAIL:
"try again later"): a wrapper script or a scheduler can requeue on it (docs/cluster.md)."""

SAME_REQUEST_S = 2.0

HANDLED = (signal.SIGTERM, signal.SIGINT)


class StopSignals:
    """While entered (in the main thread; elsewhere it does nothing), SIGTERM and SIGINT request a
    stop instead of killing the process. `requested` is the first signal's name, or None."""

    def __init__(self) -> None:
        self.requested: str | None = None
        self._first: tuple[int, float] | None = None
        self._previous: dict[int, object] = {}

    def __enter__(self) -> "StopSignals":
        if threading.current_thread() is threading.main_thread():
            for sig in HANDLED:
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()

    def _handle(self, signum: int, frame) -> None:
        now = time.monotonic()
        if self._first is None:
            self._first = (signum, now)
            self.requested = signal.Signals(signum).name
            _stderr(f"\n{self.requested}: stopping after this step with a checkpoint (send it again to exit at once)\n")
            return
        first, at = self._first
        if now - at < SAME_REQUEST_S and (signum != first or under_torchrun()):  # the same request, twice
            return
        _stderr(f"\n{signal.Signals(signum).name} again: exiting now, without a checkpoint\n")
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)


def under_torchrun() -> bool:
    """Whether this process is a worker started by torchrun (its elastic agent sets these)."""
    return "TORCHELASTIC_RUN_ID" in os.environ or "TORCHELASTIC_RESTART_COUNT" in os.environ


def _stderr(text: str) -> None:
    """Write from a signal handler: os.write, never print (a handler may interrupt a print)."""
    with contextlib.suppress(OSError):
        os.write(2, text.encode())
