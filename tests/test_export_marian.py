"""`transduce export marian`: Hugging Face's MarianMTModel (eager attention) computes what
transduce computes, MarianTokenizer tokenizes as transduce does, and a round trip through the
Marian directory is bitwise identical.

Marian's sinusoids are [sin | cos] halves where the paper interleaves them; the export permutes
the hidden dimension of every weight, and `test_without_the_permutation_the_logits_are_wrong`
shows the step is needed."""

import pytest
import torch

pytest.importorskip("transformers")

from tiny_models import SRC_WORDS, make_model, padded_batch, sentences  # noqa: E402

from transduce.cli import main  # noqa: E402
from transduce.data.vocab import EOS, PAD  # noqa: E402
from transduce.decoding.search import greedy_decode  # noqa: E402
from transduce.export.marian import export_marian, hidden_permutation  # noqa: E402
from transduce.export.marian_dir import MARIAN_DEFAULTS  # noqa: E402
from transduce.export.opus import import_marian  # noqa: E402
from transduce.positions import sinusoidal_positions  # noqa: E402
from transduce.decoding.ready import load_translation_model  # noqa: E402
from transduce.decoding.translate import translate_lines  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")

VARIANTS = {
    "paper-shared": dict(shared=True, n_layers=3),
    "separate-tied": dict(shared=False, n_layers=3),
    "separate-untied-bias": dict(shared=False, n_layers=2, tie_output=False, attention_bias=True),
}


@pytest.fixture(autouse=True, scope="module")
def quiet():
    import transformers

    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()


@pytest.fixture(scope="module", params=list(VARIANTS))
def exported(request, tmp_path_factory):
    from transformers import MarianMTModel

    root = tmp_path_factory.mktemp(request.param)
    loaded = load_translation_model(make_model(root, **VARIANTS[request.param]))
    out = export_marian(loaded.model, loaded.config, loaded.src_vocab, loaded.tgt_vocab, root / "marian")
    hf = MarianMTModel.from_pretrained(str(out), attn_implementation="eager").eval()
    return loaded, hf, out


def hf_logits(hf, src, tgt):
    with torch.no_grad():
        return hf(
            input_ids=src,
            attention_mask=(src != PAD).long(),
            decoder_input_ids=tgt,
            decoder_attention_mask=(tgt != PAD).long(),
        ).logits


def max_logit_difference(loaded, hf, src, tgt):
    with torch.no_grad():
        ref = loaded.model(src, tgt)
    real = tgt != PAD  # the outputs at padded target positions are computed and ignored, in both
    return (ref - hf_logits(hf, src, tgt))[real].abs().max().item()


BART_ERA = {"normalize_before", "normalize_embedding", "static_position_embeddings", "add_bias_logits"}
"""The keys of `MARIAN_DEFAULTS` that OPUS-MT's config.json files carry from the older BART-based config."""


def test_marian_defaults_are_marianconfigs():
    """What a config.json leaves out is read as transformers reads it: each key of `MARIAN_DEFAULTS` is
    `MarianConfig()`'s (`decoder_vocab_size` None: the `vocab_size`, as MarianConfig sets it), except the
    BART-era keys, which MarianConfig no longer has (their values: what MarianMTModel computes)."""
    from transformers import MarianConfig

    hf = MarianConfig()
    ours = {
        **MARIAN_DEFAULTS,
        "decoder_vocab_size": MARIAN_DEFAULTS["decoder_vocab_size"] or MARIAN_DEFAULTS["vocab_size"],
    }
    missing = {k for k in ours if not hasattr(hf, k)}
    assert missing <= BART_ERA, f"MarianConfig has no {sorted(missing - BART_ERA)}"
    differ = {k: (ours[k], getattr(hf, k)) for k in sorted(ours.keys() - missing) if getattr(hf, k) != ours[k]}
    assert not differ, f"MARIAN_DEFAULTS differ from MarianConfig's (ours, theirs): {differ}"


def test_positions_are_the_papers_in_marians_order():
    d = 32
    paper = sinusoidal_positions(50, d)
    sin_cos_halves = torch.cat([paper[:, 0::2], paper[:, 1::2]], 1)  # Marian's layout
    assert torch.equal(paper[:, hidden_permutation(d)], sin_cos_halves)


