"""`transduce evaluate`: the paper's tokenized, compound-split BLEU checked by hand, the ##AT##
regex, multi-bleu.perl == sacrebleu on tokens, sacreBLEU == sacrebleu itself, the Multi30k
lowercased tokenized convention, the JSON report and the CLI's errors."""

import json
import math
import random
import shutil

import pytest
import sacrebleu
import torch

from transduce.cli import main
from transduce.evaluate import compound_split, moses_tokenize, multi30k_tokenize, multi_bleu, paper_tokenize, score

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


# -- the ##AT## compound split: perl -ple 's{(\S)-(\S)}{$1 ##AT##-##AT## $2}g' ------------------


@pytest.mark.parametrize(
    "line, expected",
    [
        ("Auto-Fahrer", "Auto ##AT##-##AT## Fahrer"),
        ("die E-Mail-Adresse", "die E ##AT##-##AT## Mail ##AT##-##AT## Adresse"),
        ("a-b-c", "a ##AT##-##AT## b-c"),  # /g matches do not overlap: "b" was taken by the first (Perl too)
        ("1990-2000", "1990 ##AT##-##AT## 2000"),
        ("z.B.", "z.B."),
        ("-Test-", "-Test-"),  # hyphens at the ends of a token
        ("Berlin - Paris", "Berlin - Paris"),  # a free-standing hyphen
        ("-", "-"),
        ("x-", "x-"),
        ("---", "- ##AT##-##AT## -"),
        ("a\t-b", "a\t-b"),
        ("ß-Ü-ß", "ß ##AT##-##AT## Ü ##AT##-##AT## ß"),  # Perl consumed one byte of "Ü" only
        ("a\u00a0-b", "a\u00a0 ##AT##-##AT## b"),  # Perl reads bytes: a no-break space is \S there
        ("&quot;-Gruppe", "&quot; ##AT##-##AT## Gruppe"),
    ],
)
def test_compound_split_regex(line, expected):
    assert compound_split(line) == expected


@pytest.mark.skipif(shutil.which("perl") is None, reason="no perl")
def test_compound_split_equals_perl():
    import subprocess

    rng = random.Random(0)
    alphabet = ["a", "Ü", "-", "-", " ", "\t", "\u00a0", "z.B.", "&quot;", "ß"]
    lines = ["".join(rng.choice(alphabet) for _ in range(rng.randint(0, 12))) for _ in range(500)]
    perl = subprocess.run(
        ["perl", "-ple", "s{(\\S)-(\\S)}{$1 ##AT##-##AT## $2}g"],
        input="".join(x + "\n" for x in lines).encode("utf-8"),
        capture_output=True,
        check=True,
    )
    assert perl.stdout.decode("utf-8").split("\n")[:-1] == [compound_split(x) for x in lines]


def test_moses_tokenizer_de_defaults():
    # tokenizer.perl -l de: punctuation split off, "z.B." kept (non-breaking prefix), hyphens
    # kept inside words (no -a), special characters escaped.
    assert (
        moses_tokenize('Er sagte: "Das ist z.B. ein Auto-Test & mehr."', "de")
        == "Er sagte : &quot; Das ist z.B. ein Auto-Test &amp; mehr . &quot;"
    )


# -- the paper's convention, by hand -----------------------------------------------------------


