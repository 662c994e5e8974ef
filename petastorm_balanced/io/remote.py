"""S3 glue for Petastorm: the filesystem object Petastorm 0.12.1 can read ``s3://`` datasets through.

Why this module exists (measured with petastorm 0.12.1, pyarrow 14, s3fs 2026.x):

- Petastorm builds ``pq.ParquetDataset(path, filesystem=fs, validate_schema=False, metadata_nthreads=10)``.
  Those keywords exist only in pyarrow's *legacy* dataset code, which pyarrow 14 picks only for a legacy
  ``pyarrow.filesystem.FileSystem``. A ``pyarrow.fs`` filesystem or a bare s3fs instance (fsspec) selects the new
  dataset code, which refuses ``validate_schema``: nothing can be listed.
- pyarrow's own legacy adapter, ``pyarrow.filesystem.S3FSWrapper``, calls s3fs's private ``_ls``, which is a
  coroutine in every s3fs since 0.5 ("'coroutine' object is not iterable").

``S3FSWrapper`` below is that legacy adapter with its listing done through s3fs's public, synchronous API. It
pickles (s3fs instances re-create themselves from their arguments), so Petastorm's process pool works too.

Planning does not use this module: it reads footers through ``pyarrow.fs.S3FileSystem`` (see ``fs.resolve``).
Both sides take the endpoint from the same places: ``?endpoint_override=host:port&scheme=http`` in the URL, else
the ``AWS_ENDPOINT_URL`` environment variable, else AWS itself; credentials come from the usual AWS variables.
"""
from __future__ import annotations

import os
import posixpath
import warnings
from typing import NamedTuple
from urllib.parse import parse_qs, urlparse

import pyarrow.filesystem as legacyfs

from ..errors import MissingDependencyError
from . import fs as fsutil
from . import retry

S3_SCHEMES = ("s3", "s3a")


class PetastormSource(NamedTuple):
    """What to hand Petastorm: ``make_reader(url, filesystem=filesystem)`` or ``Reader(filesystem, path)``.

    ``url`` has the endpoint query removed (Petastorm would take it for part of the path); ``filesystem`` is None
    for schemes Petastorm resolves well by itself (``file://``, ``hdfs://``).
    """

    url: str
    filesystem: object | None
    path: str


def is_s3(url) -> bool:
    return urlparse(fsutil.normalize_url(url)).scheme in S3_SCHEMES


def endpoint_url(url) -> str | None:
    """The S3 endpoint (``http://host:port``) for ``url``: its ``endpoint_override`` query, else
    ``AWS_ENDPOINT_URL``, else None (AWS)."""
    query = parse_qs(urlparse(fsutil.normalize_url(url)).query)
    if "endpoint_override" in query:
        host = query["endpoint_override"][-1]
        if "://" in host:
            return host
        scheme = query.get("scheme", ["https"])[-1]
        return f"{scheme}://{host}"
    return os.environ.get("AWS_ENDPOINT_URL") or None


def s3fs_filesystem(url, **storage_options):
    """An s3fs filesystem for ``url``'s endpoint (``storage_options`` go to ``s3fs.S3FileSystem``)."""
    try:
        import s3fs
    except ImportError:  # pragma: no cover - depends on the installation
        raise MissingDependencyError(
            "reading s3:// datasets needs s3fs: pip install 'petastorm-balanced[s3]'") from None
    policy, options = retry.split_options(storage_options)
    client = options["client_kwargs"] = dict(options.get("client_kwargs") or {})  # never edit the caller's dict
    config = options["config_kwargs"] = dict(options.get("config_kwargs") or {})
    # the one retry policy (io/retry.py): botocore's standard mode (exponential backoff with jitter) for as many
    # requests as the policy's attempts, the same whichever way the endpoint was given
    config.setdefault("retries", {"max_attempts": policy.attempts * policy.request_attempts, "mode": "standard"})
    endpoint = endpoint_url(url)
    if endpoint:
        client.setdefault("endpoint_url", endpoint)
    region = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")
    if region:
        client.setdefault("region_name", region)
    return s3fs.S3FileSystem(**options)


