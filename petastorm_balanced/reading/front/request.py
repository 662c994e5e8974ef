"""``LoaderRequest``: what a loader is built from, resolved once at the front door.

``make_loader`` and ``BalancedIterableDataset`` turn the user's words (a plan, a URL or a list of them with weights;
rank and world, or nothing; a backend's name; the options) into objects here, once: plans loaded and checked, the
world detected, the backend chosen (by the first snapshot table), the reader's arguments checked for it. Everything
below builds from the request. One plan and a mixture come through this one door.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, cast

from ...errors import InvalidTypeError, InvalidValueError
from ...plan.load import resolve_plan
from ...plan.model import ShardPlan
from ...world import World, resolve_world
from ..backends import resolve_backend
from ..options import LoaderOptions

Backend = Literal["arrow", "petastorm"]  # a backend as resolved ("auto" is decided here)


@dataclass(frozen=True)
class LoaderRequest:
    """A loader's inputs as objects: the plans (one, or a mixture's), the world, the checked options, the chosen
    backend and its reader arguments, the mixture's weights and epoch length."""

    plans: tuple[ShardPlan, ...]
    mixture: bool  # plan=[...] was given: a mixture, even of one plan
    world: World
    options: LoaderOptions
    backend: Backend
    reader_options: Mapping[str, Any] = field(default_factory=dict)
    weights: Sequence[Any] | None = None
    epoch_steps: int | None = None

    @property
    def plan(self) -> ShardPlan:
        """The one plan of a request that is not a mixture."""
        return self.plans[0]


def resolve_request(plan: Any, rank: int | None, world: int | None, options: LoaderOptions, *,
                    weights: Sequence[Any] | None = None, epoch_steps: int | None = None, backend: str = "auto",
                    petastorm_arguments: Sequence[str] = (),
                    reader_options: Callable[[str], Mapping[str, Any]] | None = None) -> LoaderRequest:
    """The request for ``plan`` (a ShardPlan, a plan URL, or a list of them: a mixture); ``reader_options``
    gives the reader's arguments for the chosen backend (checked there), ``petastorm_arguments`` the ones only
    Petastorm's reader honours (they make ``backend="auto"`` pick it)."""
    mixture = isinstance(plan, (list, tuple))
    if mixture:
        if len(plan) < 1:
            raise InvalidTypeError(f"plan={plan!r} must be a ShardPlan, a plan URL, or a list of them (a mixture)")
        if weights is None:
            raise InvalidValueError("plan=[...] (a mixture) needs weights=, one positive number per plan, such as "
                                    "weights=[0.7, 0.3]")
    else:
        check_single_plan(weights, epoch_steps)
    plans = tuple(resolve_plan(p) for p in plan) if mixture else (resolve_plan(plan),)  # loaded once, here
    tables = [p.table for p in plans if p.table is not None]
    chosen = resolve_backend(backend, tables[0] if tables else None, petastorm_arguments)  # a table decides it
    given = dict(reader_options(chosen)) if reader_options is not None else {}
    return LoaderRequest(plans, mixture, resolve_world(rank, world), options, cast(Backend, chosen), given, weights,
                         epoch_steps)


def check_single_plan(weights, epoch_steps) -> None:
    """``weights`` and ``epoch_steps`` belong to mixtures: refused with one plan, never ignored."""
    if weights is not None or epoch_steps is not None:
        raise InvalidValueError(f"weights={weights!r}, epoch_steps={epoch_steps!r} apply to a mixture: pass plan= as "
                                "a list of plans (plan=[plan_a, plan_b]), or leave them out")
