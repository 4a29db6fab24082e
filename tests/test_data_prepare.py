"""`transduce prepare` end to end: Multi30k from the mirror, own files, filtering, and every error."""

import gzip
import json
import os
import random
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from transduce.data.batching import ParallelDataset, load_vocabs, read_metadata
from transduce.cli import main
from transduce.data.text import read_lines
from transduce.data.vocab import EOS

REPO = Path(__file__).resolve().parents[1]

WORDS_EN = "the a man woman dog cat runs sits on in under house garden red blue small big sees".split()
WORDS_DE = "der die ein mann frau hund katze läuft sitzt auf im unter haus garten rot blau klein groß".split()


def corpus(n, seed=0):
    rng = random.Random(seed)
    src, tgt = [], []
    for _ in range(n):
        k = rng.randint(3, 12)
        src.append(" ".join(rng.choice(WORDS_EN) for _ in range(k)))
        tgt.append(" ".join(rng.choice(WORDS_DE) for _ in range(k + rng.randint(-1, 2))))
    return src, tgt


def write_lines(path, lines, gz=False):
    data = "".join(line + "\n" for line in lines).encode()
    path.write_bytes(gzip.compress(data) if gz else data)
    return path


@pytest.fixture
def files(tmp_path):
    """A small parallel corpus: train (gz), valid, test."""
    d = tmp_path / "text"
    d.mkdir()
    out = {}
    for split, n, seed in [("train", 2000, 0), ("valid", 50, 1), ("test", 40, 2)]:
        src, tgt = corpus(n, seed)
        out[f"{split}_src"] = write_lines(d / f"{split}.en.gz", src, gz=True)
        out[f"{split}_tgt"] = write_lines(d / f"{split}.de", tgt)
    return out


def prepare(argv) -> int:
    """`transduce prepare ARGV`."""
    return main(["prepare", *argv])


def args_for(files, out, *extra):
    argv = []
    for key, path in files.items():
        argv += [f"--{key.replace('_', '-')}", str(path)]
    return argv + ["--src", "en", "--tgt", "de", "--vocab-size", "60", "--out", str(out), "--quiet", *extra]


def leftovers(parent):
    """Temporary directories that a run may have left beside its output."""
    return [p.name for p in parent.iterdir() if p.name.startswith(".")]


def run_error(capsys, argv):
    assert prepare(argv) == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1, captured.err  # one line, no traceback
    assert lines[0].startswith("transduce prepare: error: ")
    return lines[0][len("transduce prepare: error: ") :]


# --- Multi30k, the real thing ---------------------------------------------------------------------


@pytest.mark.corpus("multi30k")
def test_multi30k_en_de_end_to_end(tmp_path, capsys, monkeypatch, mirror):
    monkeypatch.setenv("TRANSDUCE_DATA_DIR", str(mirror))  # the mirror found without --data-dir
    out = tmp_path / "m30k"
    assert (
        prepare(
            [
                "--dataset",
                "multi30k",
                "--src",
                "en",
                "--tgt",
                "de",
                "--vocab-size",
                "2000",
                "--out",
                str(out),
                "--quiet",
            ]
        )
        == 0
    )
    report = capsys.readouterr().out
    assert "29,000 pairs read" in report and "0 empty" in report

    meta = read_metadata(out)
    assert (meta["src_lang"], meta["tgt_lang"], meta["dataset"]) == ("en", "de", "multi30k")
    assert meta["vocab"]["shared"] and meta["vocab"]["files"] == {"src": "spm.model", "tgt": "spm.model"}
    assert meta["vocab"]["size"] == {"src": 2000, "tgt": 2000}
    counts = {name: s["pairs"] for name, s in meta["splits"].items() if name != "train"}
    assert counts == {"valid": 1014, "test": 1000, "test_2017_flickr": 1000, "test_2017_mscoco": 461}
    # every training pair is read and accounted for; Multi30k train has one misaligned pair
    # (line 16664: "Young girls weave corn stalks into elaborate designs." / "@@"), which the
    # ratio filter drops or not depending on how the vocabulary splits it
    train = meta["splits"]["train"]
    r = train["filter_report"]
    assert r["read"] == 29000 and train["pairs"] == r["kept"] == 29000 - r["bad_ratio"]
    assert r["examples"] in ({}, {"bad_ratio": [16664]})
    test = meta["splits"]["test"]
    assert test["origin"] == "multi30k:test_2016_flickr"
    assert test["tgt_file"] == str(mirror / "multi30k" / "raw" / "test_2016_flickr.de.gz")

    src_vocab, tgt_vocab = load_vocabs(out)
    assert src_vocab is tgt_vocab and len(src_vocab) == 2000
    for split, n in [("train", train["pairs"]), ("valid", 1014), ("test", 1000)]:
        ds = ParallelDataset.load(out, split)
        assert len(ds) == n
        assert int(ds.src_sizes.sum()) == meta["splits"][split]["src_tokens"]
        assert np.all(ds.tgt_sizes >= 2)
    # the stored test sentences decode back to the reference text
    ds = ParallelDataset.load(out, "test")
    refs = list(read_lines(test["tgt_file"]))
    src, tgt = ds[0]
    assert tgt[-1] == EOS and tgt_vocab.decode(tgt) == refs[0]
    assert [tgt_vocab.decode(ds[i][1]) for i in range(len(ds))] == refs  # no UNK, no normalization loss
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m30k"]  # no temporary directories left


