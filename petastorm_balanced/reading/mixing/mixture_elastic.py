"""Elastic resume of a mixture (G10): a state saved at world size W continues at W' with every source in its pass.

Each source of a mixture is read on every rank as a slot of its plan at one row per batch (``mixture_rows.py``),
and every rank has taken the same rows of it: its position is ``[pass, row]``, the same on every rank. That is a
single-plan position at ``batch_size=1``: ``row`` batches of the plan epoch ``plan_epoch(pass)`` of a
``source/layout.Layout`` at one row per batch, so a source resumes through the single plan's own arithmetic
(``layout.resumed``: the rows of the pass no old rank delivered, cut for the new world as a pass is cut, ``Stage``
by ``Stage``). Over the pass no row is delivered twice, and ``drop`` leaves out fewer than ``W'`` rows of it (G2);
the next pass is an ordinary pass of the new world.

**The counter.** The mixture's schedule and epochs (``core/mixture.py``) see a source as one counter whose pass
boundaries fall at multiples of its rows per pass ``R`` (of the current world). A source resumed with ``T`` rows
left in pass ``p`` gets the counter ``(p + 1) R - T``: its pass ends after exactly those ``T`` rows, and the
``Head`` says that counters from ``begin = (p + 1) R - T`` to the pass's end read the elastic rest
(``row - begin`` rows of it delivered), not the ordinary pass.

**The state** of a source is ``[pass, row]``, or ``[pass, row, stages]`` inside an elastic rest: ``stages`` are
the single plan's saved stages (``Stage.as_list()``: world size, 1, 0, rows each of its ranks delivered) and
``row`` counts the rows delivered in the current world.

**What else a saved position may resume** (checks only): plans its sources update (``updated_plans``), states
saved before each source's order was keyed by its place (``check_order``), and the one case where two places
would read the same order (``refuse_twice``).
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ...core.elastic import Stage
from ...core.params import check_int
from ...errors import InvalidValueError
from ...plan.model import ShardPlan
from ..source.layout import Layout, resumed
from ..state import FIX, SOURCE_ORDER, SOURCES

# How a state's sources are counted; states record it. 2: each source's pass picks its plan epoch by its place
# (``plan_epoch``); 3: with DataLoader workers, in slots of world_size x num_workers (``MixtureSettings.slots``)
ORDER_VERSION = 3


def plan_epoch(pass_index: int, place: int, sources: int) -> int:
    """The plan epoch that pass ``pass_index`` of the source at ``place`` (of ``sources``) reads: keyed by the
    place, so the same plan given twice reads two independent orders (its row groups dealt and its windows permuted
    by other seeds) instead of the same rows in the same order; one source reads its plan's epochs as they are."""
    return pass_index * sources + place


@dataclass(frozen=True)
class Head:
    """A source inside an elastic rest: pass ``pass_index`` after ``stages``, read from counter ``begin`` on."""

    pass_index: int
    stages: tuple[Stage, ...]
    begin: int

    def holds(self, counter: int, rows_per_pass: int) -> bool:
        """Whether ``counter`` reads this rest (it is in the rest's pass)."""
        return counter // rows_per_pass == self.pass_index and counter >= self.begin


def encode(counter: int, head: Head | None, rows_per_pass: int) -> list:
    """A source's saved entry: ``[pass, row]``, or ``[pass, row, stages]`` inside an elastic rest."""
    if head is not None and head.holds(counter, rows_per_pass):
        return [head.pass_index, counter - head.begin, [s.as_list() for s in head.stages]]
    return list(divmod(counter, rows_per_pass))


def resume(entry, index: int, key: str, now: Layout, saved_world: int, sources: int,
           workers: int = 1) -> tuple[int, Head | None]:
    """The counter (and elastic head) at which source ``index`` (read by ``now``) continues, from its ``entry``
    saved at ``saved_world`` ranks of ``workers`` slots each: the same place when the slots agree, else the rows of
    its pass no old slot delivered, cut for the new ones (``layout.resumed``, the single plan's arithmetic)."""
    slots = saved_world * workers
    where = f"state[{key!r}][{index}]"
    if not isinstance(entry, (list, tuple)) or len(entry) not in (2, 3):
        raise InvalidValueError(f"{where}={entry!r} must be [pass, row] or [pass, row, stages]")
    pass_index = check_int(f"{where} pass", entry[0], minimum=0)
    stages: tuple[Stage, ...] = ()
    if len(entry) == 3:
        if not isinstance(entry[2], (list, tuple)) or not entry[2]:
            raise InvalidValueError(f"{where} stages={entry[2]!r} must be a non-empty list of saved stages")
        stages = tuple(Stage.from_list(s) for s in entry[2])
        if any(s.num_workers != 1 or s.part != 0 for s in stages):
            raise InvalidValueError(f"{where} stages={entry[2]!r}: a mixture source's stages are [world_size, 1, 0, "
                                    "rows]")
    epoch = plan_epoch(pass_index, index, sources)
    at, row, stages = resumed(now, epoch, entry[1], stages, slots, 1, f"{where} row")
    rows_per_pass = now.steps
    if at != epoch:  # the saved pass was over: the next one, an ordinary pass of this world
        return (pass_index + 1) * rows_per_pass, None
    if stages and now.balance_by == "cost" and slots != now.world_size:
        layout = "" if workers == 1 else f" with num_workers={workers}"
        raise InvalidValueError(
            f"{key}[{index}]: source {index} balances cost and stands at row {entry[1]} of its pass {pass_index}; "
            f"its rows per old rank follow the cost arrangement, so an elastic resume mid-pass is not supported "
            f"for it: resume at world_size={saved_world}{layout}, or once that source starts a pass")
    if not stages:
        return pass_index * rows_per_pass + row, None
    left = now.steps_of(epoch, stages)
    if left == 0:  # drop left fewer rows than the new world needs for one row per rank: the pass is over
        return (pass_index + 1) * rows_per_pass, None
    if left > rows_per_pass:  # the rest of a pass never holds more rows per rank than a whole pass
        raise InvalidValueError(f"{key}[{index}]: source {index} would have {left} rows per rank left in pass "
                                f"{pass_index}, more than a whole pass's {rows_per_pass}; the state does not belong to "
                                "these plans")
    head = Head(pass_index, stages, (pass_index + 1) * rows_per_pass - left)
    return head.begin + row, head


def refuse_twice(plans: Sequence[ShardPlan], shuffle: bool) -> None:
    """The same plan at two places reads two independent orders, each source's own (``plan_epoch``):
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
    (``plan_epoch``), so a source inside a pass would continue in another order (rows twice, rows
    never): loaded only where every source starts a pass, or with one source (the orders agree), else refused."""
    if saved in (2, ORDER_VERSION) or len(sources) == 1:
        return
    if saved != 1:
        raise InvalidValueError(f"state['mixture'][{SOURCE_ORDER!r}]={saved!r} is not an order this release reads "
                                f"(1 to {ORDER_VERSION}); {FIX}")
    inside = next((i for i, e in enumerate(sources) if not (isinstance(e, list) and len(e) == 2 and e[1] == 0)), None)
    if inside is not None:
        raise InvalidValueError(
            f"state['mixture'] has no {SOURCE_ORDER!r}: it was saved when each source read pass p as its plan's epoch "
            f"p, and this release keys each source's order by its place too; source {inside} stands inside a pass "
            f"({sources[inside]!r}), which would continue in another order: finish the epoch with the release that "
            f"saved the state, or restart that source's pass by setting state['mixture'][{SOURCES!r}][{inside}] to "
            "[pass, 0] (its rows of the pass come again)")
