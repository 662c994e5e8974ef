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
