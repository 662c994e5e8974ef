#!/usr/bin/env bash
# The "as a user" tier: what a pip user gets must work as the README says.
#   1. build the sdist and, from it, the wheel (python -m build) out of a clean copy of the clone
#   2. install the wheel into a fresh venv: torch==2.13.0 first, then the wheel with the README's extras and no
#      other constraint (pip resolves the extras' own bounds); `pip check`
#   3. from a folder outside the clone: the INSTALLED console command (plan, inspect, verify --read), then every
#      code block of README.md and docs/*.md (scripts/doc_blocks.py; a stale example fails), among them the
#      installed planning job under spark-submit (README's "The planning job on a cluster")
#   4. the API reference: mkdocs build --strict (docs/api.md, mkdocstrings)
#   5. docs/frameworks.md's TensorFlow and JAX examples, from the wheel in a second venv (numpy 2, no torch)
# The user venvs live in the checkout, ignored by git: .venv-user (about 1.9 GB) and .venv-frameworks (about 2.3 GB)
# (or under $PB_CACHE), rebuilt when the wheel's requirements or the extras change (the stamp .key-<hash> inside names
# them); a rerun only reinstalls the wheel. scripts/test.sh runs this tier last; PB_USER_TIER=0 skips it there.
#   scripts/user_tier.sh [doc_blocks.py arguments, e.g. --only docs/spark.md:29]
set -euo pipefail
shopt -s inherit_errexit  # a failed install inside $(user_venv ...) stops the tier
root="$(cd "$(dirname "$0")/.." && pwd)"
PY=${PYTHON:-python3.11}
command -v "$PY" >/dev/null || PY=python3
EXTRAS=${PB_USER_EXTRAS:-petastorm,spark,torch,plot,delta}  # delta: docs/tables.md's examples
TORCH=${PB_USER_TORCH:-torch==2.13.0}
TF_CPU=tensorflow-cpu==2.21.0 TF_KERAS=tf-keras==2.21.0  # requirements/tf_jax.txt
cache=${PB_CACHE:-$root}
work=$(mktemp -d "${TMPDIR:-/tmp}/pb-user-tier.XXXXXX")
trap 'rm -rf "$work"' EXIT
t0=$SECONDS
step() { echo "== user tier [$((SECONDS - t0)) s]: $*"; }

tools=$("$root/scripts/tools_venv.sh")
# Everything runs from outside the clone: `python -m pip` puts the current folder on sys.path, and a
# petastorm_balanced.egg-info there would pass for an installed petastorm-balanced (pip would skip the wheel).
cd "$work"

step "build sdist and wheel from a clean copy of the clone"
mkdir -p "$work/src"
(cd "$root" && git ls-files -z -co --exclude-standard | tar --null -T - --ignore-failed-read -cf - 2>/dev/null) \
  | tar -xf - -C "$work/src"
"$tools/bin/python" -m build --outdir "$work/dist" "$work/src" > "$work/build.log" 2>&1 \
  || { tail -30 "$work/build.log"; exit 1; }
wheel=$(ls "$work"/dist/petastorm_balanced-*.whl)
sdist=$(ls "$work"/dist/petastorm_balanced-*.tar.gz)
echo "built $(basename "$sdist") and $(basename "$wheel")"
# The sdist: the Spark job and the licence in, no tests (they need the checkout's conftest and both stacks).
listing=$(tar tzf "$sdist")
grep -q '/petastorm_balanced/tools/spark_job.py$' <<<"$listing" || { echo "sdist lacks the Spark job"; exit 1; }
grep -q '/LICENSE$' <<<"$listing" || { echo "sdist lacks LICENSE"; exit 1; }
if grep -q '/tests/' <<<"$listing"; then echo "sdist ships tests"; exit 1; fi

# A user venv is cached by a key: the wheel's requirements that its install uses (the core and the chosen extras)
# and what is installed before the wheel.
venv_key() {  # venv_key EXTRAS FIRST...
  local extras=$1; shift
  ("$tools/bin/python" - "$wheel" "$extras" <<'EOF'
import re, sys, zipfile
z = zipfile.ZipFile(sys.argv[1])
extras = set(sys.argv[2].split(","))
meta = z.read(next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))).decode()
for line in meta.splitlines():
    extra = re.search(r"extra == ['\"]([^'\"]+)['\"]", line)
    if line.startswith("Requires-Python:") or line.startswith("Requires-Dist:") and (not extra or extra[1] in extras):
        print(line)
