"""``load_plan``: read a plan and refuse it when it no longer describes what the caller is about to read."""
from __future__ import annotations

from typing import Optional

from . import fs as fsutil
from .errors import StalePlanError
from .plan import ShardPlan
from .plan_format import check_dataset as _check_dataset
from .plan_format import check_predicate, read_plan


def load_plan(plan_url, *, check_dataset: bool = True, dataset_url=None, where: Optional[str] = None,
              predicate=None) -> ShardPlan:
    """Load the plan at ``plan_url`` (or take a ``ShardPlan`` as is).

    ``check_dataset`` compares the dataset's files (paths, sizes) with the plan's (G7; the reader compares row
    group sizes as it reads). Passing ``dataset_url``, ``where`` or ``predicate`` also asserts that the plan was
    made for that dataset and that filter, so a training script that still names them cannot silently train on a
    plan made for something else.
    """
    plan = plan_url if isinstance(plan_url, ShardPlan) else read_plan(plan_url)
    if dataset_url is not None and fsutil.normalize_url(dataset_url) != plan.dataset_url:
        raise StalePlanError(f"the plan was made for {plan.dataset_url}, not dataset_url="
                             f"{fsutil.normalize_url(dataset_url)!r}; plan that dataset")
    if where is not None or predicate is not None:
        from .planning import predicate_info
        check_predicate(plan, predicate_info(where, predicate))
    if check_dataset:
        _check_dataset(plan)
    return plan
