"""Read only what the plan names, from where the user meant (G14, G15), on a real filesystem.

Every entry point (API, CLI, Spark engine, plan save/load) with names holding '#', '?', '%', spaces and unicode;
symlinks (loops, outside the root, dangling, two names for one file); catalog paths outside the root; rewrites
of the same size and with a byte-identical footer; plans written inside their dataset; numpy parameters.
"""
import dataclasses
import hashlib
import importlib.util
import json
import os
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pyarrow.dataset as pds
import pyarrow.parquet as pq
import pytest

from petastorm_balanced import PlanIntegrityError, StalePlanError, load_plan, make_loader, plan_shards
from petastorm_balanced.errors import InvalidTypeError, InvalidValueError
from petastorm_balanced.io import fs as fsutil
from petastorm_balanced.plan import format as plan_format
from tests.support.jobs import ROOT

AWKWARD = ["meta#frag", "q?x", "a%20b", "c%2", "a b", "données ü", "c:data", "br[1]*"]


PLAIN = {"compression": "NONE", "use_dictionary": False}  # fixed-size pages: a rewrite keeps the file size


def write_dataset(folder, rows, files=3, offset=0, row_group_size=25):
    """``rows`` ids from ``offset`` in ``files`` Parquet files (fixed-size pages); returns the folder."""
    os.makedirs(folder, exist_ok=True)
    cuts = np.linspace(0, rows, files + 1).astype(int)
    for i, (lo, hi) in enumerate(zip(cuts[:-1], cuts[1:], strict=True)):
        ids = np.arange(offset + lo, offset + hi, dtype=np.int64)
        pq.write_table(pa.table({"id": ids, "x": ids * 2}), os.path.join(folder, f"part-{i}.parquet"),
                       row_group_size=row_group_size, **PLAIN)
    return str(folder)


BACKENDS = ["arrow"] + (["petastorm"] if importlib.util.find_spec("petastorm") else [])


def delivered_ids(plan, world=1, backend="arrow"):
    ids = [b["id"] for r in range(world) for b in make_loader(r, world, plan=plan, backend=backend, workers_count=1)]
    return np.sort(np.concatenate([np.asarray(i) for i in ids]))


def oracle_ids(folder):
    return np.sort(pds.dataset(folder, format="parquet").to_table(columns=["id"]).column("id").to_numpy())


# ---- 1. locations: a local path is a path ----

@pytest.mark.parametrize("name", AWKWARD)
def test_awkward_local_names_plan_and_read_that_folder(tmp_path, name):
    """A sibling named like the part before '#'/'?' holds other rows: only the named folder's rows arrive."""
    write_dataset(tmp_path / "meta", 150, offset=10_000)
    write_dataset(tmp_path / "qAx", 90, offset=20_000)
    target = write_dataset(tmp_path / name, 300)
    out = str(tmp_path / f"plan {name}")
    plan = plan_shards(target, 1, batch_size=10, engine="local", output_url=out)
    assert plan.catalog.scanned_rows == 300
    assert fsutil.resolve(plan.dataset_url)[1] == target
    assert os.path.exists(os.path.join(out, "plan.json"))
    for backend in BACKENDS:
        assert np.array_equal(delivered_ids(out, backend=backend), oracle_ids(target)), backend
    assert load_plan(out, dataset_url=target) == plan  # the path and its URL are the same location
    assert load_plan(out, dataset_url=fsutil.normalize_url(target)) == plan


def test_file_urls_are_percent_decoded_and_fragments_refused(tmp_path):
    target = write_dataset(tmp_path / "a#b%c", 60)
    url = "file://" + target.replace("%", "%25").replace("#", "%23")
    assert fsutil.resolve(url)[1] == target and fsutil.normalize_url(url) == fsutil.normalize_url(target)
    assert plan_shards(url, 1, engine="local").catalog.scanned_rows == 60
    with pytest.raises(InvalidValueError, match="fragment"):
        plan_shards("file://" + target, 1, engine="local")  # '#' unescaped in a URL names 'a'
    with pytest.raises(InvalidValueError, match="does not exist"):
        plan_shards("c:data-that-is-not-here", 1, engine="local")  # a relative path, not a URL scheme


