"""G15's last line: a file rewritten with other values that keeps its size, its footer's very bytes (written without
statistics, PLAIN, uncompressed) and its modification time is refused by ``load_plan``, ``plan_shards(update=)``,
every reader and the local-disk row group cache: through the store's content fingerprint (S3: the ETag, which a
re-upload within the same second changes while the time does not), or on a local disk through the content digest
the user asks for (``PETASTORM_BALANCED_CONTENT_DIGEST=1``); without it the residual limit is documented."""
import importlib.util
import os
import re

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from petastorm_balanced import PlanUpdateError, StalePlanError, load_plan, make_loader, plan_shards
from petastorm_balanced.io import content
from petastorm_balanced.predicates import in_lambda
from tests.support.jobs import ROOT

BARE = {"compression": "NONE", "use_dictionary": False, "write_statistics": False, "row_group_size": 100}
BELOW = in_lambda(["id"], lambda i: i < 1000)  # every planned row; none of the rewritten ones
BACKENDS = ["arrow"] + (["petastorm"] if importlib.util.find_spec("petastorm") else [])
ROWS = 300


def table(start: int) -> pa.Table:
    ids = np.arange(start, start + ROWS, dtype=np.int64)
    return pa.table({"id": ids, "x": ids * 2})


def footer(data: bytes) -> bytes:
    return data[-8 - int.from_bytes(data[-8:-4], "little"):]


def rewrite_keeping_everything_but_the_values(path) -> None:
    """``path`` (written from ``table(0)``) rewritten with ids 1000..1299: the same size, the same footer bytes, its
    modification time restored (``cp -p``, ``rsync -a``, a restore from backup)."""
    before, stat = open(path, "rb").read(), os.stat(path)
    pq.write_table(table(1000), path, **BARE)
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    after = open(path, "rb").read()
    assert len(after) == len(before) and footer(after) == footer(before) and after != before
    assert os.stat(path).st_mtime_ns == stat.st_mtime_ns


def ids_of(loader) -> list:
    return sorted(int(i) for batch in loader for i in np.asarray(batch["id"]).tolist())


@pytest.fixture
def planned(tmp_path, monkeypatch):
    """A dataset of two files planned with the opt-in digest, the plan saved; then part-0 rewritten."""
    monkeypatch.setenv(content.DIGEST_ENV, "1")
    folder = tmp_path / "ds"
    folder.mkdir()
    for i in range(2):
        pq.write_table(table(i * ROWS), folder / f"part-{i}.parquet", **BARE)
    plan = plan_shards(str(folder), 1, batch_size=10, predicate=BELOW, engine="local",
                       output_url=str(tmp_path / "plan"))
    assert all(f.content.startswith("sha256:") for f in plan.catalog.files)
    rewrite_keeping_everything_but_the_values(folder / "part-0.parquet")
    return plan, str(folder), str(tmp_path / "plan")


def test_load_plan_refuses_the_rewrite_with_the_digest(planned):
    with pytest.raises(StalePlanError, match=r"'part-0.parquet'.*content fingerprint"):
        load_plan(planned[2])


def test_an_update_refuses_the_rewrite_with_the_digest(planned):
    _, folder, url = planned
    with pytest.raises(PlanUpdateError, match=r"'part-0.parquet'.*content fingerprint.*only adds files"):
        plan_shards(folder, 1, batch_size=10, predicate=BELOW, engine="local", update=url)


@pytest.mark.parametrize("backend", BACKENDS)
def test_every_reader_refuses_the_rewrite_with_the_digest(planned, backend):
    plan = planned[0]
    with pytest.raises(StalePlanError, match=r"'part-0.parquet'.*content fingerprint"):
        ids_of(make_loader(0, 1, plan=plan, batch_size=10, backend=backend, workers_count=1))


