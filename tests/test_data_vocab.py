"""sentencepiece vocabularies and their special ids: the default layout for those transduce trains,
a model's own for any other."""

import random

import pytest
import sentencepiece as spm

from transduce.data.text import DataError
from transduce.data.vocab import BOS, EOS, PAD, UNK, Vocab, train_vocab

WORDS = "the a man woman dog cat runs sits on in under house garden red blue small big".split()


def sentences(n, seed=0):
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 12))) for _ in range(n)]


@pytest.fixture(scope="module")
def vocab(tmp_path_factory):
    model = train_vocab(tmp_path_factory.mktemp("vocab") / "spm", iter(sentences(2000)), vocab_size=100)
    return Vocab(model)


def test_trained_vocabularies_have_the_default_ids(vocab):
    from transduce.special_ids import DEFAULT

    assert (PAD, UNK, BOS, EOS) == (0, 1, 2, 3) == tuple(DEFAULT.to_dict().values())
    assert vocab.ids == DEFAULT and (vocab.pad, vocab.unk, vocab.bos, vocab.eos) == (0, 1, 2, 3)
    assert [vocab.sp.id_to_piece(i) for i in range(4)] == ["<pad>", "<unk>", "<s>", "</s>"]
    assert len(vocab) == 100


def test_encode_decode_round_trip(vocab):
    text = "the small dog sits in the garden"
    ids = vocab.encode(text)
    assert ids and all(4 <= i < len(vocab) for i in ids)  # no BOS/EOS added
    assert vocab.decode(ids) == text
    assert vocab.decode([BOS] + ids + [EOS, PAD, PAD]) == text  # special ids are dropped
    assert vocab.encode_batch([text, "a cat"]) == [ids, vocab.encode("a cat")]
    assert vocab.encode("") == []


def test_unknown_characters_become_unk(vocab):
    assert UNK in vocab.encode("the 漢字 dog")


def test_training_is_deterministic(tmp_path):
    a = train_vocab(tmp_path / "a", iter(sentences(3000)), vocab_size=80, sample_size=500, seed=3)
    b = train_vocab(tmp_path / "b", iter(sentences(3000)), vocab_size=80, sample_size=500, seed=3)
    pieces = [[v.sp.id_to_piece(i) for i in range(len(v))] for v in (Vocab(a), Vocab(b))]
    assert pieces[0] == pieces[1]


def test_vocab_too_large_for_corpus(tmp_path):
    with pytest.raises(DataError, match="vocabulary size 5000 is too large for this corpus"):
        train_vocab(tmp_path / "spm", iter(sentences(200)), vocab_size=5000)


def test_read_error_while_training_is_passed_through(tmp_path):
    def broken():
        yield from sentences(100)
        raise DataError("invalid UTF-8 (byte 3 of the line)", "train.de", 101)

    with pytest.raises(DataError) as e:
        train_vocab(tmp_path / "spm", broken(), vocab_size=50)
    assert str(e.value) == "train.de:101: invalid UTF-8 (byte 3 of the line)"


def test_load_errors(tmp_path):
    with pytest.raises(DataError, match="no such vocabulary file"):
        Vocab(tmp_path / "missing.model")
    (tmp_path / "junk.model").write_bytes(b"not a model")
    with pytest.raises(DataError, match="not a sentencepiece model"):
        Vocab(tmp_path / "junk.model")


def test_a_model_of_another_layout_is_read_with_its_own_ids(tmp_path):
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(sentences(500)),
        model_prefix=str(tmp_path / "other"),
        vocab_size=60,
        model_type="bpe",
        minloglevel=2,
        unk_id=0,
        bos_id=1,
        eos_id=2,
        pad_id=3,
    )
    v = Vocab(tmp_path / "other.model")
    assert (v.pad, v.unk, v.bos, v.eos) == (3, 0, 1, 2)
    ids = v.encode("the small dog")
    assert v.decode([v.bos] + ids + [v.eos, v.pad]) == "the small dog"


def test_a_model_without_a_pad_piece_is_refused_in_one_line(tmp_path):
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(sentences(500)),
        model_prefix=str(tmp_path / "other"),
        vocab_size=60,
        model_type="bpe",
        minloglevel=2,  # sentencepiece defaults: unk=0, bos=1, eos=2, no pad
    )
    with pytest.raises(DataError, match="no pad piece .*train the vocabulary with transduce"):
        Vocab(tmp_path / "other.model")


def test_the_vocabulary_an_earlier_import_wrote_says_what_to_do(tmp_path):
    """The one-file JSON vocabulary that the earlier OPUS-MT import invented: import the model again."""
    (tmp_path / "marian.src.json").write_text('{"format": "transduce-marian-vocab", "version": 1}')
    with pytest.raises(DataError, match="import the model again"):
        Vocab(tmp_path / "marian.src.json")
