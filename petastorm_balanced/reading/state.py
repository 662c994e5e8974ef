"""The loader state, in one module: its keys declared once, nested per component, loaded strictly.

``state_dict()`` of ``BalancedLoader`` and ``BalancedIterableDataset`` is a plain dict (it pickles, prints and goes
through ``json``), shaped like this (torchdata style: one entry per component)::

    {"epoch": 1, "batches": 7,                       # the position: the epoch and batch the next iteration serves
     "layout": {"plan_checksum": ..., "world_size": 4, "batch_size": 32, "shuffle": True, "shuffle_window": 8192,
                "reshuffle": "epoch", "partition_epoch": 1,    # what the position is valid for (checked on load)
                "shuffle_order": 2},                 # the version that ordered shuffled windows' rows
     "elastic": {"stages": [[8, 1, 0, 120]]},         # worlds that served this pass before (G10)
     "cost": {"balance": "cost", "cost_reduce": "sum", "max_batch_cost": None,    # cost-balancing loaders only
              "cost_arrangement": 2},          # the version that arranged the windows (shuffled, fixed-size batches)
     "workers": {"num_workers": 2},                   # BalancedIterableDataset only (plus "worker",
                                                      # "worker_batches" in a state saved inside a worker)
     "mixture": {"weights": ["7/10", "3/10"], "epoch_steps": None, "phase": 3,
                 "sources": [[0, 1204], [2, 77]], "source_order": 3}}   # mixtures only; their "plan_checksum"
                                                      # is a list

The position stays at the top because training loops read it (``state["epoch"]``). Loading is strict: a key this
module does not declare, or a component with a key missing, is a ``StateKeyError`` naming the key and the fix.

**Migration.** States saved before the nesting (every key at the top: ``{"epoch", "batches", "plan_checksum",
"world_size", ..., "stages", "num_workers"}``) still load: ``nested`` recognizes one by its top-level
``plan_checksum`` and files each key under its component, with the same strictness. A state is always saved nested.

>>> state = nest({EPOCH: 0, BATCHES: 3, WORLD_SIZE: 2, STAGES: []})
>>> state["batches"], state["layout"], state["elastic"]
(3, {'world_size': 2}, {'stages': []})
>>> flat(state) == {EPOCH: 0, BATCHES: 3, WORLD_SIZE: 2, STAGES: []}
True
"""
from __future__ import annotations

from typing import Any

from ..errors import StateKeyError

# The keys, declared once: the positions, the loaders, the cost identity and the CLI use these names.
EPOCH, BATCHES, WORLD_SIZE, STAGES, PARTITION_EPOCH = "epoch", "batches", "world_size", "stages", "partition_epoch"
PLAN_CHECKSUM, BATCH_SIZE = "plan_checksum", "batch_size"
SHUFFLE, SHUFFLE_WINDOW, RESHUFFLE = "shuffle", "shuffle_window", "reshuffle"
SHUFFLE_ORDER = "shuffle_order"  # the version of core/shuffle.row_order a shuffled position was saved under
BALANCE, COST_REDUCE, MAX_BATCH_COST = "balance", "cost_reduce", "max_batch_cost"
COST_ARRANGEMENT = "cost_arrangement"  # the version of core/cost/arrangement.ARRANGEMENTS a position was saved under
# a packing loader's (reading/batches/packing.py): the packed column, tokens per sequence, sequences per step, the
# version
# of the rule that makes a window's steps, what happens to documents longer than seq_len
PACK, SEQ_LEN, SEQUENCES, PACKING, LONG_DOCUMENTS = "pack", "seq_len", "sequences", "packing", "long_documents"
NUM_WORKERS = "num_workers"  # slots per rank of a BalancedIterableDataset's state
WORKER, WORKER_BATCHES = "worker", "worker_batches"  # a state saved inside a DataLoader worker (torchdata)
# a mixture's (reading/mixing/mixture.py): the weights as fractions, the epoch length, the schedule's phase, [pass, row]
# of every source
WEIGHTS, EPOCH_STEPS, PHASE, SOURCES = "weights", "epoch_steps", "phase", "sources"
SOURCE_ORDER = "source_order"  # 3: sources counted in world x workers slots; 2: pass p reads plan epoch
# p x sources + place (2 and 3 alike with one worker); absent: 1 (epoch p)

