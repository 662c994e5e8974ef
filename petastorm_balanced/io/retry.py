"""One retry policy for remote storage: what is retried, how long to wait, and what to say when it gives up.

Why our own layer: pyarrow's S3 client retries by a strategy that depends on how the endpoint was given (an
endpoint in the URL got ``ConnectRetryStrategy``: every 200 ms, no backoff; ``AWS_ENDPOINT_URL`` got the AWS
standard strategy with 3 attempts, about 1.5 s), offers no setting for the waits, and its final error reads like
any other ``OSError``, so a throttled read was reported as a corrupt file. Here:

- every S3 filesystem we build (``fs.resolve``) gets the same request-level strategy, whatever way the endpoint
  was given: ``AwsStandardS3RetryStrategy(request_attempts)``, which absorbs single-request blips (a reset, a cut
  body, one 503) within a second;
- the operations a reader or planner depends on (listing, a footer, a row group) run through ``call``, which
  retries the whole operation on a transient error (``is_transient``) with exponential backoff and full jitter,
  ``attempts`` times in all, then raises ``StorageUnavailableError`` naming the URL, the attempts and the last
  error. An error that is not transient (a missing file, bad Parquet) is raised at once, untouched.

The default (``RetryPolicy()``): 6 attempts, waits drawn uniformly from ``[0, min(max_s, base_s * 2**k))``, base
0.2 s, cap 5 s, so a persistent outage is reported after about 3 s of waiting (6.2 s at most) plus the requests'
own time. Set it with the environment variable ``PETASTORM_BALANCED_RETRY`` (``"attempts=10,base_s=0.5,max_s=20"``;
every process: planning, ``load_plan``, readers) or per loader with
``storage_options={"retry_attempts": 10, "retry_base_s": 0.5, "retry_max_s": 20}``.
"""
from __future__ import annotations

import os
import random
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, fields, replace
from typing import TypeVar

from ..errors import InvalidValueError, StorageUnavailableError

ENV = "PETASTORM_BALANCED_RETRY"
OPTION_PREFIX = "retry_"  # storage_options keys: retry_attempts, retry_base_s, retry_max_s, retry_request_attempts
T = TypeVar("T")

# What pyarrow's AWS SDK errors, curl, s3fs/botocore and the OS say for a fault that may pass: no connection, a
# reset or cut transfer, a timeout, throttling, a 5xx. Never a 403/404 or a Parquet decoding error.
_TRANSIENT = re.compile(
    r"NETWORK_CONNECTION|SLOW_DOWN|SlowDown|SERVICE_UNAVAILABLE|ServiceUnavailable|THROTTL|Throttling|"
    r"INTERNAL_FAILURE|InternalError|REQUEST_TIMEOUT|RequestTimeout|REQUEST_LIMIT_EXCEEDED|"
    r"(?:HTTP|[Ss]tatus|[Cc]ode)[^0-9\n]{0,20}5\d\d\b|curlCode|[Cc]onnection (?:reset|refused|aborted|closed)|"
    r"[Tt]imed out|Timeout was reached|Broken pipe|partial file|IncompleteRead|"
    r"EndpointConnectionError|Couldn't connect|Could not connect|Empty reply")


