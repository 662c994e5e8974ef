"""s3:// datasets and plans against a real S3 protocol server (moto_server on 127.0.0.1, see
tests/support/s3_server.py).

Planning and the Arrow backend go through ``pyarrow.fs.S3FileSystem`` (fs.resolve); Petastorm reads through
``remote.S3FSWrapper`` (petastorm stack only). All must see exactly what they see on local disk for the same files.
"""
import json
import os
import pickle
import subprocess
import sys
from dataclasses import replace

import numpy as np
import pyarrow.parquet as pq
import pytest

from petastorm_balanced import BalancedIterableDataset, StalePlanError, load_plan, make_loader, plan_shards
from petastorm_balanced.predicates import in_set
from tests.support.jobs import ROOT
from tests.support.stacks import HAVE_PETASTORM, petastorm_only

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning", "ignore::UserWarning")

WORLD, BATCH = 3, 16


@pytest.fixture
def plain_on_s3(s3, plain_dataset):
    s3.upload(plain_dataset.path, "plain")
    return s3.join("plain")


def _same_catalog(a, b):
    # relative paths, sizes, row group sizes, footer digests; not modification times (an upload sets new ones) nor
    # content fingerprints (an object store's ETag: a local plan records none)
    def timeless(files):
        return [replace(f, mtime_ns=None, content="") for f in files]
    assert timeless(a.catalog.files) == timeless(b.catalog.files)
    assert all(f.content.startswith("etag:") for plan in (a, b) for f in plan.catalog.files
               if plan.dataset_url.startswith("s3"))
    assert a.catalog.row_groups == b.catalog.row_groups
    assert a.dataset_fingerprint == b.dataset_fingerprint
    for epoch in (0, 1):
        pa_, pb_ = a.pieces(epoch=epoch), b.pieces(epoch=epoch)
        for name in ("rank", "worker", "catalog_row", "start", "stop", "padding"):
            assert np.array_equal(getattr(pa_, name), getattr(pb_, name)), name


def test_plan_s3_dataset_equals_local_plan_and_round_trips_through_s3(s3, plain_on_s3, plain_dataset):
    local = plan_shards(plain_dataset.url, WORLD, batch_size=BATCH, engine="local")
    remote_plan = plan_shards(plain_on_s3, WORLD, batch_size=BATCH, engine="local", output_url=s3.join("plan"))
    assert remote_plan.dataset_url == plain_on_s3
    _same_catalog(remote_plan, local)
    assert {"plan.json", "catalog.parquet", "assignment.parquet"} <= {k.rsplit("/", 1)[1] for k in s3.keys("plan")}
    loaded = load_plan(s3.join("plan"))  # also lists the S3 dataset against the plan (check_dataset=True)
    assert loaded.checksum == remote_plan.checksum


def test_endpoint_in_url_query_works_without_environment(s3, plain_on_s3, plain_dataset, monkeypatch):
    monkeypatch.delenv("AWS_ENDPOINT_URL")
    query = f"?endpoint_override={s3.server.host_port}&scheme=http"
    plan = plan_shards(plain_on_s3 + query, WORLD, batch_size=BATCH, engine="local",
                       output_url=s3.join("plan") + query)
    _same_catalog(plan, plan_shards(plain_dataset.url, WORLD, batch_size=BATCH, engine="local"))
    assert load_plan(s3.join("plan") + query).checksum == plan.checksum
    if not HAVE_PETASTORM:
        return
    from petastorm_balanced.io import remote
    source = remote.petastorm_source(plain_on_s3 + query)
    assert "?" not in source.url and source.path == plain_on_s3[len("s3://"):]
    assert remote.endpoint_url(plain_on_s3 + query) == s3.server.endpoint


def test_predicate_plan_and_hive_partitions_on_s3_equal_local(s3, hive_dataset):
    s3.upload(hive_dataset.path, "hive")
    predicate = in_set({"en"}, "lang")
    local = plan_shards(hive_dataset.url, WORLD, batch_size=BATCH, engine="local", predicate=predicate)
    on_s3 = plan_shards(s3.join("hive"), WORLD, batch_size=BATCH, engine="local", predicate=predicate)
    assert on_s3.catalog.partition_columns == local.catalog.partition_columns == ("year",)
    assert 0 < on_s3.total_rows < hive_dataset.num_rows
    _same_catalog(on_s3, local)
    assert on_s3.predicate == local.predicate


