"""Spark planning: footers and predicates evaluated in Spark tasks, only per-row-group summaries on the driver.

Three ways a catalog is built, all ending in the same ``Catalog`` the in-process engine builds (G8):

- no filter: footers only. Driver threads read local footers and a few hundred remote ones; past
  ``DRIVER_FOOTERS_MAX`` remote files the file list is parallelized and every task reads its footers with
  ``pyarrow.fs``.
- ``where`` (Spark SQL): Spark evaluates the expression with its own semantics (NULL does not match, hive partition
  columns usable) and reports each matching row as its file (``_metadata.file_size`` when that tells the files
  apart, else ``_metadata.file_path``) and ``_metadata.row_index``. No shuffle: inside each scan task a
  ``mapInArrow`` function takes the task's matching rows, cuts them into row groups with the footer row counts
  and encodes each with ``selection.encode``; the driver collects one small record per matching row group.
- ``predicate`` (Petastorm): each task opens its files and runs ``predicates.row_group_mask``, exactly what the
  local engine runs, so both engines see the same masks.

Executors import this package from a zip of it that the driver builds and ships with ``SparkContext.addPyFile``,
so neither a cluster nor a local run needs ``pip install`` (set the Spark conf
``spark.petastorm_balanced.shipPackage=false`` when the package is installed on the workers).
"""
from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import sys
import tempfile
import time
import zipfile
from concurrent.futures import ThreadPoolExecutor
from typing import Dict, List, Optional, Sequence
from urllib.parse import unquote, urlparse

import numpy as np

from ...errors import InvalidTypeError, InvalidValueError, InvalidWhereError, MissingDependencyError
from ...io import fs as fsutil
from ..scan import footer_error, read_footer
from ...plan import selection
from ...plan.catalog import Catalog, FileInfo, RowGroupMatch, full_catalog, match_from_mask
from ..predicates import check_fields, row_group_mask
from ...io.dataset import has_unischema, list_data_files, load_unischema, partition_values, relative_path

try:
    from pyspark.errors import (AnalysisException, ArithmeticException, DateTimeException,
                                NumberFormatException, SparkRuntimeException)
    from pyspark.sql import SparkSession, functions as F
except ImportError as _exc:  # pragma: no cover - exercised only without pyspark
    raise MissingDependencyError("engine='spark' needs pyspark (pip install 'pyspark>=4.0'); or plan with "
                                 "engine='local' and a Petastorm predicate=") from _exc

log = logging.getLogger(__name__)

APP_NAME = "petastorm-balanced plan"
DRIVER_FOOTERS_MAX = 512  # above this many remote files, footers are read in Spark tasks
FOOTER_THREADS = 8  # per task (or on the driver): footer reads are latency-bound
SHIP_CONF = "spark.petastorm_balanced.shipPackage"
_BUCKET_SCHEMES = ("s3", "s3a", "s3n", "gs", "gcs", "abfs", "abfss", "wasb", "wasbs")
_MATCH_SCHEMA = ("path string, row_group int, total_rows long, matching_rows long, selection binary, "
                 "seconds double")
ARROW_BATCH_ROWS = 1 << 20  # rows per Arrow batch moved to the encoding Python worker
_SHIPPED = set()  # application ids that already got the package zip


def get_session(spark=None):
    """``spark``, else the active SparkSession (spark-submit, notebooks), else a new ``local[*]`` one.

    A session started here binds to ``SPARK_LOCAL_IP`` (127.0.0.1 by default) so it works on hosts whose name does
    not resolve. Under spark-submit the master comes from spark-submit and is never overridden.
    """
    if spark is not None:
        if not isinstance(spark, SparkSession):
            raise InvalidTypeError(f"spark={spark!r} is not a pyspark.sql.SparkSession")
        return spark
    active = SparkSession.getActiveSession()
    if active is not None:
        return active
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    builder = SparkSession.builder.appName(APP_NAME)
    submitted = "PYSPARK_GATEWAY_PORT" in os.environ or "--master" in os.environ.get("PYSPARK_SUBMIT_ARGS", "")
    if not submitted:
        host = os.environ.get("SPARK_LOCAL_IP", "127.0.0.1")
        builder = builder.master("local[*]").config("spark.driver.host", host)
    return builder.getOrCreate()


