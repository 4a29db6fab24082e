"""Token arrays on disk, read through a memory map (like fairseq's mmap dataset or nanoGPT's .bin).

    {prefix}.bin   all sentences' token ids, concatenated, no header: uint16 if the vocabulary
                   has fewer than 65536 entries, else int32 (told apart by the file's size)
    {prefix}.idx   a numpy .npy file of N + 1 int64 offsets: sentence i is
                   tokens[offsets[i]:offsets[i + 1]]

Each stored sentence is its subword ids followed by EOS (its vocabulary's), and `sizes` include
that EOS. Batching needs only `sizes`; `dataset[i]` copies one sentence out of the memory map.
"""

from __future__ import annotations

import os
from itertools import chain
from pathlib import Path
from typing import Sequence

import numpy as np

from ..errors import DataError
from ..special_ids import DEFAULT


def token_dtype(vocab_size: int) -> np.dtype:
    """uint16 when every id fits in it, else int32."""
    return np.dtype(np.uint16) if vocab_size < 65536 else np.dtype(np.int32)


class IndexedWriter:
    """Streams sentences into `{prefix}.bin` / `{prefix}.idx`, through temporary names that
    `finalize()` renames into place; as a context manager, it finalizes on success and discards
    the files if an exception escapes."""

    def __init__(self, prefix: str | Path, vocab_size: int, eos: int = DEFAULT.eos):
        self.prefix = Path(prefix)
        self.vocab_size, self.eos = vocab_size, eos  # `eos`: the vocabulary's (`Vocab.eos`)
        self.dtype = token_dtype(vocab_size)
        self.bin_path = self.prefix.with_name(self.prefix.name + ".bin")
        self.idx_path = self.prefix.with_name(self.prefix.name + ".idx")
        self._tmp_bin = self.bin_path.with_name(self.bin_path.name + ".tmp")
        self._tmp_idx = self.idx_path.with_name(self.idx_path.name + ".tmp")
        self._file = open(self._tmp_bin, "wb")
        self._sizes: list[np.ndarray] = []  # one int64 array per add_many call
        self.num_sentences = 0
        self.num_tokens = 0
        self.max_size = 0  # longest stored sentence, EOS included

    def add(self, ids: Sequence[int]) -> None:
        """Append one sentence (subword ids without EOS; the EOS is appended here)."""
        self.add_many([ids])

    def add_many(self, sentences: Sequence[Sequence[int]]) -> None:
        """Append many sentences at once (faster than `add` in a loop)."""
        if not sentences:
            return
        sizes = np.fromiter((len(s) + 1 for s in sentences), dtype=np.int64, count=len(sentences))
        ends = np.cumsum(sizes)
        tokens = np.full(int(ends[-1]), self.eos, dtype=np.int64)
        is_word = np.ones(len(tokens), dtype=bool)
        is_word[ends - 1] = False  # the EOS positions
        tokens[is_word] = np.fromiter(chain.from_iterable(sentences), dtype=np.int64, count=int(is_word.sum()))
        if tokens.min() < 0 or tokens.max() >= self.vocab_size:
            raise ValueError(f"token id out of range [0, {self.vocab_size}) for {self.prefix}")
        if (tokens[is_word] == self.eos).any():
            raise ValueError(f"sentence contains EOS ({self.eos}); add() appends it itself")
        self._file.write(tokens.astype(self.dtype).tobytes())
        self._sizes.append(sizes)
        self.num_sentences += len(sentences)
        self.num_tokens += int(ends[-1])
        self.max_size = max(self.max_size, int(sizes.max()))

    def finalize(self) -> None:
        """Write the index and move both files into place."""
        self._file.close()
        offsets = np.concatenate([np.zeros(1, dtype=np.int64), *self._sizes]).cumsum()
        with open(self._tmp_idx, "wb") as f:
            np.save(f, offsets)
        os.replace(self._tmp_bin, self.bin_path)
        os.replace(self._tmp_idx, self.idx_path)

    def discard(self) -> None:
        """Abandon the files being written."""
        self._file.close()
        for p in (self._tmp_bin, self._tmp_idx):
            p.unlink(missing_ok=True)

    def __enter__(self) -> "IndexedWriter":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.finalize()
        else:
            self.discard()


class IndexedDataset:
    """Read-only view of `{prefix}.bin` / `{prefix}.idx`: `sizes`, and `dataset[i]` (int64 tokens)."""

    def __init__(self, prefix: str | Path):
        self.prefix = Path(prefix)
        bin_path = self.prefix.with_name(self.prefix.name + ".bin")
        idx_path = self.prefix.with_name(self.prefix.name + ".idx")
        for p in (idx_path, bin_path):
            if not p.is_file():
                raise DataError("no such file (run `transduce prepare` first)", p)
        try:
            self.offsets = np.load(idx_path)
        except (ValueError, OSError, EOFError):
            raise DataError("not a .npy index file", idx_path) from None
        if self.offsets.ndim != 1 or len(self.offsets) == 0 or self.offsets[0] != 0:
            raise DataError("malformed index (expected int64 offsets starting at 0)", idx_path)
        self.sizes = np.diff(self.offsets)
        n_tokens = int(self.offsets[-1])
        n_bytes = bin_path.stat().st_size
        if n_tokens == 0 and n_bytes == 0:
            self.tokens = np.zeros(0, dtype=np.uint16)
            return
        dtype = {2 * n_tokens: np.uint16, 4 * n_tokens: np.int32}.get(n_bytes)
        if dtype is None:
            raise DataError(f"{n_bytes} bytes do not hold the {n_tokens} tokens of {idx_path.name}", bin_path)
        self.tokens = np.memmap(bin_path, dtype=dtype, mode="r")

    def __len__(self) -> int:
        return len(self.sizes)

    def __getitem__(self, i: int) -> np.ndarray:
        n = len(self.sizes)
        if not -n <= i < n:
            raise IndexError(f"sentence {i} out of range for {n} sentences in {self.prefix}")
        i = int(i) % n
        return self.tokens[self.offsets[i] : self.offsets[i + 1]].astype(np.int64)

    def __repr__(self) -> str:
        return f"IndexedDataset({str(self.prefix)!r}, sentences={len(self)}, tokens={int(self.offsets[-1])})"
