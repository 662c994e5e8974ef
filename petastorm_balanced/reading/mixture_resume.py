"""What a mixture's saved position may resume, beyond one plan's rules: plans its sources update, states saved
before each source's order was keyed by its place, and the one case where two places would read the same order.
Checks only, no reading; ``mixture.py`` calls them when it builds settings or loads a state."""
from __future__ import annotations

from collections.abc import Sequence

from ..errors import InvalidValueError
from ..plan.model import ShardPlan
from .mixture_elastic import ORDER_VERSION
from .state import FIX, SOURCE_ORDER, SOURCES


def refuse_twice(plans: Sequence[ShardPlan], shuffle: bool) -> None:
    """The same plan at two places reads two independent orders, each source's own (``SourceLayout.plan_epoch``):
    its rows repeat at the rate of the summed weights, as an oversampled source should. Without shuffling both
    places would read the same rows in the same order, every batch holding its rows twice: refused."""
    if shuffle:
        return
    seen: dict[str, int] = {}
    for index, plan in enumerate(plans):
        first = seen.setdefault(plan.checksum, index)
        if first != index:
            raise InvalidValueError(f"plan[{index}] is plan[{first}] again ({plan.dataset_url}) with shuffle=False: "
                                    "both places would read the same rows in the same order; pass shuffle=True "
                                    "(each place then reads its own order), or give the plan once with the sum of "
                                    "its weights")


def updated_plans(saved, sources, plans: Sequence[ShardPlan]) -> bool:
    """Whether the saved checksums are those of plans that this mixture's plans update (``ShardPlan.extends``,
    ``plan_shards(update=)``) and the rest equal. As for one plan (``Position``), an updated plan's rows join
    where a pass of it starts, because a pass in progress was dealt from the old catalog: each updated source
    must stand at the start of a pass (``[pass, 0]``), else refused naming the source and the fix."""
    if not isinstance(saved, list) or len(saved) != len(plans) or saved == [p.checksum for p in plans]:
        return False
    changed = [i for i, (old, plan) in enumerate(zip(saved, plans, strict=True)) if old != plan.checksum]
    if any(saved[i] not in plans[i].extends for i in changed):
        return False  # another plan altogether: the usual message
    for i in changed:
        entry = sources[i] if isinstance(sources, list) and len(sources) == len(plans) else None
        if isinstance(entry, list) and len(entry) == 2 and entry[1] == 0:
            continue
        where = f"state['mixture'][{SOURCES!r}][{i}]"
        skip = "" if not isinstance(entry, list) or not entry or not isinstance(entry[0], int) else \
            f", or set {where} = [{entry[0] + 1}, 0] to start its next pass now (what pass {entry[0]} had left " \
            "is then not delivered in it)"
        raise InvalidValueError(f"{where}={entry!r} stands inside a pass of the plan that plan[{i}] updates "
                                f"(checksum {str(saved[i])[:12]}); an updated plan's rows join at the start of a "
                                "pass of that source, since the pass in progress was dealt from the old plan: "
                                f"resume on the old plans until source {i} starts a pass{skip}")
    return True


def check_order(saved, sources: list) -> None:
    """A state saved when every source read pass ``p`` as its plan's epoch ``p`` (no ``source_order``: version 1)
    holds positions in those orders; this release keys each source's order by its place as well
    (``SourceLayout.plan_epoch``), so a source inside a pass would continue in another order (rows twice, rows
    never): loaded only where every source starts a pass, or with one source (the orders agree), else refused."""
    if saved == ORDER_VERSION or len(sources) == 1:
        return
    if saved != 1:
        raise InvalidValueError(f"state['mixture'][{SOURCE_ORDER!r}]={saved!r} is not an order this release reads "
                                f"(1 or {ORDER_VERSION}); {FIX}")
    inside = next((i for i, e in enumerate(sources) if not (isinstance(e, list) and len(e) == 2 and e[1] == 0)), None)
    if inside is not None:
        raise InvalidValueError(
            f"state['mixture'] has no {SOURCE_ORDER!r}: it was saved when each source read pass p as its plan's epoch "
            f"p, and this release keys each source's order by its place too; source {inside} stands inside a pass "
            f"({sources[inside]!r}), which would continue in another order: finish the epoch with the release that "
            f"saved the state, or restart that source's pass by setting state['mixture'][{SOURCES!r}][{inside}] to "
            "[pass, 0] (its rows of the pass come again)")
