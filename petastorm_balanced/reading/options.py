"""Reader and loader arguments checked once, at the boundary: which Petastorm arguments pass through, which the
plan owns (refused with what to do instead), pool options, and the plan argument itself.

Both backends and ``make_reader`` use these checks, so the same argument gets the same answer everywhere, with or
without Petastorm installed.
"""
from __future__ import annotations

import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..core.cost.arrangement import REDUCES
from ..core.cost.options import CostOptions
from ..core.cost.spec import parse_cost
from ..core.params import check_int
from ..errors import InvalidTypeError, InvalidValueError, MissingDependencyError
from ..io import retry
from ..io.row_group_cache import CacheSettings
from ..plan.model import ShardPlan
from .list_shapes import ListOptions
from .tensors import TORCH, check_batch_format

SHUFFLE_BUDGET = 512 * 2**20  # default bytes of decoded rows one slot's shuffle may hold (``core/shuffle.py``)


@dataclass(frozen=True)
class LoaderOptions:
    """What a user chose for a loader, checked once where it is given (``make_loader``,
    ``BalancedIterableDataset``) and handed down whole to ``position.Settings``, which checks it against the plan.

    One object instead of a dozen keyword arguments relayed by hand through every layer: a new option is added
    here, with its check, and reaches every loader. The checks that need the plan (the batch size's default, cost,
    sub-epochs against the steps, a transform's columns) stay in ``Settings``; these need nothing but the values.
    """

    batch_size: int | None = None
    shuffle: bool = True
    reshuffle: str = "epoch"
    shuffle_window: int | None = None  # rows; None: as many as ``shuffle_budget`` holds
    shuffle_budget: int | str = SHUFFLE_BUDGET
    schema_fields: Sequence[Any] | None = None
    padding_mask: bool = False
    partition_epoch: int = 1
    balance: str = "auto"
    cost_reduce: str = "sum"
    max_batch_cost: int | None = None
    transform_spec: Any = None
    list_format: Any = "auto"
    list_shapes: Any = None
    batch_format: str = TORCH  # "torch" or "numpy" (tensors.py)

    def __post_init__(self) -> None:
        if self.reshuffle not in ("epoch", "fixed"):
            raise InvalidValueError(f"reshuffle={self.reshuffle!r} is not one of 'epoch' (new assignment every epoch) "
                                    "or 'fixed' (the epoch-0 assignment, for caching)")
        if not isinstance(self.shuffle, bool):
            raise InvalidTypeError(f"shuffle={self.shuffle!r} must be True or False")
        if self.shuffle_window is not None:
            check_int("shuffle_window", self.shuffle_window, minimum=1, hint=" (rows per shuffle window; None: as "
                      "many as shuffle_budget holds)")
        object.__setattr__(self, "shuffle_budget", parse_bytes("shuffle_budget", self.shuffle_budget))
        object.__setattr__(self, "padding_mask", bool(self.padding_mask))
        check_batch_format(self.batch_format)
        self.lists  # noqa: B018  (checked here, where the user gave them)

    @property
    def lists(self) -> ListOptions:
        """How list columns of numbers are delivered (``list_shapes.py``)."""
        return ListOptions.of(self.list_format, self.list_shapes)


_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
          "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}


def parse_bytes(name: str, value) -> int:
    """A byte count given as an int or a string with a unit (``"512MiB"``, ``"2GB"``)."""
    if isinstance(value, str):
        match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*", value)
        unit = match.group(2).lower() if match else None
        if match is None or unit not in _UNITS:
            raise InvalidValueError(f"{name}={value!r} is not a byte count: pass an int, or a number with one of the "
                                    "units B, KB, MB, GB, TB, KiB, MiB, GiB, TiB (for example '512MiB')")
        value = int(float(match.group(1)) * _UNITS[unit])
    return check_int(name, value, minimum=1, hint=" (bytes, or a string such as '512MiB')")


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
BACKEND_NAMES = ("auto", "petastorm", "arrow")  # what backend= accepts (the readers: backends.BACKENDS)


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
    if backend not in BACKEND_NAMES:
        raise InvalidValueError(f"backend={backend!r} is not one of {BACKEND_NAMES}: 'arrow' reads with pyarrow "
                                "alone (any stack), 'petastorm' with Petastorm's reader (pyarrow < 15), 'auto' picks "
                                "Petastorm where it imports")
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