@pytest.mark.slow
@pytest.mark.stack  # how Hadoop reads a path depends on the pyspark on the stack
def test_spark_engine_reads_the_same_folder_as_the_local_engine(tmp_path, spark):
    """The Spark engine (a where= makes Spark read the data) plans the very plan the local engine plans (G8),
    footer digests and modification times included, for names Hadoop would misread."""
    write_dataset(tmp_path / "meta", 150, offset=10_000)
    write_dataset(tmp_path / "qAx", 90, offset=20_000)
    for name in ("meta#frag", "q?x", "a%20b", "données ü"):
        target = write_dataset(tmp_path / name, 300)
        local = plan_shards(target, 2, batch_size=10, engine="local")
        assert plan_shards(target, 2, batch_size=10, engine="spark", spark=spark) == local
        where = plan_shards(target, 2, batch_size=10, where="id % 3 = 0", engine="spark", spark=spark)
        assert where.catalog.files == local.catalog.files and where.total_rows == 100, name
        got = delivered_ids(where, 2)
        assert len(got) == 100 and np.array_equal(got, np.arange(0, 300, 3)), name


@pytest.mark.slow
@pytest.mark.stack
def test_spark_job_plans_and_writes_where_it_says(tmp_path, spark, capsys):
    """spark_jobs/plan_shards.py (run in this process, on the shared session) with '#' and '%' in both paths."""
    import importlib.util as iu
    spec = iu.spec_from_file_location("plan_shards_job", os.path.join(ROOT, "spark_jobs", "plan_shards.py"))
    job = iu.module_from_spec(spec)
    spec.loader.exec_module(job)
    write_dataset(tmp_path / "d", 90, offset=5_000)
    target = write_dataset(tmp_path / "d#1 %41", 300)
    out = tmp_path / "plan#2 %41"
    assert job.main([target, "--world-size", "2", "--batch-size", "10", "--where", "id < 150",
                     "--output", str(out)]) == 0, capsys.readouterr().err
    plan = load_plan(str(out), dataset_url=target)
    assert plan.total_rows == 150 and not (tmp_path / "plan").exists() and not (tmp_path / "d#1 A").exists()
    got = delivered_ids(plan, 2)  # policy drop: 2 ranks x 7 steps x 10 rows of the 150
    assert len(set(got.tolist())) == len(got) == 140 and set(got.tolist()) <= set(range(150))


