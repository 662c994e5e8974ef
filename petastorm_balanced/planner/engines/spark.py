"""Spark planning: Spark reads footers and evaluates filters; the driver builds the catalog from compact results.

Three ways a catalog is built, all ending in the same ``Catalog`` the in-process engine builds (G8):

- no filter: footers only. Driver threads read local footers and a few hundred remote ones; past
  ``DRIVER_FOOTERS_MAX`` remote files the file list is parallelized and every task reads its footers with
  ``pyarrow.fs``.
- ``where`` (Spark SQL): Spark evaluates the expression with its own semantics (NULL does not match, hive partition
  columns usable) and names each matching row by its file (``_metadata.file_size`` when that tells the files
  apart, else ``_metadata.file_path``) and ``_metadata.row_index``. The driver collects them as Arrow and cuts them
  into row groups with the footer row counts. Up to ``ROWS_TO_DRIVER_MAX`` scanned rows, a matching row travels as
  one int64 (size and row index packed); past it, Spark first folds rows into 64-row words in the JVM (partial
  aggregation inside each scan task, a shuffle of words only), at most 2 bits per scanned row where the plan's
  selections hold up to 1. A deterministic where on hive partition columns alone keeps or drops whole files, so
  only the matching files' keys travel. No Python worker: moving rows from the JVM into Python workers cost more
  than Spark's whole count(where) (``benchmarks/bench_spark_plan.py``). One Spark job in all: the schema Spark
  would infer (a job of its own in ``spark.read.parquet``) is computed on the driver from a footer already listed,
  with Spark's own converter, whenever every file has the same Parquet schema.
- ``predicate`` (Petastorm): each task opens its files and runs ``predicates.row_group_mask``, exactly what the
  local engine runs, so both engines see the same masks.

Executors import this package from a zip of it that the driver builds and ships with ``SparkContext.addPyFile``
(``spark.addArtifacts`` on Spark Connect), so neither a cluster nor a local run needs ``pip install`` (set the Spark
conf ``spark.petastorm_balanced.shipPackage=false`` when the package is installed on the workers).

Spark Connect (Databricks serverless and shared clusters) has no ``sparkContext`` and no RDDs: ``where`` and
``cost`` run there unchanged (DataFrames only), footers are read on the driver, and a Petastorm ``predicate`` (an
RDD job) is refused with the alternatives.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import re
import sys
import tempfile
import time
import zipfile
from collections.abc import Collection, Sequence
from concurrent.futures import ThreadPoolExecutor
from urllib.parse import unquote, urlparse

import numpy as np

from ...core.catalog import Catalog, FileInfo, RowGroupMatch, RowGroups, full_catalog, match_from_mask
from ...errors import InvalidTypeError, InvalidValueError, InvalidWhereError, MissingDependencyError
from ...io import fs as fsutil
from ...io.dataset import list_data_files, relative_path
from ...io.partitions import partition_values
from ...io.tables import partition_types
from ...unischema.storage import has_unischema, load_unischema
from ..filters import check_fields, row_group_mask
from ..scan import check_delta_columns, footer_error, listed_mtime, read_footer

try:
    from pyspark.errors import (
        AnalysisException,
        ArithmeticException,
        DateTimeException,
        NumberFormatException,
        SparkRuntimeException,
    )
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F
except ImportError as _exc:  # pragma: no cover - exercised only without pyspark
    raise MissingDependencyError("engine='spark' needs pyspark (pip install 'pyspark>=4.0'); or plan with "
                                 "engine='local' and a Petastorm predicate=") from _exc

log = logging.getLogger(__name__)

APP_NAME = "petastorm-balanced plan"
DRIVER_FOOTERS_MAX = 512  # above this many remote files, footers are read in Spark tasks
FOOTER_THREADS = 8  # per task (or on the driver): footer reads are latency-bound
SHIP_CONF = "spark.petastorm_balanced.shipPackage"
SPARK_ROW_METADATA = b"org.apache.spark.sql.parquet.row.metadata"  # the schema Spark stores when it writes Parquet
_BUCKET_SCHEMES = ("s3", "s3a", "s3n", "gs", "gcs", "abfs", "abfss", "wasb", "wasbs")
# Up to ROWS_TO_DRIVER_MAX scanned rows, each matching row reaches the driver as an int64 (at most 32 MB): no
# shuffle, whose second stage costs 0.1 s on local[*] and 0.4-0.9 s on a standalone cluster, a lot next to a
# count() of a few million rows. Above it, as 64-row words: at most 2 bits per scanned row, within twice the
# plan's own selections. On a 2-worker standalone cluster at 16M rows (benchmarks/bench_cluster.py), rows cost
# 1.68x count(where) at 53% and 5% matching, words 1.21x and 1.56x: the Arrow conversion, transfer and decoding
# of 8.5M int64 (1.3-2.2 s on the driver alone) outgrow the second stage well before 16M rows.
ROWS_TO_DRIVER_MAX = 1 << 22
WORD_BITS = 6
_SHIPPED: set[str | tuple[str, str]] = set()  # application ids that already got the package zip


def get_session(spark=None):
    """``spark``, else the active SparkSession (spark-submit, notebooks), else a new ``local[*]`` one.

    A session started here binds to ``SPARK_LOCAL_IP`` (127.0.0.1 by default) so it works on hosts whose name does
    not resolve. Under spark-submit the master comes from spark-submit and is never overridden.
    """
    if spark is not None:
        if not isinstance(spark, SparkSession) and not is_connect(spark):
            raise InvalidTypeError(f"spark={spark!r} is not a pyspark.sql.SparkSession (classic or Spark Connect)")
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


def is_connect(spark) -> bool:
    """Whether ``spark`` is a Spark Connect session (no ``sparkContext``, no RDDs, no py4j)."""
    return type(spark).__module__.startswith("pyspark.sql.connect")


def default_parallelism(spark) -> int | None:
    """The cluster's default parallelism, or None where the session cannot tell (Spark Connect)."""
    return None if is_connect(spark) else spark.sparkContext.defaultParallelism