def build_catalog(url: str, *, where: Optional[str] = None, predicate=None, spark=None,
                  footers_in_tasks: Optional[bool] = None, timings: Optional[dict] = None) -> Catalog:
    """The catalog of ``url`` (a normalized dataset URL) filtered by ``where`` or ``predicate``.

    A session (``get_session(spark)``) is taken only when Spark has work: a filter, or footers in tasks.

    ``footers_in_tasks`` forces footer reading into Spark tasks (True) or onto the driver (False). By default
    Spark tasks read them for remote datasets (s3://, hdfs://) of more than ``DRIVER_FOOTERS_MAX`` files, where
    each footer is a network round trip; local footers are read fastest by driver threads (2,000 small files:
    0.8 s on the driver against 2.0 s through Spark tasks on 2 cores, benchmarks/bench_spark_plan.py).

    ``timings``, a dict, receives seconds per step: ``session`` (a session started here), ``footers`` (listing
    included), ``where`` or ``predicate``
    (the Spark job, wall time) and ``encode`` (Python time inside the where's tasks, summed over tasks).
    """
    timings = {} if timings is None else timings
    if spark is not None:
        get_session(spark)  # refuse a wrong type before any work
    listed = time.perf_counter()
    url = fsutil.normalize_url(url)
    _, root, entries = list_data_files(url)
    relpaths = [relative_path(e.path, root) for e in entries]
    sizes = {p: e.size for p, e in zip(relpaths, entries)}
    in_tasks = footers_in_tasks
    if in_tasks is None:
        in_tasks = len(relpaths) > DRIVER_FOOTERS_MAX and not fsutil.is_local(url)
    log.info("scanning %d files (%.1f MB) of %s: footers %s", len(relpaths), sum(sizes.values()) / 1e6, url,
             "in Spark tasks" if in_tasks else "on the driver")
    before_session = time.perf_counter()
    if in_tasks or where is not None or predicate is not None:
        spark = get_session(spark)  # only now: footers of a local dataset need no Spark at all
    timings["session"] = time.perf_counter() - before_session
    if in_tasks:
        _ship_package(spark)
        sc = spark.sparkContext
        slices = max(1, min(len(relpaths), sc.defaultParallelism * 4))
        results = sc.parallelize(relpaths, slices).mapPartitions(_footer_task(url, root)).collect()
    else:
        results = read_footers(url, root, relpaths)
    files = _file_infos(url, results, sizes)
    kind = "petastorm" if has_unischema(url) else "plain"
    partition_columns = tuple(sorted({k for f in files for k in partition_values(f.path)}))
    timings["footers"] = time.perf_counter() - listed - timings["session"]
    log.info("%d files, %d row groups, %d rows (footers read in %.1f s)", len(files),
             sum(len(f.row_group_rows) for f in files), sum(f.num_rows for f in files), timings["footers"])
    if where is None and predicate is None:
        return full_catalog(files, kind, partition_columns)
    started = time.perf_counter()
    if where is not None:
        matches = _where_matches(spark, url, root, files, where, timings)
        what = f"where {where!r}"
    else:
        columns = list(results[0][2]) + list(partition_columns) if results else list(partition_columns)
        fields = check_fields(predicate, columns, url)
        matches = _predicate_matches(spark, url, root, files, predicate, fields, kind)
        what = f"predicate on {fields}"
    catalog = Catalog(tuple(files), tuple(sorted(matches, key=lambda m: (m.path, m.row_group))), kind,
                      partition_columns)
    timings["where" if where is not None else "predicate"] = time.perf_counter() - started
    log.info("%s matches %d of %d rows in %d row groups (%.1f s)", what, catalog.total_rows, catalog.scanned_rows,
             len(catalog.row_groups), time.perf_counter() - started)
    return catalog


# ---------------------------------------------------------------------------------------------- footers

