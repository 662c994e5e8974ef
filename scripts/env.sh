# Source me: the environment Spark and torchrun need when run from the venv.
_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
. "$_root/.venv/bin/activate"
export PYSPARK_PYTHON="$_root/.venv/bin/python" PYSPARK_DRIVER_PYTHON="$_root/.venv/bin/python"
export SPARK_LOCAL_IP=127.0.0.1
unset _root
