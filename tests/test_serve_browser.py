"""The server's demo page in a real headless Chromium (Debian's, through Playwright), as a person
uses it: type sentences, translate, read the n-best and their scores (equal to what the API
answers), click a hypothesis and read the attention view of that translation (the page of
`transduce attention`), its numbers equal to the weights the model's own forward pass gives.
Nothing is requested from anywhere but the server; no console error. With an API key, the page
asks for it. A screenshot is saved (docs/serve-demo.png is made the same way by
scripts/serve_screenshot.py, on a trained model).

Chromium: tests/browser.py (without one the test fails, saying what to install)."""

import time
from pathlib import Path

import pytest
import torch

pytest.importorskip("fastapi")
pytest.importorskip("prometheus_client")
httpx = pytest.importorskip("httpx")

from browser import launch, sync_playwright  # noqa: E402
from serving import live  # noqa: E402
from views_data import N_HEADS, N_LAYERS, make_model_dir  # noqa: E402

from transduce.data.vocab import BOS, EOS  # noqa: E402
from transduce.serve.app import create_app, torch_engine  # noqa: E402
from transduce.decoding.ready import load_translation_model  # noqa: E402
from transduce.views.weights import TYPES  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")

SOURCES = ["a dog runs on the grass with a red ball", "two children play"]


@pytest.fixture(scope="module")
def loaded(tmp_path_factory):
    return load_translation_model(make_model_dir(tmp_path_factory.mktemp("demo-page")))


@pytest.fixture(scope="module")
def browser():
    with sync_playwright() as p:
        b = launch(p)
        yield b
        b.close()


def open_page(browser, url):
    """A page on the demo, every request recorded (any not to the server is refused), problems kept."""
    page = browser.new_page(viewport={"width": 1200, "height": 900})
    requests, problems = [], []

    def route(r):
        requests.append(r.request.url)
        r.continue_() if r.request.url.startswith((url + "/", "data:", "about:")) else r.abort()

    page.route("**/*", route)
    page.on(
        "console", lambda m: problems.append(f"console {m.type}: {m.text}") if m.type in ("error", "warning") else None
    )
    page.on("pageerror", lambda e: problems.append(f"page error: {e}"))
    page.on("requestfailed", lambda r: problems.append(f"request failed: {r.url}"))
    page.goto(url + "/")
    # a locator's wait, not wait_for_function: the page's CSP forbids eval, which a string predicate
    # needs as soon as it must be polled (a slow load then failed the test)
    from playwright.sync_api import expect  # (imported here, as browser.py imports Playwright: lazily)

    expect(page.locator("#model")).not_to_contain_text("loading")
    return page, requests, problems


def model_weights(loaded, source: str, target: str) -> dict:
    """The model's own weights, forward(return_attention=True), teacher-forced: per type, per layer (h, Tq, Tk)."""
    src = torch.tensor([loaded.src_vocab.encode(source) + [EOS]])
    tgt = torch.tensor([[BOS] + loaded.tgt_vocab.encode(target)])
    with torch.no_grad():
        _, attention = loaded.model.eval()(src, tgt, return_attention=True)
    return {kind: [w[0] for w in attention[kind]] for kind in TYPES}


def row_cells(frame) -> list[tuple[int, int, float, str]]:
    return frame.locator("#row td.w").evaluate_all(
        "cs => cs.map(c => [+c.dataset.h, +c.dataset.k, +c.dataset.w, c.textContent])"
    )


