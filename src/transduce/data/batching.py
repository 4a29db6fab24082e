"""Batches by token budget, and the tensors a batch becomes.

Section 5.1: "Sentence pairs were batched together by approximate sequence length. Each training
batch contained a set of sentence pairs containing approximately 25000 source tokens and 25000
target tokens."

`batch_by_tokens` works from the sentence sizes alone: pairs sorted by length, cut into batches
whose *padded* size, batch_size * longest sentence, stays within `max_tokens` on both sides
(`max_tokens=25000` is the paper's budget summed over its 8 GPUs). `collate` turns one batch into
the model's inputs (all right-padded with PAD; the special ids are the data's, data.json's
"special_ids", which are its model's, `ModelConfig.special_ids`):

    src      (B, S)  stored source, ends with EOS          x1 x2 x3 EOS
    tgt_in   (B, T)  BOS + stored target without its EOS   BOS y1 y2 y3
    tgt_out  (B, T)  stored target, ends with EOS          y1 y2 y3 EOS

so the decoder predicts tgt_out[:, t] having seen tgt_in[:, :t+1]: with the causal mask, this is
"the output embeddings are offset by one position" of Section 3.1.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Sequence

import numpy as np
import torch

from .indexed import IndexedDataset
from ..errors import DataError
from ..special_ids import DEFAULT, SpecialIds
from .vocab import Vocab, open_vocabs

METADATA = "data.json"  # written by `transduce prepare` into the data directory


def batch_by_tokens(
    src_sizes: np.ndarray,
    tgt_sizes: np.ndarray,
    max_tokens: int,
    *,
    seed: int = 0,
    epoch: int = 0,
    shuffle: bool = True,
    num_shards: int = 1,
    shard_id: int = 0,
) -> list[np.ndarray]:
    """Group pair indices into batches of at most `max_tokens` padded tokens per side: pairs
    sorted by (target size, source size), ties broken at random by (seed, epoch), cut greedily,
    and the batches shuffled (if `shuffle`; without it the order depends on nothing else).

    Data-parallel ranks call this alike but for `shard_id`, each getting every `num_shards`-th
    batch of the same list, padded at the end with its first batches so that every shard has as
    many (nothing is dropped). Raises ValueError if a single pair is longer than `max_tokens`."""
    src_sizes = np.asarray(src_sizes, dtype=np.int64)
    tgt_sizes = np.asarray(tgt_sizes, dtype=np.int64)
    if src_sizes.shape != tgt_sizes.shape or src_sizes.ndim != 1:
        raise ValueError(f"size arrays differ: {src_sizes.shape} source vs {tgt_sizes.shape} target")
    if max_tokens < 1:
        raise ValueError(f"max_tokens must be positive, got {max_tokens}")
    if not 0 <= shard_id < num_shards:
        raise ValueError(f"shard_id {shard_id} is not in [0, {num_shards})")
    too_long = np.flatnonzero((src_sizes > max_tokens) | (tgt_sizes > max_tokens))
    if len(too_long):
        i = int(too_long[0])
        raise ValueError(
            f"pair {i} has {src_sizes[i]} source and {tgt_sizes[i]} target tokens, more than "
            f"max_tokens={max_tokens} ({len(too_long)} such pairs); raise max_tokens or prepare "
            f"the data with a smaller --max-len"
        )

    rng = np.random.default_rng([seed, epoch])
    tie_break = rng.random(len(src_sizes)) if shuffle else np.arange(len(src_sizes))
    order = np.lexsort((tie_break, src_sizes, tgt_sizes))  # the last key sorts first
    batches = _pack(order, src_sizes[order].tolist(), tgt_sizes[order].tolist(), max_tokens)
    if shuffle:
        batches = [batches[j] for j in rng.permutation(len(batches))]
    return _shard(batches, num_shards, shard_id)


def _pack(
    order: np.ndarray, src: Sequence[int], tgt: Sequence[int], max_tokens: int, max_sentences: int | None = None
) -> list[np.ndarray]:
    """Cut `order` (pair indices, with their sizes `src`, `tgt`) greedily into batches of at most
    `max_tokens` padded tokens per side and `max_sentences` pairs (a longer pair alone)."""
    batches = []
    start, longest_src, longest_tgt = 0, 0, 0
    for k in range(len(order)):
        s, t = max(longest_src, src[k]), max(longest_tgt, tgt[k])
        n = k - start + 1  # pairs in the batch with pair k
        if n > 1 and (n * max(s, t) > max_tokens or (max_sentences is not None and n > max_sentences)):
            batches.append(order[start:k])  # pair k does not fit: it opens a new batch
            start, s, t = k, src[k], tgt[k]
        longest_src, longest_tgt = s, t
    if start < len(order):
        batches.append(order[start:])
    return batches


def batch_for_decoding(sizes: Sequence[int], max_tokens: int, max_sentences: int) -> list[np.ndarray]:
    """Batches of sentences to decode (indices into `sizes`), longest first, cut as `_pack` cuts."""
    if max_tokens < 1 or max_sentences < 1:
        raise ValueError("max_tokens and max_sentences must be positive")
    sizes = np.asarray(sizes, dtype=np.int64)
    order = np.argsort(-sizes, kind="stable")  # longest first; ties keep the input order
    ordered = sizes[order].tolist()
    return _pack(order, ordered, ordered, max_tokens, max_sentences)


def pad_batch(rows: list[list[int]], pad: int) -> torch.Tensor:
    """(len(rows), longest) token ids, right-padded with `pad` (the model's `config.pad_id`): a batch to decode."""
    out = torch.full((len(rows), max(len(r) for r in rows)), pad, dtype=torch.long)
    for i, r in enumerate(rows):
        out[i, : len(r)] = torch.tensor(r, dtype=torch.long)
    return out


def _shard(batches: list[np.ndarray], num_shards: int, shard_id: int) -> list[np.ndarray]:
    """Every `num_shards`-th batch, after padding the list to a multiple of `num_shards`."""
    if num_shards == 1 or not batches:
        return batches
    per_shard = math.ceil(len(batches) / num_shards)
    padded = [batches[j % len(batches)] for j in range(per_shard * num_shards)]
    return padded[shard_id::num_shards]


def collate(
    src_list: Sequence[np.ndarray], tgt_list: Sequence[np.ndarray], pad_id: int = DEFAULT.pad, bos_id: int = DEFAULT.bos
) -> dict:
    """The model's LongTensors (module docstring), padded with `pad_id`, the decoder's input starting
    with `bos_id` (`ParallelDataset.collate`: the data's ids); and "ntokens": the non-pad target tokens."""
    if len(src_list) != len(tgt_list) or not src_list:
        raise ValueError(f"need equal, non-zero numbers of sentences, got {len(src_list)} and {len(tgt_list)}")
    batch, tgt_len = len(src_list), max(len(t) for t in tgt_list)
    src = np.full((batch, max(len(s) for s in src_list)), pad_id, dtype=np.int64)  # (B, S)
    tgt_in = np.full((batch, tgt_len), pad_id, dtype=np.int64)  # (B, T)
    tgt_out = np.full((batch, tgt_len), pad_id, dtype=np.int64)  # (B, T)
    for i, (s, t) in enumerate(zip(src_list, tgt_list)):
        src[i, : len(s)] = s
        tgt_out[i, : len(t)] = t
        tgt_in[i, 0] = bos_id
        tgt_in[i, 1 : len(t)] = t[:-1]
    return {
        "src": torch.from_numpy(src),
        "tgt_in": torch.from_numpy(tgt_in),
        "tgt_out": torch.from_numpy(tgt_out),
        "ntokens": int(sum(len(t) for t in tgt_list)),
    }


class ParallelDataset:
    """A source and a target `IndexedDataset` of the same split, pair i = (src[i], tgt[i]), and the
    special ids its batches are made with (`ids`)."""

    def __init__(self, src: IndexedDataset, tgt: IndexedDataset, ids: SpecialIds = DEFAULT):
        if len(src) != len(tgt):
            raise DataError(f"{len(src)} source but {len(tgt)} target sentences", src.prefix)
        self.src, self.tgt, self.ids = src, tgt, ids
        self.src_sizes, self.tgt_sizes = src.sizes, tgt.sizes

    @classmethod
    def load(cls, data_dir: str | Path, split: str) -> "ParallelDataset":
        """The split `split` of a `transduce prepare` output directory ({split}.src/.tgt), with
        the special ids its data.json records (none recorded: `special_ids.DEFAULT`)."""
        data_dir = Path(data_dir)
        if not (data_dir / f"{split}.src.idx").is_file():
            found = sorted(p.name[: -len(".src.idx")] for p in data_dir.glob("*.src.idx"))
            have = f"prepared splits: {', '.join(found)}" if found else "run `transduce prepare` first"
            raise DataError(f"no split {split!r} here ({have})", data_dir)
        ids = data_special_ids(read_metadata(data_dir)) if (data_dir / METADATA).is_file() else DEFAULT
        return cls(IndexedDataset(data_dir / f"{split}.src"), IndexedDataset(data_dir / f"{split}.tgt"), ids)

    def __len__(self) -> int:
        return len(self.src)

    def __getitem__(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        return self.src[i], self.tgt[i]

    def batches(self, max_tokens: int, **kwargs) -> list[np.ndarray]:
        """`batch_by_tokens` over this dataset's sizes (same keyword arguments)."""
        return batch_by_tokens(self.src_sizes, self.tgt_sizes, max_tokens, **kwargs)

    def collate(self, indices: Sequence[int]) -> dict:
        """The tensors of the pairs `indices` (see `collate`), with this data's special ids."""
        return collate(
            [self.src[int(i)] for i in indices], [self.tgt[int(i)] for i in indices], self.ids.pad, self.ids.bos
        )


def read_metadata(data_dir: str | Path) -> dict:
    """The data.json of a prepared directory."""
    path = Path(data_dir) / METADATA
    if not path.is_file():
        raise DataError("no such file (run `transduce prepare` first)", path)
    try:
        meta = json.loads(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError:
        raise DataError("not UTF-8 text (not a data.json of `transduce prepare`)", path) from None
    except json.JSONDecodeError as e:
        raise DataError(f"not valid JSON ({e.msg}, column {e.colno})", path, e.lineno) from None
    if not isinstance(meta, dict):
        raise DataError("not a data.json of `transduce prepare` (not a JSON object)", path)
    return meta


def data_special_ids(meta: dict) -> SpecialIds:
    """The special ids a data.json (or a model directory's) records; none recorded: `special_ids.DEFAULT`."""
    try:
        return SpecialIds.from_dict(meta.get("special_ids"))
    except (TypeError, ValueError) as e:
        raise DataError(f"its special_ids are not pad, unk, bos, eos ids ({e})", METADATA) from None


def load_vocabs(data_dir: str | Path) -> tuple[Vocab, Vocab]:
    """(source vocabulary, target vocabulary) of a prepared directory, or of a model directory with a
    data.json (the same object if shared; `vocab.open_vocabs`)."""
    meta = read_metadata(data_dir)
    if not isinstance(meta.get("vocab"), dict):
        raise DataError(
            'no vocabulary named in it (its "vocab" entry): pass --vocab PATH (a sentencepiece model '
            "or a model directory)",
            Path(data_dir) / METADATA,
        )
    return open_vocabs(meta["vocab"], data_dir, meta.get("special_ids"))