def test_the_local_disk_cache_never_serves_the_old_rows(tmp_path, monkeypatch):
    """An epoch fills the cache; the file is rewritten keeping size, footer and time; the next epoch refuses it
    (with the digest) instead of serving the cached old rows, and a plan made now reads the new rows."""
    monkeypatch.setenv(content.DIGEST_ENV, "1")
    folder = tmp_path / "ds"
    folder.mkdir()
    pq.write_table(table(0), folder / "part-0.parquet", **BARE)
    kwargs = {"batch_size": 10, "backend": "arrow", "cache_type": "local-disk", "cache_location": str(tmp_path / "c"),
              "workers_count": 1}
    plan = plan_shards(str(folder), 1, batch_size=10, engine="local")
    loader = make_loader(0, 1, plan=plan, **kwargs)
    assert ids_of(loader) == list(range(ROWS))
    rewrite_keeping_everything_but_the_values(folder / "part-0.parquet")
    loader.set_epoch(1)
    with pytest.raises(StalePlanError, match="content fingerprint"):
        ids_of(loader)
    fresh = plan_shards(str(folder), 1, batch_size=10, engine="local")
    assert ids_of(make_loader(0, 1, plan=fresh, **kwargs)) == list(range(1000, 1000 + ROWS))


def test_without_the_digest_the_residual_limit_is_the_documented_one(tmp_path, monkeypatch):
    """Without the opt-in, a local plan records no fingerprint (hashing every byte is the user's choice), so this
    rewrite is what G15 documents it cannot tell; the documentation names the way to tell it."""
    monkeypatch.delenv(content.DIGEST_ENV, raising=False)
    folder = tmp_path / "ds"
    folder.mkdir()
    pq.write_table(table(0), folder / "part-0.parquet", **BARE)
    plan = plan_shards(str(folder), 1, batch_size=10, engine="local", output_url=str(tmp_path / "plan"))
    assert [f.content for f in plan.catalog.files] == [""]
    rewrite_keeping_everything_but_the_values(folder / "part-0.parquet")
    load_plan(str(tmp_path / "plan"))  # the residual limit: nothing here can tell
    text = open(os.path.join(ROOT, "docs", "how-it-works.md")).read()
    row = next(line for line in text.splitlines() if line.startswith("| G15 "))
    assert content.DIGEST_ENV in row and re.search(r"residual limit", row, re.IGNORECASE)


# ---------------------------------------------------------------------------------------------- S3


def upload(client, bucket, key, data: pa.Table) -> None:
    sink = pa.BufferOutputStream()
    pq.write_table(data, sink, **BARE)
    client.put_object(Bucket=bucket, Key=key, Body=sink.getvalue().to_pybytes())


def test_on_s3_a_reupload_within_the_same_second_is_refused(s3, tmp_path):
    """No mtime trick: S3 times have one-second resolution, so a re-upload within the same second keeps size,
    footer and time; its ETag differs, and load_plan, an update and every reader refuse it."""
    client, bucket = s3.server.client(), s3.server.bucket
    prefix = s3.url.split("/", 3)[3] + "/ds"
    url = s3.join("ds")
    for _ in range(5):  # the re-upload must land in the same second as the upload
        upload(client, bucket, f"{prefix}/part-0.parquet", table(0))
        plan = plan_shards(url, 1, batch_size=10, predicate=BELOW, engine="local", output_url=str(tmp_path / "p"))
        upload(client, bucket, f"{prefix}/part-0.parquet", table(1000))
        head = client.head_object(Bucket=bucket, Key=f"{prefix}/part-0.parquet")
        from petastorm_balanced.io.dataset import list_data_files
        entry = list_data_files(url)[2][0]
        if entry.mtime_ns == plan.catalog.files[0].mtime_ns:
            break
    else:
        pytest.skip("no re-upload landed in the upload's second in 5 tries")
    assert entry.size == plan.catalog.files[0].size
    assert plan.catalog.files[0].content.startswith("etag:") and head["ETag"] not in plan.catalog.files[0].content
    with pytest.raises(StalePlanError, match=r"'part-0.parquet'.*content fingerprint"):
        load_plan(str(tmp_path / "p"))
    with pytest.raises(PlanUpdateError, match=r"content fingerprint"):
        plan_shards(url, 1, batch_size=10, predicate=BELOW, engine="local", update=str(tmp_path / "p"))
    for backend in BACKENDS:
        with pytest.raises(StalePlanError, match=r"content fingerprint"):
            ids_of(make_loader(0, 1, plan=plan, batch_size=10, backend=backend, workers_count=1))
