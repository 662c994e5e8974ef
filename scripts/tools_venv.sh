#!/usr/bin/env bash
# Print the path of the tools venv (build, ruff, mypy, mkdocs: requirements/tools.txt), creating it on first use.
# It lives outside the clone, keyed by the requirements' hash: ${PB_CACHE:-~/.cache/petastorm-balanced}/tools-<hash>.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
PY=${PYTHON:-python3.11}
command -v "$PY" >/dev/null || PY=python3
cache=${PB_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/petastorm-balanced}
key=$( (cat "$root/requirements/tools.txt"; "$PY" -c 'import sys; print(sys.version)') | sha256sum | cut -c1-16)
venv=$cache/tools-$key
if [ ! -f "$venv/.complete" ]; then
  rm -rf "$venv"
  mkdir -p "$cache"
  echo "tools: creating $venv (first time: under a minute)" >&2
  "$PY" -m venv "$venv"
  "$venv/bin/python" -m pip install -q -r "$root/requirements/tools.txt" >&2
  touch "$venv/.complete"
fi
echo "$venv"