def s3_path(url) -> str:
    """``bucket/key`` without scheme, query or trailing slash."""
    parsed = urlparse(fsutil.normalize_url(url))
    return (parsed.netloc + parsed.path).rstrip("/")


def strip_query(url) -> str:
    return urlparse(fsutil.normalize_url(url))._replace(query="").geturl()


def petastorm_source(url, **storage_options) -> PetastormSource:
    """The URL, filesystem and path to give Petastorm for a dataset URL of any scheme we support."""
    url = fsutil.normalize_url(url)
    if not is_s3(url):
        return PetastormSource(url, None, fsutil.resolve(url)[1])
    clean = strip_query(url)
    if urlparse(clean).scheme != "s3":  # s3a is the Hadoop spelling; s3fs and Petastorm know s3://
        clean = "s3://" + clean.split("://", 1)[1]
    return PetastormSource(clean, S3FSWrapper(s3fs_filesystem(url, **storage_options)), s3_path(url))


def petastorm_filesystem(url, *, filesystem=None, storage_options=None, hdfs_driver="libhdfs3"):
    """``(filesystem, path)`` for Petastorm's ``Reader`` over the dataset at ``url``, as its factories would
    resolve them, except that ``s3://`` goes through ``S3FSWrapper`` (which works) and loses its endpoint query."""
    if filesystem is None and is_s3(url):
        source = petastorm_source(url, **(storage_options or {}))
        return source.filesystem, source.path
    from petastorm.fs_utils import get_filesystem_and_path_or_paths
    storage_options = retry.split_options(storage_options)[1] or None  # the retry keys are ours
    clean = strip_query(url) if is_s3(url) else fsutil.normalize_url(url)
    fs, path = get_filesystem_and_path_or_paths(clean, hdfs_driver, storage_options=storage_options,
                                                filesystem=filesystem)
    # Petastorm takes a URL's path undecoded; ours is decoded (a local '#' or '%' is spelled %23, %25).
    return fs, (fsutil.local_path(url) if fsutil.is_local(url) else path)


class S3FSWrapper(legacyfs.S3FSWrapper):
    """pyarrow's legacy S3 adapter, listing through s3fs's synchronous public API (see the module docstring)."""

    def __init__(self, fs):
        with warnings.catch_warnings():  # the legacy classes warn that they are deprecated; we know
            warnings.simplefilter("ignore", FutureWarning)
            super().__init__(fs)

    def isdir(self, path) -> bool:
        path = _sanitize(path)
        try:
            return self.fs.isdir(path)
        except OSError:
            return False

    def isfile(self, path) -> bool:
        path = _sanitize(path)
        try:
            return self.fs.isfile(path)
        except OSError:
            return False

    def exists(self, path) -> bool:
        return self.fs.exists(_sanitize(path))

    def ls(self, path, detail=False):
        return self.fs.ls(_sanitize(path), detail=detail)

    def open(self, path, mode="rb"):
        return self.fs.open(_sanitize(path), mode=mode)

    def walk(self, path, refresh=False):
        """``os.walk`` over a prefix, one level per ``ls``; fresh listings so a re-run sees new objects."""
        path = _sanitize(path).rstrip("/")
        entries = self.fs.ls(path, detail=True, refresh=True)
        directories, files = set(), set()
        for entry in entries:
            name = entry["name"].rstrip("/")
            if name == path:
                continue
            if entry.get("type") == "directory":
                directories.add(posixpath.basename(name))
            else:
                files.add(posixpath.basename(name))
        names = sorted(directories)
        yield path, names, sorted(files - directories)
        for directory in names:
            yield from self.walk(f"{path}/{directory}", refresh=refresh)

    def __reduce__(self):
        return (S3FSWrapper, (self.fs,))


def _sanitize(path) -> str:
    path = str(path)
    for scheme in S3_SCHEMES:
        if path.startswith(scheme + "://"):
            return path[len(scheme) + 3:]
    return path
