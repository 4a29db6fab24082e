"""The data pipeline: text -> vocabulary -> token arrays -> batches.

    text.py      read line-aligned parallel text (plain or .gz), the length filter
    vocab.py     sentencepiece BPE vocabularies with fixed special ids PAD, UNK, BOS, EOS = 0, 1, 2, 3
    indexed.py   memory-mapped token arrays on disk ({prefix}.bin + {prefix}.idx)
    batching.py  batches by token budget from the size arrays; collate into model tensors
    datasets.py  datasets known by name (Multi30k, WMT14), fetched once and checksummed
    prepare.py   all of the above, from text files to a data directory (`transduce prepare`)
"""

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
