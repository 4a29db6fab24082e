"""OPUS-MT's MarianMT models imported exactly (`transduce export from-marian`), against Hugging
Face's own MarianMTModel and MarianTokenizer, on tiny random models of OPUS-MT's configuration
(tests/opus_models.py): the same ids (under the renumbering), the same logits to fp32 rounding,
the same greedy and beam outputs as `generate`, with and without a `>>xx<<` prefix; then every
other transduce path on the imported model."""

import json
import math

import pytest
import torch

pytest.importorskip("transformers")

from opus_models import make_opus_dir, opus_sentences  # noqa: E402

from transduce.checkpoint import load_model  # noqa: E402
from transduce.cli import main  # noqa: E402
from transduce.data.vocab import EOS, PAD, MarianVocab, Vocab, marian_order  # noqa: E402
from transduce.decoding.search import beam_search, greedy_decode  # noqa: E402
from transduce.export.opus import PAD_LOGIT, VOCAB_FILES  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")

LANGUAGES = {"bilingual": ((), 3.0), "multilingual": (("de", "fr"), 2.0)}
"""Each model's target languages and EOS's logits bias: the value at which its outputs have
various lengths (a random model's are mostly empty or to the length limit)."""
OFFSET = 20  # transduce's max_len_offset; generate's max_length is 1 (the start token) + source + OFFSET
ALPHA = 0.6


@pytest.fixture(autouse=True, scope="module")
def quiet():
    import transformers

    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()


class Imported:
    """An OPUS-shaped MarianMT directory, Hugging Face's model and tokenizer of it, and the transduce
    model directory `transduce export from-marian` made of it."""

    def __init__(self, root, languages, eos_bias):
        from transformers import MarianMTModel, MarianTokenizer

        self.languages = languages
        self.marian = make_opus_dir(root, languages=languages, seed=1, eos_bias=eos_bias)
        self.model_dir = root / "transduce"
        assert main(["export", "from-marian", str(self.marian), "-o", str(self.model_dir)]) == 0
        self.tok = MarianTokenizer.from_pretrained(str(self.marian))
        self.hf = MarianMTModel.from_pretrained(str(self.marian), attn_implementation="eager").eval()
        self.model, self.config = load_model(self.model_dir)
        self.src_vocab = Vocab(self.model_dir / VOCAB_FILES["src"])
        self.tgt_vocab = Vocab(self.model_dir / VOCAB_FILES["tgt"])
        vocab = json.loads((self.marian / "vocab.json").read_text(encoding="utf-8"))
        c = self.hf.config
        self.order = marian_order(vocab, c.pad_token_id, c.eos_token_id, c.decoder_start_token_id)
        self.to_transduce = {m: t for t, m in enumerate(self.order) if m is not None}
        self.lines = opus_sentences(30, languages=languages)

    def ids(self, line: str) -> list[int]:
        """transduce's source ids of a line, EOS included."""
        return self.src_vocab.encode(line) + [EOS]

    def generate(self, line: str, **options) -> list[int]:
        """Hugging Face's output for one line, in transduce's ids, without the start token and EOS."""
        enc = self.tok([line], return_tensors="pt")
        with torch.no_grad():
            out = self.hf.generate(**enc, do_sample=False, max_length=1 + len(self.ids(line)) + OFFSET,
                                   bad_words_ids=[[self.hf.config.pad_token_id]], **options)[0].tolist()
        assert out[0] == self.hf.config.decoder_start_token_id
        return [self.to_transduce[i] for i in out[1:] if i not in (self.hf.config.eos_token_id, self.hf.config.pad_token_id)]


@pytest.fixture(scope="module", params=list(LANGUAGES))
def imported(request, tmp_path_factory):
    return Imported(tmp_path_factory.mktemp(request.param), *LANGUAGES[request.param])


