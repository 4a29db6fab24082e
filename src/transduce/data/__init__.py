"""The data pipeline: text (text.py) -> vocabulary (vocab.py) -> memory-mapped token arrays
(indexed.py) -> batches (batching.py); datasets by name (corpora.py), their files fetched (datasets.py);
`transduce prepare`.

The names below are imported from their modules when first used (PEP 562), so that importing
one light module of the package (text.py, corpora.py, datasets.py: a command's flags) imports no
PyTorch."""

from __future__ import annotations

import importlib

_HOMES = {
    "batching": ("ParallelDataset", "batch_by_tokens", "collate", "load_vocabs", "read_metadata"),
    "corpora": ("DATASETS",),
    "datasets": ("fetch",),
    "indexed": ("IndexedDataset", "IndexedWriter"),
    "text": ("DataError", "FilterReport", "read_lines", "read_parallel"),
    "vocab": ("BOS", "EOS", "PAD", "UNK", "Vocab", "train_vocab"),
}
_MODULE_OF = {name: module for module, names in _HOMES.items() for name in names}

__all__ = [
    "PAD",
    "UNK",
    "BOS",
    "EOS",
    "DataError",
    "FilterReport",
    "read_lines",
    "read_parallel",
    "Vocab",
    "train_vocab",
    "IndexedWriter",
    "IndexedDataset",
    "batch_by_tokens",
    "collate",
    "ParallelDataset",
    "DATASETS",
    "fetch",
    "read_metadata",
    "load_vocabs",
]


def __getattr__(name: str):
    if name not in _MODULE_OF:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_MODULE_OF[name]}"), name)
