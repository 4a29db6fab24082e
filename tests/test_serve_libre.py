"""The LibreTranslate-compatible API of `transduce serve` (serve/libre.py), driven over HTTP on
127.0.0.1 by the unmodified LibreTranslate clients libretranslatepy (a form body), deep-translator
(the query string) and npm's libretranslate (a JSON body, its `apiKey`), and by httpx for its JSON
shapes and status codes: the
translations equal `transduce translate`'s, decoded by the server's own batcher (one job a
request); HTML keeps its markup; /languages and /detect from the model's data.json; the API key;
the limits; the native API beside it unchanged."""

import json
import shutil
import subprocess
import threading
import urllib.error

import pytest

pytest.importorskip("fastapi")
httpx = pytest.importorskip("httpx")
libretranslatepy = pytest.importorskip("libretranslatepy")
deep_translator = pytest.importorskip("deep_translator")

from deep_translator import LibreTranslator  # noqa: E402
from deep_translator.exceptions import AuthorizationException, ServerException  # noqa: E402
from libretranslatepy import LibreTranslateAPI  # noqa: E402
from serving import live, start_serve, until  # noqa: E402
from tiny_models import make_model  # noqa: E402

from transduce.documents import installed_formats  # noqa: E402
from transduce.model import Transformer  # noqa: E402
from transduce.decoding.settings import SearchSettings  # noqa: E402
from transduce.serve.app import Limits, create_app, torch_engine  # noqa: E402
from transduce.text.align import ModelTranslator  # noqa: E402
from transduce.text.markup import translate_html  # noqa: E402
from transduce.decoding.ready import load_translation_model  # noqa: E402
from transduce.decoding.translate import translate_lines, translate_stream  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")

KEY = "s3cret-key"
LIMITS = Limits(max_sentences=6, max_chars=300, max_tokens=12, max_queue=1, max_beam=4)
SEARCH = dict(beam=2, alpha=0.6, max_len_offset=4)  # the server's defaults below, and the reference's


class CountingTransformer(Transformer):
    """The model, recording the batch size of every `encode`: one per model batch decoded."""

    def __init__(self, config):
        super().__init__(config)
        self.batches: list[int] = []

    def encode(self, src, src_mask=None):
        self.batches.append(src.size(0))
        return super().encode(src, src_mask)


class HeldTransformer(Transformer):
    """The model, waiting in `encode` while `hold` is set (a decode under way), failing while `fail` is."""

    hold: threading.Event | None = None
    entered = threading.Event()
    fail = False

    def encode(self, src, src_mask=None):
        if self.hold is not None:
            self.entered.set()
            self.hold.wait(30)
        if self.fail:
            raise RuntimeError("injected failure in encode")
        return super().encode(src, src_mask)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    """A tiny model whose data.json names its languages, en -> de (as `transduce prepare` writes them)."""
    d = make_model(tmp_path_factory.mktemp("libre"), shared=False)
    meta = json.loads((d / "data.json").read_text())
    (d / "data.json").write_text(json.dumps({**meta, "src_lang": "en", "tgt_lang": "de"}))
    return d


@pytest.fixture(scope="module")
def reference_model(model_dir):
    return load_translation_model(model_dir)


@pytest.fixture(scope="module")
def reference(reference_model):
    """`transduce translate`'s best translation of each line, with the server's search defaults."""
    m = reference_model
    return lambda lines: translate_lines(m.model, m.src_vocab, m.tgt_vocab, lines, **SEARCH)


def held_model(model_dir):
    loaded = load_translation_model(model_dir)
    model = HeldTransformer(loaded.config.model)
    model.load_state_dict(loaded.model.state_dict())
    loaded.model = model.eval()
    return loaded


@pytest.fixture(scope="module")
def server(model_dir):
    """A server with an API key, on 127.0.0.1: (its URL, the app)."""
    loaded = load_translation_model(model_dir)
    app = create_app(
        torch_engine(loaded, max_tokens=LIMITS.max_tokens),
        limits=LIMITS,
        defaults=SearchSettings(**SEARCH),
        api_key=KEY,
    )
    with live(app) as url:
        yield url, app


