"""petastorm-balanced: equal steps on every rank over Parquet, planned once, read locally.

Only the public API lives here. ``import petastorm_balanced`` needs neither pyspark nor torch; the features that
use them import them when called.
"""
from ._version import __version__
from .errors import (
    InvalidWhereError,
    PlanError,
    PlanIntegrityError,
    PlanVersionError,
    StalePlanError,
    UnsafeDatasetError,
)
from .plan.load import load_plan
from .plan.model import Fragment, ShardPlan
from .planning.plan_shards import plan_shards
from .world import World

__all__ = sorted([
    "Fragment", "InvalidWhereError", "PlanError", "PlanIntegrityError", "PlanVersionError", "ShardPlan",
    "StalePlanError", "UnsafeDatasetError", "World", "load_plan", "plan_shards",
])

# Names that need torch or Petastorm's reader machinery are imported on first use, so the planning side of the
# package (and the Spark executors that run it) never pays for torch.
_LAZY = {"BalancedDataLoader": "reading.iterable", "BalancedIterableDataset": "reading.iterable",
         "BalancedLoader": "reading.loader", "make_loader": "reading.loader",
         "make_reader": "reading.reader"}
__all__ = sorted(__all__ + list(_LAZY))


def __getattr__(name):
    if name in _LAZY:
        import importlib
        return getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
