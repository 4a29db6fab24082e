# Sourced by the scripts: PYTHON, the interpreter they run, and `transduce`, the command through it.
# PYTHON: as set, else the active virtual environment's, else the repository's .venv (scripts/setup.sh),
# else python3 (never a bare `python`, which some systems lack).
if [ -z "${PYTHON:-}" ]; then
  if [ -n "${VIRTUAL_ENV:-}" ]; then
    PYTHON=$VIRTUAL_ENV/bin/python
  elif [ -x "$(dirname "${BASH_SOURCE[0]}")/../.venv/bin/python" ]; then
    PYTHON=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/.venv/bin/python
  else
    PYTHON=python3
  fi
fi

transduce() { "$PYTHON" -m transduce "$@"; }

require_transduce() {  # before a script's first command: one line where the project is not installed
  "$PYTHON" -c "import transduce" 2>/dev/null || {
    echo "$(basename "$0"): $PYTHON cannot import transduce: run \`bash scripts/setup.sh\` first (or set PYTHON)" >&2
    exit 1
  }
}
