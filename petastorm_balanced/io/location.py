"""``DatasetLocation``: a dataset's filesystem and root, resolved once where a plan enters and then handed down.

Why once: every reader of a plan's files needs the filesystem and the folder the catalog paths are relative to,
and finding the folder stats the root (``dataset.dataset_root``: a file or a folder?), a round trip on an object
store. A plan keeps its location (``ShardPlan.location``) for its life in this process, so the loader's schema
pass, its list scan and every epoch's readers share one resolution. The root of a dataset does not move while a
plan of it is read; a dataset replaced under it is refused by the plan's checks (G15).

A location is never pickled with its plan, and a forked process (a DataLoader worker) resolves its own filesystem
from the URL (``fs.resolve`` keeps one S3 client per process), keeping the root: no stat again there either.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field

import pyarrow.fs as pafs

from . import fs as fsutil
from .dataset import dataset_root


@dataclass(frozen=True)
class DatasetLocation:
    """``url`` (normalized), the folder catalog paths are relative to (``root``), and its filesystem."""

    url: str
    root: str
    _filesystem: pafs.FileSystem = field(repr=False, compare=False)
    _pid: int = field(default_factory=os.getpid, repr=False, compare=False)

    @classmethod
    def of(cls, url: str) -> DatasetLocation:
        """Resolve ``url`` (a dataset folder or single file) once: the one stat of its root."""
        filesystem, root = dataset_root(url)
        return cls(url, root, filesystem)

    @property
    def filesystem(self) -> pafs.FileSystem:
        """The filesystem, for this process: a forked one resolves its own from the URL (the root is kept)."""
        if self._pid != os.getpid():
            object.__setattr__(self, "_filesystem", fsutil.resolve(self.url)[0])
            object.__setattr__(self, "_pid", os.getpid())
        return self._filesystem

    @property
    def remote(self) -> bool:
        return not isinstance(self._filesystem, pafs.LocalFileSystem)

    def path(self, relative: str) -> str:
        """The filesystem path of a catalog path."""
        return fsutil.join(self.root, relative)
