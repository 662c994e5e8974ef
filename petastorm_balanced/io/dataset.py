"""A dataset on its filesystem: which files hold data, hive partition values, the Unischema, unreadable files.

Files are listed through ``pyarrow.fs`` in a stable sorted order; names that Spark and pyarrow treat as metadata
(leading ``_`` or ``.``, except hive ``key=value`` folders) are skipped. Planning, staleness checks and readers all
list datasets here, so they agree on what a data file is.
"""
from __future__ import annotations

import os

import pyarrow as pa
import pyarrow.fs as pafs

from ..errors import InvalidValueError
from . import fs as fsutil
from . import retry, tables
from .footer import footer_at


def is_data_name(name: str) -> bool:
    """Spark's rule: ``_x`` and ``.x`` are metadata unless ``_x`` is a ``key=value`` folder; ``.crc`` is a checksum."""
    if name.startswith("."):
        return False
    if name.startswith("_") and "=" not in name:
        return False
    return not name.endswith(".crc")


def list_data_files(url: str, *, table: tables.TableRef | None = None
                    ) -> tuple[pafs.FileSystem, str, list[pafs.FileInfo]]:
    """The data files under ``url`` (a folder or a single file), sorted by relative path.

    For a single file the root is its folder, so its catalog path is its name. On a local disk symlinks are
    followed only inside the root (G14): a symlink loop, a symlink that leaves the root, a dangling symlink and two
    names for one physical file (a symlinked folder inside the root, a hard link) are refused by name rather than
    read twice, read from elsewhere or skipped.

    ``table`` (a ``tables.TableRef``): exactly that snapshot's files. Without it a Delta table folder or an Iceberg
    metadata file is refused, never listed as bare Parquet (``io/tables.py``).
    """
    listed = tables.list_files(url, table)
    if listed is not None:
        return listed
    filesystem, root = fsutil.resolve(url)
    info = stat(filesystem, root, url)
    if info.type == pafs.FileType.NotFound:
        raise InvalidValueError(f"dataset_url={url!r} does not exist; check the path or URL")
    if info.type == pafs.FileType.File:
        return filesystem, root.rsplit("/", 1)[0], [info]
    if isinstance(filesystem, pafs.LocalFileSystem):
        files = _local_files(url, root)
    else:
        entries = retry.call_naming(lambda: filesystem.get_file_info(pafs.FileSelector(root, recursive=True)),
                                    url=url, what="listing")
        files = [e for e in entries if e.type == pafs.FileType.File
                 and all(is_data_name(part) for part in relative_path(e.path, root).split("/"))]
    if not files:
        raise InvalidValueError(f"dataset_url={url!r} holds no Parquet data file (files named _* or .* are metadata); "
                                "point it at a folder of Parquet files")
    return filesystem, root, sorted(files, key=lambda e: relative_path(e.path, root))


def dataset_root(url: str) -> tuple[pafs.FileSystem, str]:
    """The filesystem and the folder a plan's catalog paths are relative to: the dataset folder, or the folder of a
    single-file dataset (as ``list_data_files`` lists it).

    Remembered per location for the process (the last ``_ROOTS_KEPT``): whether a location is a file or a folder
    is fixed for a dataset, and the stat it takes is a round trip on an object store, which every loader, epoch
    and schema pass asked for again. A dataset replaced by a file of the same name (or the reverse) is then read
    from the old root and refused by the plan's checks (a file missing or changed, G15)."""
    filesystem, root = fsutil.resolve(url)
    if isinstance(filesystem, pafs.LocalFileSystem):  # a local stat costs microseconds: always fresh
        is_file = filesystem.get_file_info(root).type == pafs.FileType.File
        return filesystem, root.rsplit("/", 1)[0] if is_file else root
    key = (fsutil.normalize_url(url), os.environ.get("AWS_ENDPOINT_URL"))
    known = _ROOTS.get(key)
    if known is None:
        is_file = stat(filesystem, root, url).type == pafs.FileType.File
        known = _ROOTS[key] = root.rsplit("/", 1)[0] if is_file else root
        while len(_ROOTS) > _ROOTS_KEPT:
            _ROOTS.pop(next(iter(_ROOTS)))
    return filesystem, known


_ROOTS: dict[tuple[str, str | None], str] = {}
_ROOTS_KEPT = 256


def stat(filesystem: pafs.FileSystem, path: str, url: str) -> pafs.FileInfo:
    """``filesystem.get_file_info(path)`` under the retry policy; a failure names ``url``."""
    return retry.call_naming(lambda: filesystem.get_file_info(path), url=url, what="looking up")


def _local_files(url: str, root: str) -> list[pafs.FileInfo]:
    """A local folder's data files, walked with ``os.scandir`` so symlinks can be judged (``pyarrow.fs`` follows
    them blindly: a folder linked to its parent listed the data 41 times)."""
    real_root = os.path.realpath(root)
    seen: dict[tuple[int, int], str] = {}  # (device, inode) -> relative path: one physical file, one name
    out: list[pafs.FileInfo] = []

    def refuse(relative: str, what: str) -> InvalidValueError:
        return InvalidValueError(f"{relative!r} in dataset_url={url!r} {what}; a dataset must hold each of its files "
                                 "once, under its root: replace the link by the file, or point dataset_url at the "
                                 "real folder")

    def walk(folder: str, relative: str, stack: tuple[str, ...]) -> None:
        with os.scandir(folder) as entries:
            for entry in entries:
                if not is_data_name(entry.name):
                    continue
                rel = f"{relative}/{entry.name}" if relative else entry.name
                is_dir = entry.is_dir(follow_symlinks=False)
                if entry.is_symlink():
                    target = os.path.realpath(entry.path)
                    if not os.path.exists(target):
                        raise refuse(rel, f"is a dangling symlink (to {os.readlink(entry.path)!r})")
                    if target != real_root and not target.startswith(real_root.rstrip("/") + "/"):
                        raise refuse(rel, f"is a symlink to {target!r}, outside the dataset root")
                    if os.path.isdir(target):
                        if target in stack:
                            raise refuse(rel, f"is a symlink loop (to {target!r}, a folder that holds it)")
                        is_dir = True
                if is_dir:
                    walk(entry.path, rel, stack + (os.path.realpath(entry.path),))
                    continue
                stat = os.stat(entry.path)
                if not os.path.isfile(entry.path):
                    continue  # a socket or fifo is not data
                key = (stat.st_dev, stat.st_ino)
                if key in seen:
                    raise refuse(rel, f"is the same physical file as {seen[key]!r} (a symlink or hard link)")
                seen[key] = rel
                out.append(pafs.FileInfo(f"{root}/{rel}", pafs.FileType.File, size=stat.st_size,
                                         mtime_ns=stat.st_mtime_ns))

    walk(root, "", (real_root,))
    return out


def unreadable_file(url: str, paths) -> tuple[str, Exception] | None:
    """The first of ``paths`` (relative to ``url``) whose footer cannot be read, with the error; None if all can.

    Used after a read failed with an error that does not say which file (pyarrow's footer errors do not), to name it.
    """
    filesystem, root = fsutil.resolve(url)

    def parse(location):
        footer_at(filesystem, location)  # parsing the footer is the check
    for path in paths:
        location = f"{root}/{path}"
        try:
            retry.call(lambda: parse(location), url=location)  # noqa: B023 - called at once
        except (pa.ArrowException, OSError) as exc:  # a StorageUnavailableError too: the caller says which
            return path, exc
    return None


def relative_path(path: str, root: str) -> str:
    return path[len(root):].lstrip("/") if root else path
