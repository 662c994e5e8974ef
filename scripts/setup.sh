#!/usr/bin/env bash
# Create .venv (if needed) with the pinned stack and this package in editable mode. Safe to run again.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3.11}
command -v "$PY" >/dev/null || PY=python3
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
. .venv/bin/activate
stamp=.venv/.pins-$(cat requirements/pins.txt requirements/test.txt setup.cfg | sha256sum | cut -c1-16)
if [ ! -f "$stamp" ]; then
  python -m pip install -q --upgrade pip wheel setuptools
  python -m pip install -q -r requirements/pins.txt -r requirements/test.txt
  python -m pip install -q --no-deps -e .
  touch "$stamp"
fi
java -version >/dev/null 2>&1 || { echo "setup: Java 17 is needed by Spark (apt-get install openjdk-17-jre-headless)" >&2; exit 2; }
