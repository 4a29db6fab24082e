"""Importing transduce changes no environment variable: every module of the package (the
`python -m transduce` entry point aside, which runs a command) imported in a fresh process leaves
os.environ as it was. What a process needs set (oneDNN's kernel caches) is set where training or
serving starts, before its first product."""

import json
import os
import subprocess
import sys
from pathlib import Path

SRC = str(Path(__file__).resolve().parents[1] / "src")

IMPORT_ALL = """
import importlib, json, os, pkgutil
before = dict(os.environ)
import transduce
names = [m.name for m in pkgutil.walk_packages(transduce.__path__, "transduce.") if m.name != "transduce.__main__"]
missing = []
for name in names:
    try:
        importlib.import_module(name)
    except ModuleNotFoundError as e:  # an optional dependency not installed here
        if e.name.startswith("transduce"):
            raise
        missing.append(name)
after = dict(os.environ)
changed = sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k))
print(json.dumps({"imported": len(names) - len(missing), "missing": missing, "changed": changed}))
"""


def test_importing_every_transduce_module_changes_no_environment_variable():
    env = {k: v for k, v in os.environ.items() if k not in ("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "LRU_CACHE_CAPACITY")}
    out = subprocess.run(
        [sys.executable, "-c", IMPORT_ALL], env={**env, "PYTHONPATH": SRC}, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["imported"] > 50 and result["changed"] == [], result