def jobs(app) -> int:
    return app.state.batcher.stats.jobs


# -- the clients ----------------------------------------------------------------------------------


def test_libretranslatepy_translates_a_text_as_transduce_translate(server, reference):
    url, app = server
    client = LibreTranslateAPI(url, api_key=KEY)
    before = jobs(app)
    assert client.translate("a man runs on the grass", "en", "de") == reference(["a man runs on the grass"])[0]
    # lines are the model's sentences (5.1); blank lines and the whitespace around lines are kept
    text = "a man runs\n\n  the dog sits near the water \n* * *\nred ball"
    first, second, third = reference(["a man runs", "the dog sits near the water", "red ball"])
    expected = f"{first}\n\n  {second} \n* * *\n{third}"  # a line without words kept as it is
    assert client.translate(text, "en", "de") == expected
    assert client.translate(text.replace("\n", "\r\n"), "en", "de") == expected  # as LibreTranslate: \r\n -> \n
    assert jobs(app) == before + 3  # each request one job of the server's batcher, its lines together


def test_deep_translator_translates_a_text_and_a_list(server, reference):
    url, app = server
    lines = ["a man runs on the grass", "two children play with a blue ball", "the dog looks"]
    translator = LibreTranslator(source="en", target="de", api_key=KEY, custom_url=url + "/")
    assert translator.translate(lines[0]) == reference(lines[:1])[0]
    assert translator.translate_batch(lines) == reference(lines)
    assert (
        LibreTranslator(source="auto", target="de", api_key=KEY, custom_url=url + "/").translate(lines[1])
        == reference(lines[1:2])[0]
    )


def test_a_list_of_texts_is_one_request_one_job(server, reference):
    url, app = server
    lines = ["a man runs", "a woman sits on the street", "two dogs play", "the red ball"]
    before = jobs(app)
    r = httpx.post(url + "/translate", json={"q": lines, "source": "en", "target": "de", "api_key": KEY}, timeout=30)
    assert r.status_code == 200 and r.json() == {"translatedText": reference(lines)}
    assert jobs(app) == before + 1


def test_a_list_of_many_short_texts_is_decoded_as_one_batch(model_dir, reference):
    """What a localisation tool sends: 40 short strings in one q, decoded in one batch of the
    model (one `encode`), not one decode a string."""
    loaded = load_translation_model(model_dir)
    model = CountingTransformer(loaded.config.model)
    model.load_state_dict(loaded.model.state_dict())
    loaded.model = model.eval()
    texts = [
        f"{a} {b}"
        for a in ("a man", "two dogs", "a woman", "the child")
        for b in ("runs", "sits", "plays", "looks", "walks", "swims", "jumps", "eats", "reads", "sings")
    ]
    with live(
        create_app(torch_engine(loaded), limits=Limits(max_sentences=len(texts)), defaults=SearchSettings(**SEARCH))
    ) as url:
        r = httpx.post(url + "/translate", json={"q": texts, "source": "en", "target": "de"}, timeout=60)
    assert r.status_code == 200 and r.json() == {"translatedText": reference(texts)}
    assert model.batches == [len(texts)]


def test_health_and_the_npm_clients_key_spelling(server, reference):
    """GET /health (and under /libretranslate/) as monitors ask it; the key as `apiKey`, as the npm
    client sends it (an empty one is none)."""
    url, _ = server
    assert httpx.get(url + "/health").json() == httpx.get(url + "/libretranslate/health").json() == {"status": "ok"}
    body = {"q": "a man runs", "source": "en", "target": "de"}
    r = httpx.post(url + "/translate", json={**body, "apiKey": KEY}, timeout=30)
    assert (r.status_code, r.json()) == (200, {"translatedText": reference(["a man runs"])[0]})
    for key, answer in (
        ("", (400, {"error": "Please contact the server operator to get an API key"})),
        ("wrong", (403, {"error": "Invalid API key"})),
    ):
        r = httpx.post(url + "/translate", json={**body, "apiKey": key}, timeout=30)
        assert (r.status_code, r.json()) == answer


