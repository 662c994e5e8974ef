"""Reader and loader arguments checked once, at the boundary: which Petastorm arguments pass through, which the
plan owns (refused with what to do instead), pool options, and the plan argument itself.

Both backends and ``make_reader`` use these checks, so the same argument gets the same answer everywhere, with or
without Petastorm installed.
"""
from __future__ import annotations

import os

from ..core.params import check_int
from ..errors import InvalidTypeError, InvalidValueError, MissingDependencyError
from ..plan.model import ShardPlan

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
    "shuffle_row_drop_partitions": "the plan decides which rows each rank reads; use make_loader(shuffle_window=)",
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
                 "(?endpoint_override=host:port&scheme=http) or AWS_ENDPOINT_URL, credentials in the AWS variables")
BACKENDS = ("auto", "petastorm", "arrow")


def petastorm_importable() -> bool:
    """Whether Petastorm imports here (it does not on pyarrow >= 16: ``No module named 'pyarrow.filesystem'``)."""
    try:
        import petastorm.reader  # noqa: F401
    except ImportError:
        return False
    return True


def resolve_backend(backend, table=None) -> str:
    """``"petastorm"`` or ``"arrow"``: ``auto`` takes Petastorm where it imports, else Arrow.

    A Delta/Iceberg snapshot plan (``table``, ``plan.table``) is read by the Arrow backend: Petastorm's reader lists
    every Parquet file of the folder, files the table removed included, so it cannot serve one snapshot.
    """
    if backend not in BACKENDS:
        raise InvalidValueError(f"backend={backend!r} is not one of {BACKENDS}: 'arrow' reads with pyarrow alone (any "
                                "stack), 'petastorm' with Petastorm's reader (pyarrow < 15), 'auto' picks Petastorm "
                                "where it imports")
    if table is not None and table.format != "parquet":
        if backend == "petastorm":
            raise InvalidValueError(f"backend='petastorm' cannot serve a plan of {table.describe()}: Petastorm's "
                                    "reader lists every Parquet file in the folder, files the table removed "
                                    "included; use backend='arrow' or 'auto' (the same batches)")
        return "arrow"
    if backend == "auto":
        return "petastorm" if petastorm_importable() else "arrow"
    if backend == "petastorm" and not petastorm_importable():
        raise MissingDependencyError("backend='petastorm' needs Petastorm, which cannot be imported here (Petastorm "
                                     "needs pyarrow < 15); use backend='arrow' (same batches), or install the "
                                     "petastorm stack: pip install 'petastorm-balanced[petastorm]' (docs/stacks.md)")
    return backend


def check_arrow_kwargs(kwargs: dict) -> None:
    """The Petastorm reader arguments the Arrow backend cannot honour, refused with what to do instead."""
    for name, value in kwargs.items():
        if name in ("storage_options", "filesystem"):
            raise InvalidValueError(f"{name}={value!r} is not accepted with backend='arrow': {ARROW_STORAGE}")
        if name != "results_queue_size":  # the Arrow backend bounds its prefetch by workers_count instead
            raise InvalidValueError(f"{name}={value!r} is not accepted with backend='arrow': {ARROW_REFUSED}")


def check_petastorm_kwargs(kwargs: dict, refused: dict | None = None) -> None:
    """Refuse owned arguments with what to do instead; unknown ones as Python would, with a TypeError."""
    refused = {**OWNED_ARGUMENTS, **(refused or {})}
    for name in kwargs:
        if name in refused:
            raise InvalidValueError(f"{name}={kwargs[name]!r} is not accepted here: {refused[name]}")
        if name not in PASS_THROUGH:
            raise InvalidTypeError(f"unexpected keyword argument {name!r}; Petastorm reader arguments accepted here: "
                                   f"{', '.join(a for a in PASS_THROUGH if a not in refused)}")


def resolve_plan(plan) -> ShardPlan:
    """A ShardPlan as is, or a plan URL loaded and checked against its dataset (``StalePlanError``)."""
    from ..plan.load import load_plan
    if isinstance(plan, ShardPlan):
        return plan
    if plan is None:
        raise InvalidValueError("plan=None: pass a ShardPlan or the URL of a saved plan (plan_shards(output_url=...))")
    if not isinstance(plan, (str, os.PathLike)) or isinstance(plan, bytes) or not plan:
        raise InvalidTypeError(f"plan={plan!r} ({type(plan).__name__}) must be a ShardPlan or the URL or path of a "
                               "saved plan (plan_shards(output_url=...))")
    return load_plan(plan)


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