@pytest.mark.corpus("wmt14-en-de")
def test_wmt14_sample_and_test_sets(tmp_path, capsys, mirror):
    out = tmp_path / "wmt"
    assert (
        prepare(
            [
                "--dataset",
                "wmt14-en-de",
                "--train-split",
                "train-sample",
                "--src",
                "de",
                "--tgt",
                "en",
                "--data-dir",
                str(mirror),
                "--vocab-size",
                "1000",
                "--out",
                str(out),
                "--quiet",
            ]
        )
        == 0
    )
    meta = read_metadata(out)
    assert {n: s["pairs"] for n, s in meta["splits"].items() if n != "train"} == {
        "valid": 3000,
        "test": 3003,
        "newstest2014-filtered": 2737,
    }
    assert meta["splits"]["train"]["filter_report"]["read"] == 10000
    assert meta["splits"]["valid"]["src_file"].endswith("wmt14-en-de/newstest2013.de.gz")
    # the report says which of the dataset's sets each split is
    report = capsys.readouterr().out
    assert "  train (train-sample): 9,999 pairs" in report and "  valid (newstest2013): 3,000 pairs" in report
    assert "  test (newstest2014): 3,003 pairs" in report and "  newstest2014-filtered: 2,737 pairs" in report


def test_wmt14_full_training_set_is_a_clear_error(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "datasets", None)  # Hugging Face datasets not installed
    message = run_error(
        capsys,
        [
            "--dataset",
            "wmt14-en-de",
            "--src",
            "en",
            "--tgt",
            "de",
            "--cache-dir",
            str(tmp_path / "cache"),
            "--out",
            str(tmp_path / "out"),
        ],
    )
    assert "pip install datasets" in message
    assert not (tmp_path / "out").exists()


def test_readme_wmt14_recipe_uses_the_papers_vocabulary_sizes():
    """The README's WMT14 commands parse, and ask for Section 5.1's sizes (the default is not)."""
    import shlex

    from transduce.cli import build_parser

    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text(encoding="utf-8")
    commands = [
        line.split() for line in readme.splitlines() if line.strip().startswith("transduce prepare --dataset wmt14")
    ]
    sizes = {}
    for argv in commands:
        args = build_parser().parse_args(shlex.split(" ".join(argv[1:])))
        sizes[args.dataset] = args.vocab_size
    assert sizes == {"wmt14-en-de": 37000, "wmt14-en-fr": 32000}