def test_cors_only_for_the_sites_given(model_dir):
    """--cors-origin: a browser page of that site may call the API (LibreTranslate allows every
    site; transduce none unless told), the preflight answered, the answers readable there."""
    from starlette.testclient import TestClient

    loaded = load_translation_model(model_dir)
    body = {"q": "a man", "source": "en", "target": "de"}
    preflight = {
        "Origin": "https://app.example",
        "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "content-type",
    }
    with TestClient(
        create_app(torch_engine(loaded), defaults=SearchSettings(**SEARCH), cors_origins=["https://app.example"])
    ) as c:
        r = c.options("/translate", headers=preflight)
        assert r.status_code == 200 and r.headers["access-control-allow-origin"] == "https://app.example"
        r = c.post("/translate", json=body, headers={"Origin": "https://app.example"})
        assert r.status_code == 200 and r.headers["access-control-allow-origin"] == "https://app.example"
        assert (
            "access-control-allow-origin"
            not in c.get("/languages", headers={"Origin": "https://other.example"}).headers
        )
    with TestClient(create_app(torch_engine(loaded), defaults=SearchSettings(**SEARCH), cors_origins=["*"])) as c:
        assert (
            c.get("/languages", headers={"Origin": "https://any.example"}).headers["access-control-allow-origin"] == "*"
        )
    with TestClient(create_app(torch_engine(loaded), defaults=SearchSettings(**SEARCH))) as c:
        r = c.post("/translate", json=body, headers={"Origin": "https://app.example"})
        assert r.status_code == 200 and "access-control-allow-origin" not in r.headers


@pytest.fixture(scope="module")
def npm_client(tmp_path_factory):
    """The npm `libretranslate` client, unmodified, installed into a directory of its own (the test
    is skipped, saying why, where node, npm or the npm registry cannot be reached)."""
    node, npm = shutil.which("node"), shutil.which("npm")
    if node is None or npm is None:
        pytest.skip("node and npm are needed to run the npm libretranslate client")
    d = tmp_path_factory.mktemp("npm")
    try:
        done = subprocess.run(
            [npm, "install", "--no-audit", "--no-fund", "libretranslate@1"],
            cwd=d,
            capture_output=True,
            text=True,
            timeout=240,
        )
    except subprocess.TimeoutExpired:
        pytest.skip("npm install libretranslate took more than 240 s: the npm registry cannot be reached")
    if done.returncode != 0:
        pytest.skip(
            f"npm install libretranslate failed (the npm registry cannot be reached?): "
            f"{(done.stderr.strip().splitlines() or ['no message'])[-1]}"
        )
    script = d / "translate.js"
    script.write_text("""const { translate } = require("libretranslate");
const [query, source, target, apiurl, apiKey] = JSON.parse(process.argv[2]);
translate({ query, source, target, apiurl, apiKey })
  .then((text) => console.log(JSON.stringify(text === undefined ? null : text)))
  .catch((e) => { console.error(String(e)); process.exit(1); });
""")
    return lambda *args: subprocess.run(
        [node, str(script), json.dumps(args)], capture_output=True, text=True, timeout=60
    )


def test_the_npm_client_translates(server, reference, npm_client):
    """The npm client: GET /languages to check the codes (sending Content-Type on a GET), then its
    JSON body with `apiKey`; a text, `source` left to "auto", a list (JavaScript does not check q's
    type); a wrong key gets LibreTranslate's 403, which the client hands on as no translation."""
    url, _ = server
    lines = ["a man runs on the grass", "two children play with a blue ball"]
    for args, expected in (
        (("a man runs on the grass", "en", "de", url, KEY), reference(lines[:1])[0]),
        (("two children play with a blue ball", None, "de", url, KEY), reference(lines[1:])[0]),
        ((lines, "en", "de", url, KEY), reference(lines)),
        (("a man runs", "en", "de", url, "wrong"), None),
    ):
        done = npm_client(*args)
        assert done.returncode == 0 and json.loads(done.stdout) == expected, (args, done.stderr)
    done = npm_client("a man runs", "fr", "de", url, KEY)  # not in /languages: the client refuses it itself
    assert done.returncode == 1 and "This language was not found" in done.stderr