def test_paper_bleu_by_hand():
    refs = ["Der Auto-Fahrer hat z.B. 3 Kinder.", "Das ist ein Test."]
    hyps = ["Der Auto-Fahrer hatte z.B. drei Kinder.", "Das ist Test."]
    # After tokenizer.perl -l de and the compound split:
    #   ref 1: Der Auto ##AT##-##AT## Fahrer hat   z.B. 3    Kinder .   (9 tokens)
    #   hyp 1: Der Auto ##AT##-##AT## Fahrer hatte z.B. drei Kinder .   (9 tokens)
    #   ref 2: Das ist ein Test .   (5 tokens)
    #   hyp 2: Das ist Test .       (4 tokens)
    assert paper_tokenize(refs[0], "de") == "Der Auto ##AT##-##AT## Fahrer hat z.B. 3 Kinder ."
    assert paper_tokenize(hyps[0], "de") == "Der Auto ##AT##-##AT## Fahrer hatte z.B. drei Kinder ."
    assert paper_tokenize(hyps[1], "de") == "Das ist Test ."
    # Sentence 1 (9 tokens each):
    #   1-grams: Der Auto ##AT## Fahrer z.B. Kinder . match, hatte drei do not      -> 7/9
    #   2-grams: "Der Auto" "Auto ##AT##" "##AT## Fahrer" "Kinder ." match of 8     -> 4/8
    #   3-grams: "Der Auto ##AT##" "Auto ##AT## Fahrer" of 7                        -> 2/7
    #   4-grams: "Der Auto ##AT## Fahrer" of 6                                      -> 1/6
    # Sentence 2 (hyp 4, ref 5 tokens):
    #   1-grams: Das ist Test . -> 4/4;  2-grams: "Das ist" "Test ." -> 2/3
    #   3-grams: "Das ist Test" "ist Test ." -> 0/2;  4-grams: 0/1
    # Corpus: 11/13, 6/11, 2/9, 1/7; hyp_len 13 < ref_len 14: BP = exp(1 - 14/13).
    r = score(hyps, refs, lang="de")["paper_bleu"]
    assert (r["correct"], r["total"], r["hyp_len"], r["ref_len"]) == ([11, 6, 2, 1], [13, 11, 9, 7], 13, 14)
    expected = 100 * math.exp(1 - 14 / 13) * (11 / 13 * 6 / 11 * 2 / 9 * 1 / 7) ** 0.25
    assert r["score"] == pytest.approx(expected)  # 32.22
    assert r["text"] == "BLEU = 32.22, 84.6/54.5/22.2/14.3 (BP=0.926, ratio=0.929, hyp_len=13, ref_len=14)"
    # Without the compound split, sentence 1 would share no 3-gram: the split is what makes the
    # paper's numbers higher than plain tokenized BLEU.
    plain = multi_bleu([moses_tokenize(h, "de") for h in hyps], [moses_tokenize(x, "de") for x in refs])
    assert plain.correct == [9, 4, 0, 0] and plain.score == 0.0  # no smoothing, like multi-bleu.perl


def test_multi_bleu_equals_sacrebleu_on_tokens():
    rng = random.Random(0)
    words = "der die das ein eine Haus Auto ##AT##-##AT## Mann Frau geht läuft schnell , . und".split()
    refs = [" ".join(rng.choice(words) for _ in range(rng.randint(3, 25))) for _ in range(60)]
    hyps = [
        " ".join(w for w in r.split() if rng.random() > 0.15) + (" und" if rng.random() > 0.7 else "") for r in refs
    ]
    ours = multi_bleu(hyps, refs)
    theirs = sacrebleu.corpus_bleu(hyps, [refs], tokenize="none", smooth_method="none", force=True)
    assert ours.score == pytest.approx(theirs.score, abs=1e-9)
    assert ours.precisions == pytest.approx(theirs.precisions)
    assert (ours.hyp_len, ours.ref_len) == (theirs.sys_len, theirs.ref_len)
    # Two reference streams: closest reference length, counts clipped by the max over references.
    refs2 = [" ".join(r.split()[:-2]) or r for r in refs]
    ours2 = multi_bleu(hyps, [refs, refs2])
    theirs2 = sacrebleu.corpus_bleu(hyps, [refs, refs2], tokenize="none", smooth_method="none", force=True)
    assert ours2.score == pytest.approx(theirs2.score, abs=1e-9) and ours2.ref_len == theirs2.ref_len
    assert multi_bleu(["a b c d"], ["a b c d"], lowercase=True).score == pytest.approx(100.0)
    assert multi_bleu(["A B C D"], ["a b c d"]).score == 0.0
    assert multi_bleu(["A B C D"], ["a b c d"], lowercase=True).score == pytest.approx(100.0)