# The Arrow backend's local-disk row group cache takes Petastorm's names (io/row_group_cache.py)
ARROW_CACHE = ("cache_type", "cache_location", "cache_size_limit")
CACHE_SIZE_LIMIT = 10 * 2**30  # the Arrow backend's default cache_size_limit with cache_type="local-disk"


def check_arrow_kwargs(kwargs: dict) -> None:
    """The Petastorm reader arguments the Arrow backend cannot honour, refused with what to do instead
    (``storage_options`` holding only the retry policy's ``retry_*`` keys is honoured: ``arrow_retry_policy``;
    ``cache_type``, ``cache_location`` and ``cache_size_limit`` are: ``arrow_cache``)."""
    arrow_cache(kwargs)
    for name, value in kwargs.items():
        if name == "storage_options" and isinstance(value, dict) and not retry.split_options(value)[1]:
            continue
        if name in ARROW_CACHE:
            continue
        if name in ("cache_row_size_estimate", "cache_extra_settings"):
            raise InvalidValueError(f"{name}={value!r} is not accepted with backend='arrow': it sets Petastorm's "
                                    "diskcache; the Arrow backend's cache (cache_type='local-disk') is sized by "
                                    "cache_size_limit alone")
        if name in ("storage_options", "filesystem"):
            raise InvalidValueError(f"{name}={value!r} is not accepted with backend='arrow': {ARROW_STORAGE}")
        if name != "results_queue_size":  # the Arrow backend bounds its prefetch by workers_count instead
            raise InvalidValueError(f"{name}={value!r} is not accepted with backend='arrow': {ARROW_REFUSED}")


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


def resolve_cost(plan, *, balance: str, cost_reduce: str, max_batch_cost, batch_size, shuffle: bool
                 ) -> CostOptions | None:
    """The loader's cost arrangement, or None for row balance; every bad combination is refused here, when the
    loader is built, naming the parameter."""
    chosen = plan.resolve_balance(balance)  # the one "auto" rule (the plan's); refuses "cost" without a cost
    if cost_reduce not in REDUCES:
        raise InvalidValueError(f"cost_reduce={cost_reduce!r} is not one of {REDUCES}: 'sum' for packed batches, 'max' "
                                "for padded ones (batch_size x longest row)")
    if max_batch_cost is not None:
        max_batch_cost = check_int("max_batch_cost", max_batch_cost, minimum=1, hint=" (the cost budget per batch)")
        if batch_size is not None:
            raise InvalidValueError(f"max_batch_cost={max_batch_cost} sets the rows of each batch; pass "
                                    f"batch_size=None (not {batch_size})")
        if chosen == "rows":
            raise InvalidValueError("max_batch_cost needs balance='cost' (or 'auto') and a plan made with cost=")
        if not shuffle:
            raise InvalidValueError("max_batch_cost packs each shuffle window's rows into batches and needs "
                                    "shuffle=True; pass batch_size= to read in plan order")
        if cost_reduce != "sum":
            raise InvalidValueError("max_batch_cost works with cost_reduce='sum' (a batch's cost is its rows' sum); "
                                    "padded budgets (cost_reduce='max') are not supported")
    if chosen == "rows":
        return None
    # Without shuffle there are no windows to arrange: the rows come in the plan's cost-dealt order, with ``_cost``.
    spec = parse_cost(plan.cost)
    if spec.column is None:  # not spec.loader_evaluable
        raise InvalidValueError(f"the plan's cost {plan.cost!r} is a Spark SQL expression the loader cannot evaluate "
                                "per row (it evaluates a column or length/octet_length/size of a column); store it as "
                                "a column and re-plan with cost='that_column', or pass balance='rows'")
    mean = 0.0
    if max_batch_cost is not None:
        if max_batch_cost < plan.max_row_cost:
            raise InvalidValueError(f"max_batch_cost={max_batch_cost} is below the plan's largest row cost "
                                    f"{plan.max_row_cost}: that row could never be delivered; raise max_batch_cost to "
                                    f"at least {plan.max_row_cost} or filter long rows when planning (where=)")
        mean = float(plan.catalog.cost_sums().sum()) / plan.total_rows
    return CostOptions(plan.cost, spec.column, spec.function, cost_reduce, max_batch_cost, mean)
