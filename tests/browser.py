"""Chromium for the browser tests (the attention page, the server's demo page), driven by
Playwright's Python API: Debian's `chromium` (/usr/bin/chromium), or $TRANSDUCE_CHROMIUM, or the
browser `python -m playwright install chromium` downloaded. Without one a browser test fails (it is
never skipped: the pages are deliverables), saying the one command that installs it."""

import os
import shutil

import pytest

INSTALL = (
    "run `bash scripts/test.sh` (the README's test command: it installs Debian's chromium with "
    "apt-get), or `sudo apt-get install -y chromium`, or `python -m playwright install chromium`"
)


def chromium_executable() -> str | None:
    """Debian's chromium or $TRANSDUCE_CHROMIUM; None: Playwright's own download, if any."""
    for candidate in (
        os.environ.get("TRANSDUCE_CHROMIUM"),
        "/usr/bin/chromium",
        shutil.which("chromium"),
        shutil.which("chromium-browser"),
    ):
        if candidate and os.path.exists(candidate):
            return candidate
    return None


def launch(playwright):
    """A headless Chromium, or the test fails in one line saying what to install."""
    try:
        return playwright.chromium.launch(executable_path=chromium_executable())
    except Exception as e:  # noqa: BLE001 - say what to install, in one line
        pytest.fail(f"no Chromium to run the page in ({str(e).splitlines()[0]}): {INSTALL}")


def sync_playwright():
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.fail("the browser tests need Playwright: pip install -e '.[test]' (or bash scripts/test.sh)")
    return sync_playwright()