def test_the_imported_model_is_opus_mts_in_options_whose_defaults_are_the_papers(imported):
    m = imported.config.model
    assert (m.activation, m.attention_bias, m.output_bias, m.layer_norm_eps) == ("swish", True, True, 1e-5)
    assert m.src_vocab_size == imported.hf.config.vocab_size + 1  # PAD's own row
    assert isinstance(imported.src_vocab, MarianVocab) and isinstance(imported.tgt_vocab, MarianVocab)
    assert float(imported.model.output_bias.detach()[PAD]) == PAD_LOGIT


def test_the_same_ids_as_marian_tokenizer(imported):
    specials = ["a dog </s> sits <unk> x", "Ä ü a", "", "  two  children ", ">>xx<< dog", "a <pad> b"]
    lines = imported.lines + specials + ([f"{line} >>de<<" for line in imported.lines[:3]] if imported.languages else [])
    ours = imported.src_vocab.encode_batch(lines)
    for line, got in zip(lines, ours):
        theirs = [imported.to_transduce[i] for i in imported.tok(line).input_ids]
        assert got + [EOS] == theirs == imported.ids(line), line
    if imported.languages:  # the language token is one token, at the start
        assert all(imported.src_vocab.id_to_piece(ids[0]).startswith(">>") for ids in ours[:len(imported.lines)])


def test_the_same_logits_as_marian_mt_model(imported):
    """A padded batch through both, teacher-forced with a target in transduce's ids: every real
    position's logits equal to fp32 rounding (PAD's own column aside), and PAD's probability 0."""
    lines = imported.lines[:6]
    srcs = [imported.ids(line) for line in lines]
    tgts = [[2] + imported.src_vocab.encode(line)[::-1] for line in lines]  # BOS (Marian's start), then pieces
    S, T = max(map(len, srcs)), max(map(len, tgts))
    src = torch.tensor([s + [PAD] * (S - len(s)) for s in srcs])
    tgt = torch.tensor([t + [PAD] * (T - len(t)) for t in tgts])
    marian = torch.tensor(imported.order[1:])  # transduce id -> Marian id (PAD has none)
    pad = imported.hf.config.pad_token_id

    def to_marian(x):
        return torch.where(x == PAD, pad, marian[(x - 1).clamp_min(0)])

    with torch.no_grad():
        ours = imported.model(src, tgt)
        theirs = imported.hf(input_ids=to_marian(src), attention_mask=(src != PAD).long(),
                             decoder_input_ids=to_marian(tgt), decoder_attention_mask=(tgt != PAD).long()).logits
    real = tgt != PAD
    diff = (ours[real][:, 1:] - theirs[real][:, marian]).abs().max().item()
    print(f"max |logit diff| {diff:.2e}")
    assert diff < 1e-5
    assert (ours[real].log_softmax(-1)[:, PAD] == -math.inf).all() or float(ours[real].softmax(-1)[:, PAD].max()) == 0.0


def test_the_same_greedy_outputs_as_generate(imported):
    """Every line; generate without OPUS-MT's forced EOS, which at the length limit puts EOS in
    place of the last token where transduce stops (its maximum counts the tokens it writes)."""
    equal = 0
    for line in imported.lines:
        ours = greedy_decode(imported.model, torch.tensor([imported.ids(line)]), max_len_offset=OFFSET)[0]
        assert ours == imported.generate(line, num_beams=1, forced_eos_token_id=None), line
        equal += 1
    print(f"greedy: {equal}/{len(imported.lines)} equal")


def test_the_same_beam_outputs_as_generate(imported):
    """transduce's beam search with Hugging Face's length penalty (`penalty="hf"`: |Y|^alpha; and
    as generate searches: only a step's k best extensions finish, the EOS forced at the length
    limit costs nothing) against `generate` as OPUS-MT configures it (beam 4, its early stopping,
    forced EOS): the same output for every line, those that reach the length limit too."""
    at_limit, nonempty = 0, 0
    for line in imported.lines:
        theirs = imported.generate(line, num_beams=4, length_penalty=ALPHA)
        ours = beam_search(imported.model, torch.tensor([imported.ids(line)]), beam_size=4, alpha=ALPHA,
                           max_len_offset=OFFSET, penalty="hf")[0][0]
        assert ours.tokens == theirs, line
        assert imported.tgt_vocab.decode(ours.tokens) == imported.tok.decode(
            [imported.order[t] for t in ours.tokens], skip_special_tokens=True)
        at_limit += len(theirs) + 1 >= len(imported.ids(line)) + OFFSET
        nonempty += bool(theirs)
    print(f"beam: {len(imported.lines)}/{len(imported.lines)} equal ({nonempty} non-empty, {at_limit} at the length limit)")
    assert nonempty >= 10


