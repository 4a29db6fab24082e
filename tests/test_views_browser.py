"""The attention page in a real headless Chromium, driven by Playwright, as a person uses it:
opened from file:// it makes no request other than file: and data:, logs no console error,
offers L layers, h heads and the three attention types; hovering a query token shows exactly
that token's row, with the values embedded in the page; changing the layer or the type changes
what is drawn; the masks view draws the masks applied to the padded batch; a screenshot is saved.

Chromium: Debian's `chromium` package (/usr/bin/chromium; `bash scripts/test.sh`, the README's test
command, installs it when missing), or $TRANSDUCE_CHROMIUM, or a browser `python -m playwright
install chromium` downloaded (tests/browser.py). Without one the test fails (it is never skipped):
the page is a deliverable, and CI must see it work.
"""

import json
import time

import pytest

from transduce.cli import main
from transduce.views.figures import MASK_COLORS

from browser import launch, sync_playwright
from views_data import N_HEADS, N_LAYERS, make_model_dir

SOURCES = ["a dog runs on the grass with a red ball", "two children play"]
TARGETS = ["two children play with a dog on the grass", "a dog"]


@pytest.fixture(scope="module")
def page_file(tmp_path_factory):
    root = tmp_path_factory.mktemp("page")
    model = make_model_dir(root)
    html, data = root / "attention.html", root / "attention.json"
    args = [
        "attention",
        str(model),
        *SOURCES,
        *[a for t in TARGETS for a in ("--target-text", t)],
        "--html",
        str(html),
        "--json",
        str(data),
    ]
    assert main(args) == 0
    return html, json.loads(data.read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def browser():
    with sync_playwright() as p:
        b = launch(p)
        yield b
        b.close()


def lines_drawn(page) -> list[dict]:
    return page.eval_on_selector_all(
        "#view line.attn", "ls => ls.map(l => ({q: +l.dataset.q, k: +l.dataset.k, h: +l.dataset.h, w: +l.dataset.w}))"
    )


def expected_lines(data, sentence, kind, layer, rows, heads=range(N_HEADS)) -> list[dict]:
    w = data["sentences"][sentence]["attention"][kind][layer]
    return [
        {"q": i, "k": j, "h": h, "w": w[h][i][j]}
        for h in heads
        for i in rows
        for j in range(len(w[h][i]))
        if w[h][i][j] > 0
    ]


def key(line):
    return line["h"], line["q"], line["k"]


def test_page_in_chromium(page_file, browser, tmp_path):
    started = time.perf_counter()
    html, data = page_file
    page = browser.new_page(viewport={"width": 1200, "height": 900})
    requests, problems = [], []
    page.route(
        "**/*",
        lambda route: (
            requests.append(route.request.url),
            route.continue_() if route.request.url.startswith(("file:", "data:")) else route.abort(),
        ),
    )
    page.on(
        "console", lambda m: problems.append(f"console {m.type}: {m.text}") if m.type in ("error", "warning") else None
    )
    page.on("pageerror", lambda e: problems.append(f"page error: {e}"))
    page.on("requestfailed", lambda r: problems.append(f"request failed: {r.url}"))
    page.goto(html.as_uri())
    page.wait_for_selector("#view line.attn", state="attached")

    # The weights embedded in the page are the JSON the command wrote.
    embedded = page.evaluate("JSON.parse(document.getElementById('attention-data').textContent)")
    assert embedded == data

    # What it offers: L layers, h heads, three attention types, the sentences.
    assert page.eval_on_selector_all("#layer option", "os => os.map(o => o.textContent)") == [
        str(i + 1) for i in range(N_LAYERS)
    ]
    assert page.locator("input.head").count() == N_HEADS
    assert page.eval_on_selector_all("#type option", "os => os.map(o => o.value)") == [
        "encoder",
        "decoder_self",
        "decoder_cross",
    ]
    assert page.locator("#sentence option").count() == 2
    layer = N_LAYERS - 1  # the default: the last layer, encoder self-attention, every row
    n_src = len(data["sentences"][0]["source"])
    assert sorted(map(key, lines_drawn(page))) == sorted(
        map(key, expected_lines(data, 0, "encoder", layer, range(n_src)))
    )

    # Hover a query token: exactly its row, with the embedded values, in the lines and the table.
    q = 3
    page.hover(f"#view text.tok.q[data-i='{q}']")
    drawn = lines_drawn(page)
    assert {d["q"] for d in drawn} == {q}
    assert sorted(drawn, key=key) == sorted(expected_lines(data, 0, "encoder", layer, [q]), key=key)
    assert page.get_attribute("#row", "data-q") == str(q)
    cells = page.eval_on_selector_all(
        "#row td.w", "cs => cs.map(c => [+c.dataset.h, +c.dataset.k, +c.dataset.w, c.textContent])"
    )
    w = data["sentences"][0]["attention"]["encoder"][layer]
    assert len(cells) == N_HEADS * n_src
    for h, k, value, text in cells:
        assert value == w[h][q][k] and float(text) == pytest.approx(value, abs=1e-9)
    page.mouse.move(1, 1)  # away: every row again
    assert len({d["q"] for d in lines_drawn(page)}) > 1

    # Changing the layer changes what is drawn, to that layer's weights.
    before = lines_drawn(page)
    page.select_option("#layer", index=0)  # (a value would also match the labels "1", "2", ...)
    after = lines_drawn(page)
    assert page.eval_on_selector("#layer", "s => s.options[s.selectedIndex].textContent") == "1"
    assert after != before
    assert sorted(after, key=key) == sorted(expected_lines(data, 0, "encoder", 0, range(n_src)), key=key)

    # Changing the type: encoder-decoder attention, queries on the target side, keys on the source.
    page.select_option("#type", value="decoder_cross")
    n_tgt = len(data["sentences"][0]["target"])
    assert page.locator("#view text.tok.q").count() == n_tgt and page.locator("#view text.tok.k").count() == n_src
    # Decoder queries are labelled by the token they predict; the keys are the source tokens.
    assert page.eval_on_selector_all("#view text.tok.q", "ts => ts.map(t => t.childNodes[0].nodeValue)") == [
        "\u2192" + t for t in data["sentences"][0]["predicts"]
    ]
    assert (
        page.eval_on_selector_all("#view text.tok.k", "ts => ts.map(t => t.textContent)")
        == data["sentences"][0]["source"]
    )
    page.hover("#view text.tok.q[data-i='2']")
    assert sorted(lines_drawn(page), key=key) == sorted(expected_lines(data, 0, "decoder_cross", 0, [2]), key=key)
    # Decoder self-attention: the hovered row reaches no later position.
    page.select_option("#type", value="decoder_self")
    page.hover("#view text.tok.q[data-i='2']")
    assert {d["k"] for d in lines_drawn(page)} <= {0, 1, 2}

    # Heads: unticking one removes its lines.
    page.mouse.move(1, 1)
    page.uncheck("input.head[value='0']")
    assert {d["h"] for d in lines_drawn(page)} == set(range(1, N_HEADS))
    page.click("#all-heads")

    # Heatmap: one grid per head; hovering a row fades the others.
    page.select_option("#view-kind", value="heatmap")
    assert page.locator("#view svg.heatmap").count() == N_HEADS
    page.hover("#view svg.heatmap[data-h='0'] text.tok.q[data-i='1']")
    faded = page.eval_on_selector_all(
        "#view svg.heatmap[data-h='0'] rect.cell",
        "rs => rs.map(r => [+r.dataset.q, +r.getAttribute('fill-opacity'), +r.dataset.w])",
    )
    for row, opacity, value in faded:
        assert opacity == pytest.approx(0.05 + 0.95 * value if row == 1 else 0.04 * value, abs=1e-6)
    assert page.get_attribute("#row", "data-q") == "1"

    # Masks: the second sentence is padded on both sides; its mask cells say why each is blocked.
    page.mouse.move(1, 1)
    page.select_option("#view-kind", value="masks")
    page.select_option("#sentence", index=1)
    for kind in ("encoder", "decoder_self", "decoder_cross"):
        page.select_option("#type", value=kind)
        cats = page.eval_on_selector_all(
            "#masks rect.mask", "rs => rs.map(r => [+r.dataset.q, +r.dataset.k, r.dataset.cat])"
        )
        mask = data["batch"]["masks"][kind][1]
        assert len(cats) == len(mask) * len(mask[0])
        for i, j, cat in cats:
            assert (cat == "allowed") == bool(mask[i][j]) and cat in MASK_COLORS
        assert any(cat == "padding" for *_, cat in cats)
        if kind == "decoder_self":
            assert any(cat == "causal" for *_, cat in cats) and any(cat == "both" for *_, cat in cats)

    # A screenshot, as a reader would see the page: sentence 1, the lines, a hovered token.
    page.select_option("#sentence", index=0)
    page.select_option("#type", value="encoder")
    page.select_option("#view-kind", value="lines")
    page.hover("#view text.tok.q[data-i='1']")
    shot = tmp_path / "attention-page.png"
    page.screenshot(path=str(shot), full_page=True)
    assert shot.read_bytes().startswith(b"\x89PNG") and shot.stat().st_size > 10_000

    assert requests and all(u.startswith(("file:", "data:")) for u in requests), requests
    assert not problems, problems
    page.close()
    print(f"browser test: {time.perf_counter() - started:.1f} s in the page")
