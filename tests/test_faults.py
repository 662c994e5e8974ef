"""Faults: a plan writer killed mid-write (local disk and S3), failing reader workers, stale and corrupt files.

The kill tests run the writer as a real subprocess that pauses at a named step (the test wraps the format module's
file writes in that subprocess; production code has no hook for it), SIGKILL it there, and check that what is left
is never served as a plan, and that re-running planning at the same URL succeeds.
"""
import os
import re
import signal
import subprocess
import sys
import time

import pyarrow.parquet as pq
import pytest

from petastorm_balanced import (
    BalancedIterableDataset,
    PlanError,
    StalePlanError,
    datagen,
    load_plan,
    make_loader,
    plan_shards,
)
from tests.support.jobs import ROOT
from tests.support.stacks import petastorm_only

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning", "ignore::UserWarning")

WORLD, BATCH = 3, 16
# The writer pauses right after the step named in argv[4]: a data file written (``_put`` returned), or for
# ``plan.json.tmp`` the temporary written but not yet renamed into place (``os.replace`` about to run).
WRITER = """
import os, sys, time
from petastorm_balanced import plan_shards
from petastorm_balanced.plan import format as plan_format
step = sys.argv[4]

def pause():
    sys.stderr.write(f"pause after {step}\\n")
    sys.stderr.flush()
    time.sleep(600)

put, replace = plan_format._put, os.replace

def paused_put(filesystem, path, data, atomic=False):
    digest = put(filesystem, path, data, atomic)
    if path.rsplit("/", 1)[-1] == step:
        pause()
    return digest

def paused_replace(source, target):
    if step.endswith(".tmp") and os.path.basename(target) == step[:-4]:
        pause()
    return replace(source, target)

plan_format._put, os.replace = paused_put, paused_replace
plan_shards(sys.argv[1], 3, batch_size=16, seed=int(sys.argv[3]), engine="local", output_url=sys.argv[2])
"""


