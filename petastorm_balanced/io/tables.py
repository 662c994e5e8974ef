"""Delta Lake and Iceberg tables as snapshots: which Parquet files one table version holds.

A table folder holds Parquet files that are no longer part of the table (removed by deletes, updates, overwrites
and compaction, until a vacuum), so listing its ``*.parquet`` plans rows the table does not have. A version of a
table names its exact files instead, and those files never change: that makes a plan of a snapshot reproducible.

``resolve`` turns what the user passed (a folder with ``_delta_log/``, an Iceberg ``.../metadata/*.metadata.json``
URL or a pyiceberg ``Table``) into a ``TableSnapshot``: the format, the table's location, the version (Delta) or
snapshot id (Iceberg) and its data files relative to the location, with sizes and the partition values the log or
manifest records. Iceberg position deletes (Parquet) are read into each file's ``deleted_rows``, which planning
removes from the plan's selections (``core/deletes.py``). What this package cannot deliver exactly (Delta deletion
vectors and column mapping, Iceberg equality deletes and Puffin deletion vectors, files outside the table's
location, Delta partition values that would read otherwise from the folder names than deltalake reads them) is
refused with an ``InvalidValueError`` naming the version and the fix, never ignored. A Delta table's partition
columns are typed as its schema declares them (``partition_types``); an Iceberg table's are read from its files.

``deltalake`` (delta-rs, extra ``[delta]``) and ``pyiceberg`` (extra ``[iceberg]``) are imported only for a table.
Snapshots are cached per process: a version's file list is immutable, so resolving it twice (planning, then both
engines' listing, then ``load_plan``'s check) costs one log read.
"""
from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from typing import Any

import pyarrow.fs as pafs

from ..core.params import check_int
from ..errors import InvalidTypeError, InvalidValueError, MissingDependencyError
from . import fs as fsutil
from . import partitions, retry
from .footer import footer_at, open_file
from .partitions import parse, partition_values  # the reader's own rule (decoded, None for a null)

DELTA, ICEBERG, PARQUET = "delta", "iceberg", "parquet"
TABLE_FORMATS = (DELTA, ICEBERG, PARQUET)  # PARQUET: a table folder read as its raw files, on purpose
DELTA_LOG = "_delta_log"
ICEBERG_METADATA_SUFFIX = ".metadata.json"


@dataclass(frozen=True)
class TableRef:
    """Which snapshot of which table a plan reads; recorded in ``plan.json`` and resolved again by every listing.

    ``location``: the table root as a normalized URL (data file paths are relative to it). ``version``: the Delta
    version or Iceberg snapshot id (None for ``format='parquet'``). ``metadata``: the Iceberg metadata JSON URL the
    snapshot is read from ("" for Delta).
    """

    format: str
    location: str
    version: int | None = None
    metadata: str = ""

    def describe(self) -> str:
        if self.format == DELTA:
            return f"Delta table {self.location} version {self.version}"
        if self.format == ICEBERG:
            return f"Iceberg table {self.location} snapshot {self.version}"
        return f"table folder {self.location} read as raw Parquet files (table_format='parquet')"

    def to_json(self) -> dict[str, Any]:
        return {"format": self.format, "location": self.location, "version": self.version,
                "metadata": self.metadata}

    @classmethod
    def from_json(cls, document: dict[str, Any]) -> TableRef:
        ref = cls(document["format"], document["location"], document["version"], document["metadata"])
        if ref.format not in TABLE_FORMATS or (ref.version is None) != (ref.format == PARQUET):
            raise ValueError(f"table {document!r} is not a table reference")
        return ref


@dataclass(frozen=True)
class TableFile:
    """One data file of a snapshot: path relative to the table location, size, partition values from the log, and
    the positions of its rows that position deletes removed (sorted; the rows stay in the Parquet file)."""

    path: str
    size: int
    partition_values: tuple[tuple[str, str | None], ...] = ()
    deleted_rows: tuple[int, ...] = ()