def test_eager_logits_equal_transduces(exported):
    """Within float tolerance; what remains is Marian's LayerNorm epsilon (1e-5, transduce 1e-6)."""
    loaded, hf, _ = exported
    src, tgt, _, _ = padded_batch(loaded.src_vocab, loaded.tgt_vocab)
    assert (src == PAD).any() and (tgt == PAD).any()
    assert hf.model.encoder.layers[0].self_attn_layer_norm.eps == 1e-5 and loaded.config.model.layer_norm_eps == 1e-6
    assert max_logit_difference(loaded, hf, src, tgt) < 1e-4


def test_with_marians_epsilon_the_logits_agree_to_float_rounding(tmp_path):
    from transformers import MarianMTModel

    loaded = load_translation_model(make_model(tmp_path / "m", n_layers=3, layer_norm_eps=1e-5))
    out = export_marian(loaded.model, loaded.config, loaded.src_vocab, loaded.tgt_vocab, tmp_path / "marian")
    hf = MarianMTModel.from_pretrained(str(out), attn_implementation="eager").eval()
    src, tgt, _, _ = padded_batch(loaded.src_vocab, loaded.tgt_vocab)
    assert max_logit_difference(loaded, hf, src, tgt) < 1e-5


def test_without_the_permutation_the_logits_are_wrong(exported, tmp_path):
    from transformers import MarianMTModel

    loaded, _, _ = exported
    out = export_marian(
        loaded.model, loaded.config, loaded.src_vocab, loaded.tgt_vocab, tmp_path / "unpermuted", permute_hidden=False
    )
    hf = MarianMTModel.from_pretrained(str(out), attn_implementation="eager").eval()
    src, tgt, _, _ = padded_batch(loaded.src_vocab, loaded.tgt_vocab)
    assert max_logit_difference(loaded, hf, src, tgt) > 0.1


def test_greedy_generate_equals_greedy_decode(exported):
    loaded, hf, _ = exported
    lines = sentences(SRC_WORDS, 12, seed=5)
    ids = [loaded.src_vocab.encode(s) + [EOS] for s in lines]
    S = max(map(len, ids))
    src = torch.tensor([s + [PAD] * (S - len(s)) for s in ids])
    offset = 6
    ref = greedy_decode(loaded.model, src, max_len_offset=offset)
    with torch.no_grad():
        out = hf.generate(
            input_ids=src, attention_mask=(src != PAD).long(), num_beams=1, do_sample=False, max_new_tokens=S + offset
        )
    for row, s, r in zip(out.tolist(), ids, ref):
        row = row[1:]  # the decoder start token (BOS)
        got = row[: row.index(EOS)] if EOS in row else row
        assert got[: len(s) + offset] == r  # transduce stops each sentence at its own input + offset


def test_generate_without_length_arguments_is_not_cut_at_20_tokens(tmp_path):
    """Hugging Face's `generate` stops at its model-agnostic max_length 20 unless the generation
    config says otherwise: the export writes the position table's length there, so a plain
    `generate(**batch)` gives the whole translation."""
    from transformers import MarianMTModel

    loaded = load_translation_model(make_model(tmp_path, shared=True, n_layers=2))
    out = export_marian(
        loaded.model, loaded.config, loaded.src_vocab, loaded.tgt_vocab, tmp_path / "marian", max_positions=64
    )
    hf = MarianMTModel.from_pretrained(str(out), attn_implementation="eager").eval()
    assert hf.generation_config.max_length == 64
    ids = [loaded.src_vocab.encode(s) + [EOS] for s in sentences(SRC_WORDS, 6, seed=7)]
    S = max(map(len, ids))
    src = torch.tensor([s + [PAD] * (S - len(s)) for s in ids])
    ref = greedy_decode(loaded.model, src, max_len_offset=63 - S)  # at most 63 tokens after the start
    with torch.no_grad():
        out = hf.generate(input_ids=src, attention_mask=(src != PAD).long(), num_beams=1, do_sample=False)
    assert max(map(len, ref)) > 20  # the tiny random model rarely ends early: the check has teeth
    for row, s, r in zip(out.tolist(), ids, ref):
        row = row[1:]
        got = row[: row.index(EOS)] if EOS in row else row
        assert got[: len(s) + 63 - S] == r  # transduce stops each sentence at its own input + offset


