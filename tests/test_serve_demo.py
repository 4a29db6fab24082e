"""The demo's API: POST /attention gives the weights the model computes for a sentence and a
translation (checked against the model's own forward pass), the model's own translation when
none is given (the one /translate gives), the page of `transduce attention`, under the same
limits as /translate; GET / is one self-contained page. A parsing model is served as
`transduce parse` runs it: each output with its tree (equal to `transduce parse`'s lines), and
/attention with the tree's SVG; its search defaults are the paper's for parsing (6.3)."""

import json
import re

import pytest
import torch

pytest.importorskip("fastapi")
pytest.importorskip("prometheus_client")

from starlette.testclient import TestClient  # noqa: E402
from tiny_models import make_model  # noqa: E402

from transduce.cli import main  # noqa: E402
from transduce.data.vocab import BOS, EOS  # noqa: E402
from transduce.decoding.settings import SearchSettings  # noqa: E402
from transduce.serve.app import Limits, create_app, torch_engine  # noqa: E402
from transduce.serve.demo import CSP  # noqa: E402
from transduce.decoding.ready import load_translation_model  # noqa: E402
from transduce.views.weights import TYPES  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def loaded(tmp_path_factory):
    return load_translation_model(make_model(tmp_path_factory.mktemp("demo")))


@pytest.fixture(scope="module")
def client(loaded):
    limits = Limits(max_body_bytes=2000, max_chars=60, max_tokens=20, max_beam=4, max_len_offset=8)
    with TestClient(
        create_app(
            torch_engine(loaded, max_tokens=limits.max_tokens),
            limits=limits,
            defaults=SearchSettings(beam=2, max_len_offset=4),
        )
    ) as c:
        yield c


def model_weights(loaded, source: str, target: str) -> dict:
    """The model's own weights for one sentence: forward(return_attention=True), teacher-forced."""
    src = torch.tensor([loaded.src_vocab.encode(source) + [EOS]])
    tgt = torch.tensor([[BOS] + loaded.tgt_vocab.encode(target)])
    with torch.no_grad():
        _, attention = loaded.model.eval()(src, tgt, return_attention=True)
    return {kind: [w[0] for w in attention[kind]] for kind in TYPES}


def test_attention_is_the_models_weights_for_that_translation(client, loaded):
    source, target = "a man runs on the grass", "ein hund läuft auf dem gras"
    r = client.post("/attention", json={"source": source, "target": target})
    assert r.status_code == 200
    body = r.json()
    data = body["attention"]
    assert body["page"] is None and body["tree"] is None and body["svg"] is None
    assert data["format"] == "transduce-attention/1" and data["n_layers"] == 2 and data["n_heads"] == 4
    s = data["sentences"][0]
    assert s["source_text"] == source and s["target_text"] == target and s["target_from"] == "given"
    expected = model_weights(loaded, source, target)
    for kind in TYPES:
        for layer, w in enumerate(expected[kind]):
            torch.testing.assert_close(torch.tensor(s["attention"][kind][layer]), w, atol=5e-5 + 1e-7, rtol=0)


def test_attention_without_a_target_is_of_the_models_own_translation(client):
    source = "two children play near the water"
    translated = client.post("/translate", json={"sentences": [source], "beam": 3, "alpha": 1.0}).json()
    r = client.post("/attention", json={"source": source, "beam": 3, "alpha": 1.0, "page": True})
    s = r.json()["attention"]["sentences"][0]
    assert s["target_text"] == translated["translations"][0]["text"]
    assert s["target_from"] == "the model's translation (beam 3, alpha 1.0)"
    page = r.json()["page"]  # the page of `transduce attention`, the same weights embedded
    assert page.startswith("<!DOCTYPE html>")
    embedded = re.search(r'<script type="application/json" id="attention-data">(.*?)</script>', page, re.S)[1]
    assert json.loads(embedded) == r.json()["attention"]
    only_page = client.post("/attention", json={"source": source, "weights": False, "page": True}).json()
    assert only_page["attention"] is None and only_page["page"].startswith("<!DOCTYPE html>")


@pytest.mark.parametrize(
    "body, status, error, limit",
    [
        ({"source": "x" * 61}, 422, "limit_exceeded", "max_chars"),
        ({"source": "a man runs on the grass with two dogs near the water"}, 422, "limit_exceeded", "max_tokens"),
        (
            {"source": "a", "target": "ein mann läuft auf dem gras mit zwei hunden nahe dem wasser " * 2},
            422,
            "limit_exceeded",
            "max_tokens",
        ),  # more than max_tokens + max_len_offset (20 + 8)
        ({"source": "a", "beam": 5}, 422, "limit_exceeded", "max_beam"),
        ({"source": "a", "max_len_offset": 9}, 422, "limit_exceeded", "max_len_offset"),
        ({"source": "a " * 1100}, 413, "limit_exceeded", "max_body_bytes"),
        ({"source": "  "}, 422, "invalid_request", None),
        ({"source": "a", "weights": False}, 422, "invalid_request", None),
        ({"source": "a", "unknown": 1}, 422, "invalid_request", None),
        ({"sentences": ["a"]}, 422, "invalid_request", None),
    ],
)
def test_attention_requests_are_held_to_the_limits(client, body, status, error, limit):
    r = client.post("/attention", json=body)
    assert r.status_code == status and r.json()["error"] == error, r.text
    assert r.json().get("limit") == limit