@dataclass(frozen=True)
class TableSnapshot:
    ref: TableRef
    files: tuple[TableFile, ...]
    partition_types: tuple[tuple[str, str], ...] = ()  # (column, kind) a Delta schema declares (io.partitions)
    columns: tuple[str, ...] = ()  # a Delta schema's columns stored in the files (the partition columns are not)

    def deleted_rows(self) -> dict[str, Any]:
        """File path -> positions (an int64 array) of the rows deletes removed, for files with any."""
        import numpy as np
        return {f.path: np.asarray(f.deleted_rows, dtype=np.int64) for f in self.files if f.deleted_rows}


def resolve(dataset, *, table_format: str | None = None, table_version: int | None = None,
            snapshot_id: int | None = None) -> TableSnapshot | None:
    """The snapshot ``dataset`` names, or None for a plain Parquet dataset (then a version is refused).

    ``table_format``: None detects (``_delta_log/`` is Delta, a ``*.metadata.json`` URL or a pyiceberg ``Table``
    is Iceberg); ``'parquet'`` reads a table folder's raw files on purpose (removed files included).
    """
    if table_format is not None and table_format not in TABLE_FORMATS:
        raise InvalidValueError(f"table_format={table_format!r} is not one of {TABLE_FORMATS} (or None to detect)")
    if table_version is not None:
        table_version = check_int("table_version", table_version, minimum=0)
    if snapshot_id is not None:
        snapshot_id = check_int("snapshot_id", snapshot_id)
    detected, location, metadata = _detect(dataset)
    fmt = table_format or detected
    if fmt == PARQUET and (table_version is not None or snapshot_id is not None):
        raise InvalidValueError("table_format='parquet' reads the raw files; it takes no table_version or snapshot_id")
    if fmt != DELTA and table_version is not None:
        raise InvalidValueError(f"table_version={table_version} needs a Delta table (a folder holding {DELTA_LOG}/); "
                                f"{location} is {'an Iceberg table: pass snapshot_id=' if fmt == ICEBERG else 'not'}")
    if fmt != ICEBERG and snapshot_id is not None:
        raise InvalidValueError(f"snapshot_id={snapshot_id} needs an Iceberg table (its metadata JSON URL or a "
                                f"pyiceberg Table); {location} is "
                                f"{'a Delta table: pass table_version=' if fmt == DELTA else 'not'}")
    if fmt is None or (fmt == PARQUET and detected is None):
        return None
    if fmt == PARQUET:
        if detected != DELTA:
            raise InvalidValueError(f"table_format='parquet' reads a Delta folder's raw files; {location} is an "
                                    "Iceberg table: plan its snapshot instead")
        return TableSnapshot(TableRef(PARQUET, location), ())
    if fmt != detected:
        raise InvalidValueError(f"table_format={fmt!r} but {location} is "
                                f"{'a ' + detected + ' table' if detected else 'no table'}; leave table_format out")
    if fmt == DELTA:
        latest = _delta_latest(location)
        if table_version is not None and table_version > latest:  # delta-rs searches long for a version past the end
            raise InvalidValueError(f"table_version={table_version} is past the latest version {latest} of the Delta "
                                    f"table at {location}; pass a version from 0 to {latest} (see "
                                    "DeltaTable.history()), or leave table_version out for the latest")
        return snapshot(TableRef(DELTA, location, latest if table_version is None else table_version))
    return snapshot(TableRef(ICEBERG, location, _iceberg_current(metadata, snapshot_id), metadata))


def _detect(dataset) -> tuple[str | None, str, str]:
    """``(format or None, location URL, Iceberg metadata URL)`` of what the user passed."""
    if hasattr(dataset, "metadata_location") and hasattr(dataset, "scan"):  # a pyiceberg Table, without importing it
        return ICEBERG, fsutil.normalize_url(dataset.location()), fsutil.normalize_url(dataset.metadata_location)
    if not isinstance(dataset, str) and not hasattr(dataset, "__fspath__"):
        raise InvalidTypeError(f"dataset_url={dataset!r} must be a path or URL (or a pyiceberg Table)")
    url = fsutil.normalize_url(dataset)
    if url.endswith(ICEBERG_METADATA_SUFFIX):
        return ICEBERG, _iceberg_location(url), url
    if is_delta_table(url):
        return DELTA, url, ""
    return None, url, ""