POSITION = (EPOCH, BATCHES)  # at the top level
# what a saved position of one plan's loader is only valid for (``Settings.identity``, checked on load)
IDENTITY_KEYS = (PLAN_CHECKSUM, WORLD_SIZE, BATCH_SIZE, SHUFFLE, SHUFFLE_WINDOW, RESHUFFLE)
# component -> its keys; the position's settings (layout), the elastic stages, cost identity, DataLoader workers
COMPONENTS: dict[str, tuple[str, ...]] = {
    "layout": (PLAN_CHECKSUM, WORLD_SIZE, BATCH_SIZE, SHUFFLE, SHUFFLE_WINDOW, RESHUFFLE, PARTITION_EPOCH,
               SHUFFLE_ORDER),
    "elastic": (STAGES,),
    "cost": (BALANCE, COST_REDUCE, MAX_BATCH_COST, COST_ARRANGEMENT),
    "workers": (NUM_WORKERS, WORKER, WORKER_BATCHES),
    "mixture": (WEIGHTS, EPOCH_STEPS, PHASE, SOURCES, SOURCE_ORDER),
    "pack": (PACK, SEQ_LEN, SEQUENCES, PACKING, LONG_DOCUMENTS),
}
COMPONENT_OF = {key: name for name, keys in COMPONENTS.items() for key in keys}
FIX = "pass a dict saved by state_dict() of this loader type (docs/resume.md)"


def nest(values: dict[str, Any]) -> dict[str, Any]:
    """The saved form of ``values`` (every key at the top): the position at the top, the rest under its component."""
    state: dict[str, Any] = {}
    for key, value in values.items():
        if key in POSITION:
            state[key] = value
        elif key in COMPONENT_OF:
            state.setdefault(COMPONENT_OF[key], {})[key] = value
        else:
            raise AssertionError(f"state key {key!r} is not declared in reading/state.py")
    return state


def flat(state: Any) -> dict[str, Any]:
    """Every key of a saved ``state`` at the top (what the loaders check), refusing what this module does not
    declare: an unknown component or key is a ``StateKeyError`` naming it. A state in the flat form saved before
    the nesting is accepted (the migration above), with the same check of its keys."""
    if not isinstance(state, dict):
        return state  # the loaders refuse a non-dict with a typed error of their own
    if PLAN_CHECKSUM in state:  # saved before the nesting: every key at the top
        unknown = [k for k in state if k not in POSITION and k not in COMPONENT_OF]
        if unknown:
            raise StateKeyError(f"state has the unknown key {unknown[0]!r}; {FIX}")
        return dict(state)
    out: dict[str, Any] = {}
    for key, value in state.items():
        if key in POSITION:
            out[key] = value
            continue
        if key not in COMPONENTS:
            where = f" (it belongs under state[{COMPONENT_OF[key]!r}])" if key in COMPONENT_OF else ""
            raise StateKeyError(f"state has the unknown key {key!r}{where}; its keys are {list(POSITION)} and the "
                                f"components {list(COMPONENTS)}; {FIX}")
        if not isinstance(value, dict):
            raise StateKeyError(f"state[{key!r}]={value!r} must be a dict of {list(COMPONENTS[key])}; {FIX}")
        for inner, item in value.items():
            if inner not in COMPONENTS[key]:
                raise StateKeyError(f"state[{key!r}] has the unknown key {inner!r}; it holds "
                                    f"{list(COMPONENTS[key])}; {FIX}")
            out[inner] = item
    return out


def require(values: dict[str, Any], keys) -> None:
    """A ``StateKeyError`` naming the first of ``keys`` missing from ``values`` (a ``flat`` state) and where it
    belongs."""
    missing = [k for k in keys if k not in values]
    if missing:
        where = ", ".join(f"state[{COMPONENT_OF[k]!r}][{k!r}]" if k in COMPONENT_OF else f"state[{k!r}]"
                          for k in missing)
        raise StateKeyError(f"state is missing {where}; {FIX}")
