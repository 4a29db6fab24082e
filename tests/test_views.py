"""`transduce attention` and `transduce.views`: the weights shown are the fast path's, each row
sums to 1, nothing above the decoder's diagonal, nothing on padding; the JSON's layout; PNG bytes
reproducible; the page self-contained; the command as a user runs it. The page in a real browser
is tests/test_views_browser.py."""

import json
import re
import sys

import pytest
import torch
import torch.nn.functional as F

from transduce.cli import main
from transduce.data.vocab import PAD
from transduce.masks import make_masks
from transduce.model import attention_reference
from transduce.decoding.ready import load_translation_model
from transduce.decoding.translate import translate_stream
from transduce.views import figures
from transduce.views.page import render_page
from transduce.views.weights import TYPES, compute_attention, find_token, readable, to_json

from views_data import N_HEADS, N_LAYERS, make_model_dir

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py

SOURCES = ["a dog runs on the grass with a red ball", "two children play", "the man looks at the water"]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_model_dir(tmp_path_factory.mktemp("views"))


@pytest.fixture(scope="module")
def loaded(model_dir):
    return load_translation_model(model_dir)


@pytest.fixture(scope="module")
def padded(loaded):
    """Three sentences of different lengths (padding on both sides), given targets."""
    v = loaded.src_vocab
    sources = [v.encode(s) for s in SOURCES]
    targets = [v.encode(t) for t in ["two children", "a man looks at the blue water near the street", "a dog"]]
    return compute_attention(loaded.model, sources, targets)


# ---------------------------------------------------------------------------------------------
# The weights
# ---------------------------------------------------------------------------------------------


def test_weights_are_the_fast_paths(loaded, padded, monkeypatch):
    """The weights shown (forward(return_attention=True), the reference path) are those of the
    queries, keys and masks the fast path (scaled_dot_product_attention) used: softmax(QK^T/sqrt(d))
    of its q, k under its mask, and weights @ V is its output; the logits are the same."""
    calls = []
    sdpa = F.scaled_dot_product_attention

    def recording(q, k, v, attn_mask=None, dropout_p=0.0, **kw):
        out = sdpa(q, k, v, attn_mask=attn_mask, dropout_p=dropout_p, **kw)
        calls.append((q, k, v, attn_mask, out))
        return out

    monkeypatch.setattr(F, "scaled_dot_product_attention", recording)
    model = loaded.model.eval()
    with torch.no_grad():
        fast_logits = model(padded.src, padded.tgt)
        slow_logits, _ = model(padded.src, padded.tgt, return_attention=True)
    torch.testing.assert_close(slow_logits, fast_logits, atol=1e-4, rtol=1e-4)  # float32 sums in another order
    order = [("encoder", l) for l in range(N_LAYERS)] + [
        (kind, l) for l in range(N_LAYERS) for kind in ("decoder_self", "decoder_cross")
    ]
    assert len(calls) == len(order)  # every attention of the fast pass went through SDPA
    for (kind, layer), (q, k, v, mask, out) in zip(order, calls):
        shown = padded.weights[kind][layer]
        _, reference = attention_reference(q, k, v, mask)
        # (the two passes differ in the last bits from layer 1 on: SDPA and eq. 1 sum in other orders)
        torch.testing.assert_close(shown, reference, atol=1e-5, rtol=1e-4)
        torch.testing.assert_close(shown @ v, out, atol=5e-5, rtol=1e-4)
        assert shown.std() > 0.05  # sharp enough that a mix-up of rows or heads would show


def test_rows_sum_to_one_nothing_above_the_diagonal_nothing_on_padding(padded):
    src_real, tgt_real = padded.src != PAD, padded.tgt != PAD
    keys_real = {"encoder": src_real, "decoder_self": tgt_real, "decoder_cross": src_real}
    queries_real = {"encoder": src_real, "decoder_self": tgt_real, "decoder_cross": tgt_real}
    assert (~src_real).any() and (~tgt_real).any()  # the batch has padding on both sides
    for kind in TYPES:
        for w in padded.weights[kind]:  # (B, h, Tq, Tk)
            assert w.shape[:2] == (3, N_HEADS)
            sums = w.sum(-1)
            torch.testing.assert_close(sums, torch.ones_like(sums), atol=1e-5, rtol=0)  # pad query rows too
            assert (w.transpose(1, 3)[~keys_real[kind]] == 0).all()  # no weight reaches a padding key
            assert ((w > 0) == padded.masks[kind][:, None]).all()  # exactly the allowed cells are non-zero
            if kind == "decoder_self":
                assert (w.triu(diagonal=1) == 0).all()
        assert queries_real[kind].shape == padded.masks[kind].shape[:2]
    src_mask, tgt_mask = make_masks(padded.src, padded.tgt, PAD)
    assert torch.equal(padded.masks["decoder_self"], tgt_mask[:, 0].expand_as(padded.masks["decoder_self"]))
    assert torch.equal(padded.masks["encoder"], src_mask[:, 0].expand_as(padded.masks["encoder"]))