def test_sacrebleu_and_chrf_equal_sacrebleu_itself():
    refs = ["Der Auto-Fahrer hat z.B. 3 Kinder.", "Das ist ein Test.", "Ein Mann läuft über die Straße."]
    hyps = ["Der Autofahrer hatte z.B. drei Kinder.", "Das ist Test.", "Ein Mann geht über die Straße."]
    s = score(hyps, refs, lang="de")
    assert s["sacrebleu"]["score"] == pytest.approx(sacrebleu.corpus_bleu(hyps, [refs]).score)
    assert s["chrf"]["score"] == pytest.approx(sacrebleu.corpus_chrf(hyps, [refs]).score)
    assert (
        s["sacrebleu"]["signature"] == f"nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:{sacrebleu.__version__}"
    )
    assert s["chrf"]["signature"].startswith("nrefs:1|case:mixed|eff:yes|nc:6|nw:0|space:no")


# -- Multi30k: lowercased tokenized BLEU against the official tok references --------------------

# test_2016_flickr.de lines 2, 457 and 792, raw and as in tok/test_2016_flickr.lc.norm.tok.de
M30K_RAW = [
    "Ein Boston Terrier läuft über saftig-grünes Gras vor einem weißen Zaun.",
    'Eine Frau hält einen großen Scheck für "Kids\' Food Basket".',
    "Zwei Jungen essen ihr McDonald's-Menü im Außenbereich, umgeben von vielen anderen Leuten.",
]
M30K_TOK = [
    "ein boston terrier läuft über saftig-grünes gras vor einem weißen zaun .",
    "eine frau hält einen großen scheck für &quot; kids &apos; food basket &quot; .",
    "zwei jungen essen ihr mcdonald &apos; s-menü im außenbereich , umgeben von vielen anderen leuten .",
]


def test_multi30k_tokenization_reproduces_the_official_tok_files():
    assert [multi30k_tokenize(r, "de") for r in M30K_RAW] == M30K_TOK


def test_multi30k_lowercased_tokenized_bleu():
    hyps = [
        "EIN Boston Terrier läuft über saftig-grünes Gras vor einem weißen Zaun.",  # case differs
        "Eine Frau hält einen großen Scheck für „Kids’ Food Basket“.",  # typographic quotes
        "Zwei Jungen essen ihr McDonald's-Menü im Außenbereich, umgeben von vielen Leuten.",  # "anderen" missing
    ]
    # Lowercased, punctuation-normalized („ “ -> &quot;, ’ -> &apos;), tokenized:
    assert [multi30k_tokenize(h, "de") for h in hyps][:2] == M30K_TOK[:2]
    # Sentences 1, 2 match their references exactly: 12 and 14 tokens, all n-grams match.
    # Sentence 3: 15 tokens against 16; only n-grams across "vielen leuten" miss:
    #   1-grams 15/15, 2-grams 13/14, 3-grams 11/13, 4-grams 10/12.
    # Corpus: 41/41, 37/38, 33/35, 30/32; hyp_len 41, ref_len 42.
    s = score(hyps, M30K_RAW, lang="de", tok_refs=M30K_TOK)
    r = s["multi30k_lc_tok_bleu"]
    assert (r["correct"], r["total"], r["hyp_len"], r["ref_len"]) == ([41, 37, 33, 30], [41, 38, 35, 32], 41, 42)
    assert r["score"] == pytest.approx(100 * math.exp(1 - 42 / 41) * (37 / 38 * 33 / 35 * 30 / 32) ** 0.25)
    assert s["sacrebleu"]["score"] < r["score"]  # cased and with different quotes: lower


# -- the command line ----------------------------------------------------------------------------


def _write(path, lines):
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


