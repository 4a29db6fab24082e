"""Parsing end to end on a toy treebank, through the commands a user runs: `transduce prepare
--train-trees ...`, `transduce train` (a tiny model, a few hundred updates), `transduce parse`
(raw sentences in, one tree per line out, SVG pictures) and `transduce evaluate` (EVALB)."""

import json
import random

import pytest

from transduce.cli import main
from transduce.parsing.trees import is_well_formed, parse_tree, read_tree_lines

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py

DT, JJ, NN, NNP = ["the", "a"], ["red", "big", "old"], ["dog", "cat", "man", "ball", "park"], ["John", "Mary"]
VBZ, IN = ["sees", "likes", "runs", "sleeps"], ["in", "near", "with"]


def _np(rng):
    r = rng.random()
    if r < 0.3:
        return f"(NP (NNP {rng.choice(NNP)}))"
    if r < 0.6:
        return f"(NP (DT {rng.choice(DT)}) (JJ {rng.choice(JJ)}) (NN {rng.choice(NN)}))"
    return f"(NP (DT {rng.choice(DT)}) (NN {rng.choice(NN)}))"


def toy_tree(rng) -> str:
    r = rng.random()
    verb = f"(VBZ {rng.choice(VBZ)})"
    vp = (
        f"(VP {verb})"
        if r < 0.25
        else f"(VP {verb} {_np(rng)})"
        if r < 0.6
        else f"(VP {verb} (PP (IN {rng.choice(IN)}) {_np(rng)}))"
    )
    return f"(TOP (S {_np(rng)} {vp} (. .)))"


def toy_treebank(root, sizes=(400, 20, 30), *flags: str):
    """Toy train/valid/test trees in `root`, prepared into root/data (`flags`: more for prepare)."""
    rng = random.Random(0)
    for name, n in zip(("train", "valid", "test"), sizes):
        (root / f"{name}.trees").write_text("".join(toy_tree(rng) + "\n" for _ in range(n)))
    data = root / "data"
    assert (
        main(
            [
                "prepare",
                "--train-trees",
                str(root / "train.trees"),
                "--valid-trees",
                str(root / "valid.trees"),
                "--test-trees",
                str(root / "test.trees"),
                *flags,
                "--vocab-size",
                "90",
                "--out",
                str(data),
                "--quiet",
            ]
        )
        == 0
    )
    return data


@pytest.fixture(scope="module")
def parser_run(tmp_path_factory):
    """A toy treebank prepared and a tiny parser trained on it (about 10 s)."""
    root = tmp_path_factory.mktemp("parsing")
    data, run = toy_treebank(root), root / "run"
    meta = json.loads((data / "data.json").read_text())
    assert meta["task"] == "parsing" and meta["vocab"]["tgt_type"] == "sentencepiece-word"
    assert meta["splits"]["test"]["trees_file"] == str(root / "test.trees")
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
                "model.d_model=64",
                "--set",
                "model.d_ff=128",
                "--set",
                "model.n_layers=2",
                "--set",
                "model.dropout=0.0",
                "--set",
                "model.attention_dropout=0.0",
                "--batch-tokens",
                "1024",
                "--warmup",
                "100",
                "--lr-scale",
                "0.2",
                "--max-steps",
                "500",
                "--precision",
                "fp32",
                "--threads",
                "1",
                "--save-every-steps",
                "250",
                "--save-every-minutes",
                "0",
                "--valid-every",
                "1000",
                "--quiet",
                "--log-every",
                "1000",
            ]
        )
        == 0
    )
    return root, run


def test_prepare_closed_target_vocabulary(parser_run):
    root, _ = parser_run
    meta = json.loads((root / "data" / "data.json").read_text())
    # S NP VP PP, opened and closed, XX, and the 4 special pieces
    assert meta["vocab"]["size"]["tgt"] == 4 * 2 + 1 + 4
    assert meta["linearization"] == {"tags": False, "scheme": "vinyals2015"}


def test_parse_raw_sentences_line_for_line(parser_run, tmp_path, capsys):
    _, run = parser_run
    src = tmp_path / "in.txt"
    src.write_text("John sees the big dog.\n\nThe cat sleeps near Mary.\n")
    out, svg = tmp_path / "out.txt", tmp_path / "svg"
    assert (
        main(
            [
                "parse",
                str(run),
                "--input",
                str(src),
                "--out",
                str(out),
                "--svg",
                str(svg),
                "--beam",
                "4",
                "--precision",
                "fp32",
            ]
        )
        == 0
    )
    lines = out.read_text().split("\n")
    assert len(lines) == 4 and lines[1] == "" and lines[3] == ""  # line for line, the empty one kept
    first = parse_tree(lines[0])
    assert first.leaves() == ["John", "sees", "the", "big", "dog", "."]  # PTB tokens: the period split off
    assert set(first.tags()) == {"XX"}
    assert parse_tree(lines[2]).leaves() == ["The", "cat", "sleeps", "near", "Mary", "."]
    assert lines[0] == "(TOP (S (NP (XX John)) (VP (XX sees) (NP (XX the) (XX big) (XX dog))) (XX .)))"
    assert sorted(p.name for p in svg.iterdir()) == ["1.svg", "3.svg"]
    assert (svg / "1.svg").read_text().startswith("<svg") and ">dog<" in (svg / "1.svg").read_text()
    err = capsys.readouterr().err
    assert "no part-of-speech tags (XX)" in err and "3 lines" in err