def _kill_writer_after(step, dataset_url, plan_url, seed, extra_env=None):
    """Start a plan writer, wait until it reports it wrote ``step``, SIGKILL it. Returns the dead process."""
    env = dict(os.environ, PYTHONPATH=ROOT, PYTHONWARNINGS="ignore", **(extra_env or {}))
    proc = subprocess.Popen([sys.executable, "-c", WRITER, dataset_url, plan_url, str(seed), step], env=env, cwd=ROOT,
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
    s3.upload(plain_dataset.path, "ds")
    # One step (each writer costs ~3 s of interpreter start here); the local test covers every step.
    _check_kill_points(s3.join("ds"), s3.join("plan"), ["assignment.parquet"])
    assert not [k for k in s3.keys("plan") if k.endswith(".tmp")]  # object stores publish each PUT whole


# --- reader faults -------------------------------------------------------------------------------------------------

RANKS = 2
THREAD_DEADLINE_S = 5  # a failing worker must surface within seconds, never hang
PROCESS_DEADLINE_S = 60  # includes Petastorm's process pool start (~8-12 s on 2 busy cores)


@pytest.fixture
def small(tmp_path):
    """A fresh small dataset (this test damages it) and its plan, saved and in memory."""
    info = datagen.make_plain_dataset(tmp_path / "ds", num_files=3, total_rows=600, seed=4)
    plan = plan_shards(info.url, RANKS, batch_size=8, engine="local", output_url=str(tmp_path / "plan"))
    return info, plan, str(tmp_path / "plan")


def _owner(plan, path, row_group):
    """The rank whose epoch-0 assignment reads that row group."""
    return next(r for r in range(RANKS) if any((f.path, f.row_group) == (path, row_group)
                                               for f in plan.assignment(r, world_size=RANKS)))


def _overwrite(file_path, start, stop, byte=0xFF):
    """Same size, different bytes, the old modification time (bit rot, not a rewrite): invisible to a listing
    (path, size, mtime), so only reading can find it."""
    before = os.stat(file_path)
    with open(file_path, "r+b") as handle:
        handle.seek(start)
        handle.write(bytes([byte]) * (stop - start))
    os.utime(file_path, ns=(before.st_atime_ns, before.st_mtime_ns))


def _corrupt_row_group(file_path, row_group):
    chunk = pq.ParquetFile(file_path).metadata.row_group(row_group).column(0)
    start = chunk.dictionary_page_offset or chunk.data_page_offset
    _overwrite(file_path, start, start + chunk.total_compressed_size)


def _epoch(plan, rank, **kw):
    kw.setdefault("workers_count", 2)
    return [b["id"].numpy() for b in make_loader(rank, RANKS, plan=plan, **kw)]


@pytest.mark.parametrize("pool", ["thread", pytest.param("process", marks=petastorm_only)])
def test_corrupt_row_group_fails_that_rank_quickly_naming_file_and_row_group(small, pool):
    info, plan, plan_url = small
    victim = plan.catalog.row_groups[len(plan.catalog.row_groups) // 2]
    _corrupt_row_group(os.path.join(info.path, victim.path), victim.row_group)
    plan = load_plan(plan_url)  # same sizes: the listing check cannot see it
    rank = _owner(plan, victim.path, victim.row_group)
    start = time.monotonic()
    with pytest.raises(OSError) as caught:
        _epoch(plan, rank, reader_pool_type=pool, workers_count=2 if pool == "thread" else 1)
    elapsed = time.monotonic() - start
    assert elapsed < (THREAD_DEADLINE_S if pool == "thread" else PROCESS_DEADLINE_S), elapsed
    message = str(caught.value)
    assert repr(victim.path) in message and f"row group {victim.row_group}" in message, message
    if pool == "thread":  # the other rank never reads it and finishes its epoch (one process-pool start is enough)
        other = _epoch(plan, 1 - rank, reader_pool_type=pool)
        assert len(other) == plan.steps_per_epoch()


def test_corrupt_row_group_in_a_dataloader_worker_names_file_and_row_group(small):
    torch = pytest.importorskip("torch")
    info, plan, _ = small
    victim = plan.catalog.row_groups[0]
    _corrupt_row_group(os.path.join(info.path, victim.path), victim.row_group)
    rank = _owner(plan, victim.path, victim.row_group)
    dataset = BalancedIterableDataset(plan, rank, RANKS, batch_size=8)
    start = time.monotonic()
    batches = iter(torch.utils.data.DataLoader(dataset, batch_size=None, num_workers=2))
    try:
        with pytest.raises(Exception) as caught:  # torch re-raises the worker's error in the main process
            for _ in batches:
                pass
    finally:  # the other worker stopped now, not by a later test's garbage collection
        batches._shutdown_workers()
    assert time.monotonic() - start < PROCESS_DEADLINE_S
    assert repr(victim.path) in str(caught.value) and f"row group {victim.row_group}" in str(caught.value)


@pytest.mark.parametrize("given", ["plan object", "plan URL"])
@pytest.mark.parametrize("change", ["deleted", "rewritten", "truncated"])
def test_file_changed_after_planning_is_a_stale_plan(small, change, given):
    info, plan, plan_url = small
    victim = next(f for f in plan.catalog.files if f.row_group_rows)
    path = os.path.join(info.path, victim.path)
    if change == "deleted":
        os.remove(path)
    elif change == "rewritten":  # same rows, other row groups
        table = pq.read_table(path)
        pq.write_table(table, path, row_group_size=max(1, table.num_rows // 3))
    else:
        with open(path, "r+b") as handle:
            handle.truncate(victim.size // 2)
    with pytest.raises(StalePlanError, match=re.escape(repr(victim.path))):
        for rank in range(RANKS):
            _epoch(plan if given == "plan object" else plan_url, rank)


@pytest.mark.parametrize("given", ["plan object", "plan URL"])
def test_corrupt_footer_is_a_clear_error_naming_the_file(small, given):
    info, plan, plan_url = small
    victim = plan.catalog.files[-1]
    path = os.path.join(info.path, victim.path)
    with open(path, "rb") as handle:
        handle.seek(-8, os.SEEK_END)
        footer = int.from_bytes(handle.read(4), "little")
    _overwrite(path, victim.size - 8 - footer, victim.size - 8, byte=0xAB)
    with pytest.raises(OSError, match=re.escape(repr(victim.path)) + ".*not a readable Parquet file"):
        _epoch(plan if given == "plan object" else plan_url, 0)
