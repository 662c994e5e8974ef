"""TensorFlow and Keras (petastorm_balanced.tf): the loader's batches, epochs and resume through tf.data.

The oracle for what a rank trains on is ``make_loader(..., batch_format="numpy")`` itself (checked against
``pyarrow.dataset`` elsewhere): the real two-worker ``MultiWorkerMirroredStrategy`` job on 127.0.0.1 must train on
exactly its batches, epoch after epoch, also when it is interrupted and restarted from Keras' ``BackupAndRestore``.
"""
import json
import os
import subprocess
import sys
import time

import numpy as np
import pytest

from petastorm_balanced import datagen, make_loader, plan_shards
from petastorm_balanced.errors import InvalidValueError
from tests.support.jobs import ROOT, free_port, job_env

pytestmark = [pytest.mark.slow, pytest.mark.stack]
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
tf = pytest.importorskip("tensorflow")

JOB = ROOT / "tests" / "support" / "tf_job.py"
BATCH = 8


@pytest.fixture(scope="module")
def plan(tmp_path_factory):
    info = datagen.make_plain_dataset(tmp_path_factory.mktemp("tf") / "ds", num_files=3, total_rows=240, seed=4)
    url = (tmp_path_factory.mktemp("tfplan") / "plan").as_uri()
    return plan_shards(info.url, 2, batch_size=BATCH, engine="local", output_url=url), url


def oracle(plan, rank, epochs, **kwargs):
    loader = make_loader(rank, 2, plan=plan, batch_format="numpy", **kwargs)
    return [[b["id"].tolist() for b in loader] for _ in range(epochs)]


def test_dataset_spec_cardinality_epochs_and_checkpoint(plan, tmp_path):
    from petastorm_balanced.tf import make_tf_dataset
    plan, _ = plan
    ds = make_tf_dataset(0, 2, plan=plan, shuffle_window=32)
    steps = plan.steps_per_epoch(2)
    assert int(ds.cardinality()) == steps == len(ds.position)
    assert ds.element_spec["id"] == tf.TensorSpec((BATCH,), tf.int64)
    assert ds.element_spec["text"] == tf.TensorSpec((BATCH,), tf.string)
    expected = oracle(plan, 0, 3, shuffle_window=32)
    first = [b["id"].numpy().tolist() for b in ds]
    assert first == expected[0]
    text = next(iter(make_tf_dataset(0, 2, plan=plan, shuffle_window=32)))["text"].numpy()
    assert text.dtype == object and isinstance(text[0], bytes)
    # a plain loop reads nothing ahead: checkpoint mid-epoch, restore into a new dataset, continue exactly
    it = iter(ds)
    got = [next(it)["id"].numpy().tolist() for _ in range(3)]
    assert got == expected[1][:3]
    checkpoint = tf.train.Checkpoint(data=ds.position)
    path = checkpoint.save(str(tmp_path / "ckpt"))
    fresh = make_tf_dataset(0, 2, plan=plan, shuffle_window=32)
    tf.train.Checkpoint(data=fresh.position).restore(path).assert_consumed()
    assert fresh.position.steps_left() == steps - 3
    assert [b["id"].numpy().tolist() for b in fresh.take(steps - 3)] == expected[1][3:]
    assert [b["id"].numpy().tolist() for b in fresh] == expected[2]  # the next pass: the next epoch


def test_what_tensorflow_cannot_hold_is_refused(plan):
    from petastorm_balanced.tf import make_tf_dataset
    plan, _ = plan
    with pytest.raises(InvalidValueError, match="batch_format='torch' is not accepted here"):
        make_tf_dataset(0, 2, plan=plan, batch_format="torch")


def run_workers(plan_url, out, backup, epochs, interrupt):
    port = free_port()
    while port + 1 > 65535:  # two consecutive ports
        port = free_port()
    procs = [subprocess.Popen([sys.executable, str(JOB), str(rank), str(port), plan_url,
                               str(out), str(backup), str(epochs), str(interrupt)], cwd=ROOT, env=job_env(),
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for rank in range(2)]
    outputs = []
    started = time.monotonic()
    for proc in procs:
        try:
            outputs.append(proc.communicate(timeout=max(10, 540 - (time.monotonic() - started)))[0])
        except subprocess.TimeoutExpired:
            for p in procs:
                p.kill()
            raise
    for proc, output in zip(procs, outputs, strict=True):
        assert proc.returncode == 0, output[-5000:]
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]


@pytest.mark.timeout(1200)  # two jobs of two TensorFlow processes each: minutes on a loaded 2-core machine
def test_keras_fit_under_multi_worker_mirrored_strategy_resumes_exactly(plan, tmp_path):
    """Two workers on 127.0.0.1: equal steps, no row twice in an epoch, the loader's own batches; interrupted in the
    second epoch and restarted, the job trains on exactly the batches it had not trained on."""
    pytest.importorskip("tf_keras")
    plan, url = plan
    epochs, steps = 2, plan.steps_per_epoch(2)
    interrupt = steps + 2  # the third step of the second epoch
    backup = tmp_path / "backup"
    (tmp_path / "a").mkdir()
    first = run_workers(url, tmp_path / "a", backup, epochs, interrupt)
    assert [r["status"] for r in first] == ["interrupted"] * 2
    (tmp_path / "b").mkdir()
    second = run_workers(url, tmp_path / "b", backup, epochs, -1)
    assert [r["status"] for r in second] == ["done"] * 2
    for rank in range(2):
        expected = [ids for epoch in oracle(plan, rank, epochs, shuffle_window=64, schema_fields=["id", "value"])
                    for ids in epoch]
        assert first[rank]["steps_per_epoch"] == steps
        assert first[rank]["ids"] == expected[:interrupt + 1]
        assert second[rank]["ids"] == expected[interrupt + 1:]
    for epoch in range(epochs):
        rows = [i for r in range(2) for ids in (first[r]["ids"] + second[r]["ids"])[epoch * steps:(epoch + 1) * steps]
                for i in ids]
        assert len(rows) == len(set(rows)) == 2 * steps * BATCH
    assert np.intersect1d(first[0]["ids"][0], first[1]["ids"][0]).size == 0