def is_delta_table(url: str) -> bool:
    """Whether ``url`` is a folder holding ``_delta_log/`` (one metadata call)."""
    filesystem, root = fsutil.resolve(url)
    info = retry.call_naming(lambda: filesystem.get_file_info(f"{root}/{DELTA_LOG}"), url=f"{url}/{DELTA_LOG}",
                             what="looking for a Delta log at")
    return info.type == pafs.FileType.Directory


def refuse_bare_table(url: str) -> None:
    """A Delta folder or Iceberg metadata file listed as bare Parquet is refused: it would plan removed files."""
    if url.endswith(ICEBERG_METADATA_SUFFIX):
        raise InvalidValueError(f"dataset_url={url!r} is an Iceberg table's metadata: plan it with plan_shards (its "
                                "current snapshot, or snapshot_id=), which reads the snapshot's data files")
    if is_delta_table(url):
        raise InvalidValueError(f"dataset_url={url!r} is a Delta table (it holds {DELTA_LOG}/): plan it with "
                                "plan_shards (its latest version, or table_version=N), which reads that version's "
                                "files only; table_format='parquet' (CLI --table-format parquet) reads every Parquet "
                                "file in the folder on purpose, files the table removed included")


def list_files(url: str, table: TableRef | None) -> tuple[pafs.FileSystem, str, list[pafs.FileInfo]] | None:
    """``io.dataset.list_data_files``'s answer for a table, or None when ``url`` is to be listed as a folder.

    A snapshot file that is gone (vacuum, expiry) or no longer a file is an ``InvalidValueError`` naming it.
    """
    if table is None:
        refuse_bare_table(url)
        return None
    if table.format == PARQUET:
        return None
    snap = snapshot(table)
    filesystem, root = fsutil.resolve(table.location)
    infos = retry.call_naming(lambda: filesystem.get_file_info([f"{root}/{f.path}" for f in snap.files]),
                              url=table.location, what="listing the snapshot's files in")
    for f, info in zip(snap.files, infos, strict=True):
        if info.type != pafs.FileType.File:
            raise InvalidValueError(f"{f.path!r} of {table.describe()} is gone (vacuumed or expired?): that version "
                                    "can no longer be read; plan a later version")
    return filesystem, root, sorted(infos, key=lambda e: e.path)


def snapshot(ref: TableRef) -> TableSnapshot:
    """The files of ``ref``: cached per version and per state of the log file that records it (a Delta version's
    files never change, but a table deleted and written again at the same location starts its versions anew)."""
    return _snapshot(ref, _log_stamp(ref))


def _log_stamp(ref: TableRef) -> tuple:
    """What tells a Delta version's log entry from another written at the same place: its commit file's (or, past a
    checkpoint, the log folder's) size and modification time; an Iceberg metadata file is never rewritten."""
    if ref.format != DELTA:
        return ()
    import pyarrow.fs as pafs
    filesystem, root = fsutil.resolve(ref.location)
    commit = filesystem.get_file_info(f"{root}/{DELTA_LOG}/{ref.version:020d}.json")
    if commit.type == pafs.FileType.File:
        return (commit.size, commit.mtime_ns)
    entries = filesystem.get_file_info(pafs.FileSelector(f"{root}/{DELTA_LOG}", allow_not_found=True))
    return tuple(sorted((e.base_name, e.size, e.mtime_ns) for e in entries))


@functools.lru_cache(maxsize=16)
def _snapshot(ref: TableRef, stamp: tuple) -> TableSnapshot:
    files, kinds, stored = _delta_files(ref) if ref.format == DELTA else (_iceberg_files(ref), {}, ())
    if not files:
        raise InvalidValueError(f"{ref.describe()} holds no data file; nothing to plan")
    _check_partition_folders(ref, files)
    return TableSnapshot(ref, tuple(sorted(files, key=lambda f: f.path)), tuple(sorted(kinds.items())), stored)


def partition_types(table: TableRef | None, paths) -> dict[str, str]:
    """The hive partition columns' kinds (``io.partitions``) of a dataset's files ``paths``: as a Delta table's
    schema types them, else as the folder names are inferred. Planning (predicates, where) and the reader take
    them from here, so both see one value (G13). An Iceberg table has none: its identity partition columns are
    stored in the files too (other transforms are refused), and are read from there, as pyiceberg reads them, never
    from the folder text (which would make a string ``'007'`` the int 7)."""
    if table is not None and table.format == ICEBERG:
        return {}
    declared = dict(snapshot(table).partition_types) if table is not None and table.format == DELTA else None
    return partitions.partition_types(paths, declared)


