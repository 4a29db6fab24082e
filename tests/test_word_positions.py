"""Word positions (`ModelConfig.word_positions`, not in the paper): the word index each position
is at, on the source from where words start, on the target from the words emitted so far; the
same vectors in a teacher-forced pass, in incremental decoding, through the beam's reorders, and
set from the vocabularies by the training (parsing: a tree's leaves)."""

import pytest
import torch

from transduce.checkpoint import load_model
from transduce.cli import main
from transduce.config import ModelConfig
from transduce.data.batching import load_vocabs
from transduce.data.vocab import BOS, EOS
from transduce.decoding.search import beam_search, greedy_decode, length_penalty
from transduce.model import Transformer
from transduce.parsing.constrain import leaf_symbols

from test_parsing_cli import toy_treebank

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py

SRC_V, TGT_V = 20, 12
WORD_START = torch.tensor([i in range(4, 12) for i in range(SRC_V)])  # pieces 4-11 begin a word, 12-19 continue
TGT_WORD = torch.tensor([i in (4, 5, 6) for i in range(TGT_V)])  # target symbols 4-6 are words


def model(seed: int = 0) -> Transformer:
    torch.manual_seed(seed)
    m = Transformer(
        ModelConfig(
            src_vocab_size=SRC_V,
            tgt_vocab_size=TGT_V,
            n_layers=2,
            d_model=32,
            d_ff=64,
            n_heads=4,
            share_embeddings=False,
            tie_output=False,
            word_positions=True,
            dropout=0.0,
        )
    )
    m.word_positions.set_symbols(WORD_START, TGT_WORD)
    with torch.no_grad():  # sharper distributions than the initialisation gives
        m.decoder.embed.weight.mul_(3.0)
    return m.eval()


def test_word_indices_of_both_sides():
    wp = model().word_positions
    src = torch.tensor([[4, 12, 13, 5, 6, 14, EOS]])  # words: 0 0 0 1 2 2 2 (EOS continues the last)
    assert torch.equal(wp.source(src)[0], wp.weight[[0, 0, 0, 1, 2, 2, 2]])
    tgt = torch.tensor([[BOS, 7, 4, 8, 5, 6, 9]])  # words so far, this input included: 0 0 1 1 2 3 3
    vectors, count = wp.target(tgt)
    assert torch.equal(vectors[0], wp.weight[[0, 0, 1, 1, 2, 3, 3]]) and count.tolist() == [3]
    vectors, count = wp.target(tgt[:, 3:], before=torch.tensor([1]))  # a chunk after 1 word
    assert torch.equal(vectors[0], wp.weight[[1, 2, 3, 3]]) and count.tolist() == [3]
    assert torch.equal(wp.source(torch.tensor([[4] * 5 + [5] * 0]))[0], wp.weight[[0, 1, 2, 3, 4]])


def test_off_by_default_and_no_effect_without_it():
    assert (
        Transformer(ModelConfig(src_vocab_size=SRC_V, n_layers=1, d_model=16, d_ff=32, n_heads=2)).word_positions
        is None
    )


def test_the_words_change_the_output():
    m = model()
    src, tgt = torch.tensor([[4, 12, 5, EOS]]), torch.tensor([[BOS, 4, 7]])
    before = m(src, tgt)
    m.word_positions.set_symbols(torch.zeros(SRC_V, dtype=torch.bool), TGT_WORD)
    assert not torch.allclose(before, m(src, tgt))


def test_incremental_decoding_equals_the_teacher_forced_pass():
    m = model()
    src = torch.tensor([[4, 12, 5, 6, 13, EOS], [7, 8, EOS, 0, 0, 0]])
    tgt = torch.tensor([[BOS, 4, 7, 5, 8, 6, 9], [BOS, 7, 4, 4, 9, 5, 8]])
    full = m(src, tgt)
    cache = m.init_cache(m.encode(src), (src != 0)[:, None, None, :])
    steps = torch.cat([m.decode_step(tgt[:, i : i + 1], cache) for i in range(tgt.size(1))], 1)
    torch.testing.assert_close(steps, full, atol=1e-5, rtol=1e-5)
    assert cache.word_count.tolist() == [3, 3]


