"""The position of the next batch, shared by both loaders: an epoch and the batches of it already delivered.

The position is the whole resume state (G6); everything else is derived from the plan. See ``Position`` for when an
epoch advances (only delivered batches and ``set_epoch`` move it, so frameworks that probe or re-create iterators
cannot shift an epoch). After an elastic resume (a state saved at another world size, G10) the position also lists
the worlds that served the pass before (``elastic.Stage``, four ints each; the keys are declared in ``state.py``).
"""
from __future__ import annotations

import threading
from collections.abc import Iterator
from operator import length_hint
from typing import TYPE_CHECKING, Any

from ...core.elastic import Stage
from ...core.params import check_int
from ...errors import InvalidTypeError, InvalidValueError
from .. import state as loader_state
from . import layout

if TYPE_CHECKING:
    from .settings import Settings

# One lock for every position (a position is pickled for DataLoader workers; a lock of its own would not pickle),
# taken only to settle batches handed out of a list (``Position.handing``); re-entrant: counting reads ``where``.
_SETTLING = threading.RLock()


class Counting:
    """How an iteration's batches count into a position (one plan's ``Position``, a mixture's ``MixturePosition``):
    one at a time (``delivered``), or a list at a time (``handing``: a list's iterator consumed in C with no Python
    per batch, each batch counted once it left the list, settled whenever the position is read). ``_count`` moves
    the position, for the iteration that owns it only."""

    _handing: tuple | None = None  # (run, batches, size, counted)

    def _count(self, run: Any, count: int) -> None:
        raise NotImplementedError

    def delivered(self, run: Any) -> None:
        """``run`` handed out one more batch."""
        self._settle()
        self._count(run, 1)

    def handing(self, run: Any, batches: Iterator, size: int) -> None:
        """``run`` hands out ``size`` batches from ``batches``: each counts as delivered once it left ``batches``."""
        self._settle()
        self._handing = (run, batches, size, 0)

    def _settle(self) -> None:
        if self._handing is None:
            return
        with _SETTLING:  # a state_dict() in another thread must not count the same batches twice
            handing = self._handing
            if handing is None:
                return
            run, batches, size, counted = handing
            handed = size - length_hint(batches)
            if handed > counted:
                self._handing = (run, batches, size, handed) if handed < size else None
                self._count(run, handed - counted)


