"""OPUS-MT's MarianMT models imported as they are (`transduce import`), against Hugging Face's own
MarianMTModel and MarianTokenizer, on tiny random models of OPUS-MT's configuration
(tests/opus_models.py): the same ids (Marian's, nothing renumbered), the same logits to fp32
rounding, the same greedy and beam outputs as `generate`, with and without a `>>xx<<` prefix, for
OPUS-MT's id layout, tc-big's (EOS far from 0) and separate vocabularies; the vocabulary files
copied as they are; models by hub id, from a populated cache and with the hub unreachable; then
every other transduce path on the imported model."""

import hashlib
import json

import pytest
import torch

pytest.importorskip("transformers")

from opus_models import make_opus_dir, opus_sentences  # noqa: E402

from transduce.checkpoint import load_model  # noqa: E402
from transduce.cli import main  # noqa: E402
from transduce.data.batching import load_vocabs  # noqa: E402
from transduce.data.vocab import MarianVocab  # noqa: E402
from transduce.decoding.search import beam_search, greedy_decode  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")

MODELS = {
    "bilingual": dict(eos_bias=3.0),
    "multilingual": dict(languages=("de", "fr"), eos_bias=2.0),
    "tc-big": dict(layout="tc-big", eos_bias=1.5),
    "separate": dict(separate=True, eos_bias=1.5),
}
"""Each model's shape (tests/opus_models.py) and EOS's logits bias: the value at which its outputs
have various lengths (a random model's are mostly empty or to the length limit)."""
OFFSET = 20  # transduce's max_len_offset; generate's max_length is 1 (the start token) + source + OFFSET
ALPHA = 0.6


@pytest.fixture(autouse=True, scope="module")
def quiet():
    import transformers

    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()


class Imported:
    """An OPUS-shaped MarianMT directory, Hugging Face's model and tokenizer of it, and the transduce
    model directory `transduce import` made of it."""

    def __init__(self, root, languages=(), **shape):
        from transformers import MarianMTModel, MarianTokenizer

        self.languages = languages
        self.marian = make_opus_dir(root, languages=languages, seed=1, **shape)
        self.model_dir = root / "transduce"
        assert main(["import", str(self.marian), "-o", str(self.model_dir)]) == 0
        self.tok = MarianTokenizer.from_pretrained(str(self.marian))
        self.hf = MarianMTModel.from_pretrained(str(self.marian), attn_implementation="eager").eval()
        self.model, self.config = load_model(self.model_dir)
        self.src_vocab, self.tgt_vocab = load_vocabs(self.model_dir)
        self.lines = opus_sentences(30, languages=languages)

    def ids(self, line: str) -> list[int]:
        """transduce's source ids of a line, EOS included."""
        return self.src_vocab.encode(line) + [self.src_vocab.eos]

    def generate(self, line: str, **options) -> list[int]:
        """Hugging Face's output for one line, without the start token and EOS."""
        c = self.hf.config
        enc = self.tok([line], return_tensors="pt")
        with torch.no_grad():
            out = self.hf.generate(
                **enc,
                do_sample=False,
                max_length=1 + len(self.ids(line)) + OFFSET,
                bad_words_ids=[[c.pad_token_id]],
                **options,
            )[0].tolist()
        assert out[0] == c.decoder_start_token_id
        return [i for i in out[1:] if i not in (c.eos_token_id, c.pad_token_id)]


@pytest.fixture(scope="module", params=list(MODELS))
def imported(request, tmp_path_factory):
    return Imported(tmp_path_factory.mktemp(request.param), **MODELS[request.param])


