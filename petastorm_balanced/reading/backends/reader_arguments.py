"""Reader arguments checked once, at the boundary: which Petastorm arguments pass through, which the plan owns
(refused with what to do instead), what the Arrow backend takes, and the pool options.

``make_loader``, ``make_reader`` and both backends use these checks, so the same argument gets the same answer
everywhere, with or without Petastorm installed.
"""
from __future__ import annotations

import os
from typing import Any

from ...core.params import check_int
from ...errors import InvalidTypeError, InvalidValueError
from ...io import retry
from ...io.row_group_cache import CacheSettings
from ...plan.load import resolve_plan
from ...plan.model import Fragment, ShardPlan
from ...world import resolve_world
from ..options import parse_bytes

# Petastorm arguments the plan owns, and what to do instead.
OWNED_ARGUMENTS = {
    "cur_shard": "the plan assigns rows to ranks; pass rank= and world= instead",
    "shard_count": "the plan assigns rows to ranks; pass rank= and world= instead",
    "shard_seed": "the plan's seed (plan_shards(seed=...)) decides the assignment",
    "predicate": "the plan already holds exactly the matching rows; pass where= or predicate= to plan_shards",
    "filters": "the plan already holds exactly the matching rows; pass where= or predicate= to plan_shards",
    "rowgroup_selector": "the plan selects the row groups; pass a predicate to plan_shards instead",
    "num_epochs": "a planned reader covers one epoch; iterate the loader again, or pass epoch=, for the next one",
    "shuffle_row_groups": "the plan orders row groups per epoch from [seed, epoch]; use make_loader(shuffle=...)",
    "shuffle_row_drop_partitions": "the plan decides which rows each rank reads; use make_loader(shuffle_budget=) "
                                   "or shuffle_window=",
    "dataset_url": "the plan names its dataset; pass plan= only",
    "dataset_url_or_urls": "the plan names its dataset; pass plan= only",
}
# Everything else Petastorm's make_reader / make_batch_reader accept passes through.
PASS_THROUGH = ("schema_fields", "reader_pool_type", "workers_count", "results_queue_size", "shuffle_rows", "seed",
                "cache_type", "cache_location", "cache_size_limit", "cache_row_size_estimate",
                "cache_extra_settings", "hdfs_driver", "transform_spec", "storage_options", "zmq_copy_buffers",
                "filesystem", "pyarrow_serialize")
# What the Arrow backend takes besides the pool options: nothing of Petastorm's own machinery.
ARROW_REFUSED = "it configures Petastorm's reader; use backend='petastorm' (the petastorm stack), or leave it out"
ARROW_STORAGE = ("the Arrow backend reads through pyarrow.fs: give an S3 endpoint in the URL "
                 "(?endpoint_override=host:port&scheme=http) or AWS_ENDPOINT_URL, credentials in the AWS variables; "
                 "its storage_options take only the retry policy (retry_attempts, retry_base_s, retry_max_s, "
                 "retry_request_attempts)")


# The Arrow backend's local-disk row group cache takes Petastorm's names (io/row_group_cache.py)
ARROW_CACHE = ("cache_type", "cache_location", "cache_size_limit")
CACHE_SIZE_LIMIT = 10 * 2**30  # the Arrow backend's default cache_size_limit with cache_type="local-disk"


def arrow_refusal(name: str, value) -> str | None:
    """Why the Arrow backend cannot honour the Petastorm reader argument ``name=value``, or None where it does
    (``storage_options`` holding only the retry policy's ``retry_*`` keys: ``arrow_retry_policy``; ``cache_type``,
    ``cache_location`` and ``cache_size_limit``: ``arrow_cache``; ``results_queue_size``, whose prefetch the Arrow
    backend bounds by ``workers_count`` instead)."""
    if name == "storage_options" and isinstance(value, dict) and not retry.split_options(value)[1]:
        return None
    if name in ARROW_CACHE or name == "results_queue_size":
        return None
    if name in ("cache_row_size_estimate", "cache_extra_settings"):
        return ("it sets Petastorm's diskcache; the Arrow backend's cache (cache_type='local-disk') is sized by "
                "cache_size_limit alone")
    if name in ("storage_options", "filesystem"):
        return ARROW_STORAGE
    return ARROW_REFUSED


def petastorm_only(kwargs: dict, reader_pool_type: str = "thread") -> list[str]:
    """The reader arguments of a call that only Petastorm's reader honours: with them, ``backend="auto"`` takes
    Petastorm's reader where it imports (``backends.resolve_backend``)."""
    names = [name for name, value in kwargs.items() if arrow_refusal(name, value)]
    return names + (["reader_pool_type"] if reader_pool_type not in ARROW_POOL_TYPES else [])


def check_arrow_kwargs(kwargs: dict) -> None:
    """The Petastorm reader arguments the Arrow backend cannot honour, refused with what to do instead."""
    arrow_cache(kwargs)
    for name, value in kwargs.items():
        why = arrow_refusal(name, value)
        if why:
            raise InvalidValueError(f"{name}={value!r} is not accepted with backend='arrow': {why}")