def test_wmt14_full_training_set_error_names_the_mirror_and_the_sample(tmp_path, capsys, monkeypatch):
    """The folder where train-full.<lang>.gz would go is the mirror given, not a placeholder, and
    the mirror's own 10,000-pair sample is offered."""
    monkeypatch.setitem(sys.modules, "datasets", None)
    (tmp_path / "mirror").mkdir()
    message = run_error(
        capsys,
        [
            "--dataset",
            "wmt14-en-de",
            "--src",
            "en",
            "--tgt",
            "de",
            "--data-dir",
            str(tmp_path / "mirror"),
            "--cache-dir",
            str(tmp_path / "cache"),
            "--out",
            str(tmp_path / "out"),
        ],
    )
    assert f"train-full.<lang>.gz files in {tmp_path / 'mirror' / 'wmt14-en-de'}/" in message
    assert "--train-split train-sample" in message and "<data-dir>" not in message
    assert not (tmp_path / "out").exists()


def test_wmt14_offline_download_says_where_and_how_to_do_without(tmp_path, capsys, monkeypatch):
    """No network: one line naming the URL and the mirror option; nothing left in the cache."""
    import urllib.error

    from transduce.data import corpora, datasets

    def offline(*args, **kwargs):
        raise urllib.error.URLError("[Errno -2] Name or service not known")

    monkeypatch.delenv(datasets.ENV_DATA_DIR, raising=False)
    monkeypatch.setattr(datasets, "default_data_dir", lambda: None)
    monkeypatch.setattr(datasets.urllib.request, "urlopen", offline)
    cache = tmp_path / "cache"
    argv = [
        "--dataset",
        "wmt14-en-de",
        "--train-split",
        "train-sample",
        "--src",
        "en",
        "--tgt",
        "de",
        "--cache-dir",
        str(cache),
        "--out",
        str(tmp_path / "out"),
    ]

    def check(message, url):
        assert message.startswith(f"{url}: download failed ([Errno -2] Name or service not known)")
        assert "DIR/wmt14-en-de/ and pass --data-dir DIR (or set $TRANSDUCE_DATA_DIR=DIR)" in message
        assert not (tmp_path / "out").exists()

    # a plain file: the training sample
    check(run_error(capsys, argv), f"{corpora.SEQ2SEQ_ATTN_URL}/src-train.txt")
    assert [p for p in cache.rglob("*") if p.is_file()] == []
    # an archive: the test sets, once the sample is in the cache
    for lang in ("en", "de"):
        (cache / "wmt14-en-de").mkdir(parents=True, exist_ok=True)
        (cache / "wmt14-en-de" / f"train.{lang}").write_text("a b\n", encoding="utf-8")
    check(run_error(capsys, argv), corpora.WMT14_DEV)
    assert sorted(p.name for p in cache.rglob("*") if p.is_file()) == ["train.de", "train.en"]


# --- own files --------------------------------------------------------------------------------------


def test_own_files(tmp_path, files, capsys):
    out = tmp_path / "data"
    assert prepare(args_for(files, out)) == 0
    assert sorted(p.name for p in out.iterdir()) == sorted(
        ["data.json", "spm.model", "spm.vocab"]
        + [f"{s}.{side}.{ext}" for s in ("train", "valid", "test") for side in ("src", "tgt") for ext in ("bin", "idx")]
    )
    meta = json.loads((out / "data.json").read_text())
    assert [meta["splits"][s]["pairs"] for s in ("train", "valid", "test")] == [2000, 50, 40]
    assert meta["splits"]["train"]["src_file"] == str(files["train_src"])
    src_vocab, _ = load_vocabs(out)
    first = next(read_lines(files["train_src"]))
    assert src_vocab.decode(ParallelDataset.load(out, "train")[0][0]) == first


def test_separate_vocabularies(tmp_path, files):
    out = tmp_path / "data"
    assert prepare(args_for(files, out, "--separate-vocab")) == 0
    assert (out / "spm.src.model").is_file() and (out / "spm.tgt.model").is_file()
    assert not (out / "spm.model").exists()
    src_vocab, tgt_vocab = load_vocabs(out)
    assert src_vocab is not tgt_vocab
    assert src_vocab.encode("the dog") != tgt_vocab.encode("the dog")
    assert read_metadata(out)["vocab"]["shared"] is False


