"""A screenshot of `transduce serve`'s demo page (GET /) in headless Chromium (Playwright), used as
a person uses it: the sentences typed, translated with an n-best, one hypothesis clicked, its
attention shown (a type, the last layer, one query token hovered).

    python scripts/serve_screenshot.py runs/m30k docs/serve-demo.png \\
        --sentence "A man is riding a bike." --sentence "Two dogs play in the snow." --click 2,1

It starts `transduce serve MODEL` (fp32, one thread) on a free port and ends it with SIGTERM.
Chromium: /usr/bin/chromium (Debian's package), else Playwright's own.
"""

import argparse
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
from playwright.sync_api import sync_playwright

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model", type=Path)
    ap.add_argument("png", type=Path)
    ap.add_argument("--sentence", action="append", required=True, help="a sentence to type (repeat)")
    ap.add_argument("--beam", type=int, default=4)
    ap.add_argument("--n-best", type=int, default=3)
    ap.add_argument("--click", default="1,1", help="SENTENCE,HYPOTHESIS to click, from 1 (default 1,1)")
    ap.add_argument("--type", default="decoder_cross", choices=("encoder", "decoder_self", "decoder_cross"))
    ap.add_argument("--query", type=int, default=2, help="the query position to hover, from 1")
    ap.add_argument("--width", type=int, default=1200)
    args = ap.parse_args()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "OMP_NUM_THREADS": "1"}
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "transduce",
            "serve",
            str(args.model),
            "--port",
            str(port),
            "--precision",
            "fp32",
            "--threads",
            "1",
            "--log-level",
            "warning",
        ],
        env=env,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 120
        while True:
            try:
                if httpx.get(url + "/health", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.time() > deadline or server.poll() is not None:
                sys.exit("the server did not start")
            time.sleep(0.2)
        sentence, rank = (int(x) for x in args.click.split(","))
        exe = "/usr/bin/chromium" if os.path.exists("/usr/bin/chromium") else None
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=exe)
            page = browser.new_page(viewport={"width": args.width, "height": 900})
            page.goto(url + "/")
            page.wait_for_function("!document.getElementById('model').textContent.includes('loading')")
            box = page.locator("#source")
            box.click()
            for i, s in enumerate(args.sentence):
                if i:
                    box.press("Enter")
                box.press_sequentially(s, delay=5)
            page.fill("#beam", str(args.beam))
            page.fill("#n-best", str(args.n_best))
            page.click("#translate")
            page.wait_for_selector("#results tr.sentence")
            page.click(f"#results tr.clickable[data-i='{sentence - 1}'][data-rank='{rank}']")
            frame = page.frame_locator("#view")
            frame.locator("line.attn").first.wait_for(state="attached")
            frame.locator("#type").select_option(args.type)
            frame.locator(f"#view text.tok.q[data-i='{args.query - 1}']").hover()
            page.wait_for_timeout(300)
            page.screenshot(path=str(args.png), full_page=True)
            browser.close()
        print(f"wrote {args.png}")
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(30)


if __name__ == "__main__":
    main()
