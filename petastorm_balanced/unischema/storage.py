"""Where a Petastorm dataset keeps its Unischema: the keys of ``_common_metadata``, and loading the stored schema.

Petastorm 0.12.1 writes two keys into the dataset's ``_common_metadata`` (``petastorm.etl.dataset_metadata``): the
schema pickled under Petastorm's class paths, and the row groups per file as JSON. A dataset is a Petastorm dataset
exactly when the first key is there. Every path that opens one (planning, ``load_plan``, both backends, the writer
and the test-data generator) takes the keys and the loader from here, so the allow-list is never bypassed.
"""
from __future__ import annotations

import pyarrow.fs as pafs

from ..io import fs as fsutil
from ..io import retry
from ..io.footer import footer_at
from .pickling import loads

UNISCHEMA_KEY = b"dataset-toolkit.unischema.v1"
ROW_GROUPS_PER_FILE_KEY = b"dataset-toolkit.num_row_groups_per_file.v1"


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


def _unischema_bytes(url: str) -> bytes | None:
    filesystem, root = fsutil.resolve(url)
    meta_path = root + "/_common_metadata"
    where = f"{url}/_common_metadata"
    info = retry.call_naming(lambda: filesystem.get_file_info(meta_path), url=where, what="looking up")
    if info.type != pafs.FileType.File:
        return None

    def read():
        return footer_at(filesystem, meta_path).metadata or {}
    return retry.call_naming(read, url=where, what="reading").get(UNISCHEMA_KEY)
