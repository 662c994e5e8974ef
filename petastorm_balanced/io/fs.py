"""URL handling: the one place that turns a dataset or plan URL into a ``pyarrow.fs`` filesystem and path.

Local paths, ``file://``, ``s3://`` and ``hdfs://`` all go through ``pyarrow.fs`` so planning code never depends
on pyarrow's legacy dataset API. An S3 endpoint can be given in the URL (``?endpoint_override=host:port&
scheme=http``) or through ``AWS_ENDPOINT_URL``, which pyarrow 14 does not read by itself.
"""
from __future__ import annotations

import os
from typing import Tuple
from urllib.parse import urlparse

import pyarrow.fs as pafs

from ..errors import InvalidTypeError


def normalize_url(url) -> str:
    """A canonical spelling: local paths become absolute ``file://`` URLs, remote URLs lose trailing slashes."""
    if isinstance(url, os.PathLike):
        url = os.fspath(url)
    if not isinstance(url, str) or not url:
        raise InvalidTypeError(f"dataset_url must be a non-empty str or path, got {url!r}")
    parsed = urlparse(url)
    if parsed.scheme in ("", "file"):
        path = parsed.path if parsed.scheme == "file" else url
        return "file://" + os.path.abspath(os.path.expanduser(path))
    return url.rstrip("/")


def resolve(url: str) -> Tuple[pafs.FileSystem, str]:
    """The filesystem and the path inside it for a (normalized or raw) URL."""
    url = normalize_url(url)
    parsed = urlparse(url)
    if parsed.scheme == "file":
        return pafs.LocalFileSystem(), parsed.path
    if parsed.scheme in ("s3", "s3a") and "endpoint_override" not in parsed.query:
        endpoint = os.environ.get("AWS_ENDPOINT_URL")
        kwargs = {}
        if endpoint:
            ep = urlparse(endpoint)
            kwargs = {"endpoint_override": ep.netloc or ep.path, "scheme": ep.scheme or "https"}
        region = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")
        if region:
            kwargs["region"] = region
        return pafs.S3FileSystem(**kwargs), (parsed.netloc + parsed.path).rstrip("/")
    fs, path = pafs.FileSystem.from_uri(url.replace("s3a://", "s3://", 1))
    return fs, path.rstrip("/")


def is_local(url: str) -> bool:
    return urlparse(normalize_url(url)).scheme == "file"
