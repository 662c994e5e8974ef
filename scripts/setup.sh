#!/usr/bin/env bash
# Create a stack's venv (if needed) with its pins and this package in editable mode. Safe to run again.
#   scripts/setup.sh [petastorm|modern]   (default: $PB_STACK, else petastorm)
# petastorm: .venv, requirements/pins.txt (Petastorm 0.12.1, pyarrow 14, numpy 1); the Horovod wheel when present.
# modern:    .venv-modern, requirements/modern.txt (pyarrow 26, numpy 2, pandas 3, pyspark 4.3; no Petastorm).
set -euo pipefail
cd "$(dirname "$0")/.."
stack=${1:-${PB_STACK:-petastorm}}
case "$stack" in
  petastorm) venv=.venv; pins=requirements/pins.txt; size="about 3.0 GB" ;;
  modern) venv=.venv-modern; pins=requirements/modern.txt; size="about 4.9 GB" ;;
  *) echo "setup: unknown stack '$stack' (petastorm or modern)" >&2; exit 2 ;;
esac
PY=${PYTHON:-python3.11}
command -v "$PY" >/dev/null || PY=python3
if [ ! -x "$venv/bin/python" ]; then
  "$PY" -m venv "$venv"
fi
files=()
[ -f requirements/frameworks.txt ] && files+=(requirements/frameworks.txt)
# TensorFlow and JAX on the modern stack only (jax 0.10 needs numpy 2); resolved with the stack's pins and test.txt
# so that numpy, pyarrow, protobuf and torch do not move.
[ "$stack" = modern ] && [ -f requirements/tf_jax.txt ] && files+=(requirements/tf_jax.txt)
extras=()
for f in "${files[@]}"; do extras+=(-r "$f"); done
stamp=$venv/.pins-$(cat "$pins" requirements/test.txt setup.cfg "${files[@]}" scripts/setup.sh | sha256sum | cut -c1-16)
if [ ! -f "$stamp" ]; then
  echo "setup: installing the $stack stack into $venv ($size on disk; a few minutes the first time, then"
  echo "       only when a requirements file changes): $pins requirements/test.txt ${files[*]}"
  # One line per package as pip collects it, then what it installed (its progress bars and resolver chatter off).
  pipe() { "$venv/bin/python" -m pip install --progress-bar off "$@" 2>&1 \
             | awk '/^(Collecting|Installing collected|Successfully installed|ERROR)/ {print substr($0, 1, 160); fflush()}'; }
  pipe --upgrade pip wheel setuptools
  pipe -r "$pins" -r requirements/test.txt "${extras[@]}" -c "$pins"
  if [ "$stack" = modern ]; then  # Keras 2 for MultiWorkerMirroredStrategy; it declares `tensorflow`, the GPU build
    pipe --no-deps tf-keras==2.21.0
  fi
  pipe --no-deps -e .
  echo "setup: $venv ready ($(du -sh "$venv" | cut -f1))"
  rm -f "$venv"/.pins-*
  touch "$stamp"
fi
if [ "$stack" = petastorm ] && [ -x scripts/install_horovod.sh ]; then
  VIRTUAL_ENV=$PWD/$venv PATH=$PWD/$venv/bin:$PATH ./scripts/install_horovod.sh
fi
java -version >/dev/null 2>&1 || { echo "setup: Java 17 is needed by Spark (apt-get install openjdk-17-jre-headless)" >&2; exit 2; }
