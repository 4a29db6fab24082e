"""The vocabulary shortlist (`transduce shortlist`, `translate --shortlist`; not in the paper): the
associations it counts, its file, and a search over a batch's candidates that maps its choices
back to the vocabulary's ids: over every id, the same outputs as the whole vocabulary's search."""

import pytest
import torch

from tiny_models import SRC_WORDS, make_model, sentences
from transduce.cli import main
from transduce.config import ModelConfig
from transduce.decoding.search import beam_search, greedy_decode
from transduce.decoding.shortlist import FILE, Shortlist, Shortlisted, build
from transduce.decoding.translate import translate_lines, translate_stream
from transduce.decoding.ready import load_for_decoding, load_translation_model
from transduce.fast.int8 import can_int8
from transduce.model import Transformer

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


def test_each_source_token_keeps_the_targets_it_occurs_with():
    # source 5 always with target 9, source 6 with 10; target 4 is in every sentence: the frequent one
    pairs = [([5, 7], [9, 4]), ([5], [9, 4, 11]), ([6, 7], [10, 4]), ([6], [10, 4]), ([7], [4, 12])]
    sl = build(pairs, 8, 13, per_source=2, frequent=1)
    assert sl.frequent.tolist() == [4]
    assert sl.table[5].tolist() == [9, 11]  # Dice 2*2/(2+2) = 1, then 2*1/(2+1)
    assert sl.table[6].tolist() == [10, -1]  # only one target besides the frequent one
    assert sl.table[7, 0].item() in (9, 10, 12)
    assert sl.table[0].tolist() == [-1, -1]  # never seen
    assert sl.candidates([[5], [6, 99]], always=[0, 3]).tolist() == [0, 3, 4, 9, 10, 11]


def test_the_file_round_trips(tmp_path):
    sl = build([([1, 2], [3, 4])], 5, 6, per_source=3, frequent=1)
    sl.save(tmp_path / FILE)
    back = Shortlist.load(tmp_path / FILE)
    assert torch.equal(back.table, sl.table) and torch.equal(back.frequent, sl.frequent)
    assert back.target_size == 6 and back.info == sl.info
    with pytest.raises(FileNotFoundError, match="transduce shortlist"):
        Shortlist.load(tmp_path / "none.safetensors")


def tiny(**knobs):
    torch.manual_seed(0)
    c = dict(src_vocab_size=40, n_layers=2, d_model=32, d_ff=64, n_heads=4, dropout=0.0)
    c.update(knobs)
    return Transformer(ModelConfig(**c)).eval()


@pytest.mark.parametrize("knobs", [{}, {"share_embeddings": False, "tie_output": False, "output_bias": True}])
def test_over_every_id_the_search_is_the_whole_vocabularys(knobs):
    model = tiny(**knobs)
    src = torch.randint(4, 40, (3, 7), generator=torch.Generator().manual_seed(1))
    V = model.config.target_vocab_size
    everything = Shortlisted(model, torch.arange(V))
    with torch.inference_mode():
        full = beam_search(model, src, beam_size=3, max_len_offset=5, n_best=2)
        short = beam_search(everything, src, beam_size=3, max_len_offset=5, n_best=2, vocab=everything.ids)
        assert [[h.tokens for h in hs] for hs in short] == [[h.tokens for h in hs] for hs in full]
        assert greedy_decode(everything, src, max_len_offset=5, vocab=everything.ids) == greedy_decode(
            model, src, max_len_offset=5
        )


def test_a_shortlisted_search_outputs_only_candidates():
    model = tiny()
    src = torch.randint(4, 40, (2, 6), generator=torch.Generator().manual_seed(2))
    ids = torch.tensor([0, 1, 2, 3, 7, 11, 19, 23])  # the special ids and five others
    view = Shortlisted(model, ids)
    with torch.inference_mode():
        hyps = beam_search(view, src, beam_size=2, max_len_offset=4, vocab=ids)
        greedy = greedy_decode(view, src, max_len_offset=4, vocab=ids)
    tokens = {t for hs in hyps for h in hs for t in h.tokens} | {t for o in greedy for t in o}
    assert tokens and tokens <= {7, 11, 19, 23}


