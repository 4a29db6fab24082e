#!/usr/bin/env bash
# A fresh machine ready, in one command (the README's):
#   bash scripts/setup.sh                 # then `. .venv/bin/activate` for the `transduce` command
# 1. A virtual environment: .venv in the repository (VENV=DIR: elsewhere), made by ${PYTHON:-python3}
#    (Python >= 3.10); where one is active already, or PYTHON names an environment's interpreter
#    (PYTHON=.venv/bin/python), that one is used. The other scripts find .venv by themselves.
# 2. PyTorch first (TORCH, default torch==2.13.0, the version of the README's figures): without a GPU
#    (no nvidia-smi) from PyTorch's CPU-only wheel index, since PyPI's torch for Linux is the CUDA
#    build (gigabytes); where that index is out of reach, pip's own sources (a local wheel, say).
# 3. The project, editable, with EXTRAS (comma-separated, e.g. EXTRAS=serve,hf; default none).
set -euo pipefail
cd "$(dirname "$0")/.."
TORCH=${TORCH:-torch==2.13.0}
CPU_INDEX=https://download.pytorch.org/whl/cpu

if [ -n "${PYTHON:-}" ] || [ -n "${VIRTUAL_ENV:-}" ]; then
  PY=${PYTHON:-$VIRTUAL_ENV/bin/python}
else
  VENV=${VENV:-.venv}
  if [ ! -x "$VENV/bin/python" ]; then
    python3 -c 'import sys; sys.exit(sys.version_info < (3, 10))' ||
      { echo "setup.sh: transduce needs Python >= 3.10; python3 is $(python3 -V 2>&1)" >&2; exit 1; }
    echo "setup.sh: making the virtual environment $VENV" >&2
    python3 -m venv "$VENV" ||
      { echo "setup.sh: python3 -m venv failed: on Debian or Ubuntu, apt-get install python3-venv" >&2; exit 1; }
  fi
  PY=$VENV/bin/python
fi

if "$PY" -c "import torch" 2>/dev/null; then
  echo "setup.sh: PyTorch $("$PY" -c 'import torch; print(torch.__version__)') is installed: kept" >&2
elif command -v nvidia-smi >/dev/null; then
  echo "setup.sh: a GPU (nvidia-smi): $TORCH from PyPI, the CUDA build" >&2
  "$PY" -m pip install -q "$TORCH"
elif "$PY" -c "import sys, urllib.request; urllib.request.urlopen(sys.argv[1], timeout=20)" "$CPU_INDEX/" 2>/dev/null; then
  echo "setup.sh: no GPU (no nvidia-smi): $TORCH, the CPU build from PyTorch's CPU-only index" >&2
  "$PY" -m pip install -q "$TORCH" --index-url "$CPU_INDEX"
else
  echo "setup.sh: no GPU, and PyTorch's CPU-only index is out of reach: $TORCH from pip's own sources" >&2
  "$PY" -m pip install -q "$TORCH"
fi
"$PY" -m pip install -q -e ".${EXTRAS:+[$EXTRAS]}"
echo "setup.sh: transduce is installed in $("$PY" -c 'import sys; print(sys.prefix)')" >&2
