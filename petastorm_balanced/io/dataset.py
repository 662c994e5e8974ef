"""A dataset on its filesystem: which files hold data, hive partition values, the Unischema, unreadable files.

Files are listed through ``pyarrow.fs`` in a stable sorted order; names that Spark and pyarrow treat as metadata
(leading ``_`` or ``.``, except hive ``key=value`` folders) are skipped. Planning, staleness checks and readers all
list datasets here, so they agree on what a data file is.
"""
from __future__ import annotations

from typing import List, Optional, Tuple

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from . import fs as fsutil
from . import tables
from .partitions import partition_values  # noqa: F401 - re-exported: hive values, decoded (partitions.py)
from ..errors import InvalidValueError
from ..unischema.pickling import loads

UNISCHEMA_KEY = b"dataset-toolkit.unischema.v1"


def is_data_name(name: str) -> bool:
    """Spark's rule: ``_x`` and ``.x`` are metadata unless ``_x`` is a ``key=value`` folder; ``.crc`` is a checksum."""
    if name.startswith("."):
        return False
    if name.startswith("_") and "=" not in name:
        return False
    return not name.endswith(".crc")


def list_data_files(url: str, *, table: Optional[tables.TableRef] = None
                    ) -> Tuple[pafs.FileSystem, str, List[pafs.FileInfo]]:
    """The data files under ``url`` (a folder or a single file), sorted by relative path.

    ``table`` (a ``tables.TableRef``): exactly that snapshot's files. Without it a Delta table folder or an Iceberg
    metadata file is refused, never listed as bare Parquet (``io/tables.py``).
    """
    listed = tables.list_files(url, table)
    if listed is not None:
        return listed
    filesystem, root = fsutil.resolve(url)
    info = filesystem.get_file_info(root)
    if info.type == pafs.FileType.NotFound:
        raise InvalidValueError(f"dataset_url={url!r} does not exist; check the path or URL")
    if info.type == pafs.FileType.File:
        return filesystem, root.rsplit("/", 1)[0], [info]
    entries = filesystem.get_file_info(pafs.FileSelector(root, recursive=True))
    files = [e for e in entries if e.type == pafs.FileType.File
             and all(is_data_name(part) for part in relative_path(e.path, root).split("/"))]
    if not files:
        raise InvalidValueError(f"dataset_url={url!r} holds no Parquet data file (files named _* or .* are metadata); "
                                "point it at a folder of Parquet files")
    return filesystem, root, sorted(files, key=lambda e: relative_path(e.path, root))


def has_unischema(url: str) -> bool:
    """Whether the dataset is a Petastorm dataset (a Unischema in ``_common_metadata``); needs no Petastorm.

    The Unischema is loaded through the allow-list (``load_unischema``), so planning refuses a hostile pickle
    (``UnsafeDatasetError``) whether or not a predicate will decode rows.
    """
    return load_unischema(url) is not None


def load_unischema(url: str):
    """The Petastorm Unischema in ``_common_metadata`` (our classes: no Petastorm needed), or None for plain Parquet.

    Loaded through the allow-list of ``unischema/pickling.py``: a pickle naming anything but schema, codec, numpy
    and Spark SQL types raises ``UnsafeDatasetError`` and nothing in it runs. Every path that opens a Petastorm
    dataset (planning, ``load_plan``, both backends) calls this before anything else reads the pickle.
    """
    payload = _unischema_bytes(url)
    if payload is None:
        return None
    return loads(payload, where=url)


def _unischema_bytes(url: str) -> Optional[bytes]:
    filesystem, root = fsutil.resolve(url)
    meta_path = root + "/_common_metadata"
    if filesystem.get_file_info(meta_path).type != pafs.FileType.File:
        return None
    with filesystem.open_input_file(meta_path) as handle:
        metadata = pq.read_metadata(handle).metadata or {}
    return metadata.get(UNISCHEMA_KEY)


def unreadable_file(url: str, paths) -> Optional[Tuple[str, Exception]]:
    """The first of ``paths`` (relative to ``url``) whose footer cannot be read, with the error; None if all can.

    Used after a read failed with an error that does not say which file (pyarrow's footer errors do not), to name it.
    """
    filesystem, root = fsutil.resolve(url)
    for path in paths:
        try:
            with filesystem.open_input_file(f"{root}/{path}") as handle:
                pq.ParquetFile(handle).metadata  # noqa: B018 - parsing the footer is the check
        except (pa.ArrowException, OSError) as exc:
            return path, exc
    return None


def relative_path(path: str, root: str) -> str:
    return path[len(root):].lstrip("/") if root else path