def build_catalog(url: str, *, where: str | None = None, predicate=None, spark=None,
                  footers_in_tasks: bool | None = None, timings: dict | None = None, table=None,
                  only: Collection[str] | None = None) -> Catalog:
    """The catalog of ``url`` (a normalized dataset URL) filtered by ``where`` or ``predicate``.

    ``only`` (relative paths; a plan update's added files): footers are read, and ``where`` or ``predicate``
    evaluated, for those files alone, which Spark reads by name; partition columns and their types come from every
    listed file, so each file's rows get the answer a catalog of the whole dataset gives them.

    A session (``get_session(spark)``) is taken only when Spark has work: a filter, or footers in tasks.

    ``footers_in_tasks`` forces footer reading into Spark tasks (True) or onto the driver (False). By default
    Spark tasks read them for remote datasets (s3://, hdfs://) of more than ``DRIVER_FOOTERS_MAX`` files, where
    each footer is a network round trip; local footers are read fastest by driver threads (2,000 small files:
    0.8 s on the driver against 2.0 s through Spark tasks on 2 cores, benchmarks/bench_spark_plan.py).

    ``timings``, a dict, receives seconds per step: ``session`` (a session started here), ``footers`` (listing
    included), ``where`` (the Spark job) and ``encode`` (its matching rows to row group records, on the
    driver), or ``predicate``.
    """
    timings = {} if timings is None else timings
    if spark is not None:
        get_session(spark)  # refuse a wrong type before any work
    listed = time.perf_counter()
    url = fsutil.normalize_url(url)
    _, root, entries = list_data_files(url, table=table)  # table: exactly a Delta/Iceberg snapshot's files
    relpaths = [relative_path(e.path, root) for e in entries]
    sizes = {p: e.size for p, e in zip(relpaths, entries, strict=True)}
    mtimes = {p: listed_mtime(e) for p, e in zip(relpaths, entries, strict=True)}
    every_path = tuple(relpaths)  # partition columns and types: the whole dataset's
    if only is not None:
        missing = sorted(set(only) - set(sizes))
        if missing:
            raise InvalidValueError(f"{missing[0]!r} is no longer in {url}: the dataset changed while planning; "
                                    "re-run planning")
        wanted = set(only)
        relpaths = [p for p in relpaths if p in wanted]
    in_tasks = footers_in_tasks
    if in_tasks is None:
        in_tasks = len(relpaths) > DRIVER_FOOTERS_MAX and not fsutil.is_local(url)
    log.info("scanning %d files (%.1f MB) of %s: footers %s", len(relpaths), sum(sizes.values()) / 1e6, url,
             "in Spark tasks" if in_tasks else "on the driver")
    before_session = time.perf_counter()
    if in_tasks or where is not None or predicate is not None:
        spark = get_session(spark)  # only now: footers of a local dataset need no Spark at all
        if is_connect(spark):
            if predicate is not None:
                raise InvalidValueError(f"predicate={predicate!r} with engine='spark' runs an RDD job, which a Spark "
                                        "Connect session cannot; pass where= (a Spark SQL expression, which works "
                                        "on Connect), or plan with engine='local' and the predicate")
            in_tasks = False  # no RDDs: driver threads read the footers
    timings["session"] = time.perf_counter() - before_session
    if in_tasks:
        ship_package(spark)
        sc = spark.sparkContext
        slices = max(1, min(len(relpaths), sc.defaultParallelism * 4))
        results = sc.parallelize(relpaths, slices).mapPartitions(_footer_task(url, root)).collect()
    else:
        results = read_footers(url, root, relpaths)
    files = _file_infos(url, results, sizes, mtimes, table)
    kind = "petastorm" if has_unischema(url) else "plain"
    partition_columns = tuple(sorted({k for p in every_path for k in partition_values(p)}))
    timings["footers"] = time.perf_counter() - listed - timings["session"]
    log.info("%d files, %d row groups, %d rows (footers read in %.1f s)", len(files),
             sum(len(f.row_group_rows) for f in files), sum(f.num_rows for f in files), timings["footers"])
    if where is None and predicate is None:
        return full_catalog(files, kind, partition_columns)
    started = time.perf_counter()
    if where is not None:
        one_schema = len({r[4] for r in results}) == 1 and table is None and not partition_columns
        matches = _where_matches(spark, url, root, files, where, partition_columns, timings, table=table,
                                 schema_from=files[0].path if one_schema and files else None,
                                 every_path=every_path if only is not None else None)
        what = f"where {where!r}"
    else:
        columns = list(results[0][2]) + list(partition_columns) if results else list(partition_columns)
        fields = check_fields(predicate, columns, url)
        matches = _predicate_matches(spark, url, root, files, predicate, fields, kind, every_path, table)
        what = f"predicate on {fields}"
    catalog = Catalog(tuple(files), RowGroups.from_matches(sorted(matches, key=lambda m: (m.path, m.row_group))),
                      kind, partition_columns)
    if where is None:
        timings["predicate"] = time.perf_counter() - started
    log.info("%s matches %d of %d rows in %d row groups (%.1f s)", what, catalog.total_rows, catalog.scanned_rows,
             len(catalog.row_groups), time.perf_counter() - started)
    return catalog