# ---------------------------------------------------------------------------------------------- Delta Lake

def _deltalake():
    try:
        import deltalake
    except ImportError as exc:
        raise MissingDependencyError(f"reading a Delta table needs deltalake ({exc}): pip install "
                                     "'petastorm-balanced[delta]' (or pass table_format='parquet' to read the raw "
                                     "files, files the table removed included)") from None
    return deltalake


def _delta_uri(location: str) -> str:
    return location[len("file://"):] if location.startswith("file://") else location


def _delta_latest(location: str) -> int:
    return int(_deltalake().DeltaTable(_delta_uri(location)).version())


def _delta_files(ref: TableRef) -> tuple[list[TableFile], dict[str, str], tuple[str, ...]]:
    import pyarrow as pa
    deltalake = _deltalake()
    try:
        table = deltalake.DeltaTable(_delta_uri(ref.location), version=ref.version)
    except Exception as exc:  # noqa: BLE001 - delta-rs raises its own TableNotFoundError/DeltaError types
        if "deletionVectors" in str(exc):
            raise _deletion_vectors_refused(ref, "some") from None
        raise InvalidValueError(f"{ref.describe()} cannot be loaded ({type(exc).__name__}: {exc}); pass a "
                                "table_version the log still holds (see DeltaTable.history())") from None
    mode = (table.metadata().configuration or {}).get("delta.columnMapping.mode", "none")
    if mode != "none":
        physical = [(f.name, (f.metadata or {}).get("delta.columnMapping.physicalName", f.name))
                    for f in table.schema().fields]
        renamed = ", ".join(f"{name!r} as {stored!r}" for name, stored in physical if stored != name)
        raise InvalidValueError(f"{ref.describe()} uses column mapping (delta.columnMapping.mode={mode!r}): its "
                                f"Parquet files store the table's fields under other names ({renamed or 'none yet'}), "
                                "which this reader does not translate; "
                                "rewrite the table without column mapping (e.g. write_deltalake(..., "
                                "mode='overwrite') of DeltaTable(...).to_pyarrow_table()) and plan the new version")
    features = set(table.protocol().reader_features or ())
    if "deletionVectors" in features:
        vectors = pa.table(table.deletion_vectors())
        if vectors.num_rows:
            first = vectors.column("filepath")[0].as_py()
            raise _deletion_vectors_refused(ref, f"{vectors.num_rows} file(s) (first {first})")
    actions = pa.table(table.get_add_actions(flatten=False))
    columns = table.metadata().partition_columns
    paths = actions.column("path").to_pylist()
    sizes = actions.column("size_bytes").to_pylist()
    parts = actions.column("partition").to_pylist() if columns else [{} for _ in paths]
    files = [TableFile(_delta_relative(ref, p), int(s), tuple((c, _text((v or {}).get(c))) for c in columns))
             for p, s, v in zip(paths, sizes, parts, strict=True)]
    kinds = _delta_partition_kinds(ref, table, columns)
    _check_partition_parse(ref, kinds, files, parts)
    stored = tuple(f.name for f in table.schema().fields if f.name not in set(columns))
    return files, kinds, stored


# Delta primitive types -> partition kinds (``io.partitions``): the Arrow types deltalake reads them as
_DELTA_KINDS = {"string": "string", "byte": "int8", "short": "int16", "integer": "int32", "long": "int64",
                "boolean": "bool", "float": "float", "double": "double", "date": "date32[day]",
                "timestamp": "timestamp[us, tz=UTC]", "timestamp_ntz": "timestamp[us]"}