def test_filtering_is_counted_and_reported(tmp_path, files, capsys):
    src, tgt = corpus(2000)
    long_line = " ".join(["garden"] * 200)
    src[10], tgt[10] = "", "der hund"  # empty
    src[20], tgt[20] = "   ", "   "  # whitespace only: empty too
    src[30], tgt[30] = long_line, long_line  # too long
    src[40], tgt[40] = "dog", " ".join(["hund"] * 30)  # ratio
    files["train_src"] = write_lines(tmp_path / "train.en", src)
    files["train_tgt"] = write_lines(tmp_path / "train.de", tgt)
    valid_src, valid_tgt = corpus(50, 1)
    valid_src[3] = ""  # evaluation splits are never filtered
    files["valid_src"] = write_lines(tmp_path / "valid.en", valid_src)

    out = tmp_path / "data"
    assert prepare(args_for(files, out, "--max-len", "100", "--max-ratio", "8")) == 0
    report = capsys.readouterr().out
    assert "train: 1,996 pairs" in report
    assert "2,000 pairs read, 1,996 kept; dropped: 2 empty, 1 longer than 100 tokens, 1 with length ratio > 8" in report
    r = read_metadata(out)["splits"]["train"]["filter_report"]
    assert (r["read"], r["kept"], r["empty"], r["too_long"], r["bad_ratio"]) == (2000, 1996, 2, 1, 1)
    assert r["examples"] == {"empty": [11, 21], "too_long": [31], "bad_ratio": [41]}
    valid = ParallelDataset.load(out, "valid")
    assert len(valid) == 50 and valid[3][0].tolist() == [EOS]


def test_help_runs_as_a_module():
    env = dict(os.environ, PYTHONPATH=str(REPO / "src"))
    result = subprocess.run(
        [sys.executable, "-m", "transduce", "prepare", "--help"], capture_output=True, text=True, env=env
    )
    assert result.returncode == 0 and "--vocab-size" in result.stdout and "--separate-vocab" in result.stdout
    assert "Warning" not in result.stderr


# --- errors: one line naming file and line, and nothing written --------------------------------------


def test_line_count_mismatch(tmp_path, files, capsys):
    src, _ = corpus(2000)
    files["train_src"] = write_lines(tmp_path / "short.en", src[:1500])
    message = run_error(capsys, args_for(files, tmp_path / "out"))
    assert message == f"{files['train_tgt']}:1501: {files['train_src']} has only 1500 lines (line counts differ)"
    assert not (tmp_path / "out").exists() and leftovers(tmp_path) == []


def test_mismatch_in_a_later_split_leaves_nothing(tmp_path, files, capsys):
    """train is already binarized when the test split turns out to be broken."""
    test_src, _ = corpus(40, 2)
    files["test_src"] = write_lines(tmp_path / "test.en", test_src + ["one more"])
    message = run_error(capsys, args_for(files, tmp_path / "out"))
    assert message.startswith(f"{files['test_src']}:41: ")
    assert not (tmp_path / "out").exists() and leftovers(tmp_path) == []


def test_invalid_utf8(tmp_path, files, capsys):
    data = files["valid_tgt"].read_bytes().split(b"\n")
    data[6] = b"kaputt \xc3\x28"
    files["valid_tgt"].write_bytes(b"\n".join(data))
    message = run_error(capsys, args_for(files, tmp_path / "out"))
    assert message.startswith(f"{files['valid_tgt']}:7: invalid UTF-8")
    assert not (tmp_path / "out").exists() and leftovers(tmp_path) == []


def test_invalid_utf8_in_training_text_while_training_the_vocabulary(tmp_path, files, capsys):
    src, _ = corpus(2000)
    lines = [line.encode() for line in src]
    lines[1234] = b"\xff"
    files["train_src"].write_bytes(gzip.compress(b"\n".join(lines) + b"\n"))
    message = run_error(capsys, args_for(files, tmp_path / "out"))
    assert message.startswith(f"{files['train_src']}:1235: invalid UTF-8")
    assert leftovers(tmp_path) == []