def test_stale_s3_dataset_is_refused(s3, plain_on_s3):
    plan = plan_shards(plain_on_s3, WORLD, batch_size=BATCH, engine="local", output_url=s3.join("plan"))
    victim = next(f for f in plan.catalog.files if f.row_group_rows)
    client, key = s3.server.client(), plain_on_s3.split("/", 3)[3] + "/" + victim.path
    body = client.get_object(Bucket=s3.server.bucket, Key=key)["Body"].read()
    client.put_object(Bucket=s3.server.bucket, Key=key, Body=body + b"\0")  # rewritten: size changed
    with pytest.raises(StalePlanError, match=victim.path):
        load_plan(s3.join("plan"))
    client.delete_object(Bucket=s3.server.bucket, Key=key)
    with pytest.raises(StalePlanError, match="removed"):
        load_plan(s3.join("plan"))


def test_missing_s3_dataset_is_a_clear_value_error(s3):
    with pytest.raises(ValueError, match="does not exist"):
        plan_shards(s3.join("nothing-here"), WORLD, batch_size=BATCH, engine="local")


@petastorm_only
def test_petastorm_reads_s3_through_the_wrapper(s3, petastorm_dataset, hive_dataset):
    """Petastorm 0.12.1 lists and reads S3 with remote.petastorm_source (it cannot with pyarrow.fs or bare s3fs)."""
    from petastorm import make_batch_reader, make_reader

    from petastorm_balanced.io import remote
    s3.upload(petastorm_dataset.path, "pet")
    s3.upload(hive_dataset.path, "hive")
    source = remote.petastorm_source(s3.join("pet"))
    with make_reader(source.url, filesystem=source.filesystem, num_epochs=1, workers_count=2,
                     schema_fields=["id", "vec"]) as reader:
        rows = [(r.id, r.vec) for r in reader]
    assert sorted(r[0] for r in rows) == list(range(petastorm_dataset.num_rows))
    assert all(v.shape == (4,) for _, v in rows)  # codec-decoded, so _common_metadata was read from S3
    source = remote.petastorm_source(s3.join("hive"))
    with make_batch_reader(source.url, filesystem=source.filesystem, num_epochs=1, workers_count=2) as reader:
        ids = np.concatenate([b.id for b in reader])
    expected = pq.read_table(hive_dataset.path, columns=["id"]).column("id").to_numpy()
    assert np.array_equal(np.sort(ids), np.sort(expected))


@petastorm_only
def test_wrapper_lists_like_the_local_disk(s3, hive_dataset):
    from petastorm_balanced.io import remote
    s3.upload(hive_dataset.path, "hive")
    wrapper = remote.petastorm_source(s3.join("hive")).filesystem
    root = s3.join("hive")[len("s3://"):]
    listed = sorted(os.path.relpath(os.path.join(d, f), root) for d, _, fs in wrapper.walk(root) for f in fs)
    local = sorted(os.path.relpath(os.path.join(d, f), hive_dataset.path)
                   for d, _, fs in os.walk(hive_dataset.path) for f in fs)
    assert listed == local
    assert wrapper.isdir(root) and not wrapper.isfile(root)
    assert wrapper.isfile(f"{root}/{listed[-1]}") and not wrapper.isdir(f"{root}/{listed[-1]}")
    again = pickle.loads(pickle.dumps(wrapper))  # Petastorm's process pool ships the filesystem to workers
    assert sorted(again.ls(root)) == sorted(wrapper.ls(root))


def _check_epoch(plan, batches_by_rank, world):
    """G1 and G2 (drop) on the rows themselves."""
    from petastorm_balanced.tools.coverage import coverage_check, steps_check
    ids = [np.concatenate(b) for b in batches_by_rank]
    checks = [steps_check([[len(x) for x in b] for b in batches_by_rank], steps=plan.steps_per_epoch(world),
                          batch_size=plan.batch_size, name="G1"),
              coverage_check(ids, [np.zeros(len(i), bool) for i in ids], expected=plan.total_rows, policy="drop",
                             global_batch=world * plan.batch_size, name="G2")]
    assert all(c.ok for c in checks), "; ".join(c.line() for c in checks)