def test_a_target_may_be_as_long_as_an_output_of_the_server(client, loaded):
    target = "ein mann läuft auf dem gras mit zwei kindern"  # more than max_tokens (20), at most 20 + 8
    assert 20 < len(loaded.tgt_vocab.encode(target)) <= 28
    assert client.post("/attention", json={"source": "a", "target": target}).status_code == 200


def test_attention_with_the_ct2_engine_is_not_supported(loaded, tmp_path):
    pytest.importorskip("ctranslate2")
    from transduce.decoding.engines import load_ct2
    from transduce.export.ct2 import export_ct2
    from transduce.serve.app import ct2_engine

    ct2 = load_ct2(
        export_ct2(loaded.model, loaded.config, loaded.src_vocab, loaded.tgt_vocab, tmp_path / "ct2"), threads=1
    )
    with TestClient(create_app(ct2_engine(ct2))) as c:
        r = c.post("/attention", json={"source": "a man"})
        assert c.get("/info").json()["attention"] is False
    assert r.status_code == 501 and r.json()["error"] == "not_supported"


def test_the_page_is_one_self_contained_document(client):
    r = client.get("/")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    assert r.headers["content-security-policy"] == CSP and "connect-src 'self'" in CSP
    page = r.text
    assert "<script>" in page and "<style>" in page
    assert not re.search(r'\b(src|href)\s*=\s*"(https?:)?//', page)  # nothing from elsewhere
    assert not re.search(r"https?://", page.split("<script>")[1])  # the script speaks to its own origin only
    paths = client.get("/openapi.json").json()["paths"]
    assert {"/attention", "/metrics", "/translate"} <= paths.keys() and "/" not in paths


# -- a parsing model ----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def parser_dir(tmp_path_factory):
    """A tiny random model whose data.json says it parses (untrained: its outputs are repaired
    into trees, as any parser's are)."""
    d = make_model(tmp_path_factory.mktemp("parser"), shared=False, seed=3)
    meta = json.loads((d / "data.json").read_text())
    meta.update(task="parsing", linearization={"tags": False, "scheme": "vinyals2015"})
    (d / "data.json").write_text(json.dumps(meta))
    return d


def test_a_parser_is_served_as_transduce_parse_runs_it(parser_dir, tmp_path, capsys):
    lines = ["A man runs on the grass.", "Two children play near the water, don't they?", "", "The dog sits."]
    src, out = tmp_path / "in.txt", tmp_path / "out.txt"
    src.write_text("\n".join(lines) + "\n")
    assert (
        main(
            [
                "parse",
                str(parser_dir),
                "-i",
                str(src),
                "-o",
                str(out),
                "--beam",
                "3",
                "--max-len-offset",
                "12",
                "--precision",
                "fp32",
                "--workers",
                "1",
                "--quiet",
            ]
        )
        == 0
    )
    capsys.readouterr()
    trees = out.read_text().splitlines()
    with TestClient(create_app(torch_engine(load_translation_model(parser_dir)))) as c:
        got = c.post("/translate", json={"sentences": lines, "beam": 3, "max_len_offset": 12, "n_best": 2}).json()
        r = c.post("/attention", json={"source": lines[1], "beam": 3, "max_len_offset": 12}).json()
        info = c.get("/info").json()
    assert [t["tree"] for t in got["translations"]] == trees and trees[1].startswith("(TOP ")
    assert all(h["tree"].startswith("(TOP ") for h in got["translations"][1]["n_best"])
    assert info["task"] == "parsing"
    # the attention of the sentence as the parser reads it (Penn Treebank tokens), with its tree drawn
    assert r["tree"] == got["translations"][1]["tree"] and r["svg"].startswith("<svg") and ">they<" in r["svg"]
    assert r["attention"]["sentences"][0]["source_text"] == lines[1]


def test_the_command_uses_parsing_defaults_for_a_parser(parser_dir, tmp_path):
    from transduce.cli.serve import limits_from_args, resolve_defaults
    from transduce.cli import build_parser

    args = build_parser().parse_args(["serve", str(parser_dir)])
    resolve_defaults(args)
    limits = limits_from_args(args)
    assert (args.beam, args.alpha, args.max_len_offset) == (21, 0.3, 300)  # Section 6.3
    assert (limits.max_beam, limits.max_len_offset) == (21, 300)
    args = build_parser().parse_args(["serve", str(parser_dir), "--beam", "4", "--max-beam", "8"])
    resolve_defaults(args)
    assert (args.beam, args.alpha, args.max_beam) == (4, 0.3, 8)
    translation = make_model(tmp_path / "t")
    args = build_parser().parse_args(["serve", str(translation)])
    resolve_defaults(args)
    assert (args.beam, args.alpha, args.max_len_offset, args.max_beam) == (4, 0.6, 50, 16)  # Section 6.1


def test_sentences_are_counted_as_the_parser_reads_them(parser_dir):
    """The token limit counts the Penn Treebank tokens the model reads."""
    loaded = load_translation_model(parser_dir)
    engine = torch_engine(loaded)
    assert engine.encode("don't") == loaded.src_vocab.encode("do n't")