def test_cli_output_with_a_hash_is_written_where_it_says(tmp_path):
    target = write_dataset(tmp_path / "d#1", 100)
    out = tmp_path / "cliplan#x"
    env = {**os.environ, "PYTHONPATH": ROOT}
    done = subprocess.run([sys.executable, "-m", "petastorm_balanced", "plan", target, "--world-size", "2",
                           "--engine", "local", "--output", str(out)], capture_output=True, text=True, env=env,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert (out / "plan.json").exists() and not (tmp_path / "cliplan").exists()
    assert fsutil.normalize_url(str(out)) in done.stdout + done.stderr
    done = subprocess.run([sys.executable, "-m", "petastorm_balanced", "inspect", str(out)], capture_output=True,
                          text=True, env=env, timeout=120)
    assert done.returncode == 0 and "100" in done.stdout, done.stderr


# ---- 2. listing: each physical file once, symlinks judged ----

def test_symlink_loop_is_refused_naming_the_link(tmp_path):
    target = write_dataset(tmp_path / "ds", 100)
    os.makedirs(os.path.join(target, "sub"))
    os.symlink(target, os.path.join(target, "sub", "up"))
    with pytest.raises(InvalidValueError, match=r"'sub/up'.*symlink loop"):
        plan_shards(target, 1, engine="local")


def test_symlinks_leaving_the_root_dangling_or_aliasing_are_refused_by_name(tmp_path):
    target = write_dataset(tmp_path / "ds", 100)
    outside = write_dataset(tmp_path / "elsewhere", 50, offset=500)
    cases = [("out.parquet", os.path.join(outside, "part-0.parquet"), "outside the dataset root"),
             ("outdir", outside, "outside the dataset root"),
             ("gone.parquet", os.path.join(target, "nothing.parquet"), "dangling symlink"),
             ("again.parquet", os.path.join(target, "part-1.parquet"), "same physical file as 'part-1.parquet'")]
    for name, to, message in cases:
        link = os.path.join(target, name)
        os.symlink(to, link)
        with pytest.raises(InvalidValueError, match=message) as caught:
            plan_shards(target, 1, engine="local")
        assert repr(name) in str(caught.value)
        os.remove(link)
    os.link(os.path.join(target, "part-2.parquet"), os.path.join(target, "hard.parquet"))
    with pytest.raises(InvalidValueError, match="'part-2.parquet'"):
        plan_shards(target, 1, engine="local")


def test_a_symlinked_dataset_root_and_in_root_links_to_unlisted_files_are_data(tmp_path):
    real = write_dataset(tmp_path / "real", 100)
    os.symlink(real, tmp_path / "alias")
    plan = plan_shards(str(tmp_path / "alias"), 1, batch_size=10, engine="local")
    assert np.array_equal(delivered_ids(plan), oracle_ids(real))


def test_a_single_parquet_file_is_a_dataset_end_to_end(tmp_path):
    target = write_dataset(tmp_path / "one", 120, files=1)
    write_dataset(tmp_path / "one" / "neighbour", 40, offset=900)  # beside the file: not part of that dataset
    single = os.path.join(target, "part-0.parquet")
    out = str(tmp_path / "plan")
    plan = plan_shards(single, 2, batch_size=10, engine="local", output_url=out)
    assert [f.path for f in plan.catalog.files] == ["part-0.parquet"]
    for backend in BACKENDS:
        assert np.array_equal(delivered_ids(out, 2, backend), np.arange(120)), backend
    load_plan(out)  # its staleness check lists the same single file


# ---- 3. G14: a plan names only files inside its root ----

HOSTILE = ["../tamper-secret/secret.parquet", "/etc/passwd", "s3://other/x.parquet", "a/../../x.parquet",
           "nul\x00.parquet", "back\\..\\slash.parquet", "./part-0.parquet", "", "a//b.parquet"]


@pytest.mark.parametrize("hostile", HOSTILE)
def test_catalog_paths_outside_the_root_are_refused_at_load(tmp_path, hostile):
    """A plan written by the package's own writer, valid checksums and all, naming a file outside the root."""
    target = write_dataset(tmp_path / "ds", 100, files=1)
    plan = plan_shards(target, 1, batch_size=10, engine="local")
    bad_file = dataclasses.replace(plan.catalog.files[0], path=hostile)
    rows = plan.catalog.row_groups
    catalog = dataclasses.replace(plan.catalog, files=(bad_file,),
                                  row_groups=type(rows)((hostile,), rows.path_index, rows.row_group, rows.total_rows,
                                                        rows.matching_rows, rows.selection))
    forged = dataclasses.replace(plan, catalog=catalog,
                                 dataset_fingerprint=plan_format.dataset_fingerprint(catalog.files))
    plan_format.write_plan(forged, str(tmp_path / "forged"))
    with pytest.raises(PlanIntegrityError, match="outside the dataset root"):
        load_plan(str(tmp_path / "forged"), check_dataset=False)
    with pytest.raises(PlanIntegrityError):
        make_loader(0, 1, plan=str(tmp_path / "forged"), backend="arrow")


# ---- 4. G15: content staleness ----

def test_a_same_size_rewrite_is_stale_naming_the_file(tmp_path):
    target = write_dataset(tmp_path / "ds", 300)
    out = str(tmp_path / "plan")
    plan = plan_shards(target, 1, batch_size=10, engine="local", output_url=out)
    path = os.path.join(target, "part-1.parquet")
    size, stat = os.path.getsize(path), os.stat(path)
    ids = pq.read_table(path).column("id").to_numpy()
    pq.write_table(pa.table({"id": ids + 7, "x": ids * 2}), path, row_group_size=25, **PLAIN)  # same size
    assert os.path.getsize(path) == size
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))  # even with the old modification time
    load_plan(out)  # the listing (size, mtime) cannot tell
    with pytest.raises(StalePlanError, match="'part-1.parquet'.*rewritten"):
        delivered_ids(plan)  # the reader parses the footer anyway and compares its digest


