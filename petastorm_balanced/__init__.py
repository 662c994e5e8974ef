"""petastorm-balanced: equal steps on every rank over Parquet, planned once, read locally.

Only the public API lives here. ``import petastorm_balanced`` needs neither pyspark nor torch; the features that
use them import them when called.
"""
from typing import TYPE_CHECKING, Any

from ._version import __version__ as __version__
from .errors import (
    InvalidWhereError,
    PlanError,
    PlanIntegrityError,
    PlanUpdateError,
    PlanVersionError,
    StalePlanError,
    StorageUnavailableError,
    UnsafeDatasetError,
)
from .plan.load import load_plan
from .plan.model import Fragment, ShardPlan
from .planner.plan_shards import plan_shards
from .world import World

if TYPE_CHECKING:  # the lazy names below, for type checkers and IDEs (never imported here at run time)
    from .reading.batches.packing import varlen_inputs
    from .reading.formats.device import prefetch_to_device
    from .reading.front.iterable import BalancedDataLoader, BalancedIterableDataset
    from .reading.front.loader import BalancedLoader, make_loader
    from .reading.front.reader import make_reader
    from .reading.rows.transform import TransformSpec

# Names that need torch or Petastorm's reader machinery are imported on first use, so the planning side of the
# package (and the Spark executors that run it) never pays for torch.
_LAZY = {"BalancedDataLoader": "reading.front.iterable", "BalancedIterableDataset": "reading.front.iterable",
         "BalancedLoader": "reading.front.loader", "make_loader": "reading.front.loader",
         "make_reader": "reading.front.reader", "TransformSpec": "reading.rows.transform",
         "varlen_inputs": "reading.batches.packing", "prefetch_to_device": "reading.formats.device"}
# A literal list (sorted), so that linters and type checkers see the re-exports.
__all__ = [
    "BalancedDataLoader", "BalancedIterableDataset", "BalancedLoader", "Fragment", "InvalidWhereError", "PlanError",
    "PlanIntegrityError", "PlanUpdateError", "PlanVersionError", "ShardPlan", "StalePlanError",
    "StorageUnavailableError", "TransformSpec", "UnsafeDatasetError", "World",
    "load_plan", "make_loader", "make_reader", "plan_shards", "prefetch_to_device", "varlen_inputs",
]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib
        return getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
