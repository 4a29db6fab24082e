"""The data pipeline: text (text.py) -> vocabulary (vocab.py) -> memory-mapped token arrays
(indexed.py) -> batches (batching.py); datasets by name (datasets.py); `transduce prepare`."""

from .batching import ParallelDataset, batch_by_tokens, collate, load_vocabs, read_metadata
from .datasets import DATASETS, fetch
from .indexed import IndexedDataset, IndexedWriter
from .text import DataError, FilterReport, read_lines, read_parallel
from .vocab import BOS, EOS, PAD, UNK, Vocab, train_vocab

__all__ = [
    "PAD", "UNK", "BOS", "EOS",
    "DataError", "FilterReport", "read_lines", "read_parallel",
    "Vocab", "train_vocab",
    "IndexedWriter", "IndexedDataset",
    "batch_by_tokens", "collate", "ParallelDataset",
    "DATASETS", "fetch",
    "read_metadata", "load_vocabs",
]
