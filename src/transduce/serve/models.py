"""Many models behind one server (`transduce serve MODEL [MODEL ...]`, or a directory of model
directories): each model's languages, the route a request's `source` and `target` take (a model,
a multilingual model's `>>xx<<` target token, or two models through a pivot language), `source:
"auto"` detected among the sources that reach the target, models loaded on demand and unloaded
least-recently-used under a memory cap, on the one decoding thread (never unloaded mid-decode).

A model's memory is the growth of the process's resident set (RSS) while it loaded, freed pages
given back to the system before and after (`memory.release_free_memory`), and at least its
parameters' bytes (a model reloaded into pages the process kept may grow it by less). The models,
read without loading: `serve.catalog`; a request's route: `serve.routes`; their metrics:
`serve.ops.models_collector`. docs/serve.md, "Many models behind one server".
"""

from __future__ import annotations

import gc
import logging
import os
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from ..errors import TransduceError
from .backend import Engine, RequestError
from .catalog import BYTES_PER_PARAMETER, Detector, Served, _mb, code, describe, model_names, model_paths
from .common import Problem, name as language_name
from .routes import Leg, Route, RouteBatcher, RouteError, _with_token

if TYPE_CHECKING:
    from ..decoding.settings import SearchSettings

log = logging.getLogger("transduce.serve")


def resident() -> int | None:
    """The process's resident set in bytes (Linux: /proc/self/statm), or None."""
    try:
        with open("/proc/self/statm", encoding="ascii") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


# -- the set ---------------------------------------------------------------------------------------------