def test_decoding_text_as_marian_tokenizer(imported):
    g = torch.Generator().manual_seed(0)
    V = len(imported.tgt_vocab)
    for _ in range(20):
        ids = torch.randint(0, V, (12,), generator=g).tolist()
        marian = [imported.order[i] if imported.order[i] is not None else imported.hf.config.pad_token_id for i in ids]
        assert imported.tgt_vocab.decode(ids) == imported.tok.decode(marian, skip_special_tokens=True)


def test_pytorch_model_bin_is_read_as_tensors(tmp_path):
    """A directory with pytorch_model.bin alone (read by torch.load(weights_only=True)) imports to
    the same tensors as its model.safetensors twin."""
    from safetensors.torch import load_file

    a = make_opus_dir(tmp_path / "st", seed=2)
    b = make_opus_dir(tmp_path / "bin", seed=2, weights="bin")
    assert not (b / "model.safetensors").exists()
    for d in (a, b):
        assert main(["export", "from-marian", str(d), "-o", str(d.parent / "t")]) == 0
    ta, tb = (load_file(d.parent / "t" / "model.safetensors") for d in (a, b))
    assert ta.keys() == tb.keys() and all(torch.equal(ta[k], tb[k]) for k in ta)


# -- every other path on the imported model ---------------------------------------------------


@pytest.fixture(scope="module")
def multilingual(tmp_path_factory):
    return Imported(tmp_path_factory.mktemp("paths"), *LANGUAGES["multilingual"])


def _translate(model_dir, tmp_path, lines, *flags) -> list[str]:
    src, out = tmp_path / "in.txt", tmp_path / f"out{len(flags)}{hash(flags) & 0xffff}.txt"
    src.write_text("\n".join(lines) + "\n", encoding="utf-8")
    assert main(["translate", str(model_dir), "-i", str(src), "-o", str(out), "--quiet", *flags]) == 0
    return out.read_text(encoding="utf-8").splitlines()


def test_translate_cli_fp32_bf16_int8(multilingual, tmp_path):
    """`transduce translate` writes, in fp32, what MarianTokenizer decodes of generate's greedy
    output, and with `--length-penalty hf:A` of its beam search's; bf16 and int8 run (not exact)."""
    from transduce.fast.int8 import can_int8

    lines = multilingual.lines[:8]
    fp32 = _translate(multilingual.model_dir, tmp_path, lines, "--greedy", "--max-len-offset", str(OFFSET),
                      "--precision", "fp32")
    want = [multilingual.tgt_vocab.decode(multilingual.generate(line, num_beams=1, forced_eos_token_id=None))
            for line in lines]
    assert fp32 == want
    beam = _translate(multilingual.model_dir, tmp_path, lines, "--beam", "4", "--length-penalty", f"hf:{ALPHA}",
                      "--max-len-offset", str(OFFSET), "--precision", "fp32")
    assert beam == [multilingual.tgt_vocab.decode(multilingual.generate(line, num_beams=4, length_penalty=ALPHA))
                    for line in lines]
    assert len(_translate(multilingual.model_dir, tmp_path, lines, "--greedy", "--precision", "bf16")) == len(lines)
    if can_int8():  # oneDNN's int8 kernels on x86-64
        assert len(_translate(multilingual.model_dir, tmp_path, lines, "--greedy", "--precision", "int8")) == len(lines)