def test_demo_page_in_chromium(browser, loaded, tmp_path):
    started = time.perf_counter()
    with live(create_app(torch_engine(loaded))) as url:
        page, requests, problems = open_page(browser, url)
        header = page.text_content("#model")  # the model's name and what it is, not where it lies on disk
        assert header.startswith(Path(loaded.description).parent.name) and "parameters" in header and "/" not in header
        assert page.is_hidden("#key-box")

        # Type two sentences, set the search, translate.
        box = page.locator("#source")
        box.click()
        box.press_sequentially(SOURCES[0])
        box.press("Enter")
        box.press_sequentially(SOURCES[1])
        page.fill("#beam", "3")
        page.fill("#n-best", "3")
        page.click("#translate")
        page.wait_for_selector("#results tr.sentence")

        # What is shown is what the API answers: every hypothesis, in order, with its scores.
        api = httpx.post(
            url + "/translate",
            json={"sentences": SOURCES, "beam": 3, "alpha": 0.6, "greedy": False, "n_best": 3, "scores": True},
            timeout=30,
        ).json()
        shown = page.locator("#results tr.clickable").evaluate_all(
            "rs => rs.map(r => [+r.dataset.i, +r.dataset.rank, r.querySelector('td.out').textContent, +r.dataset.score, "
            "+r.dataset.logprob, r.querySelector('td.score').textContent, r.querySelector('td.logprob').textContent])"
        )
        expected = [
            (i, k + 1, h["text"], h["score"], h["logprob"], f"{h['score']:.4f}", f"{h['logprob']:.4f}")
            for i, t in enumerate(api["translations"])
            for k, h in enumerate(t["n_best"])
        ]
        assert [tuple(row) for row in shown] == expected and len(expected) == 6
        assert page.locator("#results tr.source td.src").all_text_contents() == SOURCES

        # Click the second hypothesis of the first sentence: its attention, drawn by the views page.
        hypothesis = api["translations"][0]["n_best"][1]["text"]
        page.click("#results tr.clickable[data-i='0'][data-rank='2']")
        frame = page.frame_locator("#view")
        frame.locator("line.attn").first.wait_for(state="attached")
        assert frame.locator("#texts").text_content() == f"source{SOURCES[0]}target{hypothesis}  (given)"
        assert frame.locator("#layer option").count() == N_LAYERS and frame.locator("input.head").count() == N_HEADS
        weights = model_weights(loaded, SOURCES[0], hypothesis)

        # Hover a query token: its row's numbers are the model's weights (to the page's 4 decimals).
        for kind, wanted in (("encoder", 2), ("decoder_cross", 1), ("decoder_self", 3)):
            query = min(wanted, weights[kind][0].size(1) - 1)
            frame.locator("#type").select_option(kind)
            frame.locator(f"#view text.tok.q[data-i='{query}']").hover()
            assert frame.locator("#row").get_attribute("data-q") == str(query)
            cells = row_cells(frame)
            w = weights[kind][N_LAYERS - 1]  # the view opens on the last layer
            assert len(cells) == N_HEADS * w.size(-1)
            for h, k, value, text in cells:
                assert abs(value - w[h, query, k].item()) <= 5e-5 + 1e-7, (kind, h, query, k)
                assert text == f"{value:.4f}"
        frame.locator("#layer").select_option(index=0)
        frame.locator("#view text.tok.q[data-i='0']").hover()
        for h, k, value, _ in row_cells(frame):
            assert abs(value - weights["decoder_self"][0][h, 0, k].item()) <= 5e-5 + 1e-7

        # As a reader sees it: encoder-decoder attention, the last layer, one query.
        frame.locator("#type").select_option("decoder_cross")
        frame.locator("#layer").select_option(index=N_LAYERS - 1)
        frame.locator(f"#view text.tok.q[data-i='{min(2, weights['decoder_cross'][0].size(1) - 1)}']").hover()
        shot = tmp_path / "serve-demo.png"
        page.screenshot(path=str(shot), full_page=True)
        assert shot.read_bytes().startswith(b"\x89PNG") and shot.stat().st_size > 20_000
        page.close()
    assert requests and all(u.startswith((url + "/", "about:", "data:")) for u in requests), requests
    assert {u.removeprefix(url) for u in requests} == {"/", "/info", "/translate", "/attention"}
    assert not problems, problems
    print(f"browser test: {time.perf_counter() - started:.1f} s")


def test_demo_page_asks_for_the_api_key(browser, loaded):
    with live(create_app(torch_engine(loaded), api_key="k-123")) as url:
        page, _, problems = open_page(browser, url)
        assert page.is_visible("#key-box")
        page.fill("#source", "two children play")
        page.click("#translate")
        page.wait_for_selector("#status.error")
        assert page.text_content("#status").startswith("unauthorized: an API key is required")
        page.fill("#key", "k-123")
        page.click("#translate")
        page.wait_for_selector("#results tr.sentence")
        page.click("#results tr.sentence")
        page.frame_locator("#view").locator("line.attn").first.wait_for(state="attached")
        page.close()
    # the refused request is the one problem the browser reports
    assert len(problems) == 1 and "401" in problems[0], problems