def test_html_a_sentence_at_a_time_its_tags_placed_by_the_models_attention(model_dir, reference_model):
    """format html: each sentence with its inline tags translated once (not a text node at a
    time), the tags placed by the model's own attention, as `transduce translate --file` places
    them (text.markup with text.align's aligner); markup, comments, entities and what is never
    translated (code, translate="no") as sent."""
    doc = (
        "<p class=\"intro\" data-x='1 &amp; 2'>A man <b>runs</b> on the grass. <!-- a note -->"
        'Two dogs<i>!</i></p>\n<p>See <code>the dog</code> and <span translate="no">a dog</span>.</p>'
    )
    expected = translate_html(doc, "en", ModelTranslator.from_loaded(reference_model, **SEARCH))
    for kept in (
        "<p class=\"intro\" data-x='1 &amp; 2'>",
        "<!-- a note -->",
        "<code>the dog</code>",
        '<span translate="no">a dog</span>',
        "</p>\n<p>",
    ):
        assert kept in expected
    loaded = load_translation_model(model_dir)
    app = create_app(torch_engine(loaded), defaults=SearchSettings(**SEARCH))
    with live(app) as url:
        for send in (
            {"json": {"q": doc, "source": "en", "target": "de", "format": "html"}},
            {"data": {"q": doc, "source": "en", "target": "de", "format": "html"}},
        ):
            r = httpx.post(url + "/translate", timeout=30, **send)
            assert r.status_code == 200 and r.json() == {"translatedText": expected}
    assert app.state.batcher.stats.jobs == 2  # a request's sentences one job; the alignments a call of their own


def test_languages_and_detect_name_the_models_pair(server):
    url, _ = server
    pair = [{"code": "en", "name": "English", "targets": ["de"]}, {"code": "de", "name": "German", "targets": []}]
    assert LibreTranslateAPI(url).languages() == pair  # open, as LibreTranslate's, for the clients' menus
    assert LibreTranslateAPI(url, api_key=KEY).languages() == pair
    assert LibreTranslateAPI(url, api_key=KEY).detect("a man runs") == [{"confidence": 100.0, "language": "en"}]
    prefixed = LibreTranslateAPI(url + "/libretranslate/", api_key=KEY)  # the same API under a base URL of its own
    assert prefixed.languages() == pair and prefixed.detect("a dog") == [{"confidence": 100.0, "language": "en"}]
    assert prefixed.translate("a dog", "en", "de") == LibreTranslateAPI(url, api_key=KEY).translate("a dog", "en", "de")
    settings = {
        "charLimit": 300,
        "frontendTimeout": 500,
        "apiKeys": True,
        "keyRequired": True,
        "suggestions": False,
        "filesTranslation": bool(installed_formats(upload=True)),
        "supportedFilesFormat": installed_formats(upload=True),  # serve.documents' formats
        "language": {"source": {"code": "en", "name": "English"}, "target": {"code": "de", "name": "German"}},
    }
    assert (
        httpx.get(url + "/frontend/settings").json()
        == httpx.get(url + "/libretranslate/frontend/settings").json()
        == settings
    )
    assert httpx.head(url + "/languages").status_code == 200