# ---------------------------------------------------------------------------------------------- footers

def read_footers(url: str, root: str, relpaths: Sequence[str], threads: int = FOOTER_THREADS) -> list[tuple]:
    """``(relpath, row group rows, column names, footer digest, schema key)`` per file, or ``(relpath, None,
    error text, "", "")`` for a file that is not Parquet: errors travel back as values so the driver raises one
    clear ``ValueError``, not a task failure. The schema key (the Parquet schema and the schema Spark stored, as
    text) is equal for files Spark infers one schema from, whichever of them it opens."""
    import pyarrow as pa
    filesystem, _ = fsutil.resolve(url)

    def footer(relpath):
        try:
            rows, meta, digest = read_footer(filesystem, f"{root}/{relpath}" if root else relpath)
        except (pa.ArrowException, OSError) as exc:
            return relpath, None, f"{type(exc).__name__}: {exc}", "", ""
        stored = (meta.metadata or {}).get(SPARK_ROW_METADATA, b"")
        described = [line for line in str(meta.schema).splitlines() if not line.startswith("<pyarrow")]
        return relpath, rows, tuple(meta.schema.to_arrow_schema().names), digest, "\n".join(described) + repr(stored)

    with ThreadPoolExecutor(max(1, min(threads, len(relpaths)))) as pool:
        return list(pool.map(footer, relpaths))


def _footer_task(url, root):
    def task(relpaths):
        return read_footers(url, root, list(relpaths))
    return task


