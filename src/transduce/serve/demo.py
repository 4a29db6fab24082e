"""The demo page, GET / (demo.html beside this module; its Content-Security-Policy lets nothing load
from anywhere but the server), and POST /attention under it (docs/serve.md): the weights of one
source and a target, teacher-forced, or the model's own translation, run on the decoding thread in
its turn (`Batcher.call`) under the same limits, queue and API key as /translate.
"""

from __future__ import annotations

from importlib import resources
from typing import Any

from pydantic import BaseModel, Field

from ..decoding.settings import SearchSettings
from .common import Limits, Problem, Server
from .fields import request_model

# The page's Content-Security-Policy: nothing from anywhere but the server's own origin
CSP = (
    "default-src 'none'; connect-src 'self'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; "
    "img-src data:; frame-src 'self'; base-uri 'none'; form-action 'none'"
)


class AttentionResponse(BaseModel):
    attention: dict[str, Any] | None = Field(
        None, description="the weights (`transduce attention --json`'s format, transduce-attention/1), if `weights`"
    )
    page: str | None = Field(None, description="the self-contained page that draws them, if `page`")
    tree: str | None = Field(None, description="a parsing model: the tree of the target, bracketed")
    svg: str | None = Field(None, description="a parsing model: that tree as an SVG picture")


def attention_schema(limits: Limits, defaults: SearchSettings) -> type[BaseModel]:
    return request_model(
        "AttentionRequest",
        limits,
        defaults,
        {
            "source": (str, Field(description="one source sentence")),
            # as long as an output of the server may be: max_tokens + max_len_offset tokens (checked), any characters
            "target": (str | None, Field(None, description="its translation, teacher-forced; null: the model's own")),
        },
        {
            "weights": (bool, Field(True, description="return the weights as JSON")),
            "page": (bool, Field(False, description="return the page that draws them (`transduce attention --html`)")),
        },
    )


def add_demo_routes(app, server: Server, *, keys, errors: dict) -> None:
    """GET / (the page) and POST /attention."""
    from dataclasses import replace

    from fastapi import Depends, Request
    from fastapi.responses import HTMLResponse

    limits = server.limits
    AttentionRequest = attention_schema(limits, server.defaults)

    @app.get("/", response_class=HTMLResponse, include_in_schema=False)
    async def demo():
        page = resources.files(__package__).joinpath("demo.html").read_text(encoding="utf-8")
        return HTMLResponse(
            page,
            headers={"Content-Security-Policy": CSP, "X-Content-Type-Options": "nosniff", "Cache-Control": "no-store"},
        )

    async def require_key(given=Depends(keys)):  # before the body is validated, as a dependency
        server.require_key(given)

    require_key.__annotations__.update(given=list)

    async def attention(req, request):
        e, batcher = server.lookup()
        if e.attention is None:
            raise Problem(
                501,
                "not_supported",
                f"the {e.info.get('engine')} engine gives no attention weights: serve "
                "the PyTorch model (transduce serve MODEL, without --engine ct2)",
            )
        if not req.source.strip():
            raise Problem(422, "invalid_request", "source: an empty sentence has no attention to show", field="source")
        if not (req.weights or req.page):
            raise Problem(422, "invalid_request", "ask for the weights, the page or both", field="weights")
        tokens = server.count_tokens(e.encode, [req.source], where=lambda i: "source")
        if req.target is not None:
            server.count_tokens(e.encode_target, [req.target], where=lambda i: "target", extra=limits.max_len_offset)
        search = replace(
            server.defaults,
            beam=req.beam,
            alpha=req.alpha,
            max_len_offset=req.max_len_offset,
            n_best=1,
            greedy=req.greedy,
        )
        data = await server.wait(
            batcher, lambda: batcher.call(lambda: e.attention(req.source, req.target, search), tokens), request
        )
        out: dict[str, Any] = {"attention": data if req.weights else None, "page": None, "tree": None, "svg": None}
        if req.page:
            from ..views.page import render_page

            out["page"] = render_page(data, title=req.source[:80])
        if e.tree is not None:
            from ..parsing.svg import tree_svg

            tree = e.tree(req.source, data["sentences"][0]["target_text"])
            if tree is not None:
                out["tree"], out["svg"] = str(tree), tree_svg(tree, title=" ".join(tree.leaves()))
        return out

    attention.__annotations__.update(req=AttentionRequest, request=Request)
    app.post(
        "/attention",
        response_model=AttentionResponse,
        dependencies=[Depends(require_key)],
        responses={**errors, 501: errors[400]},
        summary="the attention weights of one sentence and its translation (transduce attention)",
    )(attention)