def test_a_model_that_names_no_languages_takes_any_codes(tmp_path, reference):
    """A model directory without a data.json (or a CTranslate2 export): the server cannot tell its
    pair, so it checks none; /languages and /detect name nothing."""
    loaded = load_translation_model(make_model(tmp_path))
    expected = translate_lines(loaded.model, loaded.src_vocab, loaded.tgt_vocab, ["a man runs"], **SEARCH)[0]
    with live(create_app(torch_engine(loaded), defaults=SearchSettings(**SEARCH))) as url:
        assert LibreTranslateAPI(url).translate("a man runs", "xx", "yy") == expected
        r = httpx.post(url + "/translate", json={"q": "a man runs", "source": "auto", "target": "de"}, timeout=30)
        assert r.json() == {"translatedText": expected}  # no detectedLanguage: none is known
        assert LibreTranslateAPI(url).languages() == [] and LibreTranslateAPI(url).detect("a man") == []
        assert "language" not in httpx.get(url + "/frontend/settings").json()


def http_error(call) -> tuple[int, dict]:
    with pytest.raises(urllib.error.HTTPError) as e:
        call()
    return e.value.code, json.loads(e.value.read())


def test_the_api_key_wrong_or_missing_is_what_libretranslate_answers(server):
    url, _ = server
    assert http_error(lambda: LibreTranslateAPI(url, api_key="wrong").translate("a man", "en", "de")) == (
        403,
        {"error": "Invalid API key"},
    )
    assert http_error(lambda: LibreTranslateAPI(url, api_key="wrong").detect("a man")) == (
        403,
        {"error": "Invalid API key"},
    )
    assert http_error(lambda: LibreTranslateAPI(url).translate("a man", "en", "de")) == (
        400,
        {"error": "Please contact the server operator to get an API key"},
    )
    with pytest.raises(AuthorizationException):
        LibreTranslator(source="en", target="de", api_key="wrong", custom_url=url + "/").translate("a man")
    # the native API's headers carry the same key
    body = {"q": "a man", "source": "en", "target": "de"}
    assert httpx.post(url + "/translate", json=body, headers={"Authorization": f"Bearer {KEY}"}).status_code == 200
    assert httpx.post(url + "/translate", json=body, headers={"X-API-Key": KEY}).status_code == 200


def test_without_a_key_on_the_server_any_key_is_accepted(model_dir, reference):
    loaded = load_translation_model(model_dir)
    with live(create_app(torch_engine(loaded), defaults=SearchSettings(**SEARCH))) as url:
        translator = LibreTranslator(source="en", target="de", api_key="anything", custom_url=url + "/")
        assert translator.translate("a man runs") == reference(["a man runs"])[0]
        assert LibreTranslateAPI(url).translate("a man runs", "en", "de") == reference(["a man runs"])[0]


def test_too_long_input_is_a_libretranslate_400(server):
    url, app = server
    client = LibreTranslateAPI(url, api_key=KEY)
    before = jobs(app)
    assert http_error(lambda: client.translate("a dog\n" + "a man " * 10, "en", "de")) == (
        400,
        {"error": "Invalid request: sentence 2: 20 subword tokens, more than 12"},
    )  # the server's max_tokens
    assert http_error(lambda: client.translate("a" * 301, "en", "de")) == (
        400,
        {"error": "Invalid request: request (301) exceeds text limit (300)"},
    )  # LibreTranslate's char limit
    r = httpx.post(
        url + "/translate", json={"q": ["a" * 150, "b" * 151], "source": "en", "target": "de", "api_key": KEY}
    )
    assert (r.status_code, r.json()) == (400, {"error": "Invalid request: request (301) exceeds text limit (300)"})
    with pytest.raises(ServerException, match="ERR_BAD_REQUEST"):
        LibreTranslator(source="en", target="de", api_key=KEY, custom_url=url + "/").translate("a man " * 10)
    r = httpx.post(url + "/translate", json={"q": ["a"] * 7, "source": "en", "target": "de", "api_key": KEY})
    assert (r.status_code, r.json()) == (400, {"error": "Invalid request: request (7) exceeds text limit (6)"})
    # the native API's bound on a request's work: max_sentences sentences in all, lines and text nodes
    assert http_error(lambda: client.translate("a dog\n" * 7, "en", "de")) == (
        400,
        {"error": "Invalid request: 7 sentences, more than the 6 a request may have"},
    )
    assert jobs(app) == before  # refused before anything was queued