@dataclass(frozen=True)
class RetryPolicy:
    """How often and how patiently a remote operation is retried (see the module docstring for the default)."""

    attempts: int = 6  # tries of one operation in all, the first included
    base_s: float = 0.2  # the wait before the k-th retry is drawn from [0, min(max_s, base_s * 2**k))
    max_s: float = 5.0
    request_attempts: int = 3  # the AWS SDK's own tries of one HTTP request inside each attempt

    def __post_init__(self):
        if not isinstance(self.attempts, int) or self.attempts < 1:
            raise InvalidValueError(f"retry attempts={self.attempts!r} must be an int >= 1 (1: no retry)")
        if not isinstance(self.request_attempts, int) or self.request_attempts < 1:
            raise InvalidValueError(f"retry request_attempts={self.request_attempts!r} must be an int >= 1")
        for name in ("base_s", "max_s"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or value < 0:
                raise InvalidValueError(f"retry {name}={value!r} must be a number of seconds >= 0")

    def wait_s(self, retry: int, rng: random.Random | None = None) -> float:
        """The wait before retry number ``retry`` (0 for the first): full jitter over the exponential bound."""
        bound = min(self.max_s, self.base_s * (2 ** retry))
        return (rng or random).uniform(0.0, bound)

    @classmethod
    def parse(cls, text: str, *, name: str = ENV) -> RetryPolicy:
        """``"attempts=10,base_s=0.5"`` (any of the fields, comma-separated) over the defaults."""
        known = {f.name: f.type for f in fields(cls)}
        values: dict = {}
        for item in filter(None, (part.strip() for part in text.split(","))):
            key, _, value = item.partition("=")
            key = key.strip()
            if key not in known:
                raise InvalidValueError(f"{name}={text!r}: unknown setting {key!r}; use {', '.join(known)}")
            try:
                values[key] = int(value) if key in ("attempts", "request_attempts") else float(value)
            except ValueError:
                raise InvalidValueError(f"{name}={text!r}: {key}={value!r} is not a number") from None
        return cls(**values)


def default_policy() -> RetryPolicy:
    """The policy of this process: ``PETASTORM_BALANCED_RETRY`` if set, else ``RetryPolicy()``."""
    text = os.environ.get(ENV)
    return RetryPolicy.parse(text) if text else RetryPolicy()


def split_options(storage_options: dict | None) -> tuple[RetryPolicy, dict]:
    """The policy a loader's ``storage_options`` set (``retry_*`` keys over the process default) and the other
    options, unchanged."""
    options = dict(storage_options or {})
    policy = default_policy()
    changes = {}
    for key in [k for k in options if isinstance(k, str) and k.startswith(OPTION_PREFIX)]:
        field_name = key[len(OPTION_PREFIX):]
        if field_name not in {f.name for f in fields(RetryPolicy)}:
            raise InvalidValueError(f"storage_options key {key!r} is not a retry setting; use retry_attempts, "
                                    "retry_base_s, retry_max_s or retry_request_attempts")
        changes[field_name] = options.pop(key)
    return (replace(policy, **changes) if changes else policy), options


def is_transient(exc: BaseException) -> bool:
    """Whether ``exc`` is a storage fault that may pass (network, throttling, 5xx), not a fact about the data."""
    if isinstance(exc, StorageUnavailableError):
        return False  # already retried to the end
    if isinstance(exc, (FileNotFoundError, PermissionError, IsADirectoryError, NotADirectoryError)):
        return False
    if isinstance(exc, (ConnectionError, TimeoutError)):
        return True
    return isinstance(exc, OSError) and _TRANSIENT.search(str(exc)) is not None


def looks_transient(text: str) -> bool:
    """Whether an error's text (one that crossed a process boundary as text) reads as a passing storage fault."""
    return _TRANSIENT.search(text) is not None


_RETRIED = threading.local()  # .n: retries made by ``call`` in this thread (what loader.stats() counts)


def retries() -> int:
    """Retries ``call`` made in this thread so far (a reader takes the difference around a read)."""
    return getattr(_RETRIED, "n", 0)


def call(function: Callable[[], T], *, url: str, what: str = "reading", policy: RetryPolicy | None = None,
         sleep: Callable[[float], None] = time.sleep) -> T:
    """``function()``, retried on transient errors under ``policy`` (default: ``default_policy()``); when every
    attempt failed, ``StorageUnavailableError`` naming ``what`` and ``url``, caused by the last error."""
    policy = policy or default_policy()
    for attempt in range(policy.attempts):
        try:
            return function()
        except OSError as exc:
            if not is_transient(exc):
                raise
            last = exc
        if attempt + 1 < policy.attempts:
            _RETRIED.n = retries() + 1
            sleep(policy.wait_s(attempt))
    raise StorageUnavailableError(url, policy.attempts, last, what) from last


def call_naming(function: Callable[[], T], *, url: str, what: str, policy: RetryPolicy | None = None) -> T:
    """``call``, and an error that is not a passing fault (access denied, no such bucket) raised as an ``OSError``
    naming ``what`` was done to ``url`` (pyarrow's own names a bucket and key, or nothing), caused by it; a
    ``FileNotFoundError`` is raised as it is (callers ask whether a path exists)."""
    try:
        return call(function, url=url, what=what, policy=policy)
    except (FileNotFoundError, StorageUnavailableError):
        raise
    except OSError as exc:
        raise OSError(f"{what} {url} failed ({type(exc).__name__}: {' '.join(str(exc).split())})") from exc