def _delta_partition_kinds(ref: TableRef, table, columns: list[str]) -> dict[str, str]:
    """The partition columns' kinds as the table's schema types them (a partition folder's ``'007'`` is the
    string ``'007'`` in a string column, the int 7 in a long one), as ``DeltaTable.to_pyarrow_table`` delivers."""
    declared = {f.name: str(getattr(f.type, "type", f.type)) for f in table.schema().fields}
    kinds = {}
    for column in columns:
        name = declared.get(column, "")
        decimal = re.fullmatch(r"decimal\((\d+),\s*(\d+)\)", name)
        kind = f"decimal128({decimal.group(1)}, {decimal.group(2)})" if decimal else _DELTA_KINDS.get(name)
        if kind is None:
            raise InvalidValueError(f"{ref.describe()}: partition column {column!r} is of Delta type {name!r}, "
                                    f"which petastorm-balanced does not read from partition folders (it reads "
                                    f"{sorted(_DELTA_KINDS)} and decimal); rewrite the table partitioned by a "
                                    "column of one of those types")
        kinds[column] = kind
    return kinds


def _check_partition_parse(ref: TableRef, kinds: dict[str, str], files: list[TableFile], typed: list) -> None:
    """Every file's folder value, parsed as its column's kind (what planning and the reader use), must equal the
    value deltalake gives for it (``typed``: its add actions' partition structs), or the table is refused."""
    for f, values in zip(files, typed, strict=True):
        for column, text in partition_values(f.path).items():
            if column not in kinds:
                continue  # a folder that is no partition column of the table: _check_partition_folders refuses it
            want = (values or {}).get(column)
            try:
                got = None if text is None else parse(text, kinds[column])
            except (ValueError, TypeError, ArithmeticError) as exc:  # ArrowInvalid is a ValueError
                got = exc
            if not _same_value(got, want):
                raise InvalidValueError(f"{ref.describe()}: {f.path!r} has partition {column}={text!r}, which reads as "
                                        f"{got!r} as a {kinds[column]} but deltalake reads {want!r}; such a table "
                                        "cannot be planned exactly: rewrite it (write_deltalake(..., "
                                        "mode='overwrite')) and plan the new version")


def _same_value(got, want) -> bool:
    if isinstance(got, float) and isinstance(want, float) and got != got and want != want:
        return True  # NaN
    return type(got) is type(want) and got == want or (got is None and want is None)


def _deletion_vectors_refused(ref: TableRef, where: str) -> InvalidValueError:
    return InvalidValueError(f"{ref.describe()} has deletion vectors on {where}: their deleted rows are still in "
                             "the Parquet files, and petastorm-balanced refuses rather than deliver them; purge "
                             "them (Spark/Databricks: REORG TABLE ... APPLY (PURGE)) and plan the new version, or "
                             "write the table with delta.enableDeletionVectors=false")


def _delta_relative(ref: TableRef, path: str) -> str:
    """Add actions hold paths relative to the table (URL-encoded) or, for shallow clones, absolute URIs."""
    from urllib.parse import unquote
    if "://" not in path:
        return unquote(path)
    return _inside(ref, fsutil.normalize_url(path))