def test_a_byte_identical_footer_with_a_new_mtime_is_stale(tmp_path):
    os.makedirs(tmp_path / "ds")
    path = str(tmp_path / "ds" / "part-0.parquet")
    ids = np.arange(300, dtype=np.int64)
    plain = {"row_group_size": 100, **PLAIN}
    pq.write_table(pa.table({"id": ids, "x": ids * 2}), path, **plain)
    out = str(tmp_path / "plan")
    plan = plan_shards(str(tmp_path / "ds"), 1, batch_size=10, engine="local", output_url=out)
    before = open(path, "rb").read()
    moved = np.concatenate([ids[:100][::-1], ids[100:]])  # the same rows of row group 0 in another order
    pq.write_table(pa.table({"id": moved, "x": moved * 2}), path, **plain)
    after = open(path, "rb").read()
    assert len(after) == len(before)
    footer = lambda data: data[-8 - int.from_bytes(data[-8:-4], "little"):]  # noqa: E731
    assert footer(after) == footer(before)  # min/max and offsets unchanged: only the order of the rows moved
    assert after != before
    with pytest.raises(StalePlanError, match="'part-0.parquet'.*modified since planning"):
        load_plan(out)
    with pytest.raises(StalePlanError, match="modified since planning"):
        plan_format.check_dataset(plan)


def test_a_copy_without_mtimes_is_stale_and_with_them_is_not(tmp_path):
    import shutil
    target = write_dataset(tmp_path / "ds", 100)
    out = str(tmp_path / "plan")
    plan_shards(target, 1, engine="local", output_url=out)
    shutil.copytree(target, tmp_path / "kept")  # copy2: modification times kept
    shutil.rmtree(target)
    shutil.copytree(tmp_path / "kept", target)
    load_plan(out)
    shutil.rmtree(target)
    shutil.copytree(tmp_path / "kept", target, copy_function=shutil.copyfile)
    with pytest.raises(StalePlanError, match="modified since planning"):
        load_plan(out)


def test_a_format_1_plan_still_loads_without_content_checks(tmp_path):
    target = write_dataset(tmp_path / "ds", 100)
    out = str(tmp_path / "plan")
    plan = plan_shards(target, 1, batch_size=10, engine="local", output_url=out)
    document = json.load(open(os.path.join(out, "plan.json")))
    old_files = [type(f)(f.path, f.size, f.row_group_rows) for f in plan.catalog.files]
    document.update(format_version=1, dataset_files=[e[:3] for e in document["dataset_files"]])
    old = dataclasses.replace(plan, catalog=dataclasses.replace(plan.catalog, files=tuple(old_files)))
    document["checksum"] = plan_format.content_checksum(old, 1)  # the header names the version
    del document["content_fingerprint"]
    json.dump(document, open(os.path.join(out, "plan.json"), "w"))
    loaded = load_plan(out)
    assert all(f.footer == "" and f.mtime_ns is None for f in loaded.catalog.files)
    assert np.array_equal(delivered_ids(loaded), oracle_ids(target))


# ---- 5. planning is all-or-nothing ----

def test_numpy_parameters_write_a_whole_plan(tmp_path):
    target = write_dataset(tmp_path / "ds", 100)
    out = str(tmp_path / "plan")
    plan = plan_shards(target, np.int64(2), batch_size=np.int32(10), seed=np.uint8(3), engine="local",
                       output_url=out)
    assert load_plan(out) == plan and type(plan.world_size) is int


