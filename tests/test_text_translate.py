"""Sentence splitting on the way through a translator: the issue's paragraph comes back as three
translated sentences (one batch call), and `transduce translate --split-sentences` on a real
(tiny, random) model: each line's sentences translated as the lines of the same sentences would
be, the spaces between them kept, as many lines out as in."""

from __future__ import annotations

import pytest

from transduce.cli import main
from transduce.text import translate_text
from transduce.text.sentences import translate_lines_split

from tiny_models import make_model

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py

PARAGRAPH = (
    "Two dogs are playing in the snow. A man is riding a bike. A woman in a red dress sings on a stage "
    "while children watch her."
)
GERMAN = {
    "Two dogs are playing in the snow.": "Zwei Hunde spielen im Schnee.",
    "A man is riding a bike.": "Ein Mann fährt Fahrrad.",
    "A woman in a red dress sings on a stage while children watch her.": "Eine Frau in einem roten Kleid singt auf einer Bühne, während Kinder ihr zusehen.",
}


def test_the_paragraph_comes_back_as_three_translated_sentences():
    calls = []

    def translate_batch(sentences):  # a scripted translator: a sentence it knows, or nothing
        calls.append(sentences)
        return [GERMAN.get(s, "") for s in sentences]

    out = translate_text(translate_batch, PARAGRAPH + "\n\n" + PARAGRAPH, "en")
    one = " ".join(GERMAN.values())
    assert out == one + "\n\n" + one
    assert calls == [list(GERMAN) * 2]  # all six sentences in one call
    assert translate_text(translate_batch, PARAGRAPH, "en", mode="off") == ""  # off: one sentence it does not know


def test_lines_stream_through_one_translation_stream():
    seen = []

    def stream(sentences):
        for s in sentences:
            seen.append(s)
            yield s.upper()

    lines = ["One. Two.", "", " Three.  ", "Four? Five!"]
    done = []
    assert list(translate_lines_split(stream, iter(lines), "en", advance=done.append)) == [
        "ONE. TWO.",
        "",
        " THREE.  ",
        "FOUR? FIVE!",
    ]
    assert seen == ["One.", "Two.", "Three.", "Four?", "Five!"] and done == [1, 1, 1, 1]
    assert list(translate_lines_split(stream, iter(["", " "]), "en")) == ["", " "]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_model(tmp_path_factory.mktemp("split"))


FAST = ["--quiet", "--beam", "2", "--max-len-offset", "4"]


def translate_file(model_dir, tmp_path, lines, *flags):
    src, out = tmp_path / "in.txt", tmp_path / "out.txt"
    src.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    assert main(["translate", str(model_dir), "-i", str(src), "-o", str(out), *FAST, *flags]) == 0
    return out.read_text(encoding="utf-8").split("\n")[:-1]


def test_translate_splits_lines_when_asked(model_dir, tmp_path):
    lines = ["a man runs on the grass. the dog sits near water.", "", "two children play with a red ball"]
    sentences = ["a man runs on the grass.", "the dog sits near water.", "", "two children play with a red ball"]
    each = translate_file(model_dir, tmp_path, sentences)
    assert translate_file(model_dir, tmp_path, lines, "--split-sentences", "on") == [
        each[0] + " " + each[1],
        "",
        each[3],
    ]
    assert translate_file(model_dir, tmp_path, lines, "--split-sentences", "nonewlines") == [
        each[0] + " " + each[1],
        "",
        each[3],
    ]
    default = translate_file(model_dir, tmp_path, lines)
    assert default == translate_file(model_dir, tmp_path, lines, "--split-sentences", "off")
    assert len(default) == 3 and default[2] == each[3]


def test_n_best_is_a_lines_own(model_dir, capsys):
    assert main(["translate", str(model_dir), "--split-sentences", "on", "--n-best", "2", *FAST]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "--n-best" in err and "Traceback" not in err
