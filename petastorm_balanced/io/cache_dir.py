"""A cache folder of write-once copies: a copy is visible under its key only once it is complete.

Every writer writes into its own temporary folder (``<key>.<uuid>.tmp``; not hidden: Spark warns when it writes or
reads a folder whose name starts with ``.``; keys never hold a ``.``) and then renames it to ``<key>``.
The rename is atomic and fails when ``<key>`` already exists, so concurrent writers of one key (two processes
converting the same DataFrame) end with exactly one complete copy: the first rename wins, the others remove their
own temporary folder and serve the winner's. A writer interrupted mid-write leaves only a temporary folder, which
no reader ever opens (``Cache.lookup`` sees ``<key>`` folders only); ``Cache.sweep`` removes the old ones.
Deleting renames the copy away first, so a reader never finds a half-deleted copy under its key.

Only filesystems with an atomic, non-replacing folder rename qualify: local (and fuse-mounted: ``/dbfs``,
``/Volumes``, NFS) paths and HDFS. Object stores (S3, GCS, ABFS) have no folder rename and are refused.
"""
from __future__ import annotations

import errno
import os
import shutil
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import urlparse

import pyarrow.fs as pafs

from ..errors import InvalidValueError
from . import fs as fsutil

RENAME_SCHEMES = ("file", "hdfs", "viewfs")
TMP_SUFFIX = ".tmp"
STALE_TMP_SECONDS = 24 * 3600  # a temporary folder untouched this long belongs to a writer that died


@dataclass(frozen=True)
class Cache:
    """The cache folder ``url`` (normalized); ``check`` refuses filesystems without an atomic folder rename."""

    url: str

    @classmethod
    def at(cls, url, *, parameter: str = "parent_cache_dir_url") -> Cache:
        normalized = fsutil.normalize_url(url)
        scheme = urlparse(normalized).scheme
        if scheme not in RENAME_SCHEMES:
            raise InvalidValueError(f"{parameter}={url!r}: a cached copy is committed by an atomic folder rename, "
                                    f"which {scheme}:// does not have; use a local or mounted shared path (on "
                                    "Databricks file:///dbfs/... or /Volumes/...) or an hdfs:// folder")
        return cls(normalized)

    def child(self, name: str) -> str:
        return f"{self.url}/{name}"

    def lookup(self, key: str) -> str | None:
        """The URL of the complete copy under ``key``, or None."""
        _check_key(key)
        filesystem, path = fsutil.resolve(self.child(key))
        return self.child(key) if filesystem.get_file_info(path).type == pafs.FileType.Directory else None

    def write_once(self, key: str, write: Callable[[str], object]) -> str:
        """The URL of the complete copy under ``key``: an existing one, else the one ``write(temporary_url)``
        writes (the folder does not exist yet when ``write`` is called). When another writer commits first, its
        copy is served and ours is removed."""
        found = self.lookup(key)
        if found is not None:
            return found
        temporary = self.child(f"{key}.{uuid.uuid4().hex}{TMP_SUFFIX}")
        filesystem, root = fsutil.resolve(self.url)
        self._check_writable(filesystem, root)
        try:
            write(temporary)
            won = self._rename(temporary, self.child(key))
        except BaseException as exc:
            self._remove(temporary)
            if "No space left on device" in str(exc) or getattr(exc, "errno", None) == errno.ENOSPC:
                raise InvalidValueError(f"the cache folder {self.url} ran out of space while the copy was written "
                                        "(No space left on device; the partial copy was removed): free space there "
                                        "or point parent_cache_dir_url at a folder with room for the DataFrame's "
                                        "Parquet copy") from None
            raise
        if not won:
            self._remove(temporary)
            if self.lookup(key) is None:  # pragma: no cover - the winner deleted its copy in between
                raise InvalidValueError(f"the cached copy {self.child(key)} was deleted while it was written; retry")
        return self.child(key)

    def _check_writable(self, filesystem, root: str) -> None:
        """Refuse, naming the folder and the fix, a cache folder this process cannot write (read-only, no
        permission, full), before any work is done for it."""
        probe = f"{root}/.probe-{uuid.uuid4().hex}{TMP_SUFFIX}"
        try:
            filesystem.create_dir(root, recursive=True)
            with filesystem.open_output_stream(probe) as out:
                out.write(b"0")
            filesystem.delete_file(probe)
        except OSError as exc:
            raise InvalidValueError(f"parent_cache_dir_url: the cache folder {self.url} cannot be written here "
                                    f"({type(exc).__name__}: {' '.join(str(exc).split())}); point "
                                    "parent_cache_dir_url (or the Spark conf "
                                    "petastorm.spark.converter.parentCacheDirUrl) at a folder this process can "
                                    "write, with room for the copy") from None

    def delete(self, key: str) -> bool:
        """Remove the copy under ``key`` (renamed away first, then removed); False when there was none."""
        doomed = self.child(f"{key}.{uuid.uuid4().hex}.deleting{TMP_SUFFIX}")
        if self.lookup(key) is None or not self._rename(self.child(key), doomed):
            return False
        self._remove(doomed)
        return True

    def sweep(self, older_than: float = STALE_TMP_SECONDS) -> int:
        """Remove temporary folders of writers that died (untouched for ``older_than`` seconds); returns how many."""
        filesystem, root = fsutil.resolve(self.url)
        try:
            infos = filesystem.get_file_info(pafs.FileSelector(root, allow_not_found=True))
        except OSError:
            return 0
        cutoff = time.time() - older_than
        removed = 0
        for info in infos:
            if info.base_name.endswith(TMP_SUFFIX) and info.mtime is not None \
                    and info.mtime.timestamp() < cutoff:
                self._remove(self.child(info.base_name))
                removed += 1
        return removed

    @staticmethod
    def _rename(source: str, target: str) -> bool:
        """Atomic rename of a folder; False when ``target`` exists (someone else committed first)."""
        filesystem, source_path = fsutil.resolve(source)
        _, target_path = fsutil.resolve(target)
        if isinstance(filesystem, pafs.LocalFileSystem):
            try:
                os.rename(source_path, target_path)  # POSIX: fails on an existing non-empty folder
            except OSError as exc:
                if exc.errno in (errno.ENOTEMPTY, errno.EEXIST):
                    return False
                raise
            return True
        if filesystem.get_file_info(target_path).type != pafs.FileType.NotFound:
            return False
        try:
            filesystem.move(source_path, target_path)  # HDFS rename: refuses an existing target
        except OSError:
            if filesystem.get_file_info(target_path).type != pafs.FileType.NotFound:
                return False
            raise
        return True

    @staticmethod
    def _remove(url: str) -> None:
        filesystem, path = fsutil.resolve(url)
        if isinstance(filesystem, pafs.LocalFileSystem):
            shutil.rmtree(path, ignore_errors=True)
            return
        try:
            filesystem.delete_dir(path)
        except FileNotFoundError:
            pass


def _check_key(key: str) -> None:
    """A key is one folder name with no '.', so it never looks like a temporary folder (``<key>.<uuid>.tmp``)."""
    if not isinstance(key, str) or not key or "/" in key or "." in key:
        raise InvalidValueError(f"cache key {key!r} must be a non-empty folder name without '/' or '.'")