def read_footers(url: str, root: str, relpaths: Sequence[str], threads: int = FOOTER_THREADS) -> List[tuple]:
    """``(relpath, row group rows, column names)`` per file, or ``(relpath, None, error text)`` for a file that is
    not Parquet: errors travel back as values so the driver raises one clear ``ValueError``, not a task failure."""
    import pyarrow as pa
    filesystem, _ = fsutil.resolve(url)

    def footer(relpath):
        try:
            rows, meta = read_footer(filesystem, f"{root}/{relpath}" if root else relpath)
        except (pa.ArrowException, OSError) as exc:
            return relpath, None, f"{type(exc).__name__}: {exc}"
        return relpath, rows, tuple(meta.schema.to_arrow_schema().names)

    with ThreadPoolExecutor(max(1, min(threads, len(relpaths)))) as pool:
        return list(pool.map(footer, relpaths))


def _footer_task(url, root):
    def task(relpaths):
        return read_footers(url, root, list(relpaths))
    return task


def _file_infos(url: str, results: Sequence[tuple], sizes: Dict[str, int]) -> List[FileInfo]:
    """FileInfos sorted by path, after the checks ``scan.scan`` makes: readable footers, one set of columns."""
    results = sorted(results, key=lambda r: r[0])
    for relpath, rows, detail in results:
        if rows is None:
            raise footer_error(relpath, url, detail)
    first = results[0]
    for relpath, _, names in results:
        if set(names) != set(first[2]):
            raise InvalidValueError(f"dataset_url={url!r}: {relpath!r} has columns {sorted(names)} but {first[0]!r} "
                                    f"has {sorted(first[2])}; all files of a dataset must share one schema")
    return [FileInfo(relpath, sizes[relpath], rows) for relpath, rows, _ in results]


# ---------------------------------------------------------------------------------------------- where (SQL)

def spark_url(url: str) -> str:
    """The URL Spark's Hadoop filesystems understand for a normalized dataset URL (``s3://`` -> ``s3a://``)."""
    return "s3a://" + url[len("s3://"):] if url.startswith("s3://") else url


def spark_relative_path(spark_path: str, root: str) -> str:
    """The catalog key of a file Spark names (``_metadata.file_path``, ``inputFiles()``): URL-decoded, relative to
    the dataset root as ``fs.resolve`` spells it."""
    parsed = urlparse(spark_path)
    path = unquote(parsed.path)
    if parsed.scheme in _BUCKET_SCHEMES:
        path = parsed.netloc + path
    prefix = root.rstrip("/") + "/"
    if not path.startswith(prefix):
        raise InvalidValueError(f"Spark reads {spark_path!r}, which is not under the dataset root {root!r}; pass the "
                                "dataset URL in the form Spark and pyarrow both resolve (no symlinks or aliases)")
    return path[len(prefix):]


@contextlib.contextmanager
def _sql_conf(spark, key: str, value: str):
    """Set a SQL conf for one query and put the session's value back: the words are a small shuffle, and 200
    partitions (the default) cost more to write and schedule than to aggregate (about 0.5 s here)."""
    before = spark.conf.get(key)
    spark.conf.set(key, value)
    try:
        yield
    finally:
        spark.conf.set(key, before)


@contextlib.contextmanager
def _quiet_pyspark_error_logs():
    """PySpark logs every AnalysisException with a stack trace; we turn it into one clear ValueError instead."""
    loggers = [logging.getLogger(n) for n in ("SQLQueryContextLogger", "DataFrameQueryContextLogger")]
    before = [lg.disabled for lg in loggers]
    for lg in loggers:
        lg.disabled = True
    try:
        yield
    finally:
        for lg, was in zip(loggers, before):
            lg.disabled = was