def test_beam_search_scores_are_the_models_through_reorders():
    """Every hypothesis's log-probability, as the search computed it step by step (with the word
    counts gathered when beams reorder and sentences leave), equals the teacher-forced one."""
    m = model(seed=1)
    src = torch.tensor([[4, 12, 5, 6, 13, 7, EOS], [7, 8, EOS, 0, 0, 0, 0], [9, EOS, 0, 0, 0, 0, 0]])
    out = beam_search(m, src, beam_size=4, alpha=0.6, max_len_offset=6, n_best=4)
    assert sum(len(h.tokens) for hyps in out for h in hyps) > 20  # long enough to reorder
    for i, hyps in enumerate(out):
        row = src[i : i + 1, : int((src[i] != 0).sum())]
        for h in hyps:
            y = torch.tensor([[BOS, *h.tokens]])
            lprobs = m(row, y).log_softmax(-1)[0]
            logp = sum(lprobs[j, t].item() for j, t in enumerate([*h.tokens, EOS]))
            assert h.logprob == pytest.approx(logp, abs=1e-4)
            assert h.score == pytest.approx(logp / length_penalty(len(h.tokens) + 1, 0.6), abs=1e-4)
    greedy = greedy_decode(m, src, max_len_offset=20)  # the greedy path's cache too
    for i, tokens in enumerate(greedy):
        row = src[i : i + 1, : int((src[i] != 0).sum())]
        y = torch.tensor([[BOS, *tokens]])
        assert m(row, y)[0].argmax(-1).tolist()[: len(tokens)] == tokens


@pytest.fixture(scope="module")
def parser_with_words(tmp_path_factory):
    root = tmp_path_factory.mktemp("words")
    data, run = toy_treebank(root, (200, 10, 10), "--keep-tags"), root / "run"
    assert (
        main(
            [
                "train",
                "--data",
                str(data),
                "--run-dir",
                str(run),
                "--preset",
                "parse-cpu",
                "--set",
                "model.word_positions=true",
                "--set",
                "model.d_model=32",
                "--set",
                "model.d_ff=64",
                "--set",
                "model.n_layers=1",
                "--batch-tokens",
                "512",
                "--max-steps",
                "20",
                "--precision",
                "fp32",
                "--threads",
                "1",
                "--save-every-minutes",
                "0",
                "--valid-every",
                "0",
                "--quiet",
            ]
        )
        == 0
    )
    return root, data, run


def test_training_sets_the_words_from_the_vocabularies(parser_with_words):
    root, data, run = parser_with_words
    m, config = load_model(run / "model")  # saved with the weights, and loaded back
    assert config.model.word_positions
    src_vocab, tgt_vocab = load_vocabs(data)
    assert torch.equal(m.word_positions.src_word_start, src_vocab.word_starts())
    leaves = leaf_symbols(tgt_vocab, tags=True)
    assert torch.equal(m.word_positions.tgt_is_word, leaves)
    symbols = {tgt_vocab.sp.id_to_piece(i).lstrip("▁") for i in range(len(tgt_vocab)) if leaves[i]}
    assert {"NN", "DT", "VBZ", "."} <= symbols and not any(s[0] in "()" for s in symbols)


def test_a_parser_with_words_parses_and_does_not_export(parser_with_words, tmp_path, capsys):
    root, data, run = parser_with_words
    inp = tmp_path / "in.txt"
    inp.write_text("the dog sees John .\nMary sleeps .\n")
    out = tmp_path / "out.trees"
    assert (
        main(
            [
                "parse",
                str(run),
                "--input",
                str(inp),
                "--out",
                str(out),
                "--beam",
                "2",
                "--constrained",
                "--threads",
                "1",
                "--quiet",
            ]
        )
        == 0
    )
    trees = out.read_text().splitlines()
    assert len(trees) == 2 and all(t.startswith("(") for t in trees)
    capsys.readouterr()
    assert main(["export", "ct2", str(run), "--out", str(tmp_path / "ct2")]) != 0
    assert "word positions" in capsys.readouterr().err
