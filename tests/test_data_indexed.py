"""Memory-mapped token arrays: round trip, the EOS contract, atomic writes, damaged files."""

import numpy as np
import pytest

from transduce.data.indexed import IndexedDataset, IndexedWriter, token_dtype
from transduce.data.text import DataError
from transduce.data.vocab import EOS


def random_sentences(n, vocab_size, seed=0):
    rng = np.random.default_rng(seed)
    # ids >= 4: no special ids inside sentences
    return [rng.integers(4, vocab_size, size=rng.integers(0, 30)).tolist() for _ in range(n)]


@pytest.mark.parametrize("vocab_size, dtype", [(8000, np.uint16), (65535, np.uint16), (70000, np.int32)])
def test_round_trip(tmp_path, vocab_size, dtype):
    sents = random_sentences(500, vocab_size)
    with IndexedWriter(tmp_path / "train.src", vocab_size) as w:
        w.add(sents[0])
        w.add_many(sents[1:300])
        for s in sents[300:]:
            w.add(s)
    assert w.num_sentences == 500 and w.num_tokens == sum(len(s) + 1 for s in sents)

    ds = IndexedDataset(tmp_path / "train.src")
    assert ds.tokens.dtype == dtype == token_dtype(vocab_size)
    assert (tmp_path / "train.src.bin").stat().st_size == w.num_tokens * np.dtype(dtype).itemsize
    assert len(ds) == 500
    assert ds.sizes.tolist() == [len(s) + 1 for s in sents]  # sizes include the EOS
    for i in (0, 1, 123, 299, 300, 499):
        item = ds[i]
        assert item.dtype == np.int64
        assert item.tolist() == sents[i] + [EOS]
    assert ds[-1].tolist() == sents[-1] + [EOS]
    assert [x.tolist() for x in ds] == [s + [EOS] for s in sents]


def test_items_are_copies(tmp_path):
    with IndexedWriter(tmp_path / "x", 100) as w:
        w.add([5, 6, 7])
    ds = IndexedDataset(tmp_path / "x")
    item = ds[0]
    item[0] = 99  # must not touch the (read-only) memory map
    assert ds[0].tolist() == [5, 6, 7, EOS]


def test_index_errors(tmp_path):
    with IndexedWriter(tmp_path / "x", 100) as w:
        w.add_many([[5], [6, 7]])
    ds = IndexedDataset(tmp_path / "x")
    with pytest.raises(IndexError):
        ds[2]
    with pytest.raises(IndexError):
        ds[-3]


def test_empty_sentence_and_empty_dataset(tmp_path):
    with IndexedWriter(tmp_path / "one", 100) as w:
        w.add([])
    assert IndexedDataset(tmp_path / "one")[0].tolist() == [EOS]
    with IndexedWriter(tmp_path / "none", 100):
        pass
    ds = IndexedDataset(tmp_path / "none")
    assert len(ds) == 0 and ds.sizes.tolist() == []


def test_writer_rejects_bad_ids(tmp_path):
    w = IndexedWriter(tmp_path / "x", 100)
    with pytest.raises(ValueError, match="out of range"):
        w.add([5, 100])
    with pytest.raises(ValueError, match="out of range"):
        w.add([-1])
    with pytest.raises(ValueError, match="appends it itself"):
        w.add([5, EOS])
    w.discard()


def test_writes_are_atomic(tmp_path):
    w = IndexedWriter(tmp_path / "x", 100)
    w.add([4, 5])
    assert not (tmp_path / "x.bin").exists() and not (tmp_path / "x.idx").exists()  # only temporary names
    w.finalize()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["x.bin", "x.idx"]


def test_failure_inside_context_leaves_nothing(tmp_path):
    with pytest.raises(RuntimeError):
        with IndexedWriter(tmp_path / "x", 100) as w:
            w.add([4, 5])
            raise RuntimeError("interrupted")
    assert list(tmp_path.iterdir()) == []


def test_missing_and_damaged_files(tmp_path):
    with pytest.raises(DataError, match=r"x\.idx: no such file"):
        IndexedDataset(tmp_path / "x")
    with IndexedWriter(tmp_path / "x", 100) as w:
        w.add_many([[4, 5, 6], [7]])
    with open(tmp_path / "x.bin", "ab") as f:
        f.write(b"\0")  # one byte too many
    with pytest.raises(DataError, match="do not hold"):
        IndexedDataset(tmp_path / "x")
    (tmp_path / "x.idx").write_bytes(b"garbage")
    with pytest.raises(DataError, match="not a .npy index"):
        IndexedDataset(tmp_path / "x")
