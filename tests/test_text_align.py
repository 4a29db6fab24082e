"""transduce.text.align: the model's own encoder-decoder attention as a word alignment, in
characters; and HTML translated by a real model with its tags placed by that alignment."""

from __future__ import annotations

import random
import re

import pytest

from transduce.decoding.ready import load_translation_model
from transduce.decoding.translate import translate_lines
from transduce.text.align import AttentionAligner, ModelTranslator, piece_spans
from transduce.text.blocks import parse
from transduce.text.markup import translate_html
from transduce.views.weights import compute_attention

from tiny_models import make_model

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


@pytest.fixture(scope="module")
def loaded(tmp_path_factory):
    return load_translation_model(make_model(tmp_path_factory.mktemp("align")))


def test_piece_spans_find_each_piece_in_the_text(loaded):
    vocab = loaded.src_vocab
    text = "a  man\u00a0runs on the grass ."
    ids = vocab.encode(text)
    spans = piece_spans(vocab, text, ids)
    assert len(spans) == len(ids)
    pieces = [vocab.sp.id_to_piece(i).lstrip("\u2581") for i in ids]
    assert [text[a:b] for a, b in spans] == [p if p != "<unk>" else "." for p in pieces]  # "." is not in the vocabulary
    assert all(a2 >= b1 for (_, b1), (a2, _) in zip(spans, spans[1:]))  # in order, not overlapping


def test_piece_spans_compare_in_nfkc():
    class Pieces:  # a vocabulary whose pieces are NFKC's: "…" is "..." to sentencepiece
        sp = None

        def __init__(self):
            self.sp = self

        def id_to_piece(self, i):
            return ["\u2581ok", "...", "\u2581ｂ"][i]

    assert piece_spans(Pieces(), "ok… ｂ", [0, 1, 2]) == [(0, 2), (2, 3), (4, 5)]


def test_links_are_the_heads_mean_argmax_of_the_chosen_layer(loaded):
    aligner = AttentionAligner(loaded.model, loaded.src_vocab, loaded.tgt_vocab)
    assert aligner.layer == 1  # a 2-layer model: its last
    sources = ["a man runs on the grass", "two children play near water"]
    outputs = ["ein mann läuft", "zwei kinder spielen nahe dem wasser"]
    links = aligner.align(sources, outputs)
    for source, output, found in zip(sources, outputs, links):
        s_ids, t_ids = loaded.src_vocab.encode(source), loaded.tgt_vocab.encode(output)
        w = compute_attention(loaded.model, [s_ids], [t_ids]).weights["decoder_cross"][1][0]  # (h, T, S)
        best = w[:, : len(t_ids), : len(s_ids)].mean(0).argmax(-1).tolist()
        s_spans = piece_spans(loaded.src_vocab, source, s_ids)
        t_spans = piece_spans(loaded.tgt_vocab, output, t_ids)
        assert found == [(*t_spans[j], *s_spans[best[j]]) for j in range(len(t_ids))]
    assert aligner.align(["", "a man"], ["x", ""]) == [[], []]
    with pytest.raises(ValueError, match="not a layer"):
        AttentionAligner(loaded.model, loaded.src_vocab, loaded.tgt_vocab, layer=2)


def tags(html: str) -> list[str]:
    return re.findall(r"</?\w+", html)


def test_html_through_a_real_model(loaded):
    translator = ModelTranslator.from_loaded(loaded, beam=2, max_len_offset=4)
    doc = (
        "<p>A man <b>runs</b> on the grass. Two <i>children <u>play</u></i> near water.</p>"
        "<ul><li>a red ball<br>the blue ball</li></ul><pre>a dog</pre>"
    )
    out = translate_html(doc, "en", translator)
    assert tags(out) == tags(doc)  # every tag back, nested as it was
    assert out.endswith("</ul><pre>a dog</pre>")
    sentences = ["A man runs on the grass.", "Two children play near water.", "a red ball", "the blue ball"]
    expected = translate_lines(loaded.model, loaded.src_vocab, loaded.tgt_vocab, sentences, beam=2, max_len_offset=4)
    text = "".join(b.text for b in parse(out) if not isinstance(b, str))
    assert text == expected[0] + " " + expected[1] + expected[2] + "\n" + expected[3]


WORDS = "ant bee cat dog elk fox gnu hen ibis jay".split()


@pytest.mark.slow
def test_a_model_that_reverses_carries_each_tag_with_its_word(tmp_path):
    """A real model trained to reverse its input (`transduce.synthetic`, one word a token): its
    attention aligns output word i with source word n-1-i, and the tags follow their words."""
    from transduce.config import ModelConfig
    from transduce.data.vocab import Vocab, train_vocab
    from transduce.synthetic import N_SPECIAL, train_synthetic

    rng = random.Random(0)
    lines = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 6))) for _ in range(300)]
    vocab = Vocab(
        train_vocab(tmp_path / "words", lines, vocab_size=N_SPECIAL + len(WORDS), model_type="word", num_threads=1)
    )
    assert len(vocab) == N_SPECIAL + len(WORDS)  # each word one id of the synthetic task's symbols
    config = ModelConfig(src_vocab_size=len(vocab), n_layers=2, d_model=64, d_ff=128, n_heads=4, dropout=0.0)
    model, result = train_synthetic(
        "reverse",
        n_symbols=len(WORDS),
        max_len=6,
        batch_size=64,
        eval_every=50,
        n_dev=200,
        n_eval=200,
        lr_scale=0.5,
        model_config=config,
    )
    assert result.exact_match >= 0.95, result
    translator = ModelTranslator(model, vocab, vocab, greedy=True, beam=1)
    out = translate_html('<p>ant <b>bee</b> cat <a href="#x">dog elk</a></p><p><i>fox</i> gnu</p>', "en", translator)
    assert out == '<p><a href="#x">elk dog</a> cat <b>bee</b> ant</p><p>gnu <i>fox</i></p>'
    aligned = translator.align(["ant bee cat"], ["cat bee ant"])[0]
    assert aligned == [(0, 3, 8, 11), (4, 7, 4, 7), (8, 11, 0, 3)]
