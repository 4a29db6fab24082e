#!/usr/bin/env bash
# The test suite on a fresh machine, in one command (the README's; .ci/run calls exactly this):
#   bash scripts/test.sh            # any pytest arguments may follow, e.g. -x, -k serve, -m slow
# 1. Chromium for the browser tests (tests/test_views_browser.py, tests/test_serve_browser.py):
#    Debian's `chromium` package, installed with apt-get (through sudo when not root) unless
#    /usr/bin/chromium is there; without apt-get, Playwright's own build is downloaded after step 2.
# 2. The environment as scripts/setup.sh makes it (.venv, or the active virtual environment, or
#    PYTHON's; PyTorch's CPU build where there is no GPU), with the test extra; then the tests, in it.
#    Without a data mirror (../shared/data or TRANSDUCE_DATA_DIR) the tests that read a corpus skip,
#    each saying which corpus and how to get it (tests/conftest.py).
set -euo pipefail
cd "$(dirname "$0")/.."
chromium=/usr/bin/chromium
if [ ! -x "$chromium" ] && [ -z "${TRANSDUCE_CHROMIUM:-}" ] && command -v apt-get >/dev/null; then
    SUDO=""
    if [ "$(id -u)" != 0 ]; then
        command -v sudo >/dev/null || { echo "scripts/test.sh: the browser tests need Chromium: as root, run apt-get install -y chromium" >&2; exit 1; }
        SUDO=sudo
    fi
    echo "scripts/test.sh: installing Debian's chromium for the browser tests (apt-get)" >&2
    $SUDO apt-get update -q
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q chromium
fi
EXTRAS=test bash scripts/setup.sh
source scripts/python.sh
if [ ! -x "$chromium" ] && [ -z "${TRANSDUCE_CHROMIUM:-}" ] && ! command -v apt-get >/dev/null; then
    echo "scripts/test.sh: no apt-get: downloading Playwright's Chromium for the browser tests" >&2
    "$PYTHON" -m playwright install chromium
fi
exec "$PYTHON" -m pytest -q "$@"
