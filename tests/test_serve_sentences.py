"""Sentences in the server (serve/splitting.py): a text split into sentences in both APIs and put
back with its whitespace and line breaks as sent (`split_sentences` as DeepL spells it: on by
default in LibreTranslate's API, off in the native one), HTML a sentence at a time with its tags
placed by the engine's alignment (in proportion for an engine without one), every sentence of a
request (and of a q list) one job of the batcher, so that requests that arrive together are
decoded together. A scripted engine whose outputs and alignment are known (each token upper-cased,
in order or reversed), and a tiny model against `transduce translate`'s sentences."""

import html
import json
import re
import threading

import pytest

pytest.importorskip("fastapi")
httpx = pytest.importorskip("httpx")
pytest.importorskip("pysbd")
pytest.importorskip("sentencex")

from serving import live  # noqa: E402
from tiny_models import make_model  # noqa: E402

from transduce.decoding.ready import load_translation_model  # noqa: E402
from transduce.decoding.search import Hypothesis  # noqa: E402
from transduce.decoding.settings import SearchSettings  # noqa: E402
from transduce.decoding.translate import translate_lines  # noqa: E402
from transduce.serve.app import Engine, Limits, create_app, torch_engine  # noqa: E402
from transduce.serve.catalog import Served  # noqa: E402
from transduce.serve.models import ModelSet  # noqa: E402
from transduce.serve.splitting import mode_of  # noqa: E402
from transduce.text.markup import translate_html  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")

TOKEN = re.compile(r"\w+|[^\w\s]")
PAIR = {"languages": {"src": "en", "tgt": "de"}}
SEARCH = dict(beam=2, alpha=0.6, max_len_offset=4)


class Scripted:
    """An engine whose translations and alignment are known: a sentence's tokens (words, signs)
    upper-cased, reversed if `reverse`, each aligned to the source token it came from (no
    alignment with `aligns` False, as the ct2 engine); hypothesis k > 0 ends in " ALTk"; score
    -(tokens), logprob -2 (tokens). Records the sentences of every round and of every alignment."""

    def __init__(self, reverse: bool = False, aligns: bool = True):
        self.reverse, self.aligns = reverse, aligns
        self.rounds: list[list[str]] = []
        self.aligned: list[list[str]] = []

    def output(self, sentence: str) -> str:
        tokens = [m.group().upper() for m in TOKEN.finditer(sentence)]
        return " ".join(reversed(tokens) if self.reverse else tokens)

    def translate(self, sentences, search):
        self.rounds.append(list(sentences))
        out = []
        for s in sentences:
            n = len(TOKEN.findall(s))
            out.append(
                [
                    Hypothesis(
                        list(range(n + k)), float(-n - k), float(-2 * n - k), self.output(s) + f" ALT{k}" * (k > 0)
                    )
                    for k in range(search.n_best)
                ]
            )
        return out

    def align(self, sources, outputs):
        self.aligned.append(list(sources))
        links = []
        for s, o in zip(sources, outputs):
            src = [m.span() for m in TOKEN.finditer(s)]
            order = list(reversed(src)) if self.reverse else src
            links.append([(t0, t1, *order[j]) for j, (t0, t1) in enumerate(m.span() for m in TOKEN.finditer(o))])
        return links

    def engine(self) -> Engine:
        return Engine(
            self.translate, lambda s: [5] * len(TOKEN.findall(s)), dict(PAIR), align=self.align if self.aligns else None
        )


@pytest.fixture
def scripted():
    """(a Scripted engine, its server's URL, the app): 128 sentences a request, a 10 ms wait."""
    engine = Scripted()
    app = create_app(engine.engine(), limits=Limits(max_sentences=128, max_chars=4000, max_tokens=64))
    with live(app) as url:
        yield engine, url, app


def libre(url: str, q, **fields) -> httpx.Response:
    return httpx.post(url + "/translate", json={"q": q, "source": "en", "target": "de", **fields}, timeout=30)