def test_attention_and_evaluate_cli(multilingual, tmp_path, capsys):
    assert main(["attention", str(multilingual.model_dir), multilingual.lines[0], "--greedy", "--max-len-offset", "3",
                 "--json", str(tmp_path / "a.json")]) == 0
    data = json.loads((tmp_path / "a.json").read_text(encoding="utf-8"))
    assert data  # the weights of a teacher-forced pass, with the source's pieces
    src, ref = tmp_path / "src.txt", tmp_path / "ref.txt"
    src.write_text("\n".join(multilingual.lines[:5]) + "\n", encoding="utf-8")
    ref.write_text("ein mann\n" * 5, encoding="utf-8")
    assert main(["evaluate", str(multilingual.model_dir), "-i", str(src), "--ref", str(ref), "--tgt", "de",
                 "--greedy", "--precision", "fp32"]) == 0


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
        got = [t if isinstance(t, str) else t["text"] for t in client.post("/translate", json=body).json()["translations"]]
    assert got == [multilingual.tgt_vocab.decode(multilingual.generate(line, num_beams=1, forced_eos_token_id=None))
                   for line in lines]


def test_the_vocabulary_loads_where_prepared_data_and_runs_load_theirs(multilingual):
    """`data.batching.load_vocabs` (the trainer's, and `prepare --vocab MODEL`'s way to a model's
    vocabulary) opens the imported model's files as `MarianVocab`s that encode as MarianTokenizer."""
    from transduce.data.batching import load_vocabs

    sv, tv = load_vocabs(multilingual.model_dir)
    assert isinstance(sv, MarianVocab) and isinstance(tv, MarianVocab)
    lines = multilingual.lines[:5]
    assert sv.encode_batch(lines) == [[multilingual.to_transduce[i] for i in multilingual.tok(line).input_ids][:-1]
                                      for line in lines]
    targets = ["ein mann läuft", "zwei kinder spielen"]
    theirs = multilingual.tok(text_target=targets).input_ids
    assert tv.encode_batch(targets) == [[multilingual.to_transduce[i] for i in ids][:-1] for ids in theirs]
    assert tv.word_starts().shape == (len(tv),)



def test_fine_tuning_the_imported_model(multilingual, tmp_path, capsys):
    """`prepare --vocab` encodes text with the imported model's vocabulary (MarianTokenizer's ids,
    renumbered) and `train --init` starts from its weights, with OPUS-MT's options kept."""
    from transduce.data.batching import ParallelDataset

    lines = multilingual.lines[:12]
    targets = ["ein mann läuft", "zwei kinder spielen", "eine frau liest"] * 4
    for split in ("train", "valid"):
        (tmp_path / f"{split}.src").write_text("\n".join(lines) + "\n", encoding="utf-8")
        (tmp_path / f"{split}.tgt").write_text("\n".join(targets) + "\n", encoding="utf-8")
    data, run = tmp_path / "data", tmp_path / "run"
    assert main(["prepare", "--train-src", str(tmp_path / "train.src"), "--train-tgt", str(tmp_path / "train.tgt"),
                 "--valid-src", str(tmp_path / "valid.src"), "--valid-tgt", str(tmp_path / "valid.tgt"),
                 "--max-ratio", "100", "--vocab", str(multilingual.model_dir), "-o", str(data), "--quiet"]) == 0
    pairs = ParallelDataset.load(data, "train")
    assert pairs[0][0].tolist() == [multilingual.to_transduce[i] for i in multilingual.tok(lines[0]).input_ids]
    assert main(["train", "--data", str(data), "--run-dir", str(run), "--init", str(multilingual.model_dir),
                 "--max-steps", "3", "--warmup", "2", "--batch-tokens", "4000", "--precision", "fp32", "--threads", "1",
                 "--save-every-minutes", "0", "--valid-every", "0", "--quiet"]) == 0
    assert "starting from the weights of" in capsys.readouterr().out
    tuned, config = load_model(run / "model")
    assert config.model == multilingual.config.model  # swish, biases, the logits bias: OPUS-MT's options kept
    before, after = dict(multilingual.model.named_parameters()), dict(tuned.named_parameters())
    assert before.keys() == after.keys() and any(not torch.equal(before[k], after[k]) for k in before)  # it trained