def test_json_holds_each_sentences_weights_cut_to_its_tokens(loaded, padded):
    data = to_json(padded, loaded.src_vocab, loaded.tgt_vocab, model="tiny")
    assert (data["n_layers"], data["n_heads"], data["types"]) == (N_LAYERS, N_HEADS, list(TYPES))
    for i, s in enumerate(data["sentences"]):
        S, T = padded.src_lengths[i], padded.tgt_lengths[i]
        assert s["source"][-1] == "</s>" and s["target"][0] == "<s>" and s["predicts"][-1] == "</s>"
        assert len(s["source"]) == S and len(s["target"]) == len(s["predicts"]) == T
        assert s["predicts"][:-1] == s["target"][1:]
        for kind, (q, k) in {"encoder": (S, S), "decoder_self": (T, T), "decoder_cross": (T, S)}.items():
            w = torch.tensor(s["attention"][kind], dtype=torch.double)
            assert w.shape == (N_LAYERS, N_HEADS, q, k)
            torch.testing.assert_close(w, padded.sentence(i, kind).double(), atol=0.5e-4 + 1e-9, rtol=0)
            torch.testing.assert_close(
                w.sum(-1), torch.ones(N_LAYERS, N_HEADS, q, dtype=torch.double), atol=1e-3, rtol=0
            )
    masks = data["batch"]["masks"]
    assert torch.equal(torch.tensor(masks["decoder_cross"]).bool(), padded.masks["decoder_cross"])
    assert [len(r) for r in data["batch"]["source"]] == [padded.src.size(1)] * 3


def test_labels_of_subword_pieces_and_repeated_tokens():
    assert [readable(p) for p in ["\u2581mak", "ing", "</s>", "<s>", "\u2581", "."]] == [
        "mak",
        "\u00b7ing",
        "</s>",
        "<s>",
        "\u2423",
        "\u00b7.",
    ]
    labels = ["the", "mak", "\u00b7ing", "the", "</s>"]
    pieces = ["\u2581the", "\u2581mak", "ing", "\u2581the", "</s>"]
    assert find_token(labels, pieces, "making", "source") == 1  # a word of two pieces: its first
    assert find_token(labels, pieces, "\u00b7ing", "source") == 2
    assert find_token(labels, pieces, "4", "source") == 3
    with pytest.raises(ValueError, match="occurs at positions 1, 4 of the source: give the position"):
        find_token(labels, pieces, "the", "source")
    with pytest.raises(ValueError, match="positions 1 to 5"):
        find_token(labels, pieces, "9", "source")
    with pytest.raises(ValueError, match="not a token"):
        find_token(labels, pieces, "cat", "source")


# ---------------------------------------------------------------------------------------------
# Figures and the page
# ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def data(loaded, padded):
    return to_json(padded, loaded.src_vocab, loaded.tgt_vocab, model="tiny")


def test_png_figures_are_reproducible_bytes(data):
    made = {
        "lines": figures.lines_figure(data, kind="encoder", layer=1),
        "query": figures.lines_figure(data, kind="encoder", layer=1, heads=[0, 2], query=3),
        "rows": figures.lines_figure(data, kind="decoder_cross", layer=0, layout="rows", sentence=1),
        "heatmap": figures.heatmap_figure(data, kind="decoder_self", layer=0, sentence=1, query=2),
        "masks": figures.masks_figure(data, sentences=[1]),  # (one short sentence: seconds count here)
    }
    for name, png in made.items():
        assert png.startswith(b"\x89PNG\r\n\x1a\n"), name
        assert b"matplotlib" not in png.lower(), name  # no Software (version) metadata
    assert len(set(made.values())) == len(made)  # each choice draws something else
    assert figures.lines_figure(data, kind="encoder", layer=1) == made["lines"]
    assert figures.masks_figure(data, sentences=[1]) == made["masks"]
    with pytest.raises(Exception, match="layers 1 to 2"):
        figures.lines_figure(data, layer=2)


def test_page_is_self_contained_and_embeds_the_json(data):
    tricky = json.loads(json.dumps(data))
    tricky["sentences"][0]["target_text"] = "</script><script>alert(1)</script> <!-- x"
    page = render_page(tricky)
    assert page.count("<script") == 2 and page.count("</script>") == 2  # the text cannot close the element
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:|//)""", page)
    assert "default-src 'none'" in page  # the page may not load anything
    embedded = re.search(r'<script type="application/json" id="attention-data">(.*?)</script>', page, re.S)[1]
    assert json.loads(embedded) == tricky


# ---------------------------------------------------------------------------------------------
# The command
# ---------------------------------------------------------------------------------------------


