"""Locations: the one place that turns a dataset, plan or output location a user typed into a URL and a
``pyarrow.fs`` filesystem and path.

The rule (G14): a local path is a path, so ``#``, ``?``, ``%``, spaces and unicode are characters of it; only a
string that starts with a scheme of two or more letters followed by ``:/`` (``file:///``, ``s3://``,
``hdfs://``) is parsed as a URL, and a URL's path is percent-decoded, as Hadoop and pyarrow decode it. ``c:data``
is therefore a relative path (one-letter "schemes" are drive letters, and this package runs on POSIX).

The canonical spelling (``normalize_url``, what a plan records) of a local location is ``file://`` followed by the
absolute path with exactly ``%``, ``#`` and ``?`` (and control characters) percent-encoded: plain paths read as
they always did, and the URL decodes to the same folder in ``urllib``, pyarrow and Hadoop (Spark). A URL with a
fragment (an unescaped ``#``) is refused: it would silently name another folder.

An S3 endpoint can be given in the URL (``?endpoint_override=host:port&scheme=http``) or through
``AWS_ENDPOINT_URL``, which pyarrow 14 does not read by itself; either way the filesystem is built by
``s3_filesystem``, with the one retry policy (``io/retry.py``).
"""
from __future__ import annotations

import os
import re
from urllib.parse import parse_qs, unquote, urlparse

import pyarrow as pa
import pyarrow.fs as pafs

from ..errors import InvalidTypeError, InvalidValueError

_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.\-]+:/")
# a backslash or control character; a leading '/', an empty name ('//', trailing '/'); a '.' or '..' name
_NOT_RELATIVE_RE = r"[\\\x00-\x1f\x7f]|^/|//|/$|(?:^|/)\.\.?(?:/|$)|^[A-Za-z][A-Za-z0-9+.\-]+:/"
_NOT_RELATIVE = re.compile(_NOT_RELATIVE_RE)
_ESCAPE = {c: f"%{ord(c):02X}" for c in "%#?" + "".join(map(chr, range(32))) + "\x7f"}


def has_scheme(location: str) -> bool:
    """Whether ``location`` is a URL (``scheme:/...`` with a scheme of two or more characters), not a path."""
    return _SCHEME.match(location) is not None


def local_url(path: str) -> str:
    """The canonical ``file://`` URL of a local path (made absolute, ``~`` expanded)."""
    absolute = os.path.abspath(os.path.expanduser(path))
    return "file://" + "".join(_ESCAPE.get(c, c) for c in absolute)


def normalize_url(url, *, name: str = "dataset_url") -> str:
    """The canonical spelling of a location: local paths and ``file:`` URLs become absolute ``file://`` URLs,
    remote URLs lose trailing slashes. ``name`` is the parameter named in errors."""
    if isinstance(url, os.PathLike):
        url = os.fspath(url)
    if isinstance(url, bytes) or not isinstance(url, str) or not url:
        raise InvalidTypeError(f"{name} must be a non-empty str or path, got {url!r}")
    if "\x00" in url:
        raise InvalidValueError(f"{name}={url!r} contains a NUL character; no filesystem has such a name")
    if not has_scheme(url):
        return local_url(url)
    parsed = urlparse(url)
    if parsed.fragment or url.endswith("#"):
        raise InvalidValueError(f"{name}={url!r} is a URL with a fragment: '#' ends a URL's path, so this names "
                                f"{parsed.scheme}://{parsed.netloc}{parsed.path}; write '#' as %23 in a URL, or pass "
                                "a local path without file://")
    if parsed.scheme == "file":
        if parsed.netloc not in ("", "localhost"):
            raise InvalidValueError(f"{name}={url!r} names host {parsed.netloc!r}; a file:// URL is local "
                                    "(file:///absolute/path), pass a local path or an hdfs:// or s3:// URL")
        if parsed.query or url.endswith("?"):
            raise InvalidValueError(f"{name}={url!r} is a file:// URL with a query: '?' ends a URL's path; write "
                                    "'?' as %3F in a URL, or pass a local path without file://")
        return local_url(unquote(parsed.path) or "/")
    return url.rstrip("/")


def resolve(url, *, name: str = "dataset_url") -> tuple[pafs.FileSystem, str]:
    """The filesystem and the (decoded) path inside it for a location, raw or normalized; the one URL parser."""
    url = normalize_url(url, name=name)
    parsed = urlparse(url)
    if parsed.scheme == "file":
        return pafs.LocalFileSystem(), unquote(parsed.path)
    if parsed.scheme in ("s3", "s3a"):
        return s3_filesystem(parsed.query, name=name, url=url), (parsed.netloc + unquote(parsed.path)).rstrip("/")
    try:
        fs, path = pafs.FileSystem.from_uri(url.replace("s3a://", "s3://", 1))
    except (ValueError, TypeError) as exc:  # pyarrow's ArrowInvalid is a ValueError
        raise InvalidValueError(f"{name}={url!r} is not a location pyarrow can open ({exc}); pass a local path or "
                                "a file://, s3:// or hdfs:// URL") from None
    return fs, path.rstrip("/")


# the URL query keys an S3 location may carry, as pyarrow's own from_uri reads them
_S3_QUERY = {"endpoint_override": str, "scheme": str, "region": str, "access_key": str, "secret_key": str,
             "session_token": str}
