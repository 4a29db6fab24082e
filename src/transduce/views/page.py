"""The interactive page: one self-contained HTML file (page.html beside this module), the weights
embedded as JSON. It works from `file://` with no network: nothing is loaded from anywhere (its
Content-Security-Policy forbids it), so a saved copy keeps working.
"""

from __future__ import annotations

import html
import json
import re
from importlib import resources

from .figures import HEAD_COLORS, MASK_COLORS


def render_page(data: dict, title: str = "") -> str:
    """The page for `data` (the JSON of `weights.to_json`)."""
    template = resources.files(__package__).joinpath("page.html").read_text(encoding="utf-8")
    values = {
        "TITLE": html.escape(title or data.get("model", "")),
        "COLORS": json.dumps(HEAD_COLORS),
        "MASK_COLORS": json.dumps(MASK_COLORS),
        # every "<" as \\u003c: no text in the JSON can close the <script> element or open a comment
        "DATA": json.dumps(data, ensure_ascii=False, separators=(",", ":")).replace("<", "\\u003c"),
    }
    return re.sub(r"__(TITLE|COLORS|MASK_COLORS|DATA)__", lambda m: values[m[1]], template)