def test_a_pair_the_model_does_not_serve_is_a_400_saying_which_it_does(server):
    url, _ = server
    with pytest.raises(ServerException, match="ERR_BAD_REQUEST"):
        LibreTranslator(source="en", target="fr", api_key=KEY, custom_url=url + "/").translate("a man")
    serves = "this server translates English (en) into German (de)"
    for source, target, message in (
        ("fr", "de", f"fr is not supported: {serves}"),
        ("en", "fr", f"French (fr) is not available as a target language from English (en): {serves}"),
    ):
        r = httpx.post(url + "/translate", json={"q": "a man", "source": source, "target": target, "api_key": KEY})
        assert (r.status_code, r.json()) == (400, {"error": message})


# -- JSON shapes and status codes ----------------------------------------------------------------------


def test_json_shapes_and_400s(server, reference, reference_model):
    url, _ = server

    def post(body=None, path="/translate", **kw):
        r = (
            httpx.post(url + path, json=body, timeout=30, **kw)
            if body is not None
            else httpx.post(url + path, timeout=30, **kw)
        )
        return r.status_code, r.json()

    base = {"source": "en", "target": "de", "api_key": KEY}
    best = reference(["a man runs"])[0]
    assert post({"q": "a man runs", **base, "source": "auto"}) == (
        200,
        {"translatedText": best, "detectedLanguage": {"confidence": 100.0, "language": "en"}},
    )
    assert post({"q": ["a man runs"], **base, "source": "auto"}) == (
        200,
        {"translatedText": [best], "detectedLanguage": [{"confidence": 100.0, "language": "en"}]},
    )
    # 2 alternatives: beam 3 (at least alternatives + 1), its 3-best after the best, each once
    m = reference_model
    three = [
        c.text
        for c in next(
            translate_stream(m.model, m.src_vocab, m.tgt_vocab, ["a man runs"], **{**SEARCH, "beam": 3}, n_best=3)
        )
    ]
    alternatives = [x for k, x in enumerate(three[1:]) if x not in three[: k + 1] and x]
    assert post({"q": "a man runs", **base, "alternatives": 2}) == (
        200,
        {"translatedText": three[0], "alternatives": alternatives},
    )
    assert post({"q": "<b>a man</b>", **base, "format": "html", "alternatives": 1})[1]["alternatives"] == []
    for body, message in (
        ({**base}, "Invalid request: missing q parameter"),
        ({"q": "", **base}, "Invalid request: missing q parameter"),
        ({"q": "a", "target": "de", "api_key": KEY}, "Invalid request: missing source parameter"),
        ({"q": "a", "source": "en", "api_key": KEY}, "Invalid request: missing target parameter"),
        ({"q": "a", **base, "format": "xml"}, "xml format is not supported"),
        ({"q": "a", **base, "alternatives": "x"}, "Invalid request: alternatives parameter is not a number"),
        ({"q": "a", **base, "alternatives": 4}, "Invalid request: alternatives parameter must be <= 3"),
        ({"q": [1], **base}, "Invalid request: q must be a string or a list of strings"),
    ):
        assert post(body) == (400, {"error": message}), body
    assert post(path="/libretranslate/translate", content=b'{"q": ', headers={"content-type": "application/json"}) == (
        400,
        {"error": "Invalid JSON format"},
    )
    assert post(path="/detect", data={"api_key": KEY}) == (400, {"error": "Invalid request: missing q parameter"})
    # deep-translator's way: the fields in the query string, no body
    r = httpx.post(url + "/translate", params={"q": "a man runs", **base, "format": "text"})
    assert r.status_code == 200 and r.json() == {"translatedText": best}