def test_tokenized_input_brackets_as_the_treebank_writes_them(parser_run, tmp_path, capsys):
    """--tokenized: a bracket token is written -LRB- etc., as the treebank (and the raw
    tokenizer) write it, and a round bracket inside a token too: printed as it came, "(" broke
    the bracketing of the output tree, which no reader (evaluate --hyp, EVALB) could read."""
    _, run = parser_run
    src = tmp_path / "in.txt"
    src.write_text("John ( the dog ) sees Mary .\nMary :) sees [ John ] .\n")
    out = tmp_path / "out.txt"
    assert (
        main(
            [
                "parse",
                str(run),
                "--tokenized",
                "--input",
                str(src),
                "--out",
                str(out),
                "--beam",
                "2",
                "--precision",
                "fp32",
                "--quiet",
            ]
        )
        == 0
    )
    first, second = [parse_tree(line) for line in out.read_text().splitlines()]
    assert first.leaves() == ["John", "-LRB-", "the", "dog", "-RRB-", "sees", "Mary", "."]
    assert second.leaves() == ["Mary", ":-RRB-", "sees", "-LSB-", "John", "-RSB-", "."]
    assert read_tree_lines(out)[1].leaves() == second.leaves()


def test_evaluate_the_model_with_evalb(parser_run, tmp_path, capsys):
    """The toy grammar is learned: F1 above 95 on the held-out trees, gold tags put back; the
    saved parses score the same through --hyp."""
    root, run = parser_run
    report = tmp_path / "report.json"
    hyp = tmp_path / "hyp.trees"
    assert (
        main(
            [
                "evaluate",
                str(run),
                "--ref",
                str(root / "test.trees"),
                "--beam",
                "4",
                "--precision",
                "fp32",
                "--json",
                str(report),
                "--out",
                str(hyp),
                "--quiet",
            ]
        )
        == 0
    )
    r = json.loads(report.read_text())
    scores = r["scores"]["evalb_gold_tags"]["all"]
    assert r["decoding"]["alpha"] == 0.3 and r["decoding"]["max_len_offset"] == 300  # the paper's parsing settings
    assert scores["sentences"] == 30 and scores["errors"] == 0 and scores["f1"] > 95
    assert "evalb_own_tags" not in r["scores"]
    assert len(read_tree_lines(hyp)) == 30
    capsys.readouterr()
    assert main(["evaluate", "--hyp", str(hyp), "--ref", str(root / "test.trees"), "--trees", "--json", "-"]) == 0
    again = json.loads(capsys.readouterr().out)["scores"]["evalb_gold_tags"]["all"]
    assert again["matched"] == scores["matched"] and again["test"] == scores["test"]


def test_evaluate_names_the_hyp_lines_with_other_words(tmp_path, capsys):
    """--hyp trees over other words than the gold's (a word dropped, another word): each line is
    named, file and line, on stderr; the scores stay EVALB's (a dropped final period is not even
    an error there, punctuation being deleted, so nothing else would tell)."""
    gold, hyp = tmp_path / "gold.trees", tmp_path / "hyp.trees"
    gold.write_text(
        "(TOP (S (NP (DT the) (NN dog)) (VP (VBZ runs)) (. .)))\n"
        "(TOP (S (NP (NNP John)) (VP (VBZ sleeps)) (. .)))\n"
        "(TOP (S (NP (NNP Mary)) (VP (VBZ runs)) (. .)))\n"
    )
    hyp.write_text(
        "(TOP (S (NP (XX the) (XX dog)) (VP (XX runs)) (XX .)))\n"
        "(TOP (S (NP (XX John)) (VP (XX sleeps))))\n"
        "(TOP (S (NP (XX Mary)) (VP (XX sees)) (XX .)))\n"
    )
    assert main(["evaluate", "--hyp", str(hyp), "--ref", str(gold), "--trees", "--json", "-"]) == 0
    out, err = capsys.readouterr()
    scores = json.loads(out)["scores"]["evalb_gold_tags"]["all"]
    assert scores["errors"] == 1 and scores["f1"] == 100.0  # line 3 an error; line 2 scored as if whole
    assert f"{hyp}:2: other words than the gold tree's (2 words, the gold tree 3)" in err
    assert f"{hyp}:3: other words than the gold tree's (word 2 is 'sees', the gold tree's 'runs')" in err
    assert f"{hyp}:1:" not in err and f"2 of 3 trees in {hyp} have other words" in err