def _file_infos(url: str, results: Sequence[tuple], sizes: dict[str, int],
                mtimes: dict[str, int | None], table=None) -> list[FileInfo]:
    """FileInfos sorted by path, after the checks ``scan.scan`` makes: readable footers, one set of columns (a
    Delta table's: its columns, some files lacking the columns added after them)."""
    results = sorted(results, key=lambda r: r[0])
    for relpath, rows, detail, *_ in results:
        if rows is None:
            raise footer_error(relpath, url, detail)
    first = results[0]
    delta = table is not None and table.format == "delta"
    if delta:
        check_delta_columns(url, table, [r[0] for r in results], [r[2] for r in results])
    for relpath, _, names, *_ in [] if delta else results:
        if set(names) != set(first[2]):
            raise InvalidValueError(f"dataset_url={url!r}: {relpath!r} has columns {sorted(names)} but {first[0]!r} "
                                    f"has {sorted(first[2])}; all files of a dataset must share one schema")
    return [FileInfo(relpath, sizes[relpath], rows, digest, mtimes[relpath])
            for relpath, rows, _, digest, *_ in results]


# ---------------------------------------------------------------------------------------------- where (SQL)

def spark_url(url: str) -> str:
    """The location Spark's Hadoop filesystems read as the same folder as ``fs.resolve(url)`` (``s3://`` ->
    ``s3a://``). Hadoop's ``Path`` does not percent-decode (it reads ``file:///a%2523`` as a folder named
    ``a%2523``), so a local dataset is handed over as its decoded path: ``#``, ``%`` and spaces stay characters.
    ``read_for_where`` also turns Spark's globbing off, so ``?``, ``*`` and ``[`` are characters too."""
    if fsutil.is_local(url):
        return "file://" + fsutil.local_path(url)
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
def _sql_conf(spark, settings: dict[str, str]):
    """Set SQL confs for one query and put the session's values back."""
    before = {key: spark.conf.get(key) for key in settings}
    for key, value in settings.items():
        spark.conf.set(key, value)
    try:
        yield
    finally:
        for key, value in before.items():
            spark.conf.set(key, value)


@contextlib.contextmanager
def quiet_pyspark_error_logs():
    """PySpark logs every AnalysisException with a stack trace; we turn it into one clear ValueError instead."""
    loggers = [logging.getLogger(n) for n in ("SQLQueryContextLogger", "DataFrameQueryContextLogger")]
    before = [lg.disabled for lg in loggers]
    for lg in loggers:
        lg.disabled = True
    try:
        yield
    finally:
        for lg, was in zip(loggers, before, strict=True):
            lg.disabled = was