def _text(value) -> str | None:
    """A partition value as the text a hive folder name holds (None stays None)."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


# ---------------------------------------------------------------------------------------------- Iceberg

def _pyiceberg_table(metadata: str):
    try:
        from pyiceberg.table import StaticTable
    except ImportError as exc:
        raise MissingDependencyError(f"reading an Iceberg table needs pyiceberg ({exc}): pip install "
                                     "'petastorm-balanced[iceberg]'") from None
    return StaticTable.from_metadata(metadata)


def _iceberg_location(metadata: str) -> str:
    return fsutil.normalize_url(_pyiceberg_table(metadata).location())


def _iceberg_current(metadata: str, snapshot_id: int | None) -> int:
    table = _pyiceberg_table(metadata)
    if snapshot_id is None:
        current = table.current_snapshot()
        if current is None:
            raise InvalidValueError(f"the Iceberg table at {metadata} has no snapshot (no data was ever committed)")
        return int(current.snapshot_id)
    if table.snapshot_by_id(snapshot_id) is None:
        known = [s.snapshot_id for s in table.snapshots()]
        raise InvalidValueError(f"snapshot_id={snapshot_id} is not a snapshot of the Iceberg table at {metadata} "
                                f"(it has {known}); pass one of those, or the metadata JSON of a later version")
    return snapshot_id


def _iceberg_files(ref: TableRef) -> list[TableFile]:
    table = _pyiceberg_table(ref.metadata)
    specs = table.specs()
    columns = set(table.schema().column_names)
    files = []
    try:
        tasks = list(table.scan(snapshot_id=ref.version).plan_files())
    except (ValueError, NotImplementedError) as exc:  # pyiceberg refuses equality deletes itself
        raise InvalidValueError(f"{ref.describe()} cannot be planned ({exc}); equality deletes are not applied: "
                                "rewrite the data files (Spark: CALL system.rewrite_data_files) and plan the new "
                                "snapshot") from None
    for task in tasks:
        data = task.file
        deleted = _position_deletes(ref, data.file_path, task.delete_files) if task.delete_files else ()
        if str(getattr(data.file_format, "name", data.file_format)).upper() != "PARQUET":
            raise InvalidValueError(f"{ref.describe()}: {data.file_path} is {data.file_format}, not Parquet; only "
                                    "Parquet data files can be planned")
        fields = specs[data.spec_id].fields
        values = tuple((f.name, _text(data.partition[i])) for i, f in enumerate(fields))
        path = _inside(ref, fsutil.normalize_url(data.file_path))
        extra = sorted(set(partition_values(path)) - columns)
        if extra:  # a transform's folder (id_bucket=3): the reader would add it as a column the table lacks
            raise InvalidValueError(f"{ref.describe()}: {path!r} sits in partition folder(s) {extra} that are not "
                                    "columns of the table (a bucket/truncate/time transform); only identity "
                                    "partitions can be planned: repartition the table by identity")
        files.append(TableFile(path, int(data.file_size_in_bytes), values, deleted))
    current = table.current_snapshot()
    # as pyiceberg reads: the table's schema for its current snapshot, a time-travelled snapshot's own schema else
    schema = table.schema() if current is not None and current.snapshot_id == ref.version else \
        table.scan(snapshot_id=ref.version).projection()
    _check_field_ids(ref, _iceberg_columns(schema.fields), [task.file.file_path for task in tasks])
    return files


def _iceberg_columns(fields, prefix: str = "") -> dict[int, str]:
    """``{field id: dotted name}`` of a pyiceberg schema's fields, struct children included."""
    out: dict[int, str] = {}
    for field in fields:
        name = prefix + field.name
        out[int(field.field_id)] = name
        children = getattr(field.field_type, "fields", None)
        if children is not None and type(field.field_type).__name__ == "StructType":
            out.update(_iceberg_columns(children, name + "."))
    return out


def _parquet_columns(fields, prefix: str = "") -> dict[str, int | None]:
    """``{dotted name: Parquet field id or None}`` of an Arrow schema's fields, struct children included."""
    import pyarrow as pa
    out: dict[str, int | None] = {}
    for field in fields:
        name = prefix + field.name
        raw = (field.metadata or {}).get(b"PARQUET:field_id")
        out[name] = int(raw) if raw is not None else None
        if pa.types.is_struct(field.type):
            out.update(_parquet_columns(list(field.type), name + "."))
    return out