def test_the_native_api_beside_it_is_unchanged(server, reference):
    """A POST /translate without `q` is the native API's, as before: its answer, its 415 for a form."""
    url, _ = server
    headers = {"X-API-Key": KEY}
    r = httpx.post(url + "/translate", json={"sentences": ["a man runs"]}, headers=headers, timeout=30)
    assert r.json()["translations"][0]["text"] == reference(["a man runs"])[0]
    r = httpx.post(url + "/translate", data={"sentences": "a man runs"}, headers=headers)
    assert r.status_code == 415 and r.json()["error"] == "unsupported_media_type"
    assert httpx.post(url + "/translate", json={"q": "a"}, headers=headers).json() == {
        "error": "Invalid request: missing source parameter"
    }
    paths = httpx.get(url + "/openapi.json").json()["paths"]
    assert not any(p in paths for p in ("/languages", "/detect", "/libretranslate/translate"))


def test_queue_full_is_429_and_a_decoding_failure_500(model_dir):
    loaded = held_model(model_dir)
    model = loaded.model
    app = create_app(torch_engine(loaded), limits=Limits(max_queue=1), defaults=SearchSettings(**SEARCH), max_wait=0)
    body = {"q": "a man runs", "source": "en", "target": "de"}
    with live(app) as url:
        model.hold = threading.Event()
        answers = []
        first = threading.Thread(target=lambda: answers.append(httpx.post(url + "/translate", json=body, timeout=30)))
        first.start()
        until(model.entered.is_set)  # the first is decoding, the queue empty
        second = threading.Thread(target=lambda: answers.append(httpx.post(url + "/translate", json=body, timeout=30)))
        second.start()
        until(lambda: app.state.batcher.queued == 1)
        r = httpx.post(url + "/translate", json=body, timeout=30)
        assert r.status_code == 429 and r.json()["error"].startswith("Slowdown: ") and "Retry-After" in r.headers
        assert set(r.json()) == {"error"}
        model.hold.set()
        first.join(30)
        second.join(30)
        assert [a.status_code for a in answers] == [200, 200]
        model.hold, model.fail = None, True
        r = httpx.post(url + "/translate", json=body, timeout=30)
        assert r.status_code == 500 and r.json() == {
            "error": "Cannot translate text: decoding failed: RuntimeError: injected failure in encode"
        }
        model.fail = False
        assert httpx.post(url + "/translate", json=body, timeout=30).status_code == 200  # it goes on serving


def test_while_the_model_loads_503(model_dir):
    loaded_ready = threading.Event()

    def load():
        loaded_ready.wait(30)
        return torch_engine(load_translation_model(model_dir))

    app = create_app(load)
    with live(app) as url:
        for r in (
            httpx.post(url + "/translate", json={"q": "a", "source": "en", "target": "de"}),
            httpx.get(url + "/languages"),
            httpx.post(url + "/detect", data={"q": "a"}),
        ):
            assert (r.status_code, r.json()) == (503, {"error": "the model is still loading"}) and r.headers[
                "Retry-After"
            ]
        loaded_ready.set()
        until(lambda: httpx.get(url + "/health").status_code == 200, 30)
        assert httpx.get(url + "/languages").json()[0]["code"] == "en"


def test_transduce_serve_with_its_key_and_limits_serves_the_clients(model_dir, reference):
    """`transduce serve` as a user starts it: the key from $TRANSDUCE_API_KEY, --max-input-tokens."""
    proc, url = start_serve(
        [str(model_dir), "--beam", "2", "--max-len-offset", "4", "--max-input-tokens", "12", "--precision", "fp32"],
        env={"TRANSDUCE_API_KEY": KEY},
    )
    try:
        client = LibreTranslateAPI(url, api_key=KEY)
        assert client.translate("a man runs", "en", "de") == reference(["a man runs"])[0]
        assert http_error(lambda: LibreTranslateAPI(url, api_key="no").translate("a", "en", "de"))[0] == 403
        assert http_error(lambda: client.translate("a man " * 10, "en", "de"))[0] == 400
        assert client.languages()[0] == {"code": "en", "name": "English", "targets": ["de"]}
    finally:
        proc.terminate()
        proc.communicate(timeout=30)