@pytest.mark.parametrize("backend", ["arrow", pytest.param("petastorm", marks=petastorm_only)])
def test_loader_reads_an_s3_plan_on_every_rank(s3, plain_on_s3, backend):
    plan_shards(plain_on_s3, WORLD, batch_size=BATCH, engine="local", output_url=s3.join("plan"))
    plan = load_plan(s3.join("plan"))
    batches = [[b["id"].numpy() for b in make_loader(rank, WORLD, plan=s3.join("plan"), workers_count=2,
                                                     backend=backend)]
               for rank in range(WORLD)]
    _check_epoch(plan, batches, WORLD)


@petastorm_only
def test_process_pool_and_dataloader_workers_read_s3(s3, petastorm_dataset):
    """The S3 filesystem crosses process boundaries: Petastorm's process pool, torch DataLoader workers."""
    torch = pytest.importorskip("torch")
    s3.upload(petastorm_dataset.path, "pet")
    plan = plan_shards(s3.join("pet"), 2, batch_size=BATCH, engine="local")
    by_pool = [b["id"].numpy() for b in make_loader(0, 2, plan=plan, reader_pool_type="process", workers_count=1,
                                                    schema_fields=["id", "vec"])]
    by_thread = [b["id"].numpy() for b in make_loader(0, 2, plan=plan, schema_fields=["id", "vec"])]
    assert [list(b) for b in by_pool] == [list(b) for b in by_thread]  # G4 across pool types, on S3
    dataset = BalancedIterableDataset(plan, 1, 2, batch_size=BATCH, schema_fields=["id", "vec"])
    rank1 = [b["id"].numpy() for b in torch.utils.data.DataLoader(dataset, batch_size=None, num_workers=2,
                                                                   timeout=60)]
    _check_epoch(plan, [by_pool, rank1], 2)


def test_cli_plans_and_inspects_on_s3(s3, plain_on_s3):
    repo = str(ROOT)
    # Both commands in one process, leaving as the console entry (cli.run) does: flushed, then os._exit, since
    # pyarrow's S3 threads can abort interpreter teardown after the answer is out (seen on pyarrow 26 here).
    script = ("import os, sys; from petastorm_balanced.tools.cli import main; "
              "rc = main(sys.argv[1:5] + ['--world-size', '3', '--batch-size', '16', '--engine', 'local']); "
              "rc = rc or main(['inspect', sys.argv[4], '--json']); sys.stdout.flush(); sys.stderr.flush(); "
              "os._exit(rc)")
    done = subprocess.run([sys.executable, "-c", script, "plan", plain_on_s3, "--output", s3.join("plan")],
                          cwd=repo, env=dict(os.environ, PYTHONPATH=repo, PYTHONWARNINGS="ignore"),
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(done.stdout[done.stdout.index("{"):])
    plan = load_plan(s3.join("plan"))
    assert plan.dataset_url == plain_on_s3 and plan.world_size == 3
    assert report["dataset_url"] == plain_on_s3 and report["plan_url"] == s3.join("plan")
    assert [r["steps"] for r in report["ranks"]] == [plan.steps_per_epoch()] * 3


def test_spark_engine_plans_an_s3_dataset_like_the_local_engine(spark, s3, plain_on_s3, plain_dataset):
    """G8 on S3: the Spark engine lists and reads footers through pyarrow on the driver, so no S3A jar is needed."""
    on_s3 = plan_shards(plain_on_s3, WORLD, batch_size=BATCH, engine="spark", spark=spark)
    _same_catalog(on_s3, plan_shards(plain_dataset.url, WORLD, batch_size=BATCH, engine="local"))
    assert on_s3.checksum == plan_shards(plain_on_s3, WORLD, batch_size=BATCH, engine="local").checksum


def test_spark_where_on_s3_says_what_to_install(spark, s3, plain_on_s3):
    """where= makes Spark read the data, through Hadoop's S3A; pyspark's wheel has no S3A jar (offline here)."""
    try:
        plan = plan_shards(plain_on_s3, WORLD, batch_size=BATCH, where="lang = 'en'", engine="spark", spark=spark)
    except ImportError as exc:
        assert "hadoop-aws" in str(exc) and "engine='local'" in str(exc)
    else:  # a Spark with S3A configured for this endpoint: then it must agree with the local engine
        local = plan_shards(plain_on_s3, WORLD, batch_size=BATCH, engine="local", predicate=in_set({"en"}, "lang"))
        assert plan.catalog.row_groups == local.catalog.row_groups