def _check_field_ids(ref: TableRef, columns: dict[int, str], data_paths: list[str]) -> None:
    """Refuse a snapshot whose data files name a column otherwise than its schema does, by Iceberg field id.

    Why: Iceberg identifies columns by field id, the reader by name. After a rename (or a swap ``a`` <-> ``b``),
    a drop and a re-add under the old name, or an added column, an older file's column of that name holds another
    column's values (or the deleted ones), which a read by name would deliver as this snapshot's. Files written
    without field ids (a migrated table read through a name mapping) are read by name, as pyiceberg reads them.
    """
    from concurrent.futures import ThreadPoolExecutor


    def schema_of(data_path: str):
        filesystem, path = fsutil.resolve(fsutil.normalize_url(data_path))
        return data_path, _parquet_columns(footer_at(filesystem, path).schema.to_arrow_schema())

    by_name = {name: field_id for field_id, name in columns.items()}
    fix = ("petastorm-balanced reads columns by name, so that snapshot cannot be read exactly: rewrite the data "
           "files under the current schema (Spark: CALL system.rewrite_data_files(table => ..., options => "
           "map('rewrite-all', 'true'))) and plan the new snapshot")
    with ThreadPoolExecutor(max(1, min(16, len(data_paths)))) as pool:
        for data_path, stored in pool.map(schema_of, data_paths):
            if all(field_id is None for field_id in stored.values()):
                continue
            where = f"{ref.describe()}: {data_path}"
            for name, field_id in stored.items():
                now = columns.get(field_id) if field_id is not None else name
                if now is None and name in by_name:
                    raise InvalidValueError(f"{where} stores column {name!r} as field id {field_id}, which the "
                                            f"table dropped; {name!r} is now field id {by_name[name]} (dropped and "
                                            f"re-added): reading by name would bring back the deleted values; {fix}")
                if now is None:
                    raise InvalidValueError(f"{where} stores column {name!r} (field id {field_id}), which the table "
                                            f"dropped; {fix}")
                if now != name:
                    also = f"; {name!r} is now field id {by_name[name]}" if name in by_name else ""
                    raise InvalidValueError(f"{where} stores field id {field_id} as column {name!r}, which the "
                                            f"table now calls {now!r} (renamed{also}); {fix}")
            missing = sorted(set(columns.values()) - set(stored))
            if missing:
                raise InvalidValueError(f"{where} lacks column(s) {missing} of the table's schema (added after it was "
                                        f"written; pyiceberg reads them as nulls); {fix}")


def _position_deletes(ref: TableRef, data_path: str, delete_files) -> tuple[int, ...]:
    """The positions Parquet position-delete files remove from ``data_path`` (pyiceberg's scan planning already
    chose the delete files that apply to it); equality deletes and deletion vectors (Puffin) are refused."""
    import numpy as np
    import pyarrow.compute as pc
    positions = []
    for delete in delete_files:
        content = str(getattr(delete.content, "name", delete.content)).upper()
        fmt = str(getattr(delete.file_format, "name", delete.file_format)).upper()
        if content != "POSITION_DELETES" or fmt != "PARQUET":
            raise InvalidValueError(f"{ref.describe()}: {data_path} has a {content.lower().replace('_', ' ')} file in "
                                    f"{fmt} ({delete.file_path}): petastorm-balanced applies Parquet position "
                                    "deletes only and refuses other merge-on-read deletes rather than deliver "
                                    "deleted rows; rewrite the data files (Spark: CALL system.rewrite_data_files) "
                                    "or write with write.delete.mode=copy-on-write, and plan the new snapshot")
        filesystem, path = fsutil.resolve(fsutil.normalize_url(delete.file_path))
        with filesystem.open_input_file(path) as handle:
            table = open_file(handle).read(columns=["file_path", "pos"])
        positions.append(table.filter(pc.equal(table.column("file_path"), data_path)).column("pos").to_numpy())
    return tuple(np.unique(np.concatenate(positions)).tolist()) if positions else ()


def _inside(ref: TableRef, url: str) -> str:
    prefix = ref.location.rstrip("/") + "/"
    if not url.startswith(prefix):
        raise InvalidValueError(f"{ref.describe()} holds {url}, outside the table's location; plans address files "
                                "relative to the table, so such a table cannot be planned: rewrite the file into "
                                "the table's location")
    return url[len(prefix):]


# ---------------------------------------------------------------------------------------------- partitions

def _check_partition_folders(ref: TableRef, files: list[TableFile]) -> None:
    """The reader takes hive partition values from ``key=value`` folder names: refuse a file whose folders would
    give other values than the log records (a missing or different key, an encoded value). A Delta file's values
    are compared as typed (``_check_partition_parse``): here its folders must name its columns. An Iceberg table's
    folders are not read at all (its files store every column)."""
    if ref.format == ICEBERG:
        return  # every column is read from the files (partition_types), never from folder names
    for f in files:
        folders = partition_values(f.path)
        recorded = dict(f.partition_values)
        expected = {k: folders.get(k, v) for k, v in recorded.items()}
        if folders != expected:
            raise InvalidValueError(f"{ref.describe()}: {f.path!r} records partition values {recorded} but its "
                                    f"folder names give {folders}, which is what the reader would deliver; only "
                                    "tables whose data files sit in hive key=value folders matching the log (the "
                                    "layout delta-rs, Spark and pyiceberg identity partitions write) can be planned")
