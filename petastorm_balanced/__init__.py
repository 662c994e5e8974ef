"""petastorm-balanced: equal steps on every rank over Parquet, planned once, read locally.

Only the public API lives here. ``import petastorm_balanced`` needs neither pyspark nor torch; the features that
use them import them when called.
"""
__version__ = "0.1.0"

from .errors import PlanError, PlanIntegrityError, PlanVersionError, StalePlanError  # noqa: E402
from .plan import Fragment, ShardPlan  # noqa: E402
from .planning import plan_shards  # noqa: E402
from .plan_io import load_plan  # noqa: E402
from .world import World  # noqa: E402

__all__ = sorted([
    "Fragment", "PlanError", "PlanIntegrityError", "PlanVersionError", "ShardPlan", "StalePlanError", "World",
    "load_plan", "plan_shards",
])

# Names that need torch or Petastorm's reader machinery are imported on first use, so the planning side of the
# package (and the Spark executors that run it) never pays for torch.
_LAZY = {"BalancedDataLoader": "loader", "BalancedIterableDataset": "loader", "BalancedLoader": "loader",
         "make_loader": "loader",
         "make_reader": "reader"}
__all__ = sorted(__all__ + list(_LAZY))


def __getattr__(name):
    if name in _LAZY:
        import importlib
        return getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