def _where_matches(spark, url: str, root: str, files: Sequence[FileInfo], where: str,
                   partition_columns: Sequence[str], timings: dict, table=None,
                   schema_from: str | None = None, every_path: Sequence[str] | None = None) -> list[RowGroupMatch]:
    """``every_path``: given when ``files`` are some of the dataset's (an update), which Spark then reads by name
    with the partition types of every path."""
    started = time.perf_counter()
    schema = _footer_schema(spark, url, root, schema_from) if schema_from is not None else None
    frame = read_for_where(spark, url, partition_types(table, every_path or [f.path for f in files]),
                            files if table is not None or every_path is not None else None, schema=schema,
                            table=table)
    columns = frame.columns
    if "_metadata" in columns:
        raise InvalidValueError(f"dataset_url={url!r} has a column named '_metadata', which hides Spark's file "
                                "metadata that where= needs; rename the column or plan with a Petastorm predicate=")
    _check_same_files(url, root, files, frame.inputFiles())
    with_rows = [f for f in files if f.num_rows > 0]
    # Which file a row comes from: its size when that tells the files with rows apart (a number: cheaper to hash
    # and move than a path), packed with the row index as size << shift | row index when that fits in 63 bits.
    sizes = [f.size for f in with_rows]
    width = max([f.num_rows for f in files] + [1 << WORD_BITS]).bit_length()
    shift: int | None = width
    if len(set(sizes)) != len(sizes) or (max(sizes + [0]) + 1) << width >= 2 ** 63:
        shift = None
    packed = f"shiftleft(_metadata.file_size, {shift}) | _metadata.row_index"
    # One small shuffle (files or words): a partition per core, and no adaptive re-planning between its stages.
    cores = default_parallelism(spark)
    shuffle = {} if cores is None else {"spark.sql.shuffle.partitions": str(max(1, cores)),
                                        "spark.sql.adaptive.enabled": "false"}
    with quiet_pyspark_error_logs():
        try:
            matching = frame.where(where)
        except AnalysisException as exc:  # includes ParseException
            raise InvalidWhereError(where, first_line(exc), columns) from None
        if _decided_per_file(frame, where, partition_columns):
            # Only which files match crosses to the driver: no row index is read, no row is sent.
            mode = "files"
            query = matching.select(F.col("_metadata.file_size" if shift is not None else "_metadata.file_path")
                                    .alias("file")).distinct()
        elif shift is not None and sum(f.num_rows for f in files) <= ROWS_TO_DRIVER_MAX:
            mode, query, shuffle = "rows", matching.select(F.expr(packed).alias("row")), {}
        else:
            # Spark folds rows into words inside each scan task (partial aggregation); only words are shuffled.
            mode = "words"
            keys = ([F.expr(f"shiftright({packed}, {WORD_BITS})").alias("word")] if shift is not None else
                    [F.col("_metadata.file_path").alias("file"),
                     F.expr(f"shiftright(_metadata.row_index, {WORD_BITS})").alias("word")])
            bit = F.expr(f"bit_or(shiftleft(1L, cast(_metadata.row_index & {(1 << WORD_BITS) - 1} as int)))")
            query = matching.groupBy(*keys).agg(bit.alias("bits"))
        try:
            with _sql_conf(spark, shuffle):
                table = query.toArrow()
        except (AnalysisException, ArithmeticException, DateTimeException, NumberFormatException,
                SparkRuntimeException) as exc:
            raise InvalidWhereError(where, first_line(exc), columns, on_data=True) from None
    timings["where"] = time.perf_counter() - started
    started = time.perf_counter()
    by_size, listed = {f.size: f for f in with_rows}, {f.path: f for f in with_rows}
    if mode == "files":
        keys = table.column("file").to_pylist()
        chosen = [by_size.get(k) for k in keys] if shift is not None else \
            [listed.get(spark_relative_path(k, root)) for k in keys]
        found = [f for f in chosen if f is not None]
        if len(found) != len(chosen):
            raise _changed_while_planning()
        matches = [RowGroupMatch(f.path, i, n, n) for f in found for i, n in enumerate(f.row_group_rows) if n]
    elif mode == "rows" and shift is not None:  # rows mode is chosen only with a shift
        matches = matches_from_rows(table.column("row").to_numpy(), shift, with_rows)
    elif shift is not None:
        word = table.column("word").to_numpy()
        matches = matches_from_words(word >> (shift - WORD_BITS), word & ((1 << (shift - WORD_BITS)) - 1),
                                     table.column("bits").to_numpy(), by_size)
    else:
        coded = table.column("file").combine_chunks().dictionary_encode()
        matches = matches_from_words(coded.indices.to_numpy(zero_copy_only=False), table.column("word").to_numpy(),
                                     table.column("bits").to_numpy(),
                                     {i: listed.get(spark_relative_path(name, root))
                                      for i, name in enumerate(coded.dictionary.to_pylist())})
    timings["encode"] = time.perf_counter() - started
    return matches


def _decided_per_file(frame, where: str, partition_columns: Sequence[str]) -> bool:
    """Whether ``where`` reads hive partition columns only and is deterministic: then all the rows of a file get
    one answer (they share its partition values), and Spark need only say which files match. ``rand() < 0.1``
    reads no column but must stay row by row. Anything unclear answers False: the row-level path is always right.
    """
    if not partition_columns:
        return False
    try:
        only = frame.select(*[F.col("`" + c.replace("`", "``") + "`") for c in partition_columns]).where(where)
        analyzed = only._jdf.queryExecution().analyzed()
        return analyzed.nodeName() == "Filter" and bool(analyzed.condition().deterministic())
    except Exception:  # noqa: BLE001 - a data column in the where (AnalysisException), or a plan shape we do not know
        return False