def test_missing_file(tmp_path, files, capsys):
    files["valid_src"] = tmp_path / "nope.en"
    assert run_error(capsys, args_for(files, tmp_path / "out")) == f"{tmp_path / 'nope.en'}: no such file"
    assert not (tmp_path / "out").exists() and leftovers(tmp_path) == []


def test_empty_file(tmp_path, files, capsys):
    files["test_tgt"] = write_lines(tmp_path / "empty.de", [])
    assert run_error(capsys, args_for(files, tmp_path / "out")) == f"{tmp_path / 'empty.de'}: empty file (no lines)"
    assert not (tmp_path / "out").exists()


def test_vocabulary_too_large(tmp_path, files, capsys):
    message = run_error(capsys, args_for(files, tmp_path / "out", "--vocab-size", "100000"))
    assert message.startswith("vocabulary size 100000 is too large for this corpus (at most ")
    assert leftovers(tmp_path) == []


def test_vocabulary_too_small_for_the_characters_says_the_least_size(tmp_path, files, capsys):
    message = run_error(capsys, args_for(files, tmp_path / "out", "--vocab-size", "10"))
    assert message.startswith("vocabulary size 10 is too small for the characters of this corpus (at least ")
    assert "--character-coverage" in message and "INTERNAL" not in message and "trainer_interface" not in message
    assert leftovers(tmp_path) == []


@pytest.mark.parametrize(
    "flag, value, message",
    [
        ("--vocab-size", "0", "--vocab-size must be at least 1, not 0"),  # was silently the default 8000
        ("--vocab-size", "-5", "--vocab-size must be at least 1, not -5"),
        ("--vocab-sample", "0", "--vocab-sample must be at least 1"),
        ("--character-coverage", "2", "--character-coverage must be in [0.98, 1]"),
        ("--max-len", "0", "--max-len must be at least 1, not 0"),  # was silently the default
        ("--max-ratio", "0.5", "--max-ratio must be at least 1"),
    ],
)
def test_numeric_options_out_of_range(tmp_path, files, capsys, flag, value, message):
    assert run_error(capsys, args_for(files, tmp_path / "out", flag, value)).startswith(message)
    assert not (tmp_path / "out").exists()


def test_everything_filtered_out(tmp_path, files, capsys):
    message = run_error(capsys, args_for(files, tmp_path / "out", "--max-len", "1"))
    assert "every training pair was filtered out" in message and str(files["train_src"]) in message
    assert not (tmp_path / "out").exists() and leftovers(tmp_path) == []


def test_existing_output_is_kept_unless_overwrite(tmp_path, files, capsys):
    out = tmp_path / "out"
    out.mkdir()
    (out / "precious.txt").write_text("keep me")
    assert (
        run_error(capsys, args_for(files, out))
        == f"{out}: output directory is not empty (use --overwrite to replace it)"
    )
    assert (out / "precious.txt").read_text() == "keep me"
    assert prepare(args_for(files, out, "--overwrite")) == 0
    assert not (out / "precious.txt").exists() and (out / "data.json").is_file()
    assert leftovers(tmp_path) == []


def test_empty_output_directory_is_fine(tmp_path, files):
    (tmp_path / "out").mkdir()
    assert prepare(args_for(files, tmp_path / "out")) == 0


def test_argument_errors(tmp_path, files, capsys):
    out = str(tmp_path / "out")
    assert "not both" in run_error(
        capsys,
        ["--dataset", "multi30k", "--src", "en", "--tgt", "de", "--train-src", str(files["train_src"]), "--out", out],
    )
    assert "--valid-src and --valid-tgt" in run_error(
        capsys, ["--train-src", str(files["train_src"]), "--train-tgt", str(files["train_tgt"]), "--out", out]
    )
    assert "needs --src and --tgt" in run_error(capsys, ["--dataset", "multi30k", "--out", out])
    assert "has no language 'cs'" in run_error(
        capsys, ["--dataset", "multi30k", "--src", "en", "--tgt", "cs", "--out", out]
    )
    assert "both 'en'" in run_error(capsys, ["--dataset", "multi30k", "--src", "en", "--tgt", "en", "--out", out])