def test_json_report_keys(tmp_path, capsys):
    hyp = _write(tmp_path / "hyp.de", ["Das ist Test.", "Der Auto-Fahrer hatte z.B. drei Kinder."])
    ref = _write(tmp_path / "ref.de", ["Das ist ein Test.", "Der Auto-Fahrer hat z.B. 3 Kinder."])
    tok = _write(
        tmp_path / "ref.tok.de",
        [multi30k_tokenize(x, "de") for x in ["Das ist ein Test.", "Der Auto-Fahrer hat z.B. 3 Kinder."]],
    )
    assert (
        main(["evaluate", "--hyp", str(hyp), "--ref", str(ref), "--tok-ref", str(tok), "--tgt", "de", "--json", "-"])
        == 0
    )
    report = json.loads(capsys.readouterr().out)
    assert {"n_sentences", "tgt_lang", "hyp", "ref", "tok_ref", "scores", "conventions"} <= set(report)
    assert report["n_sentences"] == 2
    assert set(report["scores"]) == {"sacrebleu", "chrf", "paper_bleu", "multi30k_lc_tok_bleu"}
    assert set(report["conventions"]) == set(report["scores"])
    for key in ("sacrebleu", "chrf"):
        assert {"score", "signature", "convention"} <= set(report["scores"][key])
    for key in ("paper_bleu", "multi30k_lc_tok_bleu"):
        assert {"score", "precisions", "bp", "ratio", "hyp_len", "ref_len", "text", "convention"} <= set(
            report["scores"][key]
        )
    assert report["scores"]["paper_bleu"]["score"] == pytest.approx(32.22, abs=0.01)
    # The table, and the JSON into a file.
    out = tmp_path / "report.json"
    assert main(["evaluate", "--hyp", str(hyp), "--ref", str(ref), "--tgt", "de", "--json", str(out)]) == 0
    table = capsys.readouterr().out
    assert "sacreBLEU" in table and "paper: tokenized BLEU, compound split" in table and "32.22" in table
    assert set(json.loads(out.read_text())["scores"]) == {"sacrebleu", "chrf", "paper_bleu"}