def test_marian_tokenizer_is_transduces(exported):
    from transformers import MarianTokenizer

    loaded, _, out = exported
    tok = MarianTokenizer.from_pretrained(str(out))
    lines = sentences(SRC_WORDS, 10, seed=2) + ["Two dogs, 3 balls!"]
    assert tok(lines)["input_ids"] == [loaded.src_vocab.encode(s) + [EOS] for s in lines]
    tgt = [loaded.tgt_vocab.encode(s) for s in sentences(["ein", "mann", "hund", "gras"], 5, seed=1)]
    assert [tok.decode(t, skip_special_tokens=True) for t in tgt] == [loaded.tgt_vocab.decode(t) for t in tgt]


def test_round_trip_is_bitwise_identical(exported, tmp_path, capsys):
    loaded, _, out = exported
    model, config, sv, tv = import_marian(out)
    assert config == loaded.config
    a, b = loaded.model.state_dict(), model.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    # and through the command: a model directory that `transduce translate` runs as before
    assert main(["import", str(out), "-o", str(tmp_path / "back")]) == 0
    again = load_translation_model(tmp_path / "back")
    lines = sentences(SRC_WORDS, 6, seed=4)
    assert translate_lines(
        again.model, again.src_vocab, again.tgt_vocab, lines, beam=2, max_len_offset=4
    ) == translate_lines(loaded.model, loaded.src_vocab, loaded.tgt_vocab, lines, beam=2, max_len_offset=4)
    capsys.readouterr()


def test_what_marian_cannot_express_is_refused_in_one_line(tmp_path, capsys):
    for name, knobs in (
        ("pre", dict(norm_first=True)),
        ("learned", dict(positional="learned", max_positions=64)),
        ("dk", dict(d_k=4, d_v=4)),
    ):
        model_dir = make_model(tmp_path / name, **knobs)
        assert main(["export", "marian", str(model_dir), "-o", str(tmp_path / f"{name}-out")]) == 2
        err = capsys.readouterr().err
        assert err.startswith("transduce export: error: ") and err.count("\n") == 1 and "Marian" in err
        assert not (tmp_path / f"{name}-out").exists()


def test_import_says_in_one_line_what_a_directory_is_instead(tmp_path, capsys):
    """A transduce model, a Marian directory without its tokenizer, one whose weights do not fit its
    config: one line naming the directory, status 2, nothing written (nothing loaded to find out)."""
    import json
    import shutil

    model_dir = make_model(tmp_path / "t")
    loaded = load_translation_model(model_dir)
    marian = export_marian(loaded.model, loaded.config, loaded.src_vocab, loaded.tgt_vocab, tmp_path / "marian")
    no_tokenizer, misfit = tmp_path / "no-tokenizer", tmp_path / "misfit"
    shutil.copytree(marian, no_tokenizer)
    (no_tokenizer / "source.spm").unlink()
    shutil.copytree(marian, misfit)
    config = json.loads((misfit / "config.json").read_text())
    (misfit / "config.json").write_text(json.dumps({**config, "d_model": 2 * config["d_model"]}))
    (misfit / "transduce.json").unlink()  # config.json is then the config
    cases = [
        (model_dir, "a transduce model directory, not a MarianMT one (`transduce export marian` turns it into one)"),
        (model_dir.parent, 'not a MarianMT model directory (no config.json saying model_type "marian")'),
        (no_tokenizer, "a MarianMT model without source.spm: its tokenizer's files"),
        (
            misfit,
            "the shapes of its weights do not fit its config.json (model.encoder.embed_tokens.weight: [100, 32], not [100, 64])",
        ),
    ]
    for path, words in cases:
        out = tmp_path / f"{path.name}-back"
        assert main(["import", str(path), "-o", str(out)]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"transduce import: error: {path}: {words}") and err.count("\n") == 1, err
        assert not out.exists() and not list(tmp_path.glob(f".{out.name}*"))
