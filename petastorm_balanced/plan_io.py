"""``load_plan``: read a plan and, by default, make sure its dataset has not changed since."""
from __future__ import annotations

from .plan import ShardPlan
from .plan_format import check_dataset, read_plan


def load_plan(plan_url, *, check_dataset: bool = True) -> ShardPlan:
    """Load the plan at ``plan_url``; ``check_dataset`` compares the dataset's file listing with the plan's."""
    if isinstance(plan_url, ShardPlan):
        plan = plan_url
    else:
        plan = read_plan(plan_url)
    if check_dataset:
        _check(plan)
    return plan


_check = check_dataset