def _where_matches(spark, url: str, root: str, files: Sequence[FileInfo], where: str,
                   timings: Optional[dict] = None) -> List[RowGroupMatch]:
    frame = _read_for_where(spark, url)
    columns = frame.columns
    if "_metadata" in columns:
        raise InvalidValueError(f"dataset_url={url!r} has a column named '_metadata', which hides Spark's file "
                                "metadata that where= needs; rename the column or plan with a Petastorm predicate=")
    _check_same_files(url, root, files, frame.inputFiles())
    # Which file a row comes from: its size when that tells the files with rows apart (a number: cheaper to move
    # to Python than a path per row), else its path.
    sizes = [f.size for f in files if f.num_rows > 0]
    by_size = len(set(sizes)) == len(sizes)
    # With sizes, file and row index travel as one number, size << shift | row index, when it fits in 63 bits:
    # moving rows from the JVM to Python is the per-row cost here, and one column costs less than two.
    shift = max([f.num_rows for f in files] + [1]).bit_length()
    if not (by_size and (max(sizes + [0]) + 1) << shift < 2 ** 63):
        shift = None
    with _quiet_pyspark_error_logs():
        try:
            matching = frame.where(where)
        except AnalysisException as exc:  # includes ParseException
            raise InvalidWhereError(where, _first_line(exc), columns) from None
        if shift is not None:
            rows = matching.select(F.expr(f"shiftleft(_metadata.file_size, {shift}) | _metadata.row_index")
                                   .alias("file_row"))
        else:
            rows = matching.select(F.col("_metadata.file_size" if by_size else "_metadata.file_path").alias("file"),
                                   F.col("_metadata.row_index").alias("row_index"))
        lookup = {(f.size if by_size else f.path): (f.path, f.row_group_rows) for f in files if f.num_rows > 0}
        shared = spark.sparkContext.broadcast(lookup)
        _ship_package(spark)
        try:
            # No shuffle: each scan task encodes the matching rows it read, per row group, in one Python worker
            # (Spark reads a row group in exactly one task: the split holding its midpoint), and only per-row-group
            # records reach the driver. Large Arrow batches: fewer JVM-Python round trips.
            with _sql_conf(spark, "spark.sql.execution.arrow.maxRecordsPerBatch", str(ARROW_BATCH_ROWS)):
                encoded = rows.mapInArrow(_partition_encoder(root, shared, by_size, shift), _MATCH_SCHEMA).collect()
        except (AnalysisException, ArithmeticException, DateTimeException, NumberFormatException,
                SparkRuntimeException) as exc:
            raise InvalidWhereError(where, _first_line(exc), columns, on_data=True) from None
        finally:
            shared.destroy()
    if timings is not None:
        timings["encode"] = sum(r.seconds for r in encoded)
    return merge_partial_matches(
        RowGroupMatch(r.path, r.row_group, r.total_rows, r.matching_rows, bytes(r.selection)) for r in encoded)


def merge_partial_matches(matches) -> List[RowGroupMatch]:
    """One record per row group: records of the same row group from several tasks (a Spark split rule we do not
    rely on) are merged by their positions, encoded again exactly as one task would have."""
    by_key: Dict[tuple, List[RowGroupMatch]] = {}
    for m in matches:
        by_key.setdefault((m.path, m.row_group), []).append(m)
    out = []
    for (path, row_group), parts in by_key.items():
        if len(parts) == 1:
            out.append(parts[0])
            continue
        positions = np.unique(np.concatenate([p.positions() for p in parts]))
        total = parts[0].total_rows
        out.append(RowGroupMatch(path, row_group, total, len(positions), selection.encode(positions, total)))
    return out


def _read_for_where(spark, url: str):
    """The dataset as a Spark DataFrame; a Hadoop filesystem missing for the URL's scheme (offline pyspark wheels
    have no S3A) is reported as what to install instead of a Java stack trace."""
    try:
        return spark.read.parquet(spark_url(url))
    except Exception as exc:  # noqa: BLE001 - py4j wraps Hadoop's ClassNotFoundException / UnsupportedFileSystem
        text = str(exc)
        if "S3AFileSystem not found" in text or "No FileSystem for scheme" in text:
            scheme = urlparse(spark_url(url)).scheme
            raise MissingDependencyError(f"where= on {url} needs Spark to read it, and this Spark has no Hadoop "
                                         f"filesystem for {scheme}:// (for S3: the hadoop-aws jar matching Spark's "
                                         "Hadoop and the AWS SDK bundle it names, e.g. --packages "
                                         "org.apache.hadoop:hadoop-aws:3.4.1; see docs/remote.md); or plan with "
                                         "engine='local' and a Petastorm predicate=") from None
        raise


