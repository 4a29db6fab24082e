"""Token-budget batching, sharding, collation and the ParallelDataset."""

import numpy as np
import pytest
import torch

from transduce.data.batching import ParallelDataset, batch_by_tokens, batch_for_decoding, collate
from transduce.data.indexed import IndexedWriter
from transduce.data.text import DataError
from transduce.data.vocab import BOS, EOS, PAD


def sizes(n=5000, seed=0):
    rng = np.random.default_rng(seed)
    src = rng.integers(2, 80, n)
    tgt = np.clip(src + rng.integers(-5, 6, n), 2, None)  # correlated, like real translations
    return src, tgt


def as_lists(batches):
    return [b.tolist() for b in batches]


def test_every_index_exactly_once_and_budget_respected():
    src, tgt = sizes()
    batches = batch_by_tokens(src, tgt, max_tokens=1000, seed=1, epoch=0)
    flat = np.concatenate(batches)
    assert sorted(flat.tolist()) == list(range(len(src)))
    for b in batches:
        assert len(b) * src[b].max() <= 1000  # padded source tokens
        assert len(b) * tgt[b].max() <= 1000  # padded target tokens
    # full batches: the padding waste of length-sorted batches is small
    padded = sum(len(b) * tgt[b].max() for b in batches)
    assert tgt.sum() / padded > 0.9


def test_batches_are_grouped_by_length():
    src, tgt = sizes()
    batches = batch_by_tokens(src, tgt, max_tokens=1000)
    spread = np.mean([tgt[b].max() - tgt[b].min() for b in batches])
    assert spread <= 1.0  # (random batches would spread over most of 2..85)


def test_deterministic_for_seed_and_epoch():
    src, tgt = sizes()
    a = batch_by_tokens(src, tgt, 1000, seed=7, epoch=3)
    b = batch_by_tokens(src, tgt, 1000, seed=7, epoch=3)
    assert as_lists(a) == as_lists(b)
    assert as_lists(a) != as_lists(batch_by_tokens(src, tgt, 1000, seed=7, epoch=4))
    assert as_lists(a) != as_lists(batch_by_tokens(src, tgt, 1000, seed=8, epoch=3))


def test_order_of_batches_changes_across_epochs():
    src, tgt = sizes()
    first = [b[0] for b in batch_by_tokens(src, tgt, 1000, epoch=0)[:20]]
    second = [b[0] for b in batch_by_tokens(src, tgt, 1000, epoch=1)[:20]]
    assert first != second


def test_no_shuffle_is_sorted_and_ignores_seed():
    src, tgt = sizes()
    a = batch_by_tokens(src, tgt, 1000, shuffle=False, seed=1, epoch=0)
    b = batch_by_tokens(src, tgt, 1000, shuffle=False, seed=2, epoch=5)
    assert as_lists(a) == as_lists(b)
    order = np.concatenate(a)
    assert np.all(np.diff(tgt[order]) >= 0)  # sorted by target length


def test_only_sizes_are_needed():
    # batching works on size arrays of any origin (lists too) and never reads tokens
    batches = batch_by_tokens([3, 5, 4, 2], [4, 4, 6, 2], max_tokens=8, shuffle=False)
    assert as_lists(batches) == [[3, 0], [1], [2]]


def test_pair_longer_than_budget_is_an_error():
    src, tgt = np.array([5, 300, 7]), np.array([5, 6, 7])
    with pytest.raises(ValueError, match="pair 1 has 300 source and 6 target tokens, more than max_tokens=256"):
        batch_by_tokens(src, tgt, 256)
    batch_by_tokens(src, tgt, 300)  # an item of exactly max_tokens fits


def test_bad_arguments():
    with pytest.raises(ValueError, match="size arrays differ"):
        batch_by_tokens([1, 2], [1], 10)
    with pytest.raises(ValueError, match="shard_id"):
        batch_by_tokens([1], [1], 10, num_shards=2, shard_id=2)