def test_constrained_search_gives_well_formed_trees(parser_run, tmp_path):
    """With a model halfway trained (its first checkpoint), the free search's trees are repaired
    where needed; the constrained search's raw outputs are well-formed trees over the words."""
    from transduce.data.text import read_lines
    from transduce.parsing.parse import parse_stream
    from transduce.parsing.trees import read_trees
    from transduce.decoding.ready import load_translation_model

    root, run = parser_run
    m = load_translation_model(run, checkpoint="250")
    sentences = [t.leaves() for t in read_trees(root / "test.trees")][:10]
    free = list(parse_stream(m.model, m.src_vocab, m.tgt_vocab, sentences, beam=3, max_len_offset=20))
    tight = list(
        parse_stream(m.model, m.src_vocab, m.tgt_vocab, sentences, beam=3, max_len_offset=20, constrained=True)
    )
    for p, words in zip(free + tight, sentences + sentences):
        assert p.tree.leaves() == words
    assert all(is_well_formed(p.symbols, len(w)) and p.repairs.total == 0 for p, w in zip(tight, sentences))
    assert list(read_lines(root / "test.trees"))  # (the file is intact)
    # Two forked workers (the constraint inherited by each): the same trees.
    two = list(
        parse_stream(
            m.model,
            m.src_vocab,
            m.tgt_vocab,
            sentences,
            beam=3,
            max_len_offset=20,
            constrained=True,
            batch_size=3,
            workers=2,
        )
    )
    assert [p.symbols for p in two] == [p.symbols for p in tight]


def test_not_a_parsing_model_is_a_one_line_error(tmp_path, capsys):
    assert main(["parse", str(tmp_path / "nope")]) == 2
    assert "no such directory" in capsys.readouterr().err


@pytest.mark.parametrize("shared", [True, False])
def test_translation_model_is_refused_and_leaves_no_svg_directory(tmp_path, capsys, shared):
    """A translation model: one line, exit 2, and no --svg directory made; with a data.json in
    it (shared=False), refused before the model loads (its weights removed: never read). An
    --svg that is a file is refused before the model is even looked for."""
    from tiny_models import make_model

    model = make_model(tmp_path / "mt", shared=shared)
    if not shared:
        (model / "model.safetensors").unlink()  # refused before loading: the weights are never read
    svg = tmp_path / "svg"
    assert main(["parse", str(model), "--svg", str(svg), "--precision", "fp32"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("transduce parse: error: ") and "not a parsing model" in err and len(err.splitlines()) == 1
    assert not svg.exists()
    (tmp_path / "file").write_text("")
    assert main(["parse", str(tmp_path / "nope"), "--svg", str(tmp_path / "file")]) == 2  # before the model
    assert "--svg " in capsys.readouterr().err and (tmp_path / "file").read_text() == ""


def test_constrained_greedy_is_refused_before_the_model_loads(tmp_path, capsys):
    """--constrained is a beam search: with --greedy, one line before anything is loaded or
    made (it came after the model had loaded, the --svg directory made, and for evaluate after
    "parsing N sentences with ..."): here MODEL does not even exist."""
    svg, gold = tmp_path / "svg", tmp_path / "gold.trees"
    gold.write_text("(TOP (S (NP (NNP John)) (VP (VBZ sleeps)) (. .)))\n")
    for argv in (
        ["parse", str(tmp_path / "run"), "--svg", str(svg)],
        ["evaluate", str(tmp_path / "run"), "--ref", str(gold), "--trees"],
    ):
        assert main([*argv, "--greedy", "--constrained"]) == 2
        err = capsys.readouterr().err
        assert (
            err == f"transduce {argv[0]}: error: --constrained is a beam search: give --beam 1 rather than --greedy\n"
        )
    assert not svg.exists()


def test_sigterm_leaves_the_output_as_it_was(parser_run, tmp_path):
    """As translate: SIGTERM while parsing into --out discards the temporary file, exit 143."""
    import os
    import signal
    import subprocess
    import sys
    import time

    _, run = parser_run
    out = tmp_path / "out.txt"
    out.write_text("before\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), "OMP_NUM_THREADS": "1"}
    p = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "transduce",
            "parse",
            str(run),
            "--out",
            str(out),
            "--threads",
            "1",
            "--precision",
            "fp32",
            "--beam",
            "2",
        ],
        stdin=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
        cwd=tmp_path,
    )
    p.stdin.write(b"John sees the dog.\n" * 3)  # and the input stays open: it waits for more
    p.stdin.flush()
    deadline = time.monotonic() + 120
    while not list(tmp_path.glob(".out.txt.tmp-*")) and time.monotonic() < deadline and p.poll() is None:
        time.sleep(0.1)
    assert list(tmp_path.glob(".out.txt.tmp-*")), p.stderr.read().decode()  # it is writing
    p.send_signal(signal.SIGTERM)
    assert p.wait(60) == 143
    assert "transduce parse: terminated" in p.stderr.read().decode()
    p.stdin.close()
    assert sorted(x.name for x in tmp_path.iterdir()) == ["out.txt"] and out.read_text() == "before\n"