def _check_same_files(url: str, root: str, files: Sequence[FileInfo], spark_files: Sequence[str]) -> None:
    """Spark lists files by its own rules; a plan keyed by our listing must see exactly the rows Spark filtered."""
    ours = {f.path for f in files}
    theirs = {spark_relative_path(p, root) for p in spark_files}
    for path in sorted(ours ^ theirs):
        who = "Spark reads it but petastorm-balanced skips it" if path in theirs else \
            "petastorm-balanced reads it but Spark skips it"
        raise InvalidValueError(f"{path!r} in dataset_url={url!r}: {who}; rename it (a leading '_' or '.' marks a "
                                "file that is not data) or remove it")


def _partition_encoder(root: str, lookup, by_size: bool, shift: Optional[int]):
    """The ``mapInArrow`` function: the matching rows one task read -> one catalog record per row group with a
    matching row, and the seconds this task spent encoding (on its first record).

    Rows come as (file key, row index), or as one number ``size << shift | row index`` when ``shift`` is set.
    ``lookup`` (broadcast) maps the file key (size, or Spark's path) to (relative path, row group rows).
    """
    def encode(batches):
        import pyarrow as pa
        columns = [[], []]
        for batch in batches:
            if batch.num_rows:
                for i in range(batch.num_columns):
                    columns[i].append(batch.column(i))
        if not columns[0]:
            return
        started = time.perf_counter()
        if shift is not None:
            packed = np.sort(pa.chunked_array(columns[0]).combine_chunks().to_numpy(zero_copy_only=False))
            code, index = packed >> shift, packed & ((1 << shift) - 1)  # code: the file's size itself
            names = None
        else:
            coded = pa.chunked_array(columns[0]).combine_chunks().dictionary_encode()
            code = coded.indices.to_numpy(zero_copy_only=False)
            index = pa.chunked_array(columns[1]).combine_chunks().to_numpy(zero_copy_only=False).astype(np.int64)
            order = np.lexsort((index, code))  # (rows,) by file, then row index
            code, index, names = code[order], index[order], coded.dictionary
        cuts = np.flatnonzero(np.diff(code)) + 1
        records = []
        for lo, hi in zip(np.concatenate(([0], cuts)), np.concatenate((cuts, [len(code)]))):
            file_key = int(code[lo]) if names is None else names[int(code[lo])].as_py()
            entry = lookup.value.get(int(file_key) if by_size else spark_relative_path(file_key, root))
            if entry is None:
                raise InvalidValueError(f"Spark read a file ({file_key!r}) that planning did not list; the dataset "
                                        "changed while planning: re-run planning")
            records.extend(_row_group_records(entry[0], entry[1], index[lo:hi]))
        out = list(zip(*records))
        seconds = np.zeros(len(records))
        seconds[0] = time.perf_counter() - started
        yield pa.RecordBatch.from_arrays(
            [pa.array(out[0], pa.string()), pa.array(out[1], pa.int32()), pa.array(out[2], pa.int64()),
             pa.array(out[3], pa.int64()), pa.array(out[4], pa.binary()), pa.array(seconds)],
            names=["path", "row_group", "total_rows", "matching_rows", "selection", "seconds"])
    return encode