class ModelSet:
    """The models of one server. `load(served) -> Engine` loads one (on the decoding thread);
    `max_memory` (bytes) caps the memory of the models loaded at once; `pivot` a language through
    which two models translate a pair no model serves; `detector` for `source: "auto"` (made on
    first use where None). The first model is the default: the native API and the demo page use it."""

    def __init__(
        self,
        models: list[Served],
        load: Callable[[Served], Engine],
        *,
        max_memory: int | None = None,
        pivot: str | None = None,
        detector: Detector | None = None,
    ):
        if not models:
            raise ValueError("no model to serve")
        if len(models) > 1:
            for m in models:
                if m.source is None or not m.targets:
                    raise ValueError(
                        f"{m.path}: the model names no languages (its data.json has no src_lang and "
                        "tgt_lang), so no request can choose it among several: serve it alone"
                    )
        self.models = {m.name: m for m in models}
        self.default = models[0]
        self.max_memory, self.pivot = max_memory, (code(pivot) if pivot else None)
        self._load, self._detector = load, detector
        self._lock = threading.Lock()
        self._clock = 0
        self.info: dict = {}
        self._refresh()

    # -- languages and routes ---------------------------------------------------------------------

    def _direct(self, source: str, target: str) -> Leg | None:
        for m in self.models.values():  # the first model given that serves the pair
            if m.source == source and target in m.targets:
                return Leg(m.name, m.tokens.get(target))
        return None

    def legs(self, source: str, target: str) -> tuple[tuple[Leg, ...], str | None] | None:
        """The legs from `source` to `target` (and the pivot language, if through one), or None."""
        source, target = code(source), code(target)
        if (leg := self._direct(source, target)) is not None:
            return (leg,), None
        p = self.pivot
        if p is not None and p not in (source, target):
            first, second = self._direct(source, p), self._direct(p, target)
            if first is not None and second is not None:
                return (first, second), p
        return None

    def sources(self) -> list[str]:
        return list(dict.fromkeys(m.source for m in self.models.values() if m.source is not None))

    def targets_of(self, source: str, pivot: bool = True) -> list[str]:
        """Every language `source` is translated into, directly or (with `pivot`) through the pivot."""
        found = dict.fromkeys(t for m in self.models.values() if m.source == source for t in m.targets)
        if pivot and self.pivot is not None and self.pivot in found:
            found.update(dict.fromkeys(t for t in self.targets_of(self.pivot, False) if t != source))
        return list(found)

    def languages(self) -> list[dict]:
        """GET /languages, LibreTranslate's shape: every source with all its targets, then each
        language that is only a target (with none)."""
        out = [{"code": s, "name": language_name(s), "targets": self.targets_of(s)} for s in self.sources()]
        only = dict.fromkeys(t for m in self.models.values() for t in m.targets if t not in self.sources())
        return out + [{"code": t, "name": language_name(t), "targets": []} for t in only]

    def route(self, source: str, target: str, search: SearchSettings) -> Route:
        """The route of a request from `source` to `target` (not "auto"), counted as a request of
        its models; RouteError when none serves it."""
        found = self.legs(source, target)
        if found is None:
            raise RouteError(self._no_route(code(source), code(target)))
        legs, pivot = found
        with self._lock:
            for leg in legs:
                self.models[leg.model].requests += 1
        return Route(legs, search, pivot)

    def lookup(self, source: str, target: str, texts: list[str], batcher) -> tuple[Engine, RouteBatcher]:
        """What a LibreTranslate request from `source` to `target` decodes with (`common.Server.lookup`):
        an engine whose `encode` is its route's and whose info says the languages (`source: "auto"`:
        the one detected over `texts` among the sources that reach `target`, with its confidence)
        and the pivot, and the server's batcher with the route in each job's settings. Raises
        `common.Problem`: 422 `unsupported_language` for a pair not served, 501 without a detector."""
        confidence = None
        if str(source).lower() == "auto":
            among = self.sources_for(target)
            if not among:
                raise Problem(
                    422,
                    "unsupported_language",
                    f"{language_name(code(target))} ({code(target)}) is not a target language of this server",
                    field="target",
                )
            source, confidence = self.detect(" ".join(texts), among)[0]
        try:
            route = self.route(source, target, None)
        except RouteError as e:
            field = "source" if code(source) not in self.sources() else "target"
            raise Problem(422, "unsupported_language", str(e), field=field) from None
        info = {
            "languages": {"src": code(source), "tgt": code(target)},
            "pivot": route.pivot,
            "models": [leg.model for leg in route.legs],
        }
        if confidence is not None:
            info["confidence"] = confidence
        engine = Engine(self.translate, lambda s: self.encode(route, s), info, models=self, align=self.aligner(route))
        return engine, RouteBatcher(batcher, route)

    def aligner(self, route: Route | None):
        """`Engine.align` for a route of one model (the default model's without one): its model's
        alignment, the `>>xx<<` token before each source taken out of the links; None through a
        pivot (no alignment links the source with the second model's output: tags in proportion).
        On the decoding thread (the model is loaded if it was unloaded meanwhile)."""
        if route is not None and len(route.legs) != 1:
            return None
        leg = route.legs[0] if route is not None else Leg(self.default.name)

        def align(sources: list[str], outputs: list[str]) -> list:
            engine = self.acquire([leg.model])[0]
            if engine.align is None:
                return [[] for _ in sources]
            if not leg.token:
                return engine.align(sources, outputs)
            shift = len(leg.token) + 1  # `_with_token`'s "TOKEN " before a sentence
            links = engine.align([_with_token(leg.token, s) for s in sources], outputs)
            return [[(t0, t1, s0 - shift, s1 - shift) for t0, t1, s0, s1 in found if s0 >= shift] for found in links]

        return align

    def _no_route(self, source: str, target: str) -> str:
        if source not in self.sources():
            return (
                f"{language_name(source)} ({source}) is not a source language of this server: it translates from "
                + ", ".join(f"{language_name(s)} ({s})" for s in self.sources())
            )
        via = f", directly or through {language_name(self.pivot)} ({self.pivot})" if self.pivot else ""
        return (
            f"{language_name(target)} ({target}) is not available as a target language from {language_name(source)} "
            f"({source}){via}: from it this server translates into "
            + ", ".join(f"{language_name(t)} ({t})" for t in self.targets_of(source))
        )

    def detect(self, text: str, among: list[str] | None = None) -> list[tuple[str, float]]:
        """(language, confidence 0-100), best first, among `among` (default: every source served);
        one candidate is that one at 100 without asking the detector. A `common.Problem` (501)
        where the detector's extra is not installed."""
        among = list(among) if among is not None else self.sources()
        if len(among) <= 1:
            return [(c, 100.0) for c in among]
        if self._detector is None:
            try:
                self._detector = Detector()
            except TransduceError as e:  # its extra is not installed
                raise Problem(501, "not_supported", str(e)) from None
        return self._detector.rank(text, among)

    def sources_for(self, target: str) -> list[str]:
        """The sources from which `target` can be reached (what `source: "auto"` chooses among)."""
        return [s for s in self.sources() if s != code(target) and self.legs(s, target) is not None]

    def encode(self, route: Route | None, sentence: str) -> list[int]:
        """The source ids a sentence is decoded from on `route`'s first leg (the default model's
        without one), its `>>xx<<` token included."""
        leg = route.legs[0] if route is not None else Leg(self.default.name)
        return self.models[leg.model].encode(_with_token(leg.token, sentence))

    # -- the decoding thread ------------------------------------------------------------------------------

    def translate(self, sentences: list[str], settings) -> list:
        """A round of the batcher: the sentences through each leg of the route (`settings`: a
        Route, or the default model's Search), the models loaded first as needed; the last leg's
        candidates per sentence."""
        route = settings if isinstance(settings, Route) else Route((Leg(self.default.name),), settings)
        engines = self.acquire([leg.model for leg in route.legs])
        texts, results = list(sentences), []
        for i, (leg, engine) in enumerate(zip(route.legs, engines)):
            last = i == len(route.legs) - 1
            search = route.search if last else replace(route.search, n_best=1)
            results = engine.translate([_with_token(leg.token, t) for t in texts], search)
            with self._lock:
                self.models[leg.model].sentences += len(texts)
            texts = [cands[0].text if cands else "" for cands in results]
        self._refresh()
        return results

    def acquire(self, names: list[str]) -> list[Engine]:
        """The engines of these models, each loaded if it is not (others unloaded, least recently
        used first, to keep under the cap), all marked used now. On the decoding thread only."""
        needed = [self.models[n] for n in dict.fromkeys(names)]
        for m in needed:
            if m.engine is None:
                self._load_model(m, needed)
        self._clock += 1
        for m in needed:
            m.last_used = self._clock
        return [self.models[n].engine for n in names]

    def _load_model(self, m: Served, keep: list[Served]) -> None:
        from ..memory import release_free_memory

        self._make_room(m.memory if m.loads else m.estimate, keep)
        gc.collect()
        release_free_memory()
        before, started = resident(), time.perf_counter()
        engine = self._load(m)
        release_free_memory()
        after = resident()
        info = engine.info
        bytes_per = BYTES_PER_PARAMETER.get(str(info.get("precision")).lower(), 4)
        with self._lock:
            m.engine, m.info = engine, {k: v for k, v in info.items() if k not in ("config", "vocab")}
            m.load_seconds = round(time.perf_counter() - started, 2)
            m.parameter_bytes = bytes_per * info["parameters"] if info.get("parameters") else m.estimate or None
            m.rss_delta = after - before if before is not None and after is not None else None
            m.memory = max(m.rss_delta or 0, m.parameter_bytes or 0)
            m.loads += 1
        log.info(
            "model %s loaded in %.1f s: %s MB (the resident set grew by %s MB)",
            m.name,
            m.load_seconds,
            _mb(m.memory),
            _mb(m.rss_delta),
        )
        self._make_room(0, keep)  # measured, it may be larger than estimated
        self._refresh()

    def loaded_memory(self) -> int:
        return sum(m.memory for m in self.models.values() if m.engine is not None)

    def _make_room(self, extra: int, keep: list[Served]) -> None:
        """Unload models least recently used first (none of `keep`) until the loaded ones and
        `extra` bytes fit under the cap, or only `keep` are left."""
        if self.max_memory is None:
            return
        while self.loaded_memory() + extra > self.max_memory:
            idle = [m for m in self.models.values() if m.engine is not None and m not in keep]
            if not idle:
                if extra or len(keep) > 1 or self.loaded_memory() > self.max_memory:
                    log.warning(
                        "models %s need %s MB, more than --max-memory (%s MB): they are served over it",
                        ", ".join(m.name for m in keep),
                        _mb(self.loaded_memory() + extra),
                        _mb(self.max_memory),
                    )
                return
            self.unload(min(idle, key=lambda m: m.last_used))

    def unload(self, m: Served) -> None:
        """Drop a model's engine and give its memory back to the system (decoding thread only)."""
        from ..memory import release_free_memory

        before = resident()
        with self._lock:
            m.engine = None
            m.unloads += 1
        gc.collect()
        release_free_memory()
        after = resident()
        m.rss_freed = before - after if before is not None and after is not None else None
        log.info(
            "model %s unloaded (least recently used, under --max-memory %s MB): the resident set fell by %s MB",
            m.name,
            _mb(self.max_memory),
            _mb(m.rss_freed),
        )
        self._refresh()

    # -- what /info says ----------------------------------------------------------------------------------

    def _refresh(self) -> None:
        """The engine's info, in place (GET /info reads it from another thread)."""
        with self._lock:
            entries = [m.entry() for m in self.models.values()]
            loaded = self.loaded_memory()
        d = self.default
        self.info.update(
            {
                **({k: v for k, v in d.info.items()} if d.info else {}),
                "model": d.name,
                "languages": {"src": d.source, "tgt": d.targets[0]} if d.source else None,
                "models": entries,
                "max_memory_mb": _mb(self.max_memory),
                "loaded_memory_mb": _mb(loaded),
                "pivot": self.pivot,
                "resident_mb": _mb(resident()),
            }
        )
        self.info.setdefault("engine", "torch")
        self.info.setdefault("task", "parsing" if d.parsing else "translation")
        self.info.setdefault("attention", True)

    def engine(self, attention: bool = True) -> Engine:
        """The Engine the server's plumbing decodes with: `translate` takes a Route or a Search
        (the default model's), `encode` and `attention` are the default model's, `models` is this."""

        def attend(source: str, target: str | None, s: SearchSettings) -> dict:
            engine = self.acquire([self.default.name])[0]
            if engine.attention is None:
                raise RequestError(f"model {self.default.name} gives no attention weights")
            return engine.attention(source, target, s)

        def tree(source: str, output: str):
            engine = self.default.engine or self.acquire([self.default.name])[0]
            return engine.tree(source, output) if engine.tree is not None else None

        return Engine(
            self.translate,
            lambda s: self.encode(None, s),
            self.info,
            attention=attend if attention else None,
            tree=tree if self.default.parsing else None,
            models=self,
            align=None if self.default.parsing else self.aligner(None),
        )


def open_models(
    paths: list[Path], load: Callable[[Served], Engine], *, max_memory: int | None = None, pivot: str | None = None
) -> ModelSet:
    """The set `transduce serve MODEL [MODEL ...]` serves: every model the arguments name (a
    directory of model directories gives each), read without loading."""
    found = model_paths(paths)
    return ModelSet(
        [describe(p, n) for p, n in zip(found, model_names(found))], load, max_memory=max_memory, pivot=pivot
    )
