"""Footers to file infos: the first step of planning (both engines read footers here).

Files are listed by ``io.dataset``. Footers are read in parallel threads
because each one is a small, latency-bound read, which is what dominates on object stores.
"""
from __future__ import annotations

from collections.abc import Collection
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import pyarrow as pa

from ..core.catalog import FileInfo
from ..errors import InvalidValueError, StalePlanError, StorageUnavailableError
from ..io import footer as io_footer
from ..io import fs as fsutil
from ..io import retry
from ..io.dataset import list_data_files, relative_path
from ..io.partitions import partition_values
from ..plan.format import check_dataset
from ..unischema.storage import has_unischema

FOOTER_THREADS = 16
FOOTER_CHUNK = 64  # files per thread task


@dataclass(frozen=True)
class DatasetListing:
    """The data files of a dataset and what the dataset is (plain Parquet or Petastorm)."""

    url: str
    files: tuple[FileInfo, ...]
    kind: str  # 'petastorm' or 'plain'
    partition_columns: tuple[str, ...]
    schema: pa.Schema | None = None
    paths: tuple[str, ...] = ()  # every listed file's path, those not read included (``scan(only=...)``)


def scan(url: str, *, threads: int = FOOTER_THREADS, progress=None, table=None,
         only: Collection[str] | None = None) -> DatasetListing:
    """List the dataset and read every footer: row counts per row group, sizes, kind, partition columns.

    ``only`` (relative paths; a plan update's added files): read just those footers and list just those files;
    the partition columns (and ``paths``, whose partition types predicates see) still come from every listed file,
    as a scan of the whole dataset gives them.

    Footers are read in chunks of files per thread task: on a local disk a footer costs ~0.1 ms of CPU, so one
    future per file spent as much time in thread hand-offs as in parsing; chunks keep enough tasks in flight for
    object-store latency while cutting that overhead (10,000 small files: about 40% less CPU).
    """
    url = fsutil.normalize_url(url)
    filesystem, root, entries = list_data_files(url, table=table)  # table: a Delta/Iceberg snapshot (io/tables.py)
    paths = tuple(relative_path(e.path, root) for e in entries)
    if only is not None:
        wanted = set(only)
        entries = [e for e, p in zip(entries, paths, strict=True) if p in wanted]
        if len(entries) != len(wanted):
            raise StalePlanError(f"{sorted(wanted - set(paths))[0]!r} is no longer in {url}: the dataset changed "
                                 "while planning; re-run planning")

    def read(entry):
        path = relative_path(entry.path, root)
        try:
            rows, meta, digest = retry.call(lambda: read_footer(filesystem, entry.path), url=f"{url}/{path}")
        except StorageUnavailableError:
            raise  # the storage's fault: it says so, with the URL; nothing says this file is wrong
        except (pa.ArrowException, OSError) as exc:
            raise footer_error(path, url, exc) from exc
        return FileInfo(path, entry.size, rows, digest, listed_mtime(entry)), meta

    first, first_meta = read(entries[0])
    reference = first_meta.schema
    try:
        schema = reference.to_arrow_schema()
    except pa.ArrowException as exc:
        raise footer_error(first.path, url, exc) from exc

    def footers(chunk):
        """(FileInfo, column names if the schema differs from the first file's else None) per file.

        Footers are not kept: a large file's footer can weigh hundreds of KB.
        """
        out = []
        for entry in chunk:
            info, meta = read(entry)
            same = meta.schema.equals(reference)  # the common case, compared in C++ without an Arrow schema
            out.append((info, None if same else meta.schema.to_arrow_schema()))
        return out

    rest = entries[1:]
    workers = max(1, min(threads, len(rest)))
    size = max(1, min(FOOTER_CHUNK, len(rest) // (4 * workers)))  # >= 4 tasks per thread when there are few files
    results = [(first, None)]
    if progress is not None:
        progress(1)
    with ThreadPoolExecutor(workers) as pool:
        for items in pool.map(footers, [rest[i:i + size] for i in range(0, len(rest), size)]):
            results.extend(items)
            if progress is not None:
                progress(len(items))
    files = tuple(r[0] for r in results)
    if table is not None and table.format == "delta":
        schema = _delta_columns(url, files, [r[1] for r in results], schema, table)
    else:
        _check_same_columns(url, files, [None if r[1] is None else set(r[1].names) for r in results],
                            set(schema.names), table)
    columns = sorted({k for p in paths for k in partition_values(p)})
    return DatasetListing(url, files, "petastorm" if has_unischema(url) else "plain", tuple(columns),
                          schema, paths)


def _delta_columns(url, files, schemas, first: pa.Schema, table) -> pa.Schema:
    """The stored columns of a Delta snapshot, in the table's order (``schemas``: each file's Arrow schema, None
    where it equals the first file's ``first``); ``check_delta_columns`` says which files may differ."""
    names = [set(first.names) if other is None else set(other.names) for other in schemas]
    declared = check_delta_columns(url, table, [f.path for f in files], names)
    fields = {f.name: f for f in first}
    for other in schemas:
        for field in other or ():
            fields.setdefault(field.name, field)
    return pa.schema([fields[name] for name in declared])


def check_delta_columns(url, table, paths, names_per_file) -> tuple[str, ...]:
    """The table's stored columns, after checking each file's column names (``names_per_file``): a file may lack
    columns added to the table after it was written (read as nulls, as deltalake reads them), but every column must
    be the table's, and every table column in some file."""
    from ..io.tables import snapshot
    declared = snapshot(table).columns
    held: set = set()
    for path, names in zip(paths, names_per_file, strict=True):
        extra = sorted(set(names) - set(declared))
        if extra:
            raise InvalidValueError(f"dataset_url={url!r}: {path!r} of {table.describe()} stores column(s) {extra} "
                                    f"that the table's schema does not have ({list(declared)}); such a file cannot "
                                    "be read as the table: rewrite the table (write_deltalake(path, "
                                    "DeltaTable(path).to_pyarrow_table(), mode='overwrite', schema_mode='overwrite')) "
                                    "and plan the new version")
        held.update(names)
    missing = [name for name in declared if name not in held]
    if missing:
        raise InvalidValueError(f"dataset_url={url!r}: {table.describe()} declares columns {missing} that none of "
                                "its files holds (added without data), which deltalake reads as nulls but "
                                "petastorm-balanced cannot type from the files: write a version whose files hold "
                                "every column (write_deltalake(path, DeltaTable(path).to_pyarrow_table(), "
                                "mode='overwrite')) and plan it")
    return declared


def _check_same_columns(url, files, names_per_file, names, table=None):
    """Every file must have the first file's column names (``None``: its schema equals the first file's); for an
    Iceberg snapshot the message says how to bring its files to one schema (Delta: ``_delta_columns``)."""
    for f, other in zip(files, names_per_file, strict=True):
        if other is not None and other != names:
            fix = "all files of a dataset must share one schema"
            if table is not None and table.format == "iceberg":
                fix = (f"the table's schema evolved between its files ({table.describe()}); rewrite the data files "
                       "(Spark: CALL system.rewrite_data_files) and plan the new snapshot")
            raise InvalidValueError(f"dataset_url={url!r}: {f.path!r} has columns {sorted(other)} but "
                                    f"{files[0].path!r} has {sorted(names)}; {fix}")


def check_footers(plan) -> None:
    """``StalePlanError`` naming the first file whose listing or row group sizes differ from the plan's (G7), by
    reading every footer again (``load_plan`` only lists; ``verify`` and the reader look deeper)."""
    try:
        files = scan(plan.dataset_url, table=plan.table).files
    except ValueError as exc:  # gone, emptied, or a file no longer readable as Parquet
        raise StalePlanError(f"the plan's dataset changed since planning: {exc}") from None
    check_dataset(plan, files=files)


def read_footer(filesystem, path: str):
    """``(rows per row group, FileMetaData, footer digest)`` of one Parquet file; pyarrow's error if it cannot be
    read.

    The local engine and the Spark engine's tasks read footers here (through ``io.footer``, as the reader does), so
    both engines record the same footer digests (G8, G15).
    """
    with filesystem.open_input_file(path) as handle:
        footer = io_footer.read_footer(handle)
    meta = footer.metadata
    return tuple(meta.row_group(i).num_rows for i in range(meta.num_row_groups)), meta, footer.digest


def listed_mtime(entry) -> int | None:
    """A listed file's modification time in nanoseconds, or None where the filesystem reports none."""
    return entry.mtime_ns


def footer_error(path: str, url: str, exc) -> Exception:
    """The error for a footer that cannot be read: a type this pyarrow does not know is not a broken file.

    Current writers (arrow-rs, pyarrow >= 16) write view types (``Utf8View``, ``BinaryView``) that old pyarrow
    versions cannot read; telling users to delete such a file would be wrong advice for valid data.
    """
    text = " ".join(str(exc).split())  # an exception, or its text when it crossed from a Spark task
    if retry.looks_transient(text):
        return StorageUnavailableError(f"{url}/{path}", 1, exc if isinstance(exc, OSError) else OSError(text),
                                       "reading the footer of")
    if isinstance(exc, pa.ArrowNotImplementedError) or "Unrecognized type" in text or "NotImplemented" in text:
        return InvalidValueError(f"{path!r} in dataset_url={url!r} uses a Parquet/Arrow type that pyarrow "
                                 f"{pa.__version__} cannot read ({text}); it is probably valid data from a newer "
                                 "writer (view types such as Utf8View need pyarrow >= 16): upgrade pyarrow (the "
                                 "modern stack, docs/stacks.md) or rewrite the file with plain string/binary types")
    return InvalidValueError(f"{path!r} in dataset_url={url!r} is not a readable Parquet file ({text}); it is corrupt "
                             "or not Parquet: restore it, or rename it with a leading '_' so it is not data")