class Position(Counting):
    """Where the next batch comes from: the epoch, and batches of it already delivered.

    Shared by both loaders: ``state_dict`` and ``load_state_dict`` are strict (every key must be there, and the
    settings a position depends on must match), ``set_epoch`` works like ``DistributedSampler.set_epoch``.

    When the epoch advances (frameworks probe, re-create and abandon iterators; none of that may shift an epoch):

    - only a delivered batch moves the position; the batch that finishes an epoch moves it to the next epoch's
      first batch. An ``iter()`` abandoned before its first batch consumes nothing, and one abandoned after ``k``
      batches leaves the position at batch ``k``: the next ``iter()`` serves the rest of that epoch;
    - ``set_epoch(e)`` moves it to the start of epoch ``e``, except right after ``load_state_dict`` of a position
      in epoch ``e`` (the training loop's ``set_epoch`` keeps a resumed position);
    - so ``state_dict()`` always names the epoch and batch the next iteration will serve.

    An iteration takes the position when its first batch is asked for (``begin``); a later ``begin``,
    ``set_epoch`` or ``load_state_dict`` supersedes it, and a superseded iteration no longer moves the position.
    """

    # state_dict keys (declared in ``state.py``)
    EPOCH, BATCHES = loader_state.EPOCH, loader_state.BATCHES
    PLAN_CHECKSUM, WORLD_SIZE, BATCH_SIZE = (loader_state.PLAN_CHECKSUM, loader_state.WORLD_SIZE,
                                             loader_state.BATCH_SIZE)
    SHUFFLE, SHUFFLE_WINDOW, RESHUFFLE = (loader_state.SHUFFLE, loader_state.SHUFFLE_WINDOW,
                                          loader_state.RESHUFFLE)
    IDENTITY_KEYS = loader_state.IDENTITY_KEYS

    STAGES, PARTITION_EPOCH = loader_state.STAGES, loader_state.PARTITION_EPOCH  # optional on load

    def __init__(self, settings: Settings, epoch: int):
        epoch = check_int("epoch", epoch, minimum=0)
        self.settings = settings
        self.epoch, self.batches = epoch, 0  # the next batch served
        self.stages: tuple[Stage, ...] = ()  # worlds that served this epoch's pass before this one (elastic)
        self.resumed = False  # came from load_state_dict and no batch was delivered since
        self._owner: Run | None = None  # the iteration allowed to move the position
        self._steps_key: tuple | None = None  # (epoch, stages) whose steps _steps holds (``delivered``)
        self._steps = 0

    def begin(self) -> Run:
        """An iteration starting at the position now (call it when its first batch is about to be read).

        A loaded position at the very end of its epoch (an elastic resume that left fewer rows than one step of the
        new world) is served as that epoch's empty rest, so ``for e in ...: set_epoch(e)`` loops stay in step."""
        self._settle()
        if self.resumed and self.batches >= self.settings.steps_of(self.epoch, self.stages):
            run = Run(self, self.epoch, self.batches, self.stages)
            self.epoch, self.batches, self.stages = self.where()
            self.resumed = False
        else:
            self.epoch, self.batches, self.stages = self.where()
            run = Run(self, self.epoch, self.batches, self.stages)
        self._owner = run
        return run

    def _count(self, run: Any, count: int) -> None:
        if self._owner is not run:
            return
        self.resumed = False
        self.batches += count
        # where() only changes anything at the epoch's end: compare with the epoch's steps, counted once per epoch
        # (steps_of costs several us: once per batch it was about 6% of a numeric epoch, profiled)
        key = (self.epoch, self.stages)
        if key != self._steps_key:
            self._steps_key, self._steps = key, self.settings.steps_of(self.epoch, self.stages)
        if self.batches >= self._steps:
            self.epoch, self.batches, self.stages = self.where()

    def where(self) -> tuple[int, int, tuple[Stage, ...]]:
        """(epoch, batches, stages) of the next batch: at the end of an epoch (or of what an elastic resume left
        of it, which may be nothing), the next epoch's start."""
        self._settle()
        if self.batches >= self.settings.steps_of(self.epoch, self.stages):
            return (self.epoch + 1, 0, layout.carry(self.stages, self.epoch, self.epoch + 1,
                                                              self.settings.partition_epoch))
        return self.epoch, self.batches, self.stages

    def current(self):
        return self.where()[:2]

    def steps(self) -> int:
        """Steps of the epoch (or what is left of it after an elastic resume) the next batch belongs to."""
        epoch, _, stages = self.where()
        return self.settings.steps_of(epoch, stages)

    def rebase(self, workers: int) -> None:
        """The position, saved with ``workers`` slots per rank, for this loader's other slot layout."""
        self._settle()
        self.epoch, self.batches, self.stages = layout.restage(
            self.epoch, self.batches, self.stages, self.settings.world_size, workers, self.settings.partition_epoch)

    def to_workers(self, workers: int, saved: int | None = None) -> None:
        """The position for ``workers`` DataLoader workers (slots) per rank, as an iteration starts: one plan's
        batches count alike for any slots, so only a loaded position saved with other slots (``saved``) moves,
        elastically (``rebase``)."""
        if saved is not None and self.resumed and saved != workers:
            self.rebase(saved)

    def set_epoch(self, epoch: int) -> None:
        epoch = check_int("epoch", epoch, minimum=0)
        self._settle()
        if not (self.resumed and epoch == self.epoch):  # the loaded epoch itself keeps a loaded position
            before, _, stages = self.where()
            self.stages = layout.carry(stages, before, epoch, self.settings.partition_epoch, strict=True)
            self.epoch, self.batches, self.resumed = epoch, 0, False
        self._owner = None

    def values(self, extra: dict | None = None) -> dict:
        """Every state key at the top (``state.nest`` files them under their components)."""
        epoch, batches, stages = self.where()
        return {self.EPOCH: epoch, self.BATCHES: batches, **self.settings.identity(), **(extra or {}),
                self.PARTITION_EPOCH: self.settings.partition_epoch, self.STAGES: [s.as_list() for s in stages]}

    def state_dict(self, extra: dict | None = None) -> dict:
        return loader_state.nest(self.values(extra))

    def worker_state(self, extra: dict, epoch: int, start: int, worker: int, batches: int) -> dict:
        """A DataLoader worker's own state (torchdata's ``StatefulDataLoader`` asks each worker): where its
        iteration started (``epoch``, batch ``start``), the worker, and the ``batches`` it delivered since."""
        return loader_state.nest({**self.values(extra), self.EPOCH: epoch, self.BATCHES: start,
                                  loader_state.WORKER: worker, loader_state.WORKER_BATCHES: batches})

    def load_state_dict(self, state: dict, extra: dict | None = None, *, workers: int = 1) -> None:
        """Strict about keys (``state.flat``) and settings, except the world size: a state saved at another one
        resumes elastically (G10); ``workers`` is the number of slots per rank the state was saved with."""
        if not isinstance(state, dict):
            raise InvalidTypeError(f"state must be a dict from state_dict(), got {type(state).__name__}")
        state = loader_state.flat(state)  # strict: unknown keys refused; a state saved before the nesting is migrated
        expected = {**self.settings.identity(), **(extra or {})}
        check_arrangement(state, expected)
        loader_state.require(state, (self.EPOCH, self.BATCHES, *expected))
        # a state of a plan this one updates (``ShardPlan.extends``): from a pass's start only, where the window
        # that shuffled the old plan's epoch no longer decides anything
        updated = state[self.PLAN_CHECKSUM] != expected[self.PLAN_CHECKSUM] and \
            state[self.PLAN_CHECKSUM] in self.settings.plan.extends
        if updated:
            self._check_pass_start(state)
        for key, value in expected.items():
            if key == self.WORLD_SIZE or (updated and key in (self.PLAN_CHECKSUM, self.SHUFFLE_WINDOW)):
                continue  # another world size: an elastic resume, checked below (and see above)
            if key == self.SHUFFLE_WINDOW and state[key] != value and self.settings.options.shuffle_window is None:
                raise InvalidValueError(f"state[{key!r}]={state[key]!r} rows but this loader's shuffle_budget gives "
                                        f"windows of {value} rows; pass shuffle_window={state[key]!r} to resume "
                                        "that position exactly (its windows decide which rows come next)")
            if state[key] != value:
                raise InvalidValueError(f"state[{key!r}]={state[key]!r} but this loader has {key}={value!r}; a saved "
                                        "position only resumes a loader with the same plan and settings")
        if self.settings.packing is not None and state[self.WORLD_SIZE] != self.settings.world_size and \
                (state[self.BATCHES] != 0 or state.get(self.STAGES)):
            raise InvalidValueError(f"state[{self.WORLD_SIZE!r}]={state[self.WORLD_SIZE]!r} with pack=: packed steps "
                                    "are made per window from each rank's documents, so a mid-epoch position does not "
                                    f"carry to world size {self.settings.world_size}; resume at the same world size, "
                                    "or from an epoch's start (state['batches'] == 0)")
        self._settle()
        self.epoch, self.batches, self.stages = layout.loaded(self.settings.layout, state, workers)
        self._owner, self.resumed = None, True

    def _check_pass_start(self, state: dict) -> None:
        """A state saved on a plan that ``self.settings.plan`` updates (``ShardPlan.extends``) resumes only at the
        start of a pass, where the added rows join; mid-epoch the old epoch's rows per rank were dealt from the old
        catalog, which no longer exists, so continuing it here could repeat or skip rows."""
        epoch, batches = state[self.EPOCH], state[self.BATCHES]
        parts = state.get(self.PARTITION_EPOCH, 1)
        mid = (batches != 0 or state.get(self.STAGES) or state.get(loader_state.WORKER_BATCHES, 0)
               or (isinstance(epoch, int) and isinstance(parts, int) and parts > 0 and epoch % parts))
        if mid:
            raise InvalidValueError(
                f"state (epoch {epoch!r}, batch {batches!r}) was saved mid-epoch on the plan this plan updates "
                f"(checksum {str(state[self.PLAN_CHECKSUM])[:12]}); the updated plan's rows join at an epoch "
                "boundary (with partition_epoch, at the start of a pass) only: finish the epoch on the old plan and "
                "save the state there, or resume on the old plan")