@pytest.mark.parametrize("num_shards", [2, 3, 8])
def test_shards_have_equal_counts_and_cover_everything(num_shards):
    src, tgt = sizes(3001)
    full = batch_by_tokens(src, tgt, 700, seed=5, epoch=2)
    shards = [
        batch_by_tokens(src, tgt, 700, seed=5, epoch=2, num_shards=num_shards, shard_id=r) for r in range(num_shards)
    ]
    counts = {len(s) for s in shards}
    assert counts == {-(-len(full) // num_shards)}  # the same number of batches on every rank
    seen = np.concatenate([np.concatenate(s) for s in shards])
    assert set(seen.tolist()) == set(range(3001))  # nothing dropped
    repeats = len(seen) - 3001
    assert repeats <= (num_shards - 1) * max(len(b) for b in full)  # only the padding repeats
    # the shards interleave the unsharded list
    assert as_lists(shards[0]) == as_lists(full[::num_shards])


def test_fewer_batches_than_shards():
    shards = [batch_by_tokens([5, 5], [5, 5], 10, num_shards=4, shard_id=r) for r in range(4)]
    assert [len(s) for s in shards] == [1, 1, 1, 1]
    assert [len(s) for s in (batch_by_tokens([], [], 10, num_shards=4, shard_id=r) for r in range(4))] == [0] * 4


def test_decoding_batches_are_longest_first_within_both_budgets():
    """Decoding's batches: every sentence once, longest first (ties in input order), at most
    max_tokens padded tokens and max_sentences sentences; an over-long sentence alone."""
    sizes = [3, 9, 1, 4, 4, 30, 2, 9, 4, 1, 7]
    batches = batch_for_decoding(sizes, max_tokens=20, max_sentences=3)
    order = [int(i) for b in batches for i in b]
    assert order == [5, 1, 7, 10, 3, 4, 8, 0, 6, 2, 9]  # by length, descending; ties keep their order
    assert [len(b) for b in batches] == [1, 2, 2, 3, 3]  # 30 alone; 2 x 9; 7, 4; then 3 a batch
    for b in batches[1:]:
        assert len(b) <= 3 and len(b) * max(sizes[i] for i in b) <= 20
    # a cut is where one more sentence would break a budget
    for b, nxt in zip(batches[1:], batches[2:]):
        assert len(b) == 3 or (len(b) + 1) * sizes[b[0]] > 20
    with pytest.raises(ValueError):
        batch_for_decoding(sizes, max_tokens=0, max_sentences=3)


def test_collate_shapes_and_shift():
    src = [np.array([10, 11, 12, EOS]), np.array([13, EOS])]
    tgt = [np.array([20, EOS]), np.array([21, 22, 23, 24, EOS])]
    batch = collate(src, tgt)
    assert batch["src"].dtype == torch.long and batch["src"].shape == (2, 4)
    assert batch["tgt_in"].shape == batch["tgt_out"].shape == (2, 5)
    assert batch["src"].tolist() == [[10, 11, 12, EOS], [13, EOS, PAD, PAD]]
    assert batch["tgt_out"].tolist() == [[20, EOS, PAD, PAD, PAD], [21, 22, 23, 24, EOS]]
    assert batch["tgt_in"].tolist() == [[BOS, 20, PAD, PAD, PAD], [BOS, 21, 22, 23, 24]]
    assert batch["ntokens"] == 7 == int((batch["tgt_out"] != PAD).sum())
    # tgt_in is tgt_out shifted right by one, starting with BOS, on every non-pad position
    out, inp = batch["tgt_out"], batch["tgt_in"]
    assert torch.equal(inp[:, 1:][out[:, 1:] != PAD], out[:, :-1][out[:, 1:] != PAD])


def test_collate_custom_ids():
    batch = collate([np.array([7, 3])], [np.array([8, 9, 3])], pad_id=1, bos_id=5)
    assert batch["tgt_in"].tolist() == [[5, 8, 9]]


def write_split(data_dir, split, pairs, vocab_size=50):
    with (
        IndexedWriter(data_dir / f"{split}.src", vocab_size) as s,
        IndexedWriter(data_dir / f"{split}.tgt", vocab_size) as t,
    ):
        for a, b in pairs:
            s.add(a)
            t.add(b)


def test_parallel_dataset(tmp_path):
    rng = np.random.default_rng(0)
    pairs = [
        (rng.integers(4, 50, rng.integers(1, 20)).tolist(), rng.integers(4, 50, rng.integers(1, 20)).tolist())
        for _ in range(200)
    ]
    write_split(tmp_path, "train", pairs)
    ds = ParallelDataset.load(tmp_path, "train")
    assert len(ds) == 200
    assert ds.src_sizes.tolist() == [len(a) + 1 for a, _ in pairs]
    assert [x.tolist() for x in ds[5]] == [pairs[5][0] + [EOS], pairs[5][1] + [EOS]]
    batches = ds.batches(100, seed=0, epoch=0)
    assert sorted(np.concatenate(batches).tolist()) == list(range(200))
    batch = ds.collate(batches[0])
    i = int(batches[0][0])
    assert batch["src"][0, : len(pairs[i][0]) + 1].tolist() == pairs[i][0] + [EOS]
    assert batch["tgt_out"][0, : len(pairs[i][1]) + 1].tolist() == pairs[i][1] + [EOS]


def test_parallel_dataset_errors(tmp_path):
    write_split(tmp_path, "train", [([5], [6])])
    write_split(tmp_path, "valid", [([5], [6])])
    with pytest.raises(DataError, match=r"no split 'test' here \(prepared splits: train, valid\)"):
        ParallelDataset.load(tmp_path, "test")
    with IndexedWriter(tmp_path / "bad.src", 50) as w:
        w.add_many([[5], [6]])
    with IndexedWriter(tmp_path / "bad.tgt", 50) as w:
        w.add([5])
    with pytest.raises(DataError, match="2 source but 1 target sentences"):
        ParallelDataset.load(tmp_path, "bad")