def metric(text: str, name: str) -> float:
    return float(re.search(rf"^{name} (\S+)$", text, re.M).group(1))


# -- LibreTranslate's API: text ---------------------------------------------------------------------


def test_a_paragraph_is_its_sentences_joined_as_they_were_spaced(scripted):
    engine, url, app = scripted
    text = "  A man runs.  The dog sits!\nTwo children play?\n\n"
    r = libre(url, text)
    assert r.status_code == 200
    assert r.json() == {"translatedText": "  A MAN RUNS .  THE DOG SITS !\nTWO CHILDREN PLAY ?\n\n"}
    assert engine.rounds == [["A man runs.", "The dog sits!", "Two children play?"]]  # one round, three sentences
    metrics = httpx.get(url + "/metrics").text
    assert (
        metric(metrics, "transduce_batch_sentences_sum") == 3
        and metric(metrics, "transduce_batch_sentences_count") == 1
    )


def test_the_modes_off_and_nonewlines_as_deepl_spells_them(scripted):
    engine, url, _ = scripted
    text = "A man\nruns. The dog sits!\nTwo children play?\n"
    for value in ("nonewlines", "NoNewlines"):
        assert libre(url, text, split_sentences=value).json() == {
            "translatedText": "A MAN RUNS . THE DOG SITS !\nTWO CHILDREN PLAY ?\n"
        }  # the line break in a sentence a space
        assert engine.rounds.pop() == ["A man runs.", "The dog sits!", "Two children play?"]
    for value in ("0", 0, False, "off"):  # the whole text one sentence, its line breaks spaces to the model
        assert libre(url, text, split_sentences=value).json() == {
            "translatedText": "A MAN RUNS . THE DOG SITS ! TWO CHILDREN PLAY ?\n"
        }
        assert engine.rounds.pop() == ["A man runs. The dog sits! Two children play?"]
    for value in ("1", 1, True, "on", None):  # on, the default: at sentence ends and at line breaks
        body = {} if value is None else {"split_sentences": value}
        assert libre(url, text, **body).json() == {
            "translatedText": "A MAN\nRUNS . THE DOG SITS !\nTWO CHILDREN PLAY ?\n"
        }
        assert engine.rounds.pop() == ["A man", "runs.", "The dog sits!", "Two children play?"]
    form = httpx.post(
        url + "/translate", data={"q": "One. Two.", "source": "en", "target": "de", "split_sentences": "0"}
    )
    assert form.json() == {"translatedText": "ONE . TWO ."} and engine.rounds.pop() == ["One. Two."]
    for bad in ("2", "yes", 0.5):
        r = libre(url, text, split_sentences=bad)
        assert r.status_code == 400 and r.json()["error"].startswith("Invalid request: split_sentences must be ")
    assert engine.rounds == []
    assert [mode_of(v, "off") for v in (None, "", "1", "nonewlines", False)] == [
        "off",
        "off",
        "on",
        "nonewlines",
        "off",
    ]


def test_alternatives_are_the_kth_hypotheses_of_every_sentence_put_together(scripted):
    _, url, _ = scripted
    r = libre(url, "One. Two.", alternatives=2)
    assert r.json() == {
        "translatedText": "ONE . TWO .",
        "alternatives": ["ONE . ALT1 TWO . ALT1", "ONE . ALT2 TWO . ALT2"],
    }


def test_a_q_list_of_100_strings_is_one_job_decoded_in_one_round(scripted):
    engine, url, app = scripted
    q = [f"Item {i} is ready." for i in range(100)]
    rounds = app.state.batcher.stats.rounds
    r = libre(url, q)
    assert r.json() == {"translatedText": [f"ITEM {i} IS READY ." for i in range(100)]}
    assert app.state.batcher.stats.rounds == rounds + 1 and engine.rounds == [q]
    metrics = httpx.get(url + "/metrics").text
    assert (
        metric(metrics, "transduce_batch_sentences_sum") == 100 and metric(metrics, "transduce_batch_requests_sum") == 1
    )


