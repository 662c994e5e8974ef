"""A data file's content fingerprint, where the store gives one or the user asks for one (G15's last line).

Why: a file rewritten with other values can keep its size, its footer's very bytes (no statistics, PLAIN encoding,
no compression: the footer holds only sizes and offsets) and, after ``cp -p``, ``rsync -a`` or a restore from
backup, its modification time; on S3 no trick is needed, since its times have a one-second resolution and a
re-upload within the same second keeps them. What tells such a rewrite:

- ``etag:<ETag>``: an object store's entity tag, which changes with every upload (S3, and S3-compatible stores).
  pyarrow lists no ETag, but the request that opens a file for its size (a HEAD) returns it in the file's
  metadata: planning takes it before it reads the file's footer, so a re-upload in between is refused (a new
  ETag), never served; a reader takes it afresh once per file per epoch.
- ``sha256:<hex>``: the sha256 of every byte of the file, for stores that give no fingerprint (a local disk,
  HDFS) when the user asks for it by setting ``PETASTORM_BALANCED_CONTENT_DIGEST=1`` where plans are made: the
  plan records it, and every reader of that plan hashes each file it reads once per epoch (a full read of the
  file, which is the price of the check).
- ``""``: neither; G15 then rests on the footer's digest and the modification time, and a rewrite that keeps
  both is the residual limit (docs/how-it-works.md).
"""
from __future__ import annotations

import hashlib
import os
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

import pyarrow.fs as pafs

from . import retry

DIGEST_ENV = "PETASTORM_BALANCED_CONTENT_DIGEST"
ETAG, SHA256 = "etag:", "sha256:"
THREADS = 16  # each look-up is a round trip (a HEAD) on an object store
_CHUNK = 8 << 20


def digest_wanted() -> bool:
    """Whether the user asked for a content digest of files whose store gives no fingerprint."""
    return os.environ.get(DIGEST_ENV, "").strip().lower() in ("1", "true", "yes", "on")


def of_handle(handle) -> str:
    """``etag:<ETag>`` from an open file's metadata (what the request that opened it returned), or ``""``."""
    try:
        metadata = handle.metadata() or {}
    except (OSError, NotImplementedError, AttributeError):
        return ""
    etag = metadata.get(b"ETag") or metadata.get("ETag")
    if isinstance(etag, bytes):
        etag = etag.decode("utf-8", "replace")
    return ETAG + etag if etag else ""


def sha256_of(filesystem, location: str) -> str:
    """``sha256:<hex>`` of every byte of the file."""
    digest = hashlib.sha256()
    with filesystem.open_input_stream(location) as stream:
        while True:
            chunk = stream.read(_CHUNK)
            if not chunk:
                break
            digest.update(chunk)
    return SHA256 + digest.hexdigest()


def fingerprint(filesystem, location: str, *, digest: bool) -> str:
    """The file's content fingerprint now: its ETag where the store gives one, else (``digest``) its sha256."""
    if not isinstance(filesystem, pafs.LocalFileSystem):
        with filesystem.open_input_file(location) as handle:
            tag = of_handle(handle)
        if tag:
            return tag
    return sha256_of(filesystem, location) if digest else ""


def fresh(filesystem, location: str, planned: str) -> str:
    """The file's fingerprint now, of the kind the plan recorded (``planned``); ``""`` when it recorded none."""
    if planned.startswith(SHA256):
        return sha256_of(filesystem, location)
    if planned.startswith(ETAG):
        return fingerprint(filesystem, location, digest=False)
    return ""


def fingerprints(filesystem, locations: Sequence[str], *, digest: bool, names: Sequence[str],
                 threads: int = THREADS) -> list[str]:
    """``fingerprint`` of each location, ``threads`` at a time, each under the retry policy (``names``: the URL
    of each, for its errors)."""
    def one(item):
        location, name = item
        return retry.call(lambda: fingerprint(filesystem, location, digest=digest), url=name)
    items = list(zip(locations, names, strict=True))
    if len(items) < 2:
        return [one(item) for item in items]
    with ThreadPoolExecutor(min(threads, len(items))) as pool:
        return list(pool.map(one, items))


def wanted(filesystem) -> bool:
    """Whether planning records fingerprints on this filesystem: always on an object store (an ETag costs one
    request per file), on a local disk only where the user asked (a digest reads every byte)."""
    return digest_wanted() or not isinstance(filesystem, pafs.LocalFileSystem)
