"""benchmarks/opus_size.py, so that it cannot rot: --help at once without PyTorch, the process
tree's memory summed over descendants, OPUS-MT's vocabulary layouts at the published sizes, and
the whole benchmark end to end on a tiny shape (every row checks its systems' output lengths)."""

import importlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from tiny_models import SRC_WORDS, TGT_WORDS, make_model, sentences

REPO = Path(__file__).resolve().parents[1]
pytest.importorskip("ctranslate2")
pytest.importorskip("transformers")
pytest.importorskip("httpx")


def bench_module():
    return importlib.import_module("benchmarks.opus_size")


def test_help_answers_at_once_without_torch():
    r = subprocess.run(
        [sys.executable, "-m", "benchmarks.opus_size", "--help"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert r.returncode == 0 and "--before SRC_TREE" in r.stdout and "--trained RUN" in r.stdout
    r = subprocess.run(
        [sys.executable, "-c", "import sys, benchmarks.opus_size; print('torch' in sys.modules)"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert r.stdout.strip() == "False"


def test_the_memory_of_a_process_tree_is_summed_over_its_descendants():
    """A process holding 120 MB that starts one holding 200 MB: the peak counts both."""
    child = "import time; x = b'\\x01' * (200 << 20); time.sleep(1.5)"
    parent = (
        f"import subprocess, sys, time; x = b'\\x01' * (120 << 20); "
        f"subprocess.run([sys.executable, '-c', {child!r}], check=True)"
    )
    r = bench_module().measured([sys.executable, "-c", parent], dict(os.environ), timeout=60)
    assert r["processes"] == 2
    assert r["peak_mb"] > 320


@pytest.mark.parametrize("key,eos,pad", [("en-de", 0, 58100), ("tc-big", 43311, 53016)])
def test_the_vocabulary_is_numbered_as_opus_mt_publishes_it(tmp_path, key, eos, pad):
    import sentencepiece as spm

    m = bench_module()
    sp = spm.SentencePieceProcessor(model_proto=m.train_spm(sentences(SRC_WORDS + TGT_WORDS, 200, lo=5, hi=20), 80))
    vocab = m.opus_vocab(sp, m.SHAPES[key])
    assert sorted(vocab.values()) == list(range(m.SHAPES[key].vocab))  # the published size, each id once
    assert (vocab["</s>"], vocab["<pad>"], vocab["<unk>"]) == (eos, pad, 1)
    assert all(sp.id_to_piece(i) in vocab for i in range(3, sp.get_piece_size()))


def test_every_sentence_picked_encodes_back_to_its_pieces():
    import sentencepiece as spm

    m = bench_module()
    lines = sentences(SRC_WORDS, 40, seed=1, lo=3, hi=30)
    sp = spm.SentencePieceProcessor(model_proto=m.train_spm(lines, 60))
    vocab = m.opus_vocab(sp, m.SHAPES["tiny"])
    picked = m.pick_sentences(lines, sp, vocab, 5, 20)
    assert len(picked) == 5
    for text, pieces in picked:
        assert len(pieces) == 20 and sp.encode(text, out_type=str) == pieces
    with pytest.raises(RuntimeError, match="only"):
        m.pick_sentences(lines, sp, vocab, 1000, 20)


def run_bench(tmp_path: Path, *flags: str) -> dict:
    source = tmp_path / "source.en"
    source.write_text("\n".join(sentences(SRC_WORDS, 30, seed=2, lo=22, hi=30)) + "\n")
    out = tmp_path / "result.json"
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "benchmarks.opus_size",
            "--shapes",
            "tiny",
            "--sentences",
            "2",
            "--batch-size",
            "2",
            "--single-sentences",
            "1",
            "--rounds",
            "1",
            "--threads",
            "2",
            "--source",
            str(source),
            "--workdir",
            str(tmp_path),
            "--out",
            str(out),
            *flags,
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=1800,
        check=False,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    result = json.loads(out.read_text())
    assert result["table"] in r.stdout
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith("opus-size-")] == []  # the models removed
    return result


def test_end_to_end_on_a_tiny_shape(tmp_path):
    """transduce (default workers: 2 processes), CTranslate2 int8 and Hugging Face in batches; transduce
    serve and CTranslate2 one sentence at a time. Each row checked its outputs' lengths (31 and 71)."""
    result = run_bench(tmp_path, "--systems", "transduce-fp32,ct2-int8,hf-fp32", "--transduce-workers", "auto")
    tiny = result["shapes"]["tiny"]
    assert tiny["steps"] == 31 and tiny["single_steps"] == 71
    assert set(tiny["batch"]) == {
        "transduce fp32 (default workers: 2 x 1 thread(s))",
        "CTranslate2 int8",
        "Hugging Face generate fp32",
    }
    assert set(tiny["single"]) == {"transduce fp32 (serve)", "CTranslate2 int8 (in process)"}
    for r in [*tiny["batch"].values(), *tiny["single"].values()]:
        assert r["tokens_per_s"] > 0 and r["peak_mb"] > 20
    assert tiny["batch"]["transduce fp32 (default workers: 2 x 1 thread(s))"]["processes"] == 3  # itself and 2 workers
    assert tiny["batch"]["CTranslate2 int8"]["tokens_per_s"] == pytest.approx(
        62 / tiny["batch"]["CTranslate2 int8"]["wall_s"]
    )
    setup = tiny["setup"]
    assert {"ct2-transformers-converter float32", "ct2-transformers-converter int8"} <= set(setup)
    assert any(k.startswith(("transduce import", "transduce export from-marian")) for k in setup)
    assert "| CTranslate2 int8 | " in result["table"] and result["machine"][0].startswith("CPU:")


@pytest.mark.slow
def test_end_to_end_with_a_tree_before_and_a_trained_model(tmp_path):
    """--before (this same tree, so that its rows and its import run twice) and --trained (a model
    directory and a test set of its words): BLEU of each transduce precision and of CTranslate2's."""
    model = make_model(tmp_path / "trained")
    (tmp_path / "test.en").write_text("\n".join(sentences(SRC_WORDS, 6, seed=4)) + "\n")
    (tmp_path / "test.de").write_text("\n".join(sentences(TGT_WORDS, 6, seed=5)) + "\n")
    result = run_bench(
        tmp_path,
        "--systems",
        "transduce-int8,ct2-float32",
        "--transduce-workers",
        "1",
        "--before",
        str(REPO),
        "--trained",
        str(model),
        "--test-src",
        str(tmp_path / "test.en"),
        "--test-ref",
        str(tmp_path / "test.de"),
    )
    tiny = result["shapes"]["tiny"]
    assert set(tiny["batch"]) == {
        "transduce int8 (--workers 1)",
        "transduce int8 [before] (--workers 1)",
        "CTranslate2 float32",
    }
    assert set(tiny["single"]) == {
        "transduce int8 (serve)",
        "transduce int8 [before] (serve)",
        "CTranslate2 float32 (in process)",
    }
    assert sum(k.endswith("(before)") for k in tiny["setup"]) == 1  # the before tree's own import
    assert [r["system"] for r in result["bleu"]] == [
        "transduce int8",
        "transduce int8 [before]",
        "CTranslate2 float32 (transduce export ct2)",
        "CTranslate2 int8 (transduce export ct2)",
    ]
    assert all(0 <= r["bleu"] <= 100 for r in result["bleu"])
    assert "## BLEU of the trained model" in result["table"] and "(before: commit " in result["table"]