def arrow_cache(kwargs: dict) -> CacheSettings | None:
    """The Arrow backend's local-disk row group cache that ``cache_type="local-disk"``, ``cache_location`` and
    ``cache_size_limit`` (bytes or a string such as ``"10GiB"``; default 10 GiB) ask for, or None (``cache_type``
    left out, None or ``"null"``, as in Petastorm)."""
    kind = kwargs.get("cache_type")
    location, limit = kwargs.get("cache_location"), kwargs.get("cache_size_limit")
    if kind in (None, "null"):
        given = [n for n in ("cache_location", "cache_size_limit") if kwargs.get(n) is not None]
        if given:
            raise InvalidValueError(f"{given[0]}={kwargs[given[0]]!r} is given but cache_type={kind!r} caches "
                                    "nothing; pass cache_type='local-disk' too, or leave it out")
        return None
    if kind != "local-disk":
        raise InvalidValueError(f"cache_type={kind!r} is not 'null' or 'local-disk' (row groups kept on a local "
                                "disk for later epochs)")
    if not isinstance(location, (str, os.PathLike)) or not os.fspath(location):
        raise InvalidValueError(f"cache_location={location!r}: cache_type='local-disk' needs a local folder to keep "
                                "row groups in (shared by the ranks of a node), e.g. cache_location='/local/cache'")
    location = os.fspath(location)
    if "://" in location:
        raise InvalidValueError(f"cache_location={location!r} is a URL; the cache is a local folder (a path)")
    size = CACHE_SIZE_LIMIT if limit is None else parse_bytes("cache_size_limit", limit)
    return CacheSettings(location, size)


def arrow_retry_policy(kwargs: dict) -> retry.RetryPolicy:
    """The retry policy a loader's ``storage_options`` set (``retry_*`` keys), else the process default."""
    return retry.split_options(kwargs.get("storage_options"))[0]


def check_petastorm_kwargs(kwargs: dict, refused: dict | None = None) -> None:
    """Refuse owned arguments with what to do instead; unknown ones as Python would, with a TypeError."""
    refused = {**OWNED_ARGUMENTS, **(refused or {})}
    for name in kwargs:
        if name in refused:
            raise InvalidValueError(f"{name}={kwargs[name]!r} is not accepted here: {refused[name]}")
        if name not in PASS_THROUGH:
            raise InvalidTypeError(f"unexpected keyword argument {name!r}; Petastorm reader arguments accepted here: "
                                   f"{', '.join(a for a in PASS_THROUGH if a not in refused)}")


POOL_TYPES = ("thread", "process", "dummy")
ARROW_POOL_TYPES = ("thread", "dummy")  # "dummy": read in the consuming thread (DataLoader workers, debugging)


def check_pool_options(reader_pool_type, workers_count, backend: str = "petastorm") -> None:
    """Refuse a bad pool choice when the loader or reader is made, not at its first batch: the one pool check,
    for both backends (``backend``: the resolved one, ``"arrow"`` or ``"petastorm"``)."""
    check_int("workers_count", workers_count, minimum=1)
    if backend == "arrow" and reader_pool_type not in ARROW_POOL_TYPES:
        raise InvalidValueError(f"reader_pool_type={reader_pool_type!r} is not one of {ARROW_POOL_TYPES} for "
                                "backend='arrow' (pyarrow decodes in C++ without the GIL, so threads suffice); use "
                                "backend='petastorm' for Petastorm's process pool")
    if reader_pool_type not in POOL_TYPES:
        raise InvalidValueError(f"reader_pool_type={reader_pool_type!r} is not one of "
                                f"{', '.join(map(repr, POOL_TYPES))}")


def reader_options(backend: str, workers_count, reader_pool_type, petastorm_kwargs: dict) -> dict[str, Any]:
    """What the ``backend`` (resolved) reads with: the pool options checked, then Petastorm's arguments passed
    through to Petastorm, or the Arrow backend's retry policy and row group cache taken from them (the others
    refused)."""
    check_pool_options(reader_pool_type, workers_count, backend)
    if backend == "arrow":
        check_arrow_kwargs(petastorm_kwargs)
        return {"workers_count": workers_count, "reader_pool_type": reader_pool_type,
                "retry_policy": arrow_retry_policy(petastorm_kwargs), "cache": arrow_cache(petastorm_kwargs)}
    return {**petastorm_kwargs, "workers_count": workers_count, "reader_pool_type": reader_pool_type}


def planned_rows(rank, world, plan, *, epoch: int, batch_size: int | None, reshuffle: str, seed: Any,
                 shuffle_rows: Any, schema_fields: Any) -> tuple[ShardPlan, list[Fragment], tuple | None]:
    """What both ``make_reader`` backends start from, checked once: the plan, rank ``rank``'s planned fragments of
    ``epoch``, and the key that permutes rows inside each fragment with ``shuffle_rows`` (``[seed, or the plan's,
    epoch, rank]``, as Petastorm seeds its own)."""
    who = resolve_world(rank, world)
    plan = resolve_plan(plan)
    frags = plan.assignment(who.rank, epoch=epoch, world_size=who.size, batch_size=batch_size, reshuffle=reshuffle)
    if seed is not None:
        check_int("seed", seed, minimum=0, hint=" (or None for the plan's seed)")
    if schema_fields is not None and not isinstance(schema_fields, (list, tuple)):
        raise InvalidTypeError(f"schema_fields={schema_fields!r} must be a list of names, patterns or UnischemaFields "
                               "(NGram is not supported by planned readers)")
    return plan, frags, (plan.seed if seed is None else seed, epoch, who.rank) if shuffle_rows else None