@pytest.mark.skipif(not can_int8(), reason="int8 decoding needs oneDNN's int8 kernels on x86-64 (fast.int8.can_int8)")
def test_int8_rows_give_the_whole_projections_columns(tmp_path):
    # depends on: oneDNN's int8 linear (x86-64); the activations are quantized per tensor, so a row subset
    # of the int8 projection computes the same columns
    model_dir = make_model(tmp_path, d_model=64, d_ff=128)
    loaded = load_for_decoding(model_dir, precision="int8", threads=1)
    model = loaded.model
    ids = torch.tensor([0, 2, 3, 5, 8, 13, 21])
    x = torch.randn(4, 1, 64, generator=torch.Generator().manual_seed(3)).to(next(model.parameters()).dtype)
    with torch.inference_mode():
        full = model.logits(x)
        short = Shortlisted(model, ids).project(x)
    assert short.dtype == torch.float32
    torch.testing.assert_close(short, full[..., ids], rtol=0, atol=1e-5)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_model(tmp_path_factory.mktemp("shortlist"), d_model=64, d_ff=128)


def test_translate_with_a_shortlist(model_dir, tmp_path, capsys):
    lines = sentences(SRC_WORDS, 24, seed=5)
    src, tgt = tmp_path / "train.src", tmp_path / "train.tgt"
    loaded = load_translation_model(model_dir)
    reference = translate_lines(loaded.model, loaded.src_vocab, loaded.tgt_vocab, lines, beam=3, max_len_offset=6)
    src.write_text("\n".join(lines) + "\n", encoding="utf-8")
    tgt.write_text("\n".join(reference) + "\n", encoding="utf-8")
    flags = ["--beam", "3", "--max-len-offset", "6", "--threads", "1", "-i", str(src), "--precision", "fp32"]
    # every target token frequent: the shortlisted search is the whole vocabulary's, to the byte
    assert (
        main(["shortlist", str(model_dir), "--train-src", str(src), "--train-tgt", str(tgt), "--frequent", "100000"])
        == 0
    )
    assert "wrote" in capsys.readouterr().out and (model_dir / FILE).is_file()
    assert main(["translate", str(model_dir), *flags, "--shortlist", "-o", str(tmp_path / "all.txt")]) == 0
    assert "shortlist" in capsys.readouterr().err
    assert (tmp_path / "all.txt").read_text(encoding="utf-8").splitlines() == reference
    # a short one: every output token is one of the batch's candidates (the 24 lines are one batch)
    small = tmp_path / "small.safetensors"
    assert (
        main(
            [
                "shortlist",
                str(model_dir),
                "--train-src",
                str(src),
                "--train-tgt",
                str(tgt),
                "--frequent",
                "2",
                "--per-source",
                "2",
                "-o",
                str(small),
            ]
        )
        == 0
    )
    assert (
        main(["translate", str(model_dir), *flags, "--shortlist", str(small), "-o", str(tmp_path / "small.txt")]) == 0
    )
    out = (tmp_path / "small.txt").read_text(encoding="utf-8").splitlines()
    shortlist = Shortlist.load(small)
    ids = loaded.model.config.special_ids.to_dict().values()
    allowed = set(
        shortlist.candidates([loaded.src_vocab.encode(x) + [loaded.model.config.eos_id] for x in lines], ids).tolist()
    )
    cands = list(
        translate_stream(
            loaded.model, loaded.src_vocab, loaded.tgt_vocab, lines, beam=3, max_len_offset=6, shortlist=shortlist
        )
    )
    assert [c[0].text for c in cands] == out and len(allowed) < len(loaded.tgt_vocab)
    assert {t for c in cands for t in c[0].tokens} <= allowed


def test_bad_shortlist_input_is_one_line(model_dir, tmp_path, capsys):
    (tmp_path / "a").write_text("x y\nz\n", encoding="utf-8")
    (tmp_path / "b").write_text("x\n", encoding="utf-8")
    assert (
        main(
            [
                "shortlist",
                str(model_dir),
                "--train-src",
                str(tmp_path / "a"),
                "--train-tgt",
                str(tmp_path / "b"),
                "-o",
                str(tmp_path / "s.safetensors"),
            ]
        )
        == 2
    )
    err = capsys.readouterr().err
    assert "line counts differ" in err and "Traceback" not in err and not (tmp_path / "s.safetensors").exists()
    assert (
        main(
            ["translate", str(model_dir), "--shortlist", str(tmp_path / "none.safetensors"), "-i", str(tmp_path / "a")]
        )
        == 2
    )
    assert "no shortlist" in capsys.readouterr().err
