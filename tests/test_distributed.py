"""End to end: real torchrun jobs (gloo) and real Horovod-environment processes over balanced plans.

Each job trains or reads a skewed dataset filtered by ``lang == 'en'``; the tests compare what every rank
delivered with the dataset itself: equal steps (G1), no row twice and fewer than ``world * batch_size`` left out
(G2, policy drop) or every row delivered (policy pad), for a plan used at its own world size and at another (G9).
"""
import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from petastorm_balanced import datagen, plan_shards
from jobs import free_port, job_env

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
BATCH = 16
EPOCHS = 2
JOB_TIMEOUT = 240  # seconds for one whole job; a hang shows up as the process-group timeout well before this


def en_predicate():
    from petastorm.predicates import in_lambda
    return in_lambda(["lang"], lambda lang: lang == "en")


@pytest.fixture(scope="module")
def skewed(tmp_path_factory):
    """A skewed plain dataset (the en share varies 0.05..0.95 by file) and the ids of its 'en' rows."""
    info = datagen.make_plain_dataset(tmp_path_factory.mktemp("dist") / "ds", num_files=8, total_rows=9_000,
                                      seed=5, empty_files=1)
    table = pq.read_table(info.path, columns=["id", "lang"])
    lang = np.asarray(table.column("lang").to_pylist())
    return info, np.sort(table.column("id").to_numpy()[lang == "en"])


def make_plan(info, tmp_path, world_size, policy="drop"):
    url = (tmp_path / f"plan-w{world_size}-{policy}").as_uri()
    return plan_shards(info.url, world_size, predicate=en_predicate(), batch_size=BATCH, policy=policy,
                       engine="local", output_url=url), url


def torchrun(nproc: int, plan_url: str, ids_out: Path):
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={nproc}", "--master_addr",
           "127.0.0.1", "--master_port", str(free_port()), str(EXAMPLES / "train_ddp.py"), "--plan", plan_url,
           "--epochs", str(EPOCHS), "--batch-size", str(BATCH), "--workers", "2", "--pg-timeout", "60",
           "--ids-out", str(ids_out)]
    started = time.monotonic()
    done = subprocess.run(cmd, cwd=ROOT, env=job_env(), capture_output=True, text=True, timeout=JOB_TIMEOUT)
    return done, time.monotonic() - started


def check_delivery(steps, ids, padding, *, expected_steps, matching, world, policy):
    """G1 and G2 for one epoch, against the dataset's own matching ids."""
    assert steps == [expected_steps] * world, f"unequal steps {steps}, expected {expected_steps} on every rank"
    for rank_ids in ids:
        assert len(rank_ids) == expected_steps * BATCH
    all_ids = np.concatenate([np.asarray(i, np.int64) for i in ids])
    flags = np.concatenate([np.asarray(p, bool) for p in padding])
    real = all_ids[~flags]
    assert len(np.unique(real)) == len(real), "a row was delivered twice without a padding flag"
    assert np.isin(all_ids, matching).all(), "a delivered row does not match lang == 'en'"
    missing = np.setdiff1d(matching, real)
    if policy == "drop":
        assert not flags.any()
        assert len(missing) < world * BATCH, f"{len(missing)} matching rows left out (limit {world * BATCH - 1})"
    else:
        assert len(missing) == 0, f"policy pad left out {len(missing)} matching rows"
        assert flags.sum() < world * BATCH and np.isin(all_ids[flags], real).all()
    return set(missing.tolist())


def excerpt(output: str) -> str:
    """The lines that explain a failed job (its checks and the ranks' errors), then its tail."""
    keep = [line for line in output.splitlines()
            if line.startswith(("CHECK", "ALL CHECKS", "[rank")) or "Error" in line or "error" in line
            or "Signal" in line or "exitcode" in line]
    return "\n".join(keep[-60:]) + "\n--- tail ---\n" + output[-2000:]


def check_ddp_job(done, ids_out, plan, world, matching):
    output = done.stdout + done.stderr
    assert done.returncode == 0, f"job exited {done.returncode}:\n{excerpt(output)}"
    assert "ALL CHECKS PASSED" in done.stdout and "FAILED" not in done.stdout, excerpt(output)
    expected = plan.steps_per_epoch(world_size=world, batch_size=BATCH)
    for epoch in range(EPOCHS):
        record = json.loads((ids_out / f"epoch{epoch}.json").read_text())
        assert record["world"] == world and record["steps_per_epoch"] == expected
        check_delivery(record["steps"], record["ids"], record["padding"], expected_steps=expected,
                       matching=matching, world=world, policy=plan.policy)
        for rank in range(world):  # every rank logged its own count
            assert f"[rank {rank}] epoch {epoch}: steps={expected} " in done.stdout


def test_torchrun_four_ranks_gloo_equal_steps_and_coverage(skewed, tmp_path):
    info, matching = skewed
    plan, url = make_plan(info, tmp_path, 4)
    done, seconds = torchrun(4, url, tmp_path / "ids")
    check_ddp_job(done, tmp_path / "ids", plan, 4, matching)
    assert seconds < 180, f"4-rank job took {seconds:.0f} s"


def test_plan_for_four_ranks_trains_with_three(skewed, tmp_path):
    """G9 with policy pad: the 4-rank plan serves 3 ranks, and every matching row is delivered each epoch."""
    info, matching = skewed
    plan, url = make_plan(info, tmp_path, 4, policy="pad")
    assert plan.world_size == 4
    done, _ = torchrun(3, url, tmp_path / "ids")
    check_ddp_job(done, tmp_path / "ids", plan, 3, matching)


