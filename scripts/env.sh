# Source me: the environment Spark and torchrun need when run from a stack's venv.
#   PB_STACK=modern . scripts/env.sh   (default: petastorm, the .venv)
_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
if [ "${PB_STACK:-petastorm}" = modern ]; then _venv="$_root/.venv-modern"; else _venv="$_root/.venv"; fi
. "$_venv/bin/activate"
export PYSPARK_PYTHON="$_venv/bin/python" PYSPARK_DRIVER_PYTHON="$_venv/bin/python"
export SPARK_LOCAL_IP=127.0.0.1
unset _root _venv
