"""The one error vocabulary of transduce: a `TransduceError` is a problem of the user's input,
which the `transduce` command reports as one line, ``transduce SUBCOMMAND: error: MESSAGE``, exit
status 2, no traceback (`transduce.cli.report_errors`), as it does ValueError and FileNotFoundError.
"""

from __future__ import annotations

from pathlib import Path


class TransduceError(Exception):
    """A problem of the user's input, reported on one line with exit status 2."""


class DataError(TransduceError):
    """A problem with the user's data, reported as one line: ``<file>:<line>: <what>``."""

    def __init__(self, message: str, path: str | Path | None = None, line: int | None = None):
        self.message = " ".join(str(message).split("\n"))
        self.path = None if path is None else str(path)
        self.line = line
        super().__init__(str(self))

    def __str__(self) -> str:
        if self.path is None:
            return self.message
        if self.line is None:
            return f"{self.path}: {self.message}"
        return f"{self.path}:{self.line}: {self.message}"


class UsageError(TransduceError):
    """Bad input from the command line: reported as one line, exit status 2."""


class TrainingStopped(TransduceError):
    """Training stopped on purpose, its state resumable: another trainer holds the run directory,
    a checkpoint could not be written, or too many steps in a row were not finite."""