def _row_group_records(relpath: str, rows: Sequence[int], index: np.ndarray) -> List[tuple]:
    """(path, row group, total rows, matching rows, selection) per row group of one file with a row in ``index``
    (sorted row indexes in the file), encoded exactly as ``match_from_mask`` encodes (G8)."""
    bounds = np.concatenate(([0], np.cumsum(rows, dtype=np.int64)))
    if len(index) and (index[0] < 0 or index[-1] >= bounds[-1]):
        raise InvalidValueError(f"Spark reports row {int(index[-1])} of {relpath!r}, which has {int(bounds[-1])} rows "
                                f"by its footer; the dataset changed while planning: re-run planning")
    group = np.searchsorted(bounds, index, side="right") - 1
    cuts = np.flatnonzero(np.diff(group)) + 1
    out = []
    for lo, hi in zip(np.concatenate(([0], cuts)), np.concatenate((cuts, [len(group)]))):
        i = int(group[lo])
        positions = index[lo:hi] - bounds[i]
        out.append((relpath, i, int(rows[i]), int(hi - lo), selection.encode(positions, int(rows[i]))))
    return out


# ---------------------------------------------------------------------------------------------- Petastorm predicate

def _predicate_matches(spark, url, root, files, predicate, fields, kind) -> List[RowGroupMatch]:
    _ship_package(spark)
    sc = spark.sparkContext
    work = [(f.path, f.row_group_rows) for f in files if f.num_rows > 0]
    if not work:
        return []
    slices = max(1, min(len(work), sc.defaultParallelism * 4))
    out = sc.parallelize(work, slices).mapPartitions(_predicate_task(url, root, predicate, fields, kind)).collect()
    errors = [r for r in out if r[0] is None]
    if errors:
        raise InvalidValueError(f"predicate={predicate!r} failed on {errors[0][1]}; fix the predicate so do_include "
                                "accepts the rows of this dataset")
    return [RowGroupMatch(*r) for r in out]


def _predicate_task(url, root, predicate, fields, kind):
    def task(items):
        filesystem, _ = fsutil.resolve(url)
        unischema = load_unischema(url) if kind == "petastorm" else None
        for relpath, rows in items:
            with filesystem.open_input_file(f"{root}/{relpath}" if root else relpath) as handle:
                for i, n in enumerate(rows):
                    if n == 0:
                        continue
                    try:
                        mask = row_group_mask(handle, relpath, i, predicate, fields, unischema=unischema)
                    except Exception as exc:  # noqa: BLE001 - reported on the driver with the file named
                        yield None, f"{relpath!r} row group {i} ({type(exc).__name__}: {exc})"
                        return
                    m = match_from_mask(relpath, i, mask)
                    if m is not None:
                        yield m.path, m.row_group, m.total_rows, m.matching_rows, m.selection
    return task


# ---------------------------------------------------------------------------------------------- shipping

def package_zip() -> str:
    """A zip of this package's sources, named by their digest so one content is built and shipped once."""
    package_dir = _package_dir()
    sources = sorted(os.path.relpath(os.path.join(d, n), os.path.dirname(package_dir))
                     for d, _, names in os.walk(package_dir) for n in names if n.endswith(".py"))
    digest = hashlib.sha256()
    for rel in sources:
        with open(os.path.join(os.path.dirname(package_dir), rel), "rb") as handle:
            digest.update(rel.encode() + b"\0" + handle.read())
    target = os.path.join(tempfile.gettempdir(), f"petastorm_balanced-{digest.hexdigest()[:16]}.zip")
    if not os.path.exists(target):
        partial = f"{target}.{os.getpid()}.tmp"
        with zipfile.ZipFile(partial, "w", zipfile.ZIP_DEFLATED) as archive:
            for rel in sources:
                archive.write(os.path.join(os.path.dirname(package_dir), rel), rel)
        os.replace(partial, target)
    return target


def _package_dir() -> str:
    """The folder of the top-level package (this module sits ``__name__.count('.')`` folders below it)."""
    path = os.path.abspath(__file__)
    for _ in range(__name__.count(".")):
        path = os.path.dirname(path)
    return path


def _ship_package(spark) -> None:
    sc = spark.sparkContext
    if sc.applicationId in _SHIPPED or sc.getConf().get(SHIP_CONF, "true").lower() == "false":
        return
    if not os.path.isdir(_package_dir()):
        return  # imported from a zip (--py-files): Spark already ships that zip to the executors
    sc.addPyFile(package_zip())
    _SHIPPED.add(sc.applicationId)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
