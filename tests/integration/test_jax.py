"""JAX (petastorm_balanced.jax): jax.Arrays from the loader, global batches over two real processes.

The oracle is ``make_loader(..., batch_format="numpy")`` (checked against ``pyarrow.dataset`` elsewhere): two
processes with ``jax.distributed.initialize`` on 127.0.0.1 (CPU) run a jitted step over global batches assembled
from both processes' rows; each must train on exactly its loader's batches, the same number of steps, no row twice
in an epoch, and after stopping mid-epoch and restarting from ``get_state()``, exactly the batches that were left.
"""
import json
import subprocess
import sys
import time

import numpy as np
import pytest

from petastorm_balanced import datagen, make_loader, plan_shards
from petastorm_balanced.errors import InvalidValueError
from tests.support.jobs import ROOT, free_port, job_env

pytestmark = [pytest.mark.slow, pytest.mark.stack]
jax = pytest.importorskip("jax")

JOB = ROOT / "tests" / "support" / "jax_job.py"
BATCH = 8


@pytest.fixture(scope="module")
def plan(tmp_path_factory):
    info = datagen.make_plain_dataset(tmp_path_factory.mktemp("jax") / "ds", num_files=3, total_rows=400, seed=6)
    url = (tmp_path_factory.mktemp("jaxplan") / "plan").as_uri()
    return plan_shards(info.url, 2, batch_size=BATCH, engine="local", output_url=url), url


def oracle(plan, rank, epochs, **kwargs):
    loader = make_loader(rank, 2, plan=plan, batch_format="numpy", **kwargs)
    return [b["id"].tolist() for _ in range(epochs) for b in loader]


@pytest.fixture
def x64():
    jax.config.update("jax_enable_x64", True)
    yield
    jax.config.update("jax_enable_x64", False)


def test_64_bit_columns_need_x64(plan):
    from petastorm_balanced.jax import make_jax_iterator
    plan, _ = plan
    with pytest.raises(InvalidValueError, match=r"columns \['id', 'value'\] are 64-bit, which JAX would silently"):
        make_jax_iterator(0, 2, plan=plan, schema_fields=["id", "value", "label"])
    batch = next(iter(make_jax_iterator(0, 2, plan=plan, schema_fields=["label"])))
    assert batch["label"].dtype == np.int32


def test_single_process_arrays_and_state(plan, x64):
    from petastorm_balanced.jax import make_jax_iterator
    plan, _ = plan
    it = make_jax_iterator(1, 2, plan=plan, shuffle_window=32)
    expected = oracle(plan, 1, 2, shuffle_window=32)
    got = []
    for batch in it:
        assert isinstance(batch["id"], jax.Array) and batch["id"].dtype == np.int64 and isinstance(batch["text"], list)
        got.append(np.asarray(batch["id"]).tolist())
        if len(got) == 5:
            break
    state = it.get_state()
    assert json.loads(json.dumps(state)) == state
    again = make_jax_iterator(1, 2, plan=plan, shuffle_window=32)
    again.set_state(state)
    got += [np.asarray(b["id"]).tolist() for _ in range(2) for b in again]
    assert got == expected  # the rest of epoch 0, then epoch 1


def test_a_sharding_over_other_processes_is_refused(plan, x64):
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    from petastorm_balanced.jax import make_jax_iterator
    plan, _ = plan
    sharding = NamedSharding(Mesh(jax.devices(), ("data",)), PartitionSpec("data"))
    with pytest.raises(InvalidValueError, match="sharding spans the devices of 1 process"):
        make_jax_iterator(0, 2, plan=plan, sharding=sharding)


def run(plan_url, out, stop_after, state_in=None):
    out.mkdir()
    port = free_port()
    procs = []
    for rank in range(2):
        args = [sys.executable, str(JOB), str(rank), str(port), plan_url, str(out),
                str(stop_after)] + ([str(state_in)] if state_in else [])
        procs.append(subprocess.Popen(args, cwd=ROOT, env=job_env(JAX_PLATFORMS="cpu"), stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True))
    started, outputs = time.monotonic(), []
    for proc in procs:
        try:
            outputs.append(proc.communicate(timeout=max(10, 300 - (time.monotonic() - started)))[0])
        except subprocess.TimeoutExpired:
            for p in procs:
                p.kill()
            raise
    for proc, output in zip(procs, outputs, strict=True):
        assert proc.returncode == 0, output[-5000:]
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]


def test_two_processes_global_batches_and_exact_resume(plan, tmp_path):
    plan, url = plan
    steps = plan.steps_per_epoch(2)
    stop = steps + 3  # mid-way through the second epoch
    first = run(url, tmp_path / "a", stop)
    assert first[0]["state"] == first[1]["state"]  # one state for every process
    state = tmp_path / "state.json"
    state.write_text(json.dumps(first[0]["state"]))
    second = run(url, tmp_path / "b", -1, state)
    for rank in range(2):
        got = [s["ids"] for s in first[rank]["steps"] + second[rank]["steps"]]
        assert got == oracle(plan, rank, 2, shuffle_window=64, schema_fields=["id", "value"])
        assert len(first[rank]["steps"]) == stop and len(second[rank]["steps"]) == 2 * steps - stop
    for s0, s1 in zip(first[0]["steps"] + second[0]["steps"], first[1]["steps"] + second[1]["steps"], strict=True):
        assert s0["rows"] == s1["rows"] == 2 * BATCH  # a global batch of both processes' rows
        assert s0["global_mean"] == s1["global_mean"] == pytest.approx(np.mean(s0["ids"] + s1["ids"]))
    for epoch in range(2):
        rows = [i for r in range(2) for s in (first[r]["steps"] + second[r]["steps"])[epoch * steps:(epoch + 1) * steps]
                for i in s["ids"]]
        assert len(rows) == len(set(rows)) == 2 * steps * BATCH