_S3_FILESYSTEMS: dict[tuple, pafs.S3FileSystem] = {}
_S3_KEPT = 32

# Requests a process keeps in flight to an object store (the remote read threads, ``reading/backends/arrow.py``, and
# pyarrow's I/O pool, where pre-buffered reads wait): a row group costs a round trip however small, so at 30 ms
# per request a reader needs about 20 requests in flight to keep two cores decoding, and twice that at 60 ms.
REMOTE_REQUESTS = 64


def raise_io_threads() -> None:
    """pyarrow's I/O pool raised to ``REMOTE_REQUESTS`` threads. Before any S3 filesystem is made: the AWS SDK
    sizes a client's connection pool from that pool when the client is built (25 connections otherwise), and a
    request beyond the pool's connections waits for one, whatever the threads (measured: 64 reads of 100 ms from
    64 threads took 0.37 s, not 0.2, through a filesystem made before the pool was raised)."""
    if pa.io_thread_count() < REMOTE_REQUESTS:
        pa.set_io_thread_count(REMOTE_REQUESTS)


def s3_filesystem(query: str = "", *, name: str = "dataset_url", url: str = "") -> pafs.S3FileSystem:
    """The S3 filesystem for a location's query (``endpoint_override=host:port&scheme=http``, ``region``, keys),
    else ``AWS_ENDPOINT_URL`` and ``AWS_REGION``: built the same way whichever way the endpoint was given, with
    the retry policy's request-level strategy (``io/retry.py``), and kept for the process (one client and its
    connection pool per endpoint and credentials, not one per call: a new client opens new connections, a
    round trip each). Keyed by process id too, since a forked DataLoader worker must not share its parent's."""
    from .retry import default_policy
    kwargs: dict = {}
    for key, values in parse_qs(query, keep_blank_values=True).items():
        if key not in _S3_QUERY:
            raise InvalidValueError(f"{name}={url!r} has the query key {key!r}, which no S3 setting takes; use "
                                    f"{', '.join(sorted(_S3_QUERY))}, or the AWS environment variables")
        kwargs[key] = values[-1]
    if "endpoint_override" not in kwargs:
        endpoint = os.environ.get("AWS_ENDPOINT_URL")
        if endpoint:
            ep = urlparse(endpoint)
            kwargs.update(endpoint_override=ep.netloc or ep.path, scheme=ep.scheme or "https")
    elif "://" in kwargs["endpoint_override"]:
        ep = urlparse(kwargs["endpoint_override"])
        kwargs.update(endpoint_override=ep.netloc, scheme=ep.scheme)
    region = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")
    if region:
        kwargs.setdefault("region", region)
    attempts = default_policy().request_attempts
    credentials = tuple(os.environ.get(k) for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN",
                                                    "AWS_PROFILE"))
    cache_key = (tuple(sorted(kwargs.items())), attempts, credentials, os.getpid())
    filesystem = _S3_FILESYSTEMS.get(cache_key)
    if filesystem is None:
        raise_io_threads()  # the client's connection pool is sized from it
        filesystem = pafs.S3FileSystem(**kwargs, retry_strategy=pafs.AwsStandardS3RetryStrategy(attempts))
        _S3_FILESYSTEMS[cache_key] = filesystem
        while len(_S3_FILESYSTEMS) > _S3_KEPT:
            _S3_FILESYSTEMS.pop(next(iter(_S3_FILESYSTEMS)))
    return filesystem


def is_local(url) -> bool:
    return normalize_url(url).startswith("file://")


def local_path(url) -> str:
    """The local path of a ``file://`` location (``resolve``'s path)."""
    return unquote(urlparse(normalize_url(url)).path)


def join(root: str, relative: str) -> str:
    """``root/relative`` for a catalog path that ``check_relative`` accepted (a plan's paths are checked when it
    loads; this refuses again rather than open anything outside the root)."""
    check_relative(relative)
    return f"{root}/{relative}" if root else relative


def check_relative(path) -> None:
    """``InvalidValueError`` unless ``path`` is a plain root-relative path: '/'-separated non-empty names, none of
    them ``.`` or ``..``, no leading '/', no scheme, no NUL, no backslash, no control character (G14)."""
    if not isinstance(path, str) or not path:
        raise InvalidValueError(f"file path {path!r} is not a non-empty string")
    if _NOT_RELATIVE.search(path):
        raise InvalidValueError(f"file path {path!r} is not a plain path inside the dataset root (absolute, '..', "
                                "'.', an empty name, a scheme, a backslash or a control character)")


def first_not_relative(paths) -> str | None:
    """The first of ``paths`` that ``check_relative`` refuses, or None: one vectorized regex pass (RE2, the same
    pattern), since a plan lists up to ~10^5 files and every rank checks them at start-up."""
    import pyarrow as pa
    import pyarrow.compute as pc
    array = pa.array(list(paths), pa.string())
    bad = pc.or_kleene(pc.match_substring_regex(array, _NOT_RELATIVE_RE), pc.equal(pc.utf8_length(array), 0))
    if not pc.any(bad).as_py():
        return None
    return array.filter(bad)[0].as_py()
