#!/usr/bin/env bash
# Print the path of the tools venv (build, ruff, mypy, mkdocs: requirements/tools.txt), creating it on first use.
# It lives in the checkout, ignored by git: .venv-tools (or $PB_CACHE/.venv-tools), rebuilt when the requirements
# change (the stamp .key-<hash> inside names them). About 150 MB.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
PY=${PYTHON:-python3.11}
command -v "$PY" >/dev/null || PY=python3
key=$( (cat "$root/requirements/tools.txt"; "$PY" -c 'import sys; print(sys.version)') | sha256sum | cut -c1-16)
venv=${PB_CACHE:-$root}/.venv-tools
if [ ! -f "$venv/.key-$key" ]; then
  rm -rf "$venv"
  mkdir -p "$(dirname "$venv")"
  echo "tools: creating $venv from requirements/tools.txt (build, ruff, mypy, mkdocs; about 150 MB, a minute)" >&2
  "$PY" -m venv "$venv"
  "$venv/bin/python" -m pip install --progress-bar off -r "$root/requirements/tools.txt" 2>&1 \
    | awk '/^(Collecting|Installing collected|Successfully installed|ERROR)/ {print substr($0, 1, 160); fflush()}' >&2  # pipefail: pip's failure fails here
  touch "$venv/.key-$key"
fi
echo "$venv"