def test_requests_that_arrive_together_are_decoded_together():
    """Two paragraphs sent at once, each split: their five sentences in one round of the batcher."""
    engine = Scripted()
    app = create_app(engine.engine(), max_wait=2.0)  # the first waits up to 2 s for others
    answers = {}
    with live(app) as url:

        def send(name, text):
            answers[name] = libre(url, text).json()

        threads = [
            threading.Thread(target=send, args=a) for a in (("a", "One dog. Two cats."), ("b", "Red. Blue! Green?"))
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
    assert answers == {"a": {"translatedText": "ONE DOG . TWO CATS ."}, "b": {"translatedText": "RED . BLUE ! GREEN ?"}}
    assert len(engine.rounds) == 1 and sorted(engine.rounds[0]) == sorted(
        ["One dog.", "Two cats.", "Red.", "Blue!", "Green?"]
    )
    assert app.state.batcher.stats.rounds == 1 and app.state.batcher.stats.jobs == 2


def test_the_limits_count_sentences(scripted):
    _, url, _ = scripted
    r = libre(url, "Go. " * 129)
    assert (r.status_code, r.json()) == (
        400,
        {"error": "Invalid request: 129 sentences, more than the 128 a request may have"},
    )


# -- LibreTranslate's API: HTML ---------------------------------------------------------------------


@pytest.mark.parametrize("reverse", [False, True])
def test_html_one_sentence_with_its_tag_around_the_right_word(reverse):
    engine = Scripted(reverse=reverse)
    with live(create_app(engine.engine())) as url:
        r = libre(url, "<p>A dog <b>runs</b>.</p>", format="html")
    assert r.json() == {"translatedText": "<p>. <b>RUNS</b> DOG A</p>" if reverse else "<p>A DOG <b>RUNS</b> .</p>"}
    assert engine.rounds == [["A dog runs."]] and engine.aligned == [["A dog runs."]]


def test_html_without_an_alignment_places_tags_in_proportion():
    """An engine that gives no alignment (the ct2 engine): the tag lands as far into the output as
    it was into the source."""
    engine = Scripted(aligns=False)
    with live(create_app(engine.engine())) as url:
        r = libre(url, ["<p>A dog <b>runs</b>.</p>", "<p>No tags here. None!</p>"], format="html")
    assert r.json() == {"translatedText": ["<p>A DOG <b>RUNS</b> .</p>", "<p>NO TAGS HERE . NONE !</p>"]}
    assert engine.rounds == [["A dog runs.", "No tags here.", "None!"]] and engine.aligned == []


@pytest.mark.parametrize(
    "doc",
    [
        "plain text",
        "<a href='x'>link</a>",
        "a <b>c</b> <i>",
        "x < y & z",
        "<script>if (a < b) { c }</script>tail",
        "<!DOCTYPE html><html><body>\n hi \n</body>",
        "<p>line\r\nnext &nbsp; </p>",
        "</b>stray<br>",
        "<?xml version='1.0'?><x>&#65;</x>",
        "<p>a</p><p> . </p>\U0001f600 <i>!</i>",
        '<p>Use <code>ls -l</code> now.</p><pre>keep  <b>this</b></pre><p translate="no">No.</p>'
        "<style>p { color: red }</style><textarea>as is</textarea>",
    ],
)
def test_html_as_text_markup_translates_it(scripted, doc):
    """The server's answer is text.markup's for the same engine: markup, entities and what is never
    translated as sent; a document with no words exactly as sent."""
    engine, url, _ = scripted
    expected = translate_html(doc, "en", Translator(engine))
    assert libre(url, doc, format="html").json() == {"translatedText": expected}
    if not any(c.isalnum() for c in html.unescape(re.sub(r"<[^>]*>", "", doc))):
        assert expected == doc


class Translator:
    """`text.markup.Translator` over a Scripted engine."""

    def __init__(self, engine: Scripted):
        self.engine = engine

    def translate(self, sentences):
        return [self.engine.output(s) for s in sentences]

    def align(self, sources, outputs):
        return Scripted(self.engine.reverse).align(sources, outputs)


# -- the native API ---------------------------------------------------------------------------------


def native(url: str, **body) -> httpx.Response:
    return httpx.post(url + "/translate", json=body, timeout=30)


def test_the_native_api_splits_when_asked(scripted):
    engine, url, _ = scripted
    text = "A man runs.  The dog sits!\nOk"
    r = native(url, sentences=[text, "Two."])  # off by default: each input is a sentence, as sent
    assert [t["text"] for t in r.json()["translations"]] == ["A MAN RUNS . THE DOG SITS ! OK", "TWO ."]
    assert engine.rounds.pop() == [text, "Two."]
    r = native(url, sentences=[text, "Two.", ":-)"], split_sentences="on", scores=True, n_best=2)
    first, second, kept = r.json()["translations"]
    assert engine.rounds.pop() == ["A man runs.", "The dog sits!", "Ok", "Two."]
    assert first["text"] == "A MAN RUNS .  THE DOG SITS !\nOK" and second["text"] == "TWO ."
    # its sentences' scores and log-probabilities summed (4, 4 and 1 tokens), the n-best their k-th put together
    assert (first["score"], first["logprob"]) == (-9.0, -18.0)
    assert [h["text"] for h in first["n_best"]] == [
        "A MAN RUNS .  THE DOG SITS !\nOK",
        "A MAN RUNS . ALT1  THE DOG SITS ! ALT1\nOK ALT1",
    ]
    assert first["n_best"][1]["score"] == -12.0
    assert kept["text"] == ":-)" and kept["score"] is None  # nothing to translate: as sent
    r = native(url, sentences=["One\ntwo. Three."], split_sentences="nonewlines")
    assert r.json()["translations"][0]["text"] == "ONE TWO . THREE ." and engine.rounds.pop() == ["One two.", "Three."]
    r = native(url, sentences=["One."], split_sentences="sometimes")
    assert r.status_code == 422 and r.json()["error"] == "invalid_request" and r.json()["field"] == "split_sentences"
    assert (
        "split_sentences"
        in httpx.get(url + "/openapi.json").json()["components"]["schemas"]["TranslateRequest"]["properties"]
    )


def test_the_native_api_names_the_input_of_a_sentence_over_the_limit():
    engine = Scripted()
    with live(create_app(engine.engine(), limits=Limits(max_tokens=4))) as url:
        r = native(url, sentences=["Fine.", "Short. This one is far too long."], split_sentences=True)
    assert r.status_code == 422 and r.json()["field"] == "sentences.1 (its sentence 2)" and engine.rounds == []


def test_a_parsing_model_is_not_split():
    engine = Scripted()
    parser = Engine(engine.translate, lambda s: [5], {}, tree=lambda source, output: None)
    with live(create_app(parser)) as url:
        r = native(url, sentences=["One. Two."], split_sentences="on")
    assert r.status_code == 422 and "parsing model" in r.json()["message"]


# -- a model --------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    d = make_model(tmp_path_factory.mktemp("sentences"), shared=False)
    meta = json.loads((d / "data.json").read_text())
    (d / "data.json").write_text(json.dumps({**meta, "src_lang": "en", "tgt_lang": "de"}))
    return d


def test_a_model_translates_each_sentence_as_transduce_translate(model_dir):
    """Through a tiny model: the paragraph's translation is each sentence's `transduce translate`
    output, joined with the paragraph's own spacing; the native API's too."""
    loaded = load_translation_model(model_dir)
    sentences = ["A man runs on the grass.", "The dog sits near the water!", "Two children play."]
    first, second, third = translate_lines(loaded.model, loaded.src_vocab, loaded.tgt_vocab, sentences, **SEARCH)
    paragraph = f"{sentences[0]} {sentences[1]}\n\n  {sentences[2]}"
    app = create_app(torch_engine(loaded), defaults=SearchSettings(**SEARCH))
    with live(app) as url:
        assert libre(url, paragraph).json() == {"translatedText": f"{first} {second}\n\n  {third}"}
        r = native(url, sentences=[paragraph], split_sentences="on")
        assert r.json()["translations"][0]["text"] == f"{first} {second}\n\n  {third}"
        metrics = httpx.get(url + "/metrics").text
    assert (
        metric(metrics, "transduce_batch_sentences_sum") == 6
        and metric(metrics, "transduce_batch_sentences_count") == 2
    )


# -- several models: a multilingual model's alignment ---------------------------------------------


def test_a_multilingual_models_alignment_leaves_out_its_target_token():
    """The >>xx<< token the model is given before each sentence is not in the request's text: the
    links the model gives past it are moved back by its length, those to it dropped."""
    seen = []

    def align(sources, outputs):
        seen.append(list(sources))
        return [[(0, 1, 0, 7), (2, 5, 8, 9), (6, 9, 10, 13)] for _ in sources]  # ">>fra<<", "a", "man"

    def load(served):
        return Engine(lambda s, search: [], lambda s: [], {}, align=align)

    served = Served("opus", None, "en", ("fr", "es"), {"fr": ">>fra<<", "es": ">>spa<<"}, lambda s: [], 0)
    models = ModelSet([served], load)
    engine, _ = models.lookup("en", "fr", [], batcher=None)
    assert engine.align(["a man"], ["un homme"]) == [[(2, 5, 0, 1), (6, 9, 2, 5)]]
    assert seen == [[">>fra<< a man"]]


WORDS = "ant bee cat dog elk fox gnu hen ibis jay".split()


@pytest.mark.slow
def test_a_model_that_reverses_gets_its_tags_from_its_own_attention(tmp_path):
    """A real model trained to reverse its input (as tests/test_text_align.py trains it), served:
    the server's torch engine aligns by its attention, and each tag follows its word."""
    import random
    import shutil

    from transduce.checkpoint import save_model
    from transduce.config import Config, ModelConfig
    from transduce.data.vocab import Vocab, train_vocab
    from transduce.synthetic import N_SPECIAL, train_synthetic

    rng = random.Random(0)
    lines = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 6))) for _ in range(300)]
    vocab = Vocab(
        train_vocab(tmp_path / "words", lines, vocab_size=N_SPECIAL + len(WORDS), model_type="word", num_threads=1)
    )
    config = ModelConfig(src_vocab_size=len(vocab), n_layers=2, d_model=64, d_ff=128, n_heads=4, dropout=0.0)
    model, result = train_synthetic(
        "reverse",
        n_symbols=len(WORDS),
        max_len=6,
        batch_size=64,
        eval_every=50,
        n_dev=200,
        n_eval=200,
        lr_scale=0.5,
        model_config=config,
    )
    assert result.exact_match >= 0.95, result
    save_model(model, Config(model=config), tmp_path / "model")
    shutil.copy(vocab.path, tmp_path / "model" / "spm.model")
    app = create_app(
        torch_engine(load_translation_model(tmp_path / "model")), defaults=SearchSettings(beam=1, greedy=True)
    )
    with live(app) as url:
        r = libre(url, '<p>ant <b>bee</b> cat <a href="#x">dog elk</a></p><p><i>fox</i> gnu</p>', format="html")
    assert r.json() == {"translatedText": '<p><a href="#x">elk dog</a> cat <b>bee</b> ant</p><p>gnu <i>fox</i></p>'}