def _digest(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_the_imported_model_is_marians_ids_and_files_as_they_are(imported):
    """OPUS-MT's options (defaults: the paper's), Marian's special ids in the model's config (the
    decoder starting with PAD), no row added, the logits bias as it was, and the vocabulary files
    copied byte for byte."""
    m, c = imported.config.model, imported.hf.config
    assert (m.activation, m.attention_bias, m.output_bias, m.layer_norm_eps) == ("swish", True, True, 1e-5)
    assert (m.src_vocab_size, m.target_vocab_size) == (c.vocab_size, c.decoder_vocab_size)
    vocab = json.loads((imported.marian / "vocab.json").read_text(encoding="utf-8"))
    assert (m.pad_id, m.unk_id, m.bos_id, m.eos_id) == (
        c.pad_token_id,
        vocab["<unk>"],
        c.decoder_start_token_id,
        c.eos_token_id,
    )
    assert m.bos_id == m.pad_id and (m.eos_id != 0) == (imported.marian.parent.name.startswith("tc-big"))
    assert torch.equal(imported.model.output_bias.detach(), imported.hf.final_logits_bias.reshape(-1))
    assert isinstance(imported.src_vocab, MarianVocab) and isinstance(imported.tgt_vocab, MarianVocab)
    assert (imported.src_vocab is imported.tgt_vocab) is False  # two sentencepiece models, as MarianTokenizer has
    # one vocab.json read once: the two sides share its look-up (a separate target_vocab.json: their own)
    assert (imported.src_vocab.ids_of is imported.tgt_vocab.ids_of) is (not m.tgt_vocab_size)
    names = ["source.spm", "target.spm", "vocab.json"] + (["target_vocab.json"] if m.tgt_vocab_size else [])
    for name in names:
        assert _digest(imported.model_dir / name) == _digest(imported.marian / name), name
    meta = json.loads((imported.model_dir / "data.json").read_text(encoding="utf-8"))
    assert meta["special_ids"] == m.special_ids.to_dict() and (meta["src_lang"], meta["tgt_lang"]) == ("en", "de")


def test_the_same_ids_as_marian_tokenizer(imported):
    specials = ["a dog </s> sits <unk> x", "Ä ü a", "", "  two  children ", ">>xx<< dog", "a <pad> b"]
    lines = (
        imported.lines + specials + ([f"{line} >>de<<" for line in imported.lines[:3]] if imported.languages else [])
    )
    ours = imported.src_vocab.encode_batch(lines)
    for line, got in zip(lines, ours):
        assert got + [imported.src_vocab.eos] == imported.tok(line).input_ids == imported.ids(line), line
    targets = ["ein mann läuft", "zwei kinder spielen", "Ä x"]
    assert [t + [imported.tgt_vocab.eos] for t in imported.tgt_vocab.encode_batch(targets)] == imported.tok(
        text_target=targets
    ).input_ids
    if imported.languages:  # the language token is one token, at the start
        assert all(imported.src_vocab.id_to_piece(ids[0]).startswith(">>") for ids in ours[: len(imported.lines)])


def test_the_same_logits_as_marian_mt_model(imported):
    """A padded batch through both, teacher-forced from the start token (Marian's PAD): every real
    position's logits equal to fp32 rounding."""
    lines = imported.lines[:6]
    pad, start = imported.config.model.pad_id, imported.config.model.bos_id
    srcs = [imported.ids(line) for line in lines]
    tgts = [
        [start] + imported.tgt_vocab.encode(line)[::-1]
        for line in ["ein mann", "zwei kinder spielen", "gras", "hund auf dem gras", "ein", "rot blau"]
    ]
    S, T = max(map(len, srcs)), max(map(len, tgts))
    src = torch.tensor([s + [pad] * (S - len(s)) for s in srcs])
    tgt = torch.tensor([t + [pad] * (T - len(t)) for t in tgts])
    real = torch.tensor([[j < len(t) for j in range(T)] for t in tgts])  # the start token (PAD) included
    with torch.no_grad():
        ours = imported.model(src, tgt)
        theirs = imported.hf(
            input_ids=src, attention_mask=(src != pad).long(), decoder_input_ids=tgt, decoder_attention_mask=real.long()
        ).logits
    diff = (ours[real] - theirs[real]).abs().max().item()
    print(f"max |logit diff| {diff:.2e}")
    assert diff < 1e-5


def test_the_same_greedy_outputs_as_generate(imported):
    """Every line; generate without OPUS-MT's forced EOS, which at the length limit puts EOS in
    place of the last token where transduce stops (its maximum counts the tokens it writes)."""
    for line in imported.lines:
        ours = greedy_decode(imported.model, torch.tensor([imported.ids(line)]), max_len_offset=OFFSET)[0]
        assert ours == imported.generate(line, num_beams=1, forced_eos_token_id=None), line
    print(f"greedy: {len(imported.lines)}/{len(imported.lines)} equal")


def test_the_same_beam_outputs_as_generate(imported):
    """transduce's beam search with Hugging Face's length penalty (`penalty="hf"`: |Y|^alpha; and
    as generate searches: only a step's k best extensions finish, the EOS forced at the length
    limit costs nothing) against `generate` as OPUS-MT configures it (beam 4, its early stopping,
    forced EOS): the same output for every line, those that reach the length limit too."""
    at_limit, nonempty = 0, 0
    for line in imported.lines:
        theirs = imported.generate(line, num_beams=4, length_penalty=ALPHA)
        ours = beam_search(
            imported.model,
            torch.tensor([imported.ids(line)]),
            beam_size=4,
            alpha=ALPHA,
            max_len_offset=OFFSET,
            penalty="hf",
        )[0][0]
        assert ours.tokens == theirs, line
        assert imported.tgt_vocab.decode(ours.tokens) == imported.tok.decode(ours.tokens, skip_special_tokens=True)
        at_limit += len(theirs) + 1 >= len(imported.ids(line)) + OFFSET
        nonempty += bool(theirs)
    print(
        f"beam: {len(imported.lines)}/{len(imported.lines)} equal ({nonempty} non-empty, {at_limit} at the length limit)"
    )
    assert nonempty >= 10


def test_decoding_text_as_marian_tokenizer(imported):
    g = torch.Generator().manual_seed(0)
    V = len(imported.tgt_vocab)
    for _ in range(20):
        ids = torch.randint(0, V, (12,), generator=g).tolist()
        assert imported.tgt_vocab.decode(ids) == imported.tok.decode(ids, skip_special_tokens=True)


def test_pytorch_model_bin_is_read_as_tensors(tmp_path):
    """A directory with pytorch_model.bin alone (read memory-mapped by torch.load(weights_only=True))
    imports to the same tensors as its model.safetensors twin."""
    from safetensors.torch import load_file

    a = make_opus_dir(tmp_path / "st", seed=2)
    b = make_opus_dir(tmp_path / "bin", seed=2, weights="bin")
    assert not (b / "model.safetensors").exists()
    for d in (a, b):
        assert main(["import", str(d), "-o", str(d.parent / "t")]) == 0
    ta, tb = (load_file(d.parent / "t" / "model.safetensors") for d in (a, b))
    assert ta.keys() == tb.keys() and all(torch.equal(ta[k], tb[k]) for k in ta)


def test_the_import_writes_what_save_model_writes(tmp_path):
    """The weights written a tensor at a time (`save_made_tensors_as_model`) are the tensors of the
    model built in memory (`import_marian`) and saved by `save_model`, bit for bit."""
    from safetensors.torch import load_file

    from transduce.checkpoint import save_model
    from transduce.export.opus import import_marian

    d = make_opus_dir(tmp_path, seed=3)
    assert main(["import", str(d), "-o", str(tmp_path / "streamed")]) == 0
    model, config, _, _ = import_marian(d)
    save_model(model, config, tmp_path / "saved")
    streamed, saved = (load_file(tmp_path / n / "model.safetensors") for n in ("streamed", "saved"))
    state = model.state_dict()
    for name, t in streamed.items():
        assert torch.equal(t, state[name]), name
    assert len(streamed) == len(saved)


def test_the_import_makes_the_parent_of_its_directory(tmp_path):
    """`-o models/en-de` where models/ is not there yet (a fresh checkout), as prepare's --out."""
    d = make_opus_dir(tmp_path / "made", seed=4)
    out = tmp_path / "models" / "en-de"
    assert main(["import", str(d), "-o", str(out)]) == 0
    assert (out / "model.safetensors").is_file() and (out / "generation.json").is_file()


def test_export_from_marian_is_gone(tmp_path, capsys):
    """`transduce import` is the one spelling: `export from-marian` was never released."""
    with pytest.raises(SystemExit) as e:  # argparse's own refusal of an unknown FORMAT
        main(["export", "from-marian", str(tmp_path), "-o", str(tmp_path / "out")])
    assert e.value.code == 2 and "invalid choice: 'from-marian'" in capsys.readouterr().err


# -- generation settings, languages and models by name --------------------------------------------

HUB_GENERATION = {"num_beams": 4, "max_length": 512, "renormalize_logits": False}
"""What the hub's generation_config.json of an OPUS-MT model sets besides the ids (and bad_words_ids [[PAD]])."""


@pytest.fixture(scope="module")
def with_settings(tmp_path_factory):
    root = tmp_path_factory.mktemp("hubshaped")
    marian = make_opus_dir(root / "opus-mt-en-de", seed=1, eos_bias=3.0, generation=HUB_GENERATION)
    settings = json.loads((marian / "generation_config.json").read_text(encoding="utf-8"))
    settings["bad_words_ids"] = [[settings["pad_token_id"]]]
    (marian / "generation_config.json").write_text(json.dumps(settings), encoding="utf-8")
    return marian


def test_generation_settings_travel_and_translate_decodes_as_generate(with_settings, tmp_path):
    """num_beams and the length penalty of generation_config.json go into generation.json, and
    `translate` without search flags decodes with them: what generate gives by default (beam 4,
    |Y|^1.0, forced EOS), its max_length (kept, not applied) put at transduce's limit."""
    from transformers import MarianMTModel, MarianTokenizer

    from transduce.decoding.ready import load_translation_model

    out = tmp_path / "model"
    assert main(["import", str(with_settings), "-o", str(out)]) == 0
    g = json.loads((out / "generation.json").read_text(encoding="utf-8"))
    assert (g["beam"], g["length_penalty"], g["max_length"], g["not_applied"]) == (4, 1.0, 512, {})
    loaded = load_translation_model(out)
    assert loaded.generation.search() == {"beam": 4, "greedy": False, "alpha": 1.0, "length_penalty": "hf"}
    tok, hf = MarianTokenizer.from_pretrained(str(with_settings)), MarianMTModel.from_pretrained(str(with_settings))
    lines = opus_sentences(8, seed=9)
    src = tmp_path / "in.txt"
    src.write_text("\n".join(lines) + "\n", encoding="utf-8")
    assert (
        main(["translate", str(out), "-i", str(src), "-o", str(tmp_path / "out.txt"), "--precision", "fp32", "--quiet"])
        == 0
    )
    got = (tmp_path / "out.txt").read_text(encoding="utf-8").splitlines()
    for line, ours in zip(lines, got):
        enc = tok([line], return_tensors="pt")
        with torch.no_grad():  # its own settings (beam 4, |Y|^1.0), but for max_length: transduce's source + 50
            theirs = hf.generate(**enc, max_length=1 + enc.input_ids.size(1) + 50)[0]
        assert ours == tok.decode(theirs, skip_special_tokens=True), line
    assert sum(map(bool, got)) >= 4


def test_serve_decodes_with_the_imported_settings_unless_told_otherwise(with_settings, tmp_path):
    """`transduce serve` of an imported model takes its generation settings as its defaults, as
    `translate` does (beam 4, |Y|^1.0); the flags, where given, win."""
    pytest.importorskip("fastapi")
    import argparse

    from transduce.cli import serve as serve_cli

    out = tmp_path / "model"
    assert main(["import", str(with_settings), "-o", str(out)]) == 0
    parser = argparse.ArgumentParser()
    serve_cli.add_args(parser)
    args = parser.parse_args([str(out)])
    serve_cli.check_args(args)
    assert (args.beam, args.penalty, args.alpha) == (4, "hf", 1.0)
    args = parser.parse_args([str(out), "--beam", "2", "--length-penalty", "gnmt:0.6"])
    serve_cli.check_args(args)
    assert (args.beam, args.penalty, args.alpha) == (2, "paper", 0.6)


def test_languages_from_the_name_and_the_target_tokens(tmp_path):
    """The languages of a model named as the hub names OPUS-MT's, where its tokenizer_config.json
    names none, and a multilingual model's `>>xx<<` tokens."""
    marian = make_opus_dir(tmp_path / "made", languages=("fr", "es"), seed=5).rename(tmp_path / "opus-mt-en-ROMANCE")
    (marian / "tokenizer_config.json").write_text("{}", encoding="utf-8")
    out = tmp_path / "model"
    assert main(["import", str(marian), "-o", str(out)]) == 0
    meta = json.loads((out / "data.json").read_text(encoding="utf-8"))
    g = json.loads((out / "generation.json").read_text(encoding="utf-8"))
    assert (meta["src_lang"], meta["tgt_lang"]) == ("en", "ROMANCE") and g["target_tokens"] == [">>fr<<", ">>es<<"]


def _hub_cache(cache, repo: str, files) -> None:
    """A huggingface_hub cache holding `repo` at main, laid out as huggingface_hub lays it out:
    blobs by their hash, a snapshot of links to them, refs/main naming the snapshot."""
    import os

    commit = "0123456789abcdef0123456789abcdef01234567"
    folder = cache / f"models--{repo.replace('/', '--')}"
    (folder / "refs").mkdir(parents=True)
    (folder / "refs" / "main").write_text(commit)
    snapshot = folder / "snapshots" / commit
    (folder / "blobs").mkdir()
    snapshot.mkdir(parents=True)
    for f in files:
        blob = folder / "blobs" / hashlib.sha256(f.read_bytes()).hexdigest()
        blob.write_bytes(f.read_bytes())
        os.symlink(os.path.relpath(blob, snapshot), snapshot / f.name)


def test_a_model_by_hub_id_from_the_cache_offline(with_settings, tmp_path, monkeypatch, capsys):
    """`transduce import Helsinki-NLP/opus-mt-en-de` with HF_HUB_OFFLINE=1 and the model in
    huggingface_hub's cache: imported from there, its languages from the hub id."""
    pytest.importorskip("huggingface_hub")
    cache = tmp_path / "cache"
    _hub_cache(cache, "Helsinki-NLP/opus-mt-en-de", [f for f in with_settings.iterdir() if f.is_file()])
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    import huggingface_hub.constants as hub_constants

    monkeypatch.setattr(hub_constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(hub_constants, "HF_HUB_OFFLINE", True)
    out = tmp_path / "model"
    assert main(["import", "Helsinki-NLP/opus-mt-en-de", "-o", str(out)]) == 0
    assert "beam 4" in capsys.readouterr().out
    meta = json.loads((out / "data.json").read_text(encoding="utf-8"))
    assert meta["imported_from"] == "Helsinki-NLP/opus-mt-en-de"
    assert _digest(out / "vocab.json") == _digest(with_settings / "vocab.json")
    assert main(["import", "Helsinki-NLP/opus-mt-en-fr", "-o", str(tmp_path / "fr")]) == 2  # not in the cache
    err = capsys.readouterr().err
    assert (
        len(err.strip().splitlines()) == 1 and "not in huggingface_hub's cache" in err and "pass its directory" in err
    )


def test_the_hub_unreachable_is_one_line_saying_what_to_do(tmp_path, monkeypatch, capsys):
    """Online, the hub unreachable (a closed port for its endpoint): one line, no traceback."""
    pytest.importorskip("huggingface_hub")
    import huggingface_hub.constants as hub_constants

    monkeypatch.setattr(hub_constants, "HF_HUB_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(hub_constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(hub_constants, "ENDPOINT", "http://127.0.0.1:9")
    monkeypatch.setenv("HF_HUB_ETAG_TIMEOUT", "2")
    assert main(["import", "Helsinki-NLP/opus-mt-en-de", "-o", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert (
        err.startswith("transduce import: error: Helsinki-NLP/opus-mt-en-de: ") and len(err.strip().splitlines()) == 1
    )
    assert "HF_HUB_OFFLINE" in err and "Traceback" not in err
    assert not (tmp_path / "out").exists()


# -- every other path on the imported model ---------------------------------------------------


@pytest.fixture(scope="module")
def multilingual(tmp_path_factory):
    return Imported(tmp_path_factory.mktemp("paths"), **MODELS["multilingual"])


def _translate(model_dir, tmp_path, lines, *flags) -> list[str]:
    src, out = tmp_path / "in.txt", tmp_path / f"out{len(flags)}{hash(flags) & 0xFFFF}.txt"
    src.write_text("\n".join(lines) + "\n", encoding="utf-8")
    assert main(["translate", str(model_dir), "-i", str(src), "-o", str(out), "--quiet", *flags]) == 0
    return out.read_text(encoding="utf-8").splitlines()


def test_translate_cli_fp32_bf16_int8(multilingual, tmp_path):
    """`transduce translate` writes, in fp32, what MarianTokenizer decodes of generate's greedy
    output, and with `--length-penalty hf:A` of its beam search's; bf16 and int8 run (not exact)."""
    from transduce.fast.int8 import can_int8

    lines = multilingual.lines[:8]
    fp32 = _translate(
        multilingual.model_dir, tmp_path, lines, "--greedy", "--max-len-offset", str(OFFSET), "--precision", "fp32"
    )
    want = [
        multilingual.tgt_vocab.decode(multilingual.generate(line, num_beams=1, forced_eos_token_id=None))
        for line in lines
    ]
    assert fp32 == want
    beam = _translate(
        multilingual.model_dir,
        tmp_path,
        lines,
        "--beam",
        "4",
        "--length-penalty",
        f"hf:{ALPHA}",
        "--max-len-offset",
        str(OFFSET),
        "--precision",
        "fp32",
    )
    assert beam == [
        multilingual.tgt_vocab.decode(multilingual.generate(line, num_beams=4, length_penalty=ALPHA)) for line in lines
    ]
    assert len(_translate(multilingual.model_dir, tmp_path, lines, "--greedy", "--precision", "bf16")) == len(lines)
    if can_int8():  # oneDNN's int8 kernels on x86-64
        assert len(_translate(multilingual.model_dir, tmp_path, lines, "--greedy", "--precision", "int8")) == len(lines)


def test_attention_and_evaluate_cli(multilingual, tmp_path, capsys):
    assert (
        main(
            [
                "attention",
                str(multilingual.model_dir),
                multilingual.lines[0],
                "--greedy",
                "--max-len-offset",
                "3",
                "--json",
                str(tmp_path / "a.json"),
            ]
        )
        == 0
    )
    data = json.loads((tmp_path / "a.json").read_text(encoding="utf-8"))
    assert data  # the weights of a teacher-forced pass, with the source's pieces
    src, ref = tmp_path / "src.txt", tmp_path / "ref.txt"
    src.write_text("\n".join(multilingual.lines[:5]) + "\n", encoding="utf-8")
    ref.write_text("ein mann\n" * 5, encoding="utf-8")
    assert (
        main(
            [
                "evaluate",
                str(multilingual.model_dir),
                "-i",
                str(src),
                "--ref",
                str(ref),
                "--tgt",
                "de",
                "--greedy",
                "--precision",
                "fp32",
            ]
        )
        == 0
    )


def test_ct2_export_decodes_as_transduce(multilingual, tmp_path):
    pytest.importorskip("ctranslate2")
    assert main(["export", "ct2", str(multilingual.model_dir), "-o", str(tmp_path / "ct2")]) == 0
    lines = multilingual.lines[:8]
    flags = ("--greedy", "--max-len-offset", str(OFFSET))
    ours = _translate(multilingual.model_dir, tmp_path, lines, *flags, "--precision", "fp32")
    assert _translate(tmp_path / "ct2", tmp_path, lines, "--engine", "ct2", *flags) == ours


def test_serve_translates_as_generate(multilingual):
    """The server's torch engine (POST /translate) on the imported model, greedy in fp32: what
    MarianTokenizer decodes of generate's greedy output."""
    pytest.importorskip("fastapi")
    from fastapi.testclient import TestClient

    from transduce.decoding.ready import load_translation_model
    from transduce.serve.app import create_app, torch_engine

    loaded = load_translation_model(multilingual.model_dir)
    lines = multilingual.lines[:6]
    with TestClient(create_app(torch_engine(loaded))) as client:
        body = {"sentences": lines, "greedy": True, "max_len_offset": OFFSET}
        got = [
            t if isinstance(t, str) else t["text"] for t in client.post("/translate", json=body).json()["translations"]
        ]
    assert got == [
        multilingual.tgt_vocab.decode(multilingual.generate(line, num_beams=1, forced_eos_token_id=None))
        for line in lines
    ]


def test_the_vocabulary_loads_where_prepared_data_and_runs_load_theirs(multilingual):
    """`data.batching.load_vocabs` (the trainer's, and `prepare --vocab MODEL`'s way to a model's
    vocabulary) opens the imported model's files as `MarianVocab`s that encode as MarianTokenizer."""
    from transduce.data.batching import load_vocabs

    sv, tv = load_vocabs(multilingual.model_dir)
    assert isinstance(sv, MarianVocab) and isinstance(tv, MarianVocab)
    lines = multilingual.lines[:5]
    assert sv.encode_batch(lines) == [multilingual.tok(line).input_ids[:-1] for line in lines]
    targets = ["ein mann läuft", "zwei kinder spielen"]
    theirs = multilingual.tok(text_target=targets).input_ids
    assert tv.encode_batch(targets) == [ids[:-1] for ids in theirs]
    assert tv.word_starts().shape == (len(tv),)


def test_fine_tuning_the_imported_model(multilingual, tmp_path, capsys):
    """`prepare --vocab` encodes text with the imported model's vocabulary (MarianTokenizer's ids,
    as they are) and `train --init` starts from its weights, with OPUS-MT's options and ids kept: the
    batches padded with Marian's PAD, the decoder starting from it, its loss ignoring it."""
    from transduce.data.batching import ParallelDataset

    lines = multilingual.lines[:12]
    targets = ["ein mann läuft", "zwei kinder spielen", "eine frau liest"] * 4
    for split in ("train", "valid"):
        (tmp_path / f"{split}.src").write_text("\n".join(lines) + "\n", encoding="utf-8")
        (tmp_path / f"{split}.tgt").write_text("\n".join(targets) + "\n", encoding="utf-8")
    data, run = tmp_path / "data", tmp_path / "run"
    assert (
        main(
            [
                "prepare",
                "--train-src",
                str(tmp_path / "train.src"),
                "--train-tgt",
                str(tmp_path / "train.tgt"),
                "--valid-src",
                str(tmp_path / "valid.src"),
                "--valid-tgt",
                str(tmp_path / "valid.tgt"),
                "--max-ratio",
                "100",
                "--vocab",
                str(multilingual.model_dir),
                "-o",
                str(data),
                "--quiet",
            ]
        )
        == 0
    )
    pairs = ParallelDataset.load(data, "train")
    assert pairs[0][0].tolist() == multilingual.tok(lines[0]).input_ids
    assert pairs.ids == multilingual.config.model.special_ids
    batch = pairs.collate([0, 1])
    assert batch["tgt_in"][0, 0] == multilingual.config.model.bos_id == multilingual.config.model.pad_id
    assert (
        main(
            [
                "train",
                "--data",
                str(data),
                "--run-dir",
                str(run),
                "--init",
                str(multilingual.model_dir),
                "--max-steps",
                "3",
                "--warmup",
                "2",
                "--batch-tokens",
                "4000",
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
    assert "starting from the weights of" in capsys.readouterr().out
    tuned, config = load_model(run / "model")
    assert config.model == multilingual.config.model  # swish, biases, the logits bias: OPUS-MT's options kept
    before, after = dict(multilingual.model.named_parameters()), dict(tuned.named_parameters())
    assert before.keys() == after.keys() and any(not torch.equal(before[k], after[k]) for k in before)  # it trained