@pytest.mark.parametrize("where", ["", "sub", "sub/deeper"])
def test_a_plan_inside_its_dataset_is_refused_before_anything_is_written(tmp_path, where):
    target = write_dataset(tmp_path / "ds", 100)
    listing = sorted(os.listdir(target))
    with pytest.raises(InvalidValueError, match="output_url=.*inside the dataset"):
        plan_shards(target, 1, engine="local", output_url=os.path.join(target, where))
    os.symlink(target, tmp_path / "alias")
    with pytest.raises(InvalidValueError, match="inside the dataset"):
        plan_shards(target, 1, engine="local", output_url=str(tmp_path / "alias" / where))
    assert sorted(os.listdir(target)) == listing


def test_bad_parameters_write_nothing(tmp_path):
    target = write_dataset(tmp_path / "ds", 100)
    out = tmp_path / "plan"
    for kwargs in ({"batch_size": 1000}, {"world_size": 0}, {"seed": -1}, {"policy": "nope"}):
        with pytest.raises((InvalidValueError, InvalidTypeError)):
            plan_shards(target, kwargs.pop("world_size", 1), engine="local", output_url=str(out), **kwargs)
        assert not out.exists(), kwargs


# ---- 6. smaller items ----

def test_malformed_plan_json_of_any_shape_is_a_plan_error(tmp_path):
    out = tmp_path / "plan"
    out.mkdir()
    for text in ["[" * 100_000 + "]" * 100_000, '{"a":' * 50_000 + "1" + "}" * 50_000, "[]", "nul", '"x"']:
        (out / "plan.json").write_text(text)
        with pytest.raises(PlanIntegrityError):
            load_plan(str(out))


def test_schema_fields_and_plan_type_errors_are_clear(tmp_path):
    target = write_dataset(tmp_path / "ds", 100)
    plan = plan_shards(target, 1, batch_size=10, engine="local")
    with pytest.raises(InvalidValueError, match="regular expression"):
        next(iter(make_loader(0, 1, plan=plan, backend="arrow", schema_fields=["("])))
    with pytest.raises(InvalidValueError, match="selects no column"):
        next(iter(make_loader(0, 1, plan=plan, backend="arrow", schema_fields=[])))
    with pytest.raises(InvalidTypeError, match="plan=123"):
        make_loader(0, 1, plan=123, backend="arrow")


def test_each_footer_is_read_once_per_epoch_whatever_the_row_group_order(tmp_path, monkeypatch):
    """A shuffled row group order over more files than a reading thread keeps open reopens files within an epoch;
    their footers are read, hashed and checked once per epoch, not once per reopening, and the rows delivered
    are still the dataset's (against pyarrow.dataset)."""
    from petastorm_balanced.io import footer as footer_io
    from petastorm_balanced.reading.rows import fragments
    files = fragments.OPEN_FILES * 2
    target = write_dataset(tmp_path / "ds", files * 3 * 10, files=files, row_group_size=10)
    plan = plan_shards(target, 1, batch_size=5, engine="local")
    reads, parses = [], []
    real = footer_io.read_footer
    monkeypatch.setattr(footer_io, "read_footer", lambda handle, parsed=None: reads.append(1) or real(handle, parsed))
    real_parse = footer_io.pq.read_metadata
    monkeypatch.setattr(footer_io.pq, "read_metadata", lambda *a, **k: parses.append(1) or real_parse(*a, **k))
    monkeypatch.setattr(footer_io, "READ_FOOTERS", footer_io.ParsedFooters(1 << 20))  # none parsed yet
    opened = []
    real_open = fragments.FileCache.get
    monkeypatch.setattr(fragments.FileCache, "get", lambda self, path: opened.append(path) or real_open(self, path))
    expected = sorted(pds.dataset(target).to_table().column("id").to_pylist())
    loader = make_loader(0, 1, plan=plan, batch_size=5, backend="arrow", reader_pool_type="dummy", shuffle=False)
    assert len(parses) == files  # the batch schema's footers
    for epoch in range(2):
        reads.clear(), parses.clear()
        loader.set_epoch(epoch)
        assert sorted(i for b in loader for i in b["id"].tolist()) == expected
        assert len(reads) == files  # read, hashed and checked once per file and epoch
        assert not parses  # the same bytes are not parsed twice
    assert len(opened) > 2 * files  # files were reopened within epochs: the case this is about


