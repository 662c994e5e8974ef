"""spark-submit entry from a checkout: ``spark-submit spark_jobs/plan_shards.py DATASET_URL --world-size W ...``.

A thin wrapper: the job is ``petastorm_balanced/tools/spark_job.py`` (installed with the package; pip users run
``spark-submit "$(petastorm-balanced spark-job-path)" ...``). This file puts the repository it lives in on
``sys.path`` so that the checkout's package is used without installing it; arguments and exit codes are the job's.
"""
import os
import sys

_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if os.path.isdir(os.path.join(_REPO, "petastorm_balanced")) and _REPO not in sys.path:
    sys.path.insert(0, _REPO)

from petastorm_balanced.tools.spark_job import PROG, main, parse_args  # noqa: E402,F401  (after the path is set)

if __name__ == "__main__":
    sys.exit(main())