EOF
   echo "$extras $*"; "$PY" -c 'import sys; print(sys.version)') | sha256sum | cut -c1-16
}
# user_venv NAME EXTRAS SIZE FIRST... : a fresh venv (kept) that gets FIRST, then the wheel[EXTRAS] (torch's CPU
# build first, as a user picks their torch); the words after a "--no-deps" in FIRST go in without their dependencies.
user_venv() {
  local name=$1 extras=$2 size=$3; shift 3
  local dir=$cache/.venv-$name key; key=$(venv_key "$extras" "$@")
  if [ ! -f "$dir/.key-$key" ]; then
    step "fresh venv $dir ($size on disk, a few minutes): $*, then the wheel[$extras]" >&2
    rm -rf "$dir"; mkdir -p "$cache"
    "$PY" -m venv "$dir"
    pipe() {  # a line per package as pip collects it, then what it installed
      "$dir/bin/python" -m pip install --progress-bar off "$@" 2>&1 \
        | awk '/^(Collecting|Installing collected|Successfully installed|ERROR)/ {print substr($0, 1, 160); fflush()}' >&2
    }
    pipe --upgrade pip
    local first=() nodeps=() word
    for word in "$@"; do
      if [ "$word" = --no-deps ] || [ ${#nodeps[@]} -gt 0 ]; then nodeps+=("$word"); else first+=("$word"); fi
    done
    if [ ${#first[@]} -gt 0 ]; then pipe "${first[@]}"; fi
    if [ ${#nodeps[@]} -gt 0 ]; then pipe "${nodeps[@]}"; fi
    pipe "$wheel[$extras]"
    touch "$dir/.key-$key"
  else
    step "cached venv $dir (same requirements): reinstall this wheel only" >&2
    "$dir/bin/python" -m pip install -q --no-deps --force-reinstall "$wheel" >&2
  fi
  echo "$dir"
}
venv=$(user_venv user "$EXTRAS" "about 1.9 GB" "$TORCH")
"$venv/bin/python" -m pip check
"$venv/bin/python" -m pip list 2>/dev/null | grep -i -E '^(petastorm|petastorm-balanced|pyarrow|numpy|pandas|pyspark|torch) '

step "the installed console command, from outside the clone"
mkdir -p "$work/user"; cd "$work/user"
export PATH="$venv/bin:$PATH" PYSPARK_PYTHON="$venv/bin/python" PYSPARK_DRIVER_PYTHON="$venv/bin/python"
export SPARK_LOCAL_IP=127.0.0.1
unset PYTHONPATH VIRTUAL_ENV
where=$(python -c 'import petastorm_balanced; print(petastorm_balanced.__file__)')
case "$where" in "$venv"/*) ;; *) echo "imported petastorm_balanced from $where, not the wheel"; exit 1 ;; esac
petastorm-balanced --help > /dev/null
python -m petastorm_balanced.datagen reviews --rows 20000 --files 6 > /dev/null
petastorm-balanced plan reviews --world-size 4 --batch-size 64 --engine local --output plan
petastorm-balanced inspect plan --json > inspect.json
petastorm-balanced verify plan --read --epochs 1 | tail -2
step "every code block of README.md and docs/*.md (scripts/doc_blocks.py)"
"$venv/bin/python" "$root/scripts/doc_blocks.py" --bin "$venv/bin" "$@"

step "TensorFlow and JAX examples from the wheel (docs/frameworks.md): a second venv, numpy 2, no torch"
# tensorflow-cpu is the CPU build of the [tf] extra's tensorflow (the same code, what CI's machines can run), and
# tf-keras declares `tensorflow`, so it goes in without its dependencies; the wheel then takes [jax]. Every block of
# frameworks.md must run here: a module that does not import fails the tier instead of skipping the block.
fw=$(user_venv frameworks jax "about 2.3 GB" "$TF_CPU" --no-deps "$TF_KERAS")
"$fw/bin/python" -m pip list 2>/dev/null | grep -i -E '^(petastorm-balanced|pyarrow|numpy|tensorflow.cpu|tf.keras|jax) '
if "$fw/bin/python" -c 'import torch' 2>/dev/null; then echo "torch is in the framework venv"; exit 1; fi
"$fw/bin/python" "$root/scripts/doc_blocks.py" --bin "$fw/bin" --require-needs \
  "$root/docs/frameworks.md"

step "API reference: mkdocs build --strict"
(cd "$root" && "$tools/bin/mkdocs" build --strict --quiet --site-dir "$work/site")
step "done"
