#!/usr/bin/env bash
# Set up (idempotent) and run the test suite on both supported stacks (what CI runs). Extra arguments go to pytest.
# Disk, all in the checkout and ignored by git: .venv about 3.0 GB, .venv-modern about 4.9 GB, .venv-tools 150 MB,
# and the user tier's .venv-user 1.9 GB and .venv-frameworks 2.3 GB (scripts/user_tier.sh): about 12 GB in all.
# The tests write nothing elsewhere but the system's temporary folder, and remove what they made there.
#   scripts/test.sh                      both stacks: everything on the petastorm stack, then the modern stack
#   PB_STACKS=modern scripts/test.sh -m "not slow"     one stack, the fast tier (daily work, under 3 minutes)
# On the modern stack the slow tests run only where the stack matters (marker `stack`: reading, planning, Spark,
# torchrun); Petastorm-only tests skip there by themselves. The cross-stack test (same plan, same batches on both)
# runs on the modern stack with the petastorm stack's python as the other side.
# Around the suites (scripts/lint.sh first, scripts/user_tier.sh last):
#   PB_LINT=0          skip ruff and mypy (clean: any finding fails the run; PB_LINT_STRICT=0 only reports)
#   PB_USER_TIER=0|1   skip or force the "as a user" tier (build the wheel, fresh venv, console command, every doc
#                      block, mkdocs --strict); by default it runs when no pytest arguments are given (what CI runs)
set -euo pipefail
cd "$(dirname "$0")/.."
stacks=${PB_STACKS:-petastorm modern}
status=0
for stack in $stacks; do
  ./scripts/setup.sh "$stack"
done
if [ "${PB_LINT:-1}" != 0 ]; then
  PB_LINT_STRICT=${PB_LINT_STRICT:-1} ./scripts/lint.sh || status=1
fi
for stack in $stacks; do
  echo "== tests on the $stack stack"
  (
    export PB_STACK=$stack
    . scripts/env.sh
    [ -x .venv/bin/python ] && export PB_PETASTORM_PYTHON=$PWD/.venv/bin/python
    [ -x .venv-modern/bin/python ] && export PB_MODERN_PYTHON=$PWD/.venv-modern/bin/python
    if [ "$stack" = modern ] && [ $# -eq 0 ]; then
      python -m pytest -q -ra -m "not slow or stack"
    else
      python -m pytest -q -ra "$@"
    fi
  ) || status=1
done
if [ "${PB_USER_TIER:-$([ $# -eq 0 ] && echo 1 || echo 0)}" = 1 ]; then
  echo "== the user tier (scripts/user_tier.sh)"
  ./scripts/user_tier.sh || status=1
fi
exit $status