def test_errors_are_one_line(tmp_path, capsys):
    hyp = _write(tmp_path / "hyp.de", ["a", "b"])
    ref = _write(tmp_path / "ref.de", ["a"])
    assert main(["evaluate", "--hyp", str(hyp), "--ref", str(ref), "--tgt", "de"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"transduce evaluate: error: {hyp}: 2 lines, but the reference {ref} has 1"]
    assert main(["evaluate", "--hyp", str(hyp), "--ref", str(hyp)]) == 2
    assert "give --tgt LANG" in capsys.readouterr().err
    bad = tmp_path / "bad.de"
    bad.write_bytes(b"ok\n\xffno\n")
    assert main(["evaluate", "--hyp", str(bad), "--ref", str(hyp), "--tgt", "de"]) == 2
    assert capsys.readouterr().err.strip() == f"transduce evaluate: error: {bad}:2: invalid UTF-8 (byte 1 of the line)"


@pytest.mark.corpus("multi30k")
def test_multi30k_dataset_from_the_mirror(tmp_path, capsys, monkeypatch, mirror):
    import gzip

    monkeypatch.setenv("TRANSDUCE_DATA_DIR", str(mirror))
    with gzip.open(mirror / "multi30k" / "raw" / "test_2016_flickr.de.gz", "rt", encoding="utf-8") as f:
        hyp = _write(tmp_path / "hyp.de", f.read().splitlines())
    assert (
        main(["evaluate", "--hyp", str(hyp), "--dataset", "multi30k", "--src", "en", "--tgt", "de", "--json", "-"]) == 0
    )
    report = json.loads(capsys.readouterr().out)
    assert report["n_sentences"] == 1000 and report["split"] == "test_2016_flickr"
    for key in ("sacrebleu", "paper_bleu", "multi30k_lc_tok_bleu"):  # the reference scored against itself
        assert report["scores"][key]["score"] == pytest.approx(100.0), key


def _tiny_model(tmp_path):
    """A random 1-layer model (d_model 16) with a 60-piece vocabulary beside it, and the 300
    lines its vocabulary was learned from."""
    from transduce.checkpoint import save_model
    from transduce.config import Config, ModelConfig
    from transduce.data.vocab import Vocab, train_vocab
    from transduce.model import Transformer

    rng = random.Random(0)
    words = ["ein", "mann", "hund", "läuft", "auf", "dem", "gras", "rot", "blau", "ball"]
    lines = [" ".join(rng.choice(words) for _ in range(rng.randint(2, 8))) for _ in range(300)]
    spm = train_vocab(tmp_path / "spm", lines, vocab_size=60, num_threads=1)
    torch.manual_seed(0)
    mc = ModelConfig(src_vocab_size=len(Vocab(spm)), n_layers=1, d_model=16, d_ff=32, n_heads=2, dropout=0.0)
    model_dir = save_model(Transformer(mc), Config(model=mc), tmp_path / "model")
    shutil.copy(spm, model_dir / "spm.model")
    return model_dir, lines


def test_translate_and_evaluate_with_a_model(tmp_path, capsys):
    model_dir, lines = _tiny_model(tmp_path)
    src = _write(tmp_path / "src.txt", lines[:5] + [""])
    ref = _write(tmp_path / "ref.txt", lines[5:10] + [""])
    saved = tmp_path / "hyp.txt"
    assert (
        main(
            [
                "evaluate",
                str(model_dir),
                "--input",
                str(src),
                "--ref",
                str(ref),
                "--tgt",
                "de",
                "--beam",
                "2",
                "--max-len-offset",
                "3",
                "--out",
                str(saved),
                "--json",
                "-",
                "--quiet",
            ]
        )
        == 0
    )
    report = json.loads(capsys.readouterr().out)
    assert report["model"] == str(model_dir) and report["decoding"]["beam"] == 2
    assert report["n_sentences"] == 6 and len(saved.read_text(encoding="utf-8").split("\n")) == 7
    assert main(["evaluate", str(model_dir), "--hyp", str(saved), "--ref", str(ref), "--tgt", "de"]) == 2
    assert "either --hyp FILE or a MODEL" in capsys.readouterr().err


def test_languages_the_other_way_round_from_the_models_are_refused(tmp_path, capsys):
    """A model inside a run directory (RUN/avg_last5) has its languages in RUN/data.json: an
    en->de model asked to translate de->en is refused before it loads, with both directions named."""
    model_dir, lines = _tiny_model(tmp_path)
    (tmp_path / "data.json").write_text(json.dumps({"src_lang": "en", "tgt_lang": "de"}), encoding="utf-8")
    src = _write(tmp_path / "src.txt", lines[:3])
    ref = _write(tmp_path / "ref.txt", lines[3:6])
    common = [str(model_dir), "--input", str(src), "--ref", str(ref), "--beam", "1", "--max-len-offset", "2", "--quiet"]
    assert main(["evaluate", *common, "--src", "de", "--tgt", "en"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "translates en->de" in err and "ask for de->en" in err
    assert main(["evaluate", *common, "--tgt", "en"]) == 2  # the target alone is checked too
    assert "ask for target en" in capsys.readouterr().err
    assert main(["evaluate", *common, "--src", "en", "--tgt", "de"]) == 0  # the model's own direction


# -- output files and flags checked before the work ------------------------------------------------


def test_outputs_are_checked_before_the_work_and_errors_name_the_users_path(tmp_path, capsys):
    model_dir, lines = _tiny_model(tmp_path)
    src = _write(tmp_path / "src.txt", lines[:4])
    ref = _write(tmp_path / "ref.txt", lines[4:8])
    (tmp_path / "adir").mkdir()
    model = [str(model_dir), "--input", str(src), "--ref", str(ref), "--tgt", "de", "--quiet"]
    hyp = ["--hyp", str(src), "--ref", str(ref), "--tgt", "de"]
    for argv, path, what in [
        (model + ["--out", str(tmp_path / "nodir" / "h.de")], tmp_path / "nodir" / "h.de", "No such file or directory"),
        (model + ["--json", str(tmp_path / "adir")], tmp_path / "adir", "Is a directory"),
        (
            hyp + ["--json", str(tmp_path / "nodir" / "x.json")],
            tmp_path / "nodir" / "x.json",
            "No such file or directory",
        ),
        (hyp + ["--out", str(tmp_path / "adir")], tmp_path / "adir", "Is a directory"),
    ]:
        assert main(["evaluate", *argv]) == 2
        out, err = capsys.readouterr()
        assert err.splitlines() == [f"transduce evaluate: error: {path}: {what}"] and out == ""  # nothing decoded
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "adir",
        "model",
        "ref.txt",
        "spm.model",
        "spm.vocab",
        "src.txt",
    ]
    assert not list((tmp_path / "adir").iterdir())


def test_the_table_is_printed_before_the_json_file_is_written(tmp_path, capsys, monkeypatch):
    import errno
    import os

    from transduce.checkpoint import files  # what `transduce evaluate` writes with, imported when it runs

    hyp = _write(tmp_path / "hyp.de", ["Das ist ein Test."])
    report = tmp_path / "report.json"

    def disk_full(path, text):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))

    monkeypatch.setattr(files, "atomic_write_text", disk_full)
    assert main(["evaluate", "--hyp", str(hyp), "--ref", str(hyp), "--tgt", "de", "--json", str(report)]) == 2
    out, err = capsys.readouterr()
    assert "sacreBLEU" in out and "100.00" in out  # shown, whatever happens to the file
    assert err.splitlines() == [f"transduce evaluate: error: {report}: No space left on device"]