def test_horovod_environment_ranks_read_balanced_shards(skewed, tmp_path):
    """Two real processes that know their rank only from the environment: rank 0 from Horovod's variables
    (horovodrun), rank 1 from Open MPI's (mpirun), so one job covers both launchers' detection."""
    info, matching = skewed
    plan, url = make_plan(info, tmp_path, 2)
    envs = [{"HOROVOD_RANK": "0", "HOROVOD_SIZE": "2"}, {"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "2"}]
    cmd = [sys.executable, str(EXAMPLES / "train_horovod.py"), "--data-only", "--plan", url, "--epochs",
           str(EPOCHS), "--batch-size", str(BATCH), "--ids-out", str(tmp_path / "ids")]
    procs = [subprocess.Popen(cmd, cwd=ROOT, env=job_env(**env), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True) for env in envs]
    outputs = [p.communicate(timeout=JOB_TIMEOUT)[0] for p in procs]
    for proc, output in zip(procs, outputs):
        assert proc.returncode == 0, excerpt(output)
    records = [json.loads((tmp_path / "ids" / f"rank{r}.json").read_text()) for r in range(2)]
    assert [(r["rank"], r["world"]) for r in records] == [(0, 2), (1, 2)]
    expected = plan.steps_per_epoch(world_size=2, batch_size=BATCH)
    left_out = []
    for epoch in range(EPOCHS):
        per_rank = [r["epochs"][epoch] for r in records]
        left_out.append(check_delivery([e["steps"] for e in per_rank], [e["ids"] for e in per_rank],
                                       [e["padding"] for e in per_rank], expected_steps=expected,
                                       matching=matching, world=2, policy="drop"))
    orders = [r["epochs"][0]["ids"][:BATCH] != r["epochs"][1]["ids"][:BATCH] for r in records]
    assert any(orders), "epoch 1 repeated epoch 0's first batch on every rank (G5: fresh epochs)"
    assert left_out[0] != left_out[1] or not left_out[0], "the same rows were left out in both epochs (G2)"


def test_horovod_training_when_installed(skewed, tmp_path):
    """The real Horovod path (horovodrun with gloo), only where Horovod is installed (docs/distributed.md)."""
    pytest.importorskip("horovod.torch")
    info, matching = skewed
    plan, url = make_plan(info, tmp_path, 2)
    cmd = [sys.executable, "-m", "horovod.runner.launch", "-np", "2", "-H", "localhost:2", "--gloo",
           sys.executable, str(EXAMPLES / "train_horovod.py"), "--plan", url, "--epochs", str(EPOCHS),
           "--batch-size", str(BATCH), "--ids-out", str(tmp_path / "ids")]
    done = subprocess.run(cmd, cwd=ROOT, env=job_env(), capture_output=True, text=True, timeout=JOB_TIMEOUT)
    check_ddp_job(done, tmp_path / "ids", plan, 2, matching)


def test_petastorm_contrast_shows_unequal_steps(skewed, tmp_path):
    """Plain cur_shard/shard_count covers the rows but gives ranks different step counts; the plan does not."""
    info, matching = skewed
    plan, url = make_plan(info, tmp_path, 4)
    cmd = [sys.executable, str(EXAMPLES / "petastorm_imbalance.py"), info.url, "--world-size", "4",
           "--batch-size", str(BATCH), "--lang", "en", "--plan", url, "--json"]
    done = subprocess.run(cmd, cwd=ROOT, env=job_env(), capture_output=True, text=True, timeout=JOB_TIMEOUT)
    assert done.returncode == 0, excerpt(done.stdout + done.stderr)
    report = json.loads(done.stdout.strip().splitlines()[-1])
    rows = [r["rows"] for r in report["ranks"]]
    steps = [r["steps"] for r in report["ranks"]]
    assert sum(rows) == len(matching), "Petastorm sharding should deliver every matching row exactly once"
    assert len(set(steps)) > 1, f"this skewed dataset should shard unevenly under Petastorm, got steps {steps}"
    balanced = report["balanced_steps"]
    assert balanced == plan.steps_per_epoch(world_size=4, batch_size=BATCH)
    assert balanced * 4 * BATCH <= len(matching) < (balanced + 1) * 4 * BATCH  # policy drop: all but < W*B rows


def _load_example(name):
    spec = importlib.util.spec_from_file_location(name, EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(EXAMPLES))
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(EXAMPLES))
    return module


def test_example_checks_catch_broken_epochs():
    """The in-job check must fail on the faults it exists for, or a passing job would prove nothing."""
    check = _load_example("train_ddp").check_epoch
    ids = [np.arange(0, 8), np.arange(8, 16)]
    flags = [np.zeros(8, bool), np.zeros(8, bool)]

    def failed(steps, ids, flags, matching_rows=16, policy="drop"):
        return {name for name, ok, _ in check(steps, 2, ids, flags, matching_rows=matching_rows, batch_size=4,
                                              policy=policy) if not ok}

    assert failed([2, 2], ids, flags) == set()
    assert "equal steps" in failed([2, 1], [ids[0], ids[1][:4]], [flags[0], flags[1][:4]])
    assert "no id twice" in failed([2, 2], [ids[0], ids[0]], flags)
    assert "coverage" in failed([2, 2], ids, flags, matching_rows=24)  # 8 left out, limit is 2 * 4 - 1
    assert "coverage" in failed([2, 2], ids, flags, matching_rows=17, policy="pad")
    padded = [np.r_[np.arange(0, 7), 99], np.arange(8, 16)]
    assert "padding repeats delivered rows" in failed([2, 2], padded, [np.r_[np.zeros(7, bool), True], flags[1]],
                                                      matching_rows=15, policy="pad")
