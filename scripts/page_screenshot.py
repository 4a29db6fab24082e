"""A screenshot of a `transduce attention --html` page in headless Chromium (Playwright).

    python scripts/page_screenshot.py page.html shot.png --type encoder --layer 3 --query 33 --heads 2,3

Chromium: /usr/bin/chromium (Debian's package), else Playwright's own (`python -m playwright
install chromium`). Layers, heads and query positions from 1, as on the page.
"""

import argparse
import os
from pathlib import Path

from playwright.sync_api import sync_playwright


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("html", type=Path)
    ap.add_argument("png", type=Path)
    ap.add_argument("--sentence", type=int, default=1)
    ap.add_argument("--type", default="encoder", choices=("encoder", "decoder_self", "decoder_cross"))
    ap.add_argument("--layer", type=int)
    ap.add_argument("--heads", help="e.g. 2,3 (default: all)")
    ap.add_argument("--view", default="lines", choices=("lines", "heatmap", "masks"))
    ap.add_argument("--query", type=int, help="hover this query position")
    ap.add_argument("--width", type=int, default=1200)
    ap.add_argument("--height", type=int, default=900)
    args = ap.parse_args()
    exe = "/usr/bin/chromium" if os.path.exists("/usr/bin/chromium") else None
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=exe)
        page = browser.new_page(viewport={"width": args.width, "height": args.height})
        page.goto(args.html.resolve().as_uri())
        page.select_option("#sentence", index=args.sentence - 1)  # (value= would also match a label)
        page.select_option("#type", value=args.type)
        if args.layer:
            page.select_option("#layer", index=args.layer - 1)
        if args.heads:
            keep = {int(h) - 1 for h in args.heads.split(",")}
            for box in page.query_selector_all("input.head"):
                if int(box.get_attribute("value")) not in keep:
                    box.uncheck()
        page.select_option("#view-kind", value=args.view)
        if args.query:
            page.hover(f"#view text.tok.q[data-i='{args.query - 1}']")
        page.screenshot(path=str(args.png), full_page=False)
        browser.close()


if __name__ == "__main__":
    main()
