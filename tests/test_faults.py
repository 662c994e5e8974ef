"""Faults: a plan writer killed mid-write (local disk and S3), failing reader workers, stale and corrupt files.

The kill tests run the writer as a real subprocess that pauses at a named step (the test-only hook
``PETASTORM_BALANCED_TEST_PAUSE_AFTER`` in plan_format.py), SIGKILL it there, and check that what is left is never
served as a plan, and that re-running planning at the same URL succeeds.
"""
import os
import signal
import subprocess
import sys

import pytest

from petastorm_balanced import PlanError, load_plan, plan_shards, remote
from petastorm_balanced.plan_format import TEST_PAUSE_ENV
from tests.s3_server import s3, s3_server  # noqa: F401 - fixtures

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning", "ignore::UserWarning")

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WORLD, BATCH = 3, 16
WRITER = ("import sys; from petastorm_balanced import plan_shards; "
          "plan_shards(sys.argv[1], 3, batch_size=16, seed=int(sys.argv[3]), engine='local', output_url=sys.argv[2])")


def _kill_writer_after(step, dataset_url, plan_url, seed, extra_env=None):
    """Start a plan writer, wait until it reports it wrote ``step``, SIGKILL it. Returns the dead process."""
    env = dict(os.environ, PYTHONPATH=REPO, PYTHONWARNINGS="ignore", **{TEST_PAUSE_ENV: step}, **(extra_env or {}))
    proc = subprocess.Popen([sys.executable, "-c", WRITER, dataset_url, plan_url, str(seed)], env=env, cwd=REPO,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    seen = []
    try:
        for line in proc.stderr:  # EOF if the writer dies before the pause: the assert below reports it
            seen.append(line)
            if f"pause after {step}" in line:
                break
        assert proc.poll() is None, f"writer exited before pausing after {step}: {''.join(seen)[-2000:]}"
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=30)
        proc.stderr.close()
    assert proc.returncode == -signal.SIGKILL
    return proc


def _check_kill_points(dataset_url, plan_url, steps):
    """For each step: an older valid plan at ``plan_url``, a writer killed after ``step``, nothing loadable,
    then a re-run that gives a plan equal to one made in-process."""
    previous = plan_shards(dataset_url, WORLD, batch_size=BATCH, seed=0, engine="local", output_url=plan_url)
    for i, step in enumerate(steps, start=1):
        _kill_writer_after(step, dataset_url, plan_url, seed=i)
        with pytest.raises(PlanError, match="re-run planning"):
            load_plan(plan_url)  # neither the killed plan nor a mix of it with the older one
        rerun = plan_shards(dataset_url, WORLD, batch_size=BATCH, seed=i, engine="local", output_url=plan_url)
        loaded = load_plan(plan_url)
        assert loaded.checksum == rerun.checksum != previous.checksum and loaded.seed == i
        previous = rerun


def test_local_plan_write_killed_at_each_step_is_never_loadable(plain_dataset, tmp_path):
    _check_kill_points(plain_dataset.url, str(tmp_path / "plan"),
                       ["catalog.parquet", "assignment.parquet", "plan.json.tmp"])
    leftovers = [n for n in os.listdir(tmp_path / "plan") if n.endswith(".tmp")]
    assert len(leftovers) == 1  # the killed plan.json temporary: never read, harmless


def test_s3_plan_write_killed_at_each_step_is_never_loadable(s3, plain_dataset):
    remote.upload_folder(plain_dataset.path, s3.join("ds"))
    # One step (each writer costs ~3 s of interpreter start here); the local test covers every step.
    _check_kill_points(s3.join("ds"), s3.join("plan"), ["assignment.parquet"])
    assert not [k for k in s3.keys("plan") if k.endswith(".tmp")]  # object stores publish each PUT whole
