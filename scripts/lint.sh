#!/usr/bin/env bash
# Lint and types: ruff (rules in pyproject.toml [tool.ruff]) over the repository, mypy ([tool.mypy]) over the package,
# type-checked against a stack's python so that pyarrow, numpy and torch resolve. Tools: scripts/tools_venv.sh.
#   scripts/lint.sh                 report; exit 0 even with findings unless PB_LINT_STRICT=1
#   PB_LINT_STRICT=1 scripts/lint.sh   exit 1 on any finding (CI once the package is clean)
set -uo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
tools=$(./scripts/tools_venv.sh) || exit 2
stack_python=${PB_LINT_PYTHON:-}
if [ -z "$stack_python" ]; then
  for candidate in .venv/bin/python .venv-modern/bin/python; do
    [ -x "$candidate" ] && { stack_python=$PWD/$candidate; break; }
  done
fi
status=0
echo "== lint: ruff check ($("$tools/bin/ruff" --version))"
"$tools/bin/ruff" check --statistics . || status=1
echo "== lint: mypy petastorm_balanced ($("$tools/bin/mypy" --version))"
"$tools/bin/mypy" ${stack_python:+--python-executable "$stack_python"} petastorm_balanced | tail -n 25 || status=1
if [ $status -ne 0 ]; then
  if [ "${PB_LINT_STRICT:-0}" = 1 ]; then
    echo "lint: findings above (PB_LINT_STRICT=1: failing)"; exit 1
  fi
  echo "lint: findings above (not failing: set PB_LINT_STRICT=1 to make them fail)"
fi
exit 0