# A state key naming the version of a rule that decides which rows a shuffled window's batches hold, its component,
# and what the rule does (for the message); a state without the key was saved before states recorded it, under 1.
VERSIONED = ((loader_state.COST_ARRANGEMENT, "cost", "arranges cost-balanced windows"),
             (loader_state.SHUFFLE_ORDER, "layout", "orders the rows of shuffled windows"))
RESTART = "restart the epoch: set state['batches'] = 0 (its rows served so far come again)"


def check_arrangement(state: dict, expected: dict, *, fresh: bool | None = None, restart: str = RESTART) -> None:
    """Refuse a position saved under another version of a rule of ``VERSIONED`` than this loader's (the cost
    arrangement, the shuffled windows' row order), unless nothing of its epoch was served yet.

    Versions put other rows in a window's batches, so resuming mid-epoch under another one would replay a
    different set of batches (rows twice, rows never). At an epoch's first batch, with no elastic stages and no
    worker's batches (``fresh``, which a mixture decides by its sources' positions), no window of the epoch was
    served: the epoch starts here under this loader's version, and the state is taken as saved under it (``state``
    is the ``flat`` copy, updated in place)."""
    if fresh is None:
        fresh = state.get(loader_state.BATCHES) == 0 and not state.get(loader_state.STAGES) and \
            not state.get(loader_state.WORKER_BATCHES)
    for key, component, rule in VERSIONED:
        if key not in expected or state.get(key) == expected[key]:
            continue
        saved = state.get(key, 1)
        if fresh:
            state[key] = expected[key]
            continue
        epoch, batches = state.get(loader_state.EPOCH), state.get(loader_state.BATCHES)
        absent = " (absent: saved before states recorded it)" if key not in state else ""
        raise InvalidValueError(
            f"state[{component!r}][{key!r}]={saved!r}{absent} but this loader {rule} with version {expected[key]!r}, "
            f"which puts other rows in each batch: resuming epoch {epoch!r} at batch {batches!r} would not continue "
            "the batches already served. Finish that epoch with the release that saved the state and save it at the "
            f"epoch's end (a state at an epoch's first batch loads here), or {restart}")


class Run:
    """One iteration: where it started; ``delivered()`` counts its batches into the position it came from."""

    __slots__ = ("position", "epoch", "start", "stages")

    def __init__(self, position: Position, epoch: int, start: int, stages: tuple[Stage, ...] = ()):
        self.position, self.epoch, self.start, self.stages = position, epoch, start, stages

    def delivered(self) -> None:
        self.position.delivered(self)