def test_a_file_rewritten_between_epochs_is_refused_by_the_same_loader(tmp_path):
    """Footers parsed in one epoch are reused in the next only for the very same bytes: a file rewritten between
    epochs with its size and modification time kept is parsed again, and refused (G15)."""
    target = write_dataset(tmp_path / "ds", 300)
    plan = plan_shards(target, 1, batch_size=10, engine="local")
    loader = make_loader(0, 1, plan=plan, batch_size=10, backend="arrow", reader_pool_type="dummy")
    assert sorted(i for b in loader for i in b["id"].tolist()) == sorted(
        pds.dataset(target).to_table().column("id").to_pylist())
    path = os.path.join(target, "part-1.parquet")
    size, stat = os.path.getsize(path), os.stat(path)
    ids = pq.read_table(path).column("id").to_numpy()
    pq.write_table(pa.table({"id": ids + 7, "x": ids * 2}), path, row_group_size=25, **PLAIN)
    assert os.path.getsize(path) == size
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    loader.set_epoch(1)
    with pytest.raises(StalePlanError, match="'part-1.parquet'.*rewritten"):
        list(loader)


def test_a_file_rewritten_between_opens_is_checked_again(tmp_path):
    """A reader reuses a checked footer only for a file of the checked size: one rewritten to another size
    between two opens is read and checked again, so a stale plan is refused rather than read with an old footer."""
    from petastorm_balanced.io.footer import CheckedFooters
    target = write_dataset(tmp_path / "ds", 60, files=1)
    path = os.path.join(target, "part-0.parquet")
    plan = plan_shards(target, 1, batch_size=5, engine="local")
    checks = []

    def check(name, footer):
        checks.append(name)
        plan_format.check_file(plan, plan.catalog.files[0], footer=footer.digest)
    footers = CheckedFooters(fsutil.resolve("file://" + target)[0], check)
    footers.open("part-0.parquet", path).close()
    footers.open("part-0.parquet", path).close()
    assert checks == ["part-0.parquet"]
    ids = np.arange(90, dtype=np.int64)
    pq.write_table(pa.table({"id": ids, "x": ids * 2}), path, row_group_size=25, **PLAIN)
    with pytest.raises(StalePlanError, match="rewritten since planning"):
        footers.open("part-0.parquet", path)
    assert checks == ["part-0.parquet"] * 2


def test_parsed_footers_are_bounded_by_their_bytes(tmp_path, monkeypatch):
    """The parsed-footer cache holds at most ``max_bytes`` of footer bytes, least recently used out first, and
    gives back the very metadata of the bytes asked for."""
    from petastorm_balanced.io import footer as footer_io
    target = write_dataset(tmp_path / "ds", 90, files=3)
    stored = []
    for i in range(3):
        data = open(os.path.join(target, f"part-{i}.parquet"), "rb").read()
        length = int.from_bytes(data[-8:-4], "little")
        stored.append((data[-8 - length:], hashlib.sha256(data[-8 - length:-8]).hexdigest()))
    cache = footer_io.ParsedFooters(max(len(s) for s, _ in stored) * 2)
    parses = []
    real_parse = footer_io.pq.read_metadata
    monkeypatch.setattr(footer_io.pq, "read_metadata", lambda *a, **k: parses.append(1) or real_parse(*a, **k))
    for (data, digest), path in zip(stored, (f"part-{i}.parquet" for i in range(3)), strict=True):
        assert cache.parse(data, digest).equals(pq.ParquetFile(os.path.join(target, path)).metadata)
    assert len(parses) == 3
    cache.parse(*stored[2]), cache.parse(*stored[1])  # held
    assert len(parses) == 3
    cache.parse(*stored[0])  # evicted when the third came
    assert len(parses) == 4