def matches_from_rows(rows: np.ndarray, shift: int, files: Sequence[FileInfo]) -> list[RowGroupMatch]:
    """One ``RowGroupMatch`` per row group with a matching row, from matching rows packed as
    ``file size << shift | row index`` (any order; ``files`` have distinct sizes). No sort: one mask over every
    scanned row, set by scatter."""
    files = sorted(files, key=lambda f: f.size)
    sizes = np.array([f.size for f in files], dtype=np.int64)
    offsets = np.concatenate(([0], np.cumsum([f.num_rows for f in files], dtype=np.int64)))
    at = np.minimum(np.searchsorted(sizes, rows >> shift), len(files) - 1) if len(files) else rows[:0]
    index = rows & ((1 << shift) - 1)
    if len(rows) and not (np.array_equal(sizes[at], rows >> shift) and (index < np.diff(offsets)[at]).all()):
        raise _changed_while_planning()
    mask = np.zeros(offsets[-1], dtype=bool)
    mask[offsets[at] + index] = True
    return [m for k, info in enumerate(files) for m in _file_matches(info, mask[offsets[k]:offsets[k + 1]])]


def matches_from_words(file_key: np.ndarray, word: np.ndarray, bits: np.ndarray, files) -> list[RowGroupMatch]:
    """One ``RowGroupMatch`` per row group with a matching row, from 64-row words: ``(file_key[i], word[i])``
    names rows ``64 * word[i]`` to ``64 * word[i] + 63`` of the file ``files[file_key[i]]`` (a ``FileInfo``), and
    bit ``j`` of ``bits[i]`` (an int64, as Spark's long) says whether row ``64 * word[i] + j`` matches. Keys are
    unique, in any order. One file is unpacked at a time, so memory follows the largest file, not the dataset.
    """
    order = np.argsort(file_key, kind="stable")
    file_key, word = file_key[order], word[order]
    bits = np.ascontiguousarray(bits[order]).astype("<i8", copy=False)
    cuts = np.flatnonzero(np.diff(file_key)) + 1
    out = []
    for lo, hi in zip(np.concatenate(([0], cuts)), np.concatenate((cuts, [len(file_key)])), strict=True):
        if lo == hi:
            continue  # no word at all
        info = files.get(int(file_key[lo]))
        words = -(-info.num_rows // (1 << WORD_BITS)) if info is not None else 0
        if info is None or word[lo:hi].max() >= words:
            raise _changed_while_planning()
        packed = np.zeros(words, dtype="<i8")
        packed[word[lo:hi]] = bits[lo:hi]
        mask = np.unpackbits(packed.view(np.uint8), bitorder="little").view(bool)
        if mask[info.num_rows:].any():
            raise _changed_while_planning()
        out.extend(_file_matches(info, mask[:info.num_rows]))
    return out


def _file_matches(info: FileInfo, mask: np.ndarray) -> list[RowGroupMatch]:
    """The records of one file's row groups with a matching row, encoded by ``match_from_mask`` as the local engine
    encodes them (G8)."""
    bounds = np.concatenate(([0], np.cumsum(info.row_group_rows, dtype=np.int64)))
    return [m for i in range(len(info.row_group_rows))
            if (m := match_from_mask(info.path, i, mask[bounds[i]:bounds[i + 1]])) is not None]


def _changed_while_planning() -> InvalidValueError:
    return InvalidValueError("Spark reports matching rows past the files' footers (or in a file planning did not "
                             "list); the dataset changed while planning: re-run planning")


def _footer_schema(spark, url: str, root: str, relpath: str):
    """The schema Spark's own inference gives the dataset, computed on the driver from one footer with Spark's own
    converter (``ParquetFileFormat.readSchemaFromFooter``, the session's SQL conf), or None to let Spark infer it.

    ``spark.read.parquet`` infers a schema in a Spark job that opens one file's footer: 0.1-0.5 s on a cluster,
    10-25% of a count(where) of a few million rows. The caller passes a file only when every file has the same
    Parquet schema (and Spark-stored schema), no hive partition columns and no table snapshot, so the file Spark
    would open gives the same answer. A summary file (``_common_metadata``, ``_metadata``), which Spark reads
    first, or anything unexpected (Spark Connect, another Spark version's classes) leaves it to Spark."""
    if is_connect(spark):
        return None
    from pyarrow import fs as pafs
    filesystem, _ = fsutil.resolve(url)
    try:
        summaries = filesystem.get_file_info([f"{root}/{name}" if root else name
                                              for name in ("_common_metadata", "_metadata")])
        if any(info.type != pafs.FileType.NotFound for info in summaries):
            return None
        from pyspark.sql.types import StructType
        jvm, session = spark._jvm, spark._jsparkSession
        parquet = jvm.org.apache.spark.sql.execution.datasources.parquet
        path = jvm.org.apache.hadoop.fs.Path(f"{spark_url(url)}/{relpath}")
        conf, everything = (session.sessionState().newHadoopConf(),
                            jvm.org.apache.parquet.format.converter.ParquetMetadataConverter.NO_FILTER)
        try:  # Spark 4.0: (Configuration, Path, filter)
            metadata = parquet.ParquetFooterReader.readFooter(conf, path, everything)
        except Exception:  # noqa: BLE001 - Spark 4.1+: (HadoopInputFile, filter)
            metadata = parquet.ParquetFooterReader.readFooter(
                jvm.org.apache.parquet.hadoop.util.HadoopInputFile.fromPath(path, conf), everything)
        converter = parquet.ParquetToSparkSchemaConverter(session.sessionState().conf())
        inferred = parquet.ParquetFileFormat.readSchemaFromFooter(jvm.org.apache.parquet.hadoop.Footer(path, metadata),
                                                                  converter)
        return StructType.fromJson(json.loads(inferred.asNullable().json()))  # as the file source relation makes it
    except Exception as exc:  # noqa: BLE001 - any failure here only costs the inference job we tried to save
        log.debug("schema from the footer of %s failed (%s); Spark infers it", relpath, first_line(exc))
        return None


def read_for_where(spark, url: str, hive_types: dict[str, str] | None = None,
                    files: Sequence[FileInfo] | None = None, schema=None, table=None):
    """The dataset as a Spark DataFrame; a Hadoop filesystem missing for the URL's scheme (offline pyspark wheels
    have no S3A) is reported as what to install instead of a Java stack trace.

    With ``hive_types`` (``io.partitions.partition_types``) the hive partition columns get the types the loader
    delivers instead of Spark's own inference (which makes ``1.5`` a double and ``2021-01-01`` a date): strings,
    or ints where pyarrow infers int32; Spark URL-decodes values and reads ``__HIVE_DEFAULT_PARTITION__`` as NULL
    as pyarrow does, so a where sees the values the loader delivers (G13).

    ``files`` (a table snapshot's): Spark reads exactly those, partitions discovered below ``url`` as for a folder;
    no Delta or Iceberg jar is involved.

    ``schema`` (``_footer_schema``): the schema Spark would infer, given so that no inference job runs.

    ``table`` (a Delta snapshot's ``TableRef``): its files' schemas are merged, so that a column added to the table
    reads as nulls in the files written before it (as deltalake reads them) rather than Spark taking one file's
    columns."""
    base = spark_url(url)
    paths = [f"{base}/{f.path}" for f in files] if files is not None else [base]

    def read(reader):
        reader = reader.option("__globPaths__", "false")  # a path, not a pattern (``q?x`` would read ``qAx`` too)
        if table is not None and table.format == "delta":
            reader = reader.option("mergeSchema", "true")
        # an Iceberg file stores its identity partition columns: without a basePath Spark reads them from the file,
        # as pyiceberg does, and no folder text ('s=007', pyiceberg's 'a+b' for 'a b') becomes a column
        iceberg = table is not None and table.format == "iceberg"
        return (reader.option("basePath", base) if files is not None and not iceberg else reader).parquet(*paths)

    try:
        if schema is not None and not hive_types:
            return read(spark.read.schema(schema))
        if not hive_types:
            return read(spark.read)
        with _sql_conf(spark, {"spark.sql.sources.partitionColumnTypeInference.enabled": "false"}):
            frame = read(spark.read)
            ints = [name for name, kind in hive_types.items() if kind == "int32" and name in frame.columns]
            if ints:
                from pyspark.sql.types import IntegerType, StructField, StructType
                schema = StructType([StructField(f.name, IntegerType(), True) if f.name in ints else f
                                     for f in frame.schema.fields])
                frame = read(spark.read.schema(schema))
            for name, kind in hive_types.items():  # a table's declared types: the folder text cast as declared
                if kind not in ("int32", "string") and name in frame.columns:
                    from pyspark.sql import functions as F
                    frame = frame.withColumn(name, F.expr(_spark_cast(f"`{name}`", kind)))
        return frame
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


def _spark_cast(column: str, kind: str) -> str:
    """Spark SQL giving a partition folder's text (a string column) the value ``io.partitions.parse`` gives it: a
    UTC timestamp without a zone offset is read as UTC whatever the session's time zone."""
    decimal = re.fullmatch(r"decimal128\((\d+), (\d+)\)", kind)
    if decimal:
        return f"CAST({column} AS DECIMAL({decimal.group(1)}, {decimal.group(2)}))"
    if kind == "timestamp[us, tz=UTC]":
        return (f"CAST(CASE WHEN {column} RLIKE '(Z|[+-][0-9][0-9]:?[0-9][0-9])$' THEN {column} "
                f"ELSE concat({column}, 'Z') END AS TIMESTAMP)")
    sql = {"int8": "TINYINT", "int16": "SMALLINT", "int64": "BIGINT", "bool": "BOOLEAN", "float": "FLOAT",
           "double": "DOUBLE", "date32[day]": "DATE", "timestamp[us]": "TIMESTAMP_NTZ"}[kind]
    return f"CAST({column} AS {sql})"


def _check_same_files(url: str, root: str, files: Sequence[FileInfo], spark_files: Sequence[str]) -> None:
    """Spark lists files by its own rules; a plan keyed by our listing must see exactly the rows Spark filtered."""
    ours = {f.path for f in files}
    theirs = {spark_relative_path(p, root) for p in spark_files}
    for path in sorted(ours ^ theirs):
        who = "Spark reads it but petastorm-balanced skips it" if path in theirs else \
            "petastorm-balanced reads it but Spark skips it"
        raise InvalidValueError(f"{path!r} in dataset_url={url!r}: {who}; rename it (a leading '_' or '.' marks a "
                                "file that is not data) or remove it")


# ---------------------------------------------------------------------------------------------- Petastorm predicate

def _predicate_matches(spark, url, root, files, predicate, fields, kind, every_path, table=None
                       ) -> list[RowGroupMatch]:
    ship_package(spark)
    sc = spark.sparkContext
    work = [(f.path, f.row_group_rows) for f in files if f.num_rows > 0]
    if not work:
        return []
    slices = max(1, min(len(work), sc.defaultParallelism * 4))
    types = partition_types(table, every_path)  # the whole dataset's, as the local engine passes them
    out = sc.parallelize(work, slices).mapPartitions(_predicate_task(url, root, predicate, fields, kind,
                                                                     types)).collect()
    errors = [r for r in out if r[0] is None]
    if errors:
        raise InvalidValueError(f"predicate={predicate!r} failed on {errors[0][1]}; fix the predicate so do_include "
                                "accepts the rows of this dataset")
    return [RowGroupMatch(*r) for r in out]


def _predicate_task(url, root, predicate, fields, kind, types):
    def task(items):
        filesystem, _ = fsutil.resolve(url)
        unischema = load_unischema(url) if kind == "petastorm" else None
        for relpath, rows in items:
            with filesystem.open_input_file(f"{root}/{relpath}" if root else relpath) as handle:
                for i, n in enumerate(rows):
                    if n == 0:
                        continue
                    try:
                        mask = row_group_mask(handle, relpath, i, predicate, fields, unischema=unischema,
                                              partition_types=types)
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


def ship_package(spark) -> None:
    if is_connect(spark):
        _ship_package_connect(spark)
        return
    sc = spark.sparkContext
    if sc.applicationId in _SHIPPED or sc.getConf().get(SHIP_CONF, "true").lower() == "false":
        return
    if not os.path.isdir(_package_dir()):
        return  # imported from a zip (--py-files): Spark already ships that zip to the executors
    sc.addPyFile(package_zip())
    _SHIPPED.add(sc.applicationId)


def _ship_package_connect(spark) -> None:
    """Spark Connect: the zip goes to the session's Python path with ``addArtifacts`` (once per session)."""
    key = ("connect", spark.session_id)
    if key in _SHIPPED or (spark.conf.get(SHIP_CONF, "true") or "true").lower() == "false":
        return
    if not os.path.isdir(_package_dir()):
        return
    spark.addArtifacts(package_zip(), pyfile=True)
    _SHIPPED.add(key)


def first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