def test_json_follows_a_symlink_and_streams_into_a_fifo(tmp_path, capsys):
    import os
    import threading

    hyp = _write(tmp_path / "hyp.de", ["Das ist ein Test."])
    argv = ["evaluate", "--hyp", str(hyp), "--ref", str(hyp), "--tgt", "de", "--json"]
    (tmp_path / "link.json").symlink_to("real.json")  # dangling: its target is made, as `>` would
    assert main([*argv, str(tmp_path / "link.json")]) == 0
    assert (tmp_path / "link.json").is_symlink() and json.loads((tmp_path / "real.json").read_text())[
        "n_sentences"
    ] == 1
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    got = []
    reader = threading.Thread(target=lambda: got.append(open(fifo, "rb").read()), daemon=True)
    reader.start()
    try:
        assert main([*argv, str(fifo)]) == 0
    finally:
        if reader.is_alive() and not got:
            os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))  # let the reader go if nothing came
        reader.join(10)
    assert json.loads(got[0])["n_sentences"] == 1 and fifo.is_fifo()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fifo", "hyp.de", "link.json", "real.json"]
    capsys.readouterr()


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--threads", "-1"], "--threads must be at least 1, not -1"),
        (["--threads", "0"], "--threads must be at least 1, not 0"),
        (["--length-penalty", "gnmt:nan"], "--length-penalty gnmt:nan: alpha must be a finite number >= 0"),
        (["--length-penalty", "gnmt:-1"], "--length-penalty gnmt:-1: alpha must be a finite number >= 0"),
    ],
)
def test_bad_decoding_flags_are_one_line_errors_before_the_model_loads(tmp_path, capsys, flags, message):
    src = _write(tmp_path / "src.txt", ["ein mann"])
    assert (
        main(
            ["evaluate", str(tmp_path / "no-such-model"), "--input", str(src), "--ref", str(src), "--tgt", "de", *flags]
        )
        == 2
    )
    assert capsys.readouterr().err.splitlines() == [f"transduce evaluate: error: {message}"]


def test_unknown_sacrebleu_tokenizer_is_refused_with_the_list(tmp_path, capsys):
    hyp = _write(tmp_path / "hyp.de", ["a"])
    with pytest.raises(SystemExit) as e:
        main(["evaluate", "--hyp", str(hyp), "--ref", str(hyp), "--tgt", "de", "--sacrebleu-tokenize", "bogus"])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("transduce evaluate: error: argument --sacrebleu-tokenize: invalid choice: 'bogus'")
    assert all(name in err for name in ("13a", "intl", "none", "char"))


def test_tokenized_output_is_scored_as_the_literature_scores_multi30k():
    """A model trained on Multi30k's tok variant writes lowercased tokenized text: multi-bleu.perl -lc
    scores it against the tok references as it is (escapes and all), and the other scores are
    computed on its detokenized form, lowercased."""
    from transduce import evaluate

    tok = ["ein mann mit einem hut , der etwas anstarrt .", "zwei hunde spielen im schnee &amp; eis ."]
    raw = ["Ein Mann mit einem Hut, der etwas anstarrt.", "Zwei Hunde spielen im Schnee & Eis."]
    s = evaluate.score(tok, raw, lang="de", tok_refs=tok, tokenized=True)
    assert s["multi30k_lc_tok_bleu"]["score"] == 100.0
    assert round(s["sacrebleu_lc"]["score"], 6) == 100.0 and "case:lc" in s["sacrebleu_lc"]["signature"]
    assert set(s) == {"multi30k_lc_tok_bleu", "sacrebleu_lc", "chrf_lc"}
    # the same lines scored as raw output would be re-tokenized and lose the escapes' match
    assert evaluate.score(tok, raw, lang="de", tok_refs=tok)["multi30k_lc_tok_bleu"]["score"] < 100
