"""Reading line-aligned parallel text (plain or gzip, UTF-8, streamed line by line), and the length
filter applied to training pairs. Bad input raises `DataError`, one line naming the file and line.

Lines are split on b"\\n" only: Python's text mode and `str.splitlines` would also split on "\\r",
U+0085, U+2028 and U+2029, which occur inside sentences of web-crawled corpora and would silently
break the line alignment.
"""

from __future__ import annotations

import gzip
import zlib
from dataclasses import asdict, dataclass, field
from itertools import zip_longest
from pathlib import Path
from typing import BinaryIO, Iterator

from ..defaults import MAX_LEN, MAX_RATIO
from ..errors import DataError


def open_text(path: str | Path) -> BinaryIO:
    """Open a plain or gzip (by the magic bytes, not the name) file for `iter_lines`."""
    path = Path(path)
    if not path.exists():
        raise DataError("no such file", path)
    if path.is_dir():
        raise DataError("is a directory, not a text file", path)
    try:
        with open(path, "rb") as f:
            magic = f.read(2)
        return gzip.open(path, "rb") if magic == b"\x1f\x8b" else open(path, "rb")
    except PermissionError:
        raise DataError("cannot read file (permission denied)", path) from None


def iter_lines(f: BinaryIO, name: str | Path) -> Iterator[str]:
    """The lines of a binary stream (`open_text`), decoded as UTF-8, without their line endings
    (a trailing "\\r" and a leading byte-order mark dropped). Invalid UTF-8 and corrupt gzip data
    raise DataError naming `name` and the line."""
    n = 0
    try:
        for n, raw in enumerate(f, start=1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                # the byte's position counts from 1, as the line's does
                raise DataError(f"invalid UTF-8 (byte {e.start + 1} of the line)", name, n) from None
            line = line.removesuffix("\n").removesuffix("\r")
            yield line.removeprefix("\ufeff") if n == 1 else line  # a byte-order mark
    except (EOFError, zlib.error, gzip.BadGzipFile) as e:  # a truncated or damaged gzip stream
        raise DataError(f"corrupt gzip data ({e or type(e).__name__})", name, n + 1) from None


def read_lines(path: str | Path) -> Iterator[str]:
    """Yield the lines of a text file (`iter_lines`); an empty file is a DataError."""
    path = Path(path)
    n = 0
    with open_text(path) as f:
        for n, line in enumerate(iter_lines(f, path), start=1):
            yield line
    if n == 0:
        raise DataError("empty file (no lines)", path)


def read_parallel(src_path: str | Path, tgt_path: str | Path) -> Iterator[tuple[str, str]]:
    """Yield (source line, target line) pairs; DataError if the line counts differ."""
    for n, (src, tgt) in enumerate(zip_longest(read_lines(src_path), read_lines(tgt_path))):
        if src is None:
            raise DataError(f"{src_path} has only {n} lines (line counts differ)", tgt_path, n + 1)
        if tgt is None:
            raise DataError(f"{tgt_path} has only {n} lines (line counts differ)", src_path, n + 1)
        yield src, tgt


# --- the length filter: subword tokens without EOS, training pairs only (BLEU needs whole test sets);
# its defaults, `transduce.defaults.MAX_LEN` and `MAX_RATIO`


def filter_reason(src_len: int, tgt_len: int, max_len: int, max_ratio: float) -> str | None:
    """Why a pair of these token lengths is dropped ("empty", "too_long", "bad_ratio"), or None."""
    if src_len == 0 or tgt_len == 0:
        return "empty"
    if src_len > max_len or tgt_len > max_len:
        return "too_long"
    if max(src_len, tgt_len) > max_ratio * min(src_len, tgt_len):
        return "bad_ratio"
    return None


@dataclass
class FilterReport:
    """What the length filter did to one split, with the first few lines dropped for each reason."""

    max_len: int = MAX_LEN
    max_ratio: float = MAX_RATIO
    read: int = 0
    kept: int = 0
    empty: int = 0
    too_long: int = 0
    bad_ratio: int = 0
    examples: dict[str, list[int]] = field(default_factory=dict)

    MAX_EXAMPLES = 5

    def count(self, reason: str | None, line: int) -> None:
        """Record one pair read at `line` that was kept (reason None) or dropped for `reason`."""
        self.read += 1
        if reason is None:
            self.kept += 1
            return
        setattr(self, reason, getattr(self, reason) + 1)
        lines = self.examples.setdefault(reason, [])
        if len(lines) < self.MAX_EXAMPLES:
            lines.append(line)

    @property
    def dropped(self) -> int:
        return self.read - self.kept

    def summary(self) -> str:
        """One line for the user, e.g. ``29,000 pairs read, 28,996 kept; dropped: 0 empty, ...``."""
        return (
            f"{self.read:,} pairs read, {self.kept:,} kept; dropped: {self.empty:,} empty, "
            f"{self.too_long:,} longer than {self.max_len} tokens, "
            f"{self.bad_ratio:,} with length ratio > {self.max_ratio:g}"
        )

    def to_dict(self) -> dict:
        return asdict(self)