def test_command_writes_png_json_html_with_the_models_own_translation(model_dir, loaded, tmp_path, capsys):
    out = {ext: tmp_path / f"a.{ext}" for ext in ("png", "json", "html")}
    args = [
        "attention",
        str(model_dir),
        SOURCES[0],
        SOURCES[1],
        "--beam",
        "2",
        "--max-len-offset",
        "5",
        "--layer",
        "1",
        "--heads",
        "1,3",
        "--query",
        "dog",
        "--png",
        str(out["png"]),
        "--json",
        str(out["json"]),
        "--html",
        str(out["html"]),
    ]
    assert main(args) == 0
    data = json.loads(out["json"].read_text(encoding="utf-8"))
    own = list(
        translate_stream(loaded.model, loaded.src_vocab, loaded.tgt_vocab, SOURCES[:2], beam=2, max_len_offset=5)
    )
    for s, cands in zip(data["sentences"], own):
        assert s["target_pieces"][1:] == [loaded.tgt_vocab.sp.id_to_piece(t) for t in cands[0].tokens]
        assert s["target_text"] == cands[0].text and "beam 2" in s["target_from"]
    assert out["png"].read_bytes().startswith(b"\x89PNG")
    assert "attention-data" in out["html"].read_text(encoding="utf-8")
    printed = capsys.readouterr().out
    assert "1 source: a dog runs" in printed


def test_command_with_targets_from_a_file_and_the_token_cap(model_dir, tmp_path, capsys):
    tsv = tmp_path / "in.tsv"
    tsv.write_text("a dog runs on the grass with a red ball\ttwo children\nthe man looks\n", encoding="utf-8")
    assert (
        main(
            [
                "attention",
                str(model_dir),
                "-i",
                str(tsv),
                "--greedy",
                "--max-len-offset",
                "3",
                "--keep-tokens",
                "4",
                "--json",
                str(tmp_path / "b.json"),
            ]
        )
        == 0
    )
    data = json.loads((tmp_path / "b.json").read_text(encoding="utf-8"))
    first, second = data["sentences"]
    assert first["target_from"] == "given" and first["target_text"] == "two children"
    assert second["target_from"] == "the model's greedy translation"
    assert len(first["source"]) == 5 and "source cut to its first 4" in first["notes"][0]  # 4 + </s>
    assert "source cut" in capsys.readouterr().err


@pytest.mark.parametrize(
    "extra, message",
    [
        ([], "nothing to write"),
        (["--json", "X/none/out.json"], "no such directory"),
        (["--png", "OUT.png", "--query", "a"], "occurs at positions"),
        (["--json", "OUT.json", "--target-text", "x", "--target-text", "y"], "2 --target-text for 1 sentences"),
        (["--png", "OUT.png", "--heads", "9"], "heads [9]: the model has heads 1 to 4"),
        (["--png", "OUT.svg"], "--png"),
        (["--json", "OUT.json", "--threads", "-1"], "--threads must be at least 1"),
        (
            ["--json", "OUT.json", "--length-penalty", "gnmt:nan"],
            "--length-penalty gnmt:nan: alpha must be a finite number >= 0",
        ),  # the figure is a PNG: a name saying otherwise is refused
        (["--json", "OUT.json", "--heads", "9"], "--heads choose what the PNG figure shows: add --png FILE"),
        (["--html", "OUT.html", "--type", "decoder-cross", "--query", "dog"], "--type, --query choose what the PNG"),
    ],
)
def test_command_errors_are_one_line(model_dir, tmp_path, capsys, extra, message):
    extra = [e.replace("OUT", str(tmp_path / "o")).replace("X/", str(tmp_path) + "/") for e in extra]
    assert (
        main(["attention", str(model_dir), "a dog runs with a red ball", "--greedy", "--max-len-offset", "2", *extra])
        == 2
    )
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("transduce attention: error: ") and message in err[-1], err
    assert not list(tmp_path.iterdir())  # nothing half-written


def test_png_without_matplotlib_names_the_extra(model_dir, tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # as if not installed
    assert main(["attention", str(model_dir), "a dog", "--png", str(tmp_path / "x.png")]) == 2
    assert "pip install 'transduce[views]'" in capsys.readouterr().err


def test_a_page_too_large_is_refused_with_what_to_do(model_dir, tmp_path, monkeypatch, capsys):
    import transduce.views.weights as weights

    monkeypatch.setattr(weights, "MAX_WEIGHTS", 100)  # 2 layers x 4 heads x (S^2 + T^2 + TS) > 100 here
    assert (
        main(
            [
                "attention",
                str(model_dir),
                "a dog runs on the grass",
                "--target-text",
                "a dog",
                "--json",
                str(tmp_path / "x.json"),
            ]
        )
        == 2
    )
    err = capsys.readouterr().err
    assert "weights would be more than a page should hold" in err and "--keep-tokens" in err
    assert not (tmp_path / "x.json").exists()
