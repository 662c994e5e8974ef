"""``verify`` for sub-epochs and elastic resumes: a whole pass served the way the loaders serve it, then checked.

Each world that served the pass (the stages of a saved state, then the world being checked) delivers its parts;
a world that stopped mid-part delivers only its ranks' first batches, in the order the loaders deliver them (the
slot's planned rows through the real ``WindowBatcher``). This is the forward rule; the loaders find the rows left
with ``core/elastic.py`` (the rule run backwards), so the check is not a restatement of the code it checks. Then:
G1 for every world and part (every rank the same steps, whole batches), and G2 over the pass (no real row twice,
``drop`` leaves out fewer than ``W_last x batch`` rows, ``pad`` delivers every row, padding below the worlds'
``sum(W x batch)``).
"""
from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from ..core.elastic import Stage
from ..core.shuffle import window_rows
from ..errors import InvalidValueError
from ..reading.batches.batching import WindowBatcher, start_point
from ..reading.source.layout import Layout
from .coverage import Check, bounds_check

# Keys of the rows of one fragment (plan mode: ids derived from the catalog; read mode: rows read from the files).
FragmentKeys = Callable[[object], np.ndarray]


def pass_checks(layout: Layout, *, epoch: int, stages: Sequence[Stage] = (), num_workers: int = 1,
                keys: FragmentKeys | None = None, expected: np.ndarray | None = None,
                label: str = "plan") -> list[Check]:
    """G1 per world and part, G2 over the pass of ``epoch`` served by ``stages`` and then ``layout``'s world.

    ``keys`` maps a fragment to its rows' keys (default: one id per matching row, from the catalog) and
    ``expected`` is every key the pass must cover (default: every matching row).
    """
    plan, batch, parts = layout.plan, _fixed_batch(layout), layout.partition_epoch
    if keys is None:
        offsets = np.concatenate(([0], np.cumsum(plan.catalog.matching_counts())))
        index = {(r.path, r.row_group): i for i, r in enumerate(plan.catalog.row_groups)}
        positions = {}

        def keys(fragment):
            i = index[(fragment.path, fragment.row_group)]
            if i not in positions:
                positions[i] = plan.catalog.row_groups[i].positions()
            return offsets[i] + np.searchsorted(positions[i], fragment.row_indices())
        expected = np.arange(plan.total_rows, dtype=np.int64)
    if expected is None:
        raise InvalidValueError("pass_checks(keys=...) needs expected= (every key the pass must cover)")
    pass_index = epoch // parts
    worlds: list[tuple[int, int, int, int | None]] = [(s.world_size, s.num_workers, s.part, s.batches)
                                                      for s in stages]
    worlds.append((layout.world_size, num_workers, parts - 1, None))
    checks: list[Check] = []
    real_parts: list[np.ndarray] = []  # keys delivered per slot: real rows, and padding rows
    padded_parts: list[np.ndarray] = []
    first_part = 0
    for index_, (world, workers, stop_part, stop_batches) in enumerate(worlds):
        for part in range(first_part, stop_part + 1):
            e = pass_index * parts + part
            where = f"world {world}, epoch {e}" + (f" (part {part} of pass {pass_index})" if parts > 1 else "")
            rank_rows = []
            take = stop_batches if part == stop_part and stop_batches is not None else None
            for rank in range(world):
                fragments = plan.assignment(rank, epoch=e, world_size=world, num_workers=workers,
                                            batch_size=batch, reshuffle=layout.reshuffle, partition_epoch=parts,
                                            stages=tuple(stages[:index_]),
                                            windows=layout.windows)
                rank_rows.append(sum(f.num_rows for f in fragments))
                for worker in range(workers):
                    mine = [f for f in fragments if f.worker == worker]
                    slot_keys = np.concatenate([keys(f) for f in mine] or [np.zeros(0, np.int64)])
                    flags = np.concatenate([np.full(f.num_rows, f.padding) for f in mine] or [np.zeros(0, bool)])
                    order = _delivery_order(len(slot_keys), layout, e, index_, rank, worker)
                    done = len(order) if take is None else (take + workers - 1 - worker) // workers * batch
                    order = order[:done]
                    real_parts.append(slot_keys[order][~flags[order]])
                    padded_parts.append(slot_keys[order][flags[order]])
            if len(set(rank_rows)) != 1 or rank_rows[0] % batch:
                checks.append(Check(f"G1 equal steps, {where} ({label})", False,
                                    f"rows per rank {min(rank_rows)}..{max(rank_rows)}, batch {batch}"))
            else:
                checks.append(Check(f"G1 equal steps, {where} ({label})", True,
                                    f"{world} ranks x {rank_rows[0] // batch} steps x {batch} rows"))
        first_part = stop_part
    real, padded = np.concatenate(real_parts), np.concatenate(padded_parts)
    unique = np.unique(real)
    foreign = len(np.setdiff1d(np.concatenate([unique, padded]), expected))
    left_out = len(np.setdiff1d(expected, unique))
    last = worlds[-1][0] * batch
    name = f"G2 coverage, pass {pass_index} ({label})"
    check = bounds_check(name, plan.policy, last, duplicates=len(real) - len(unique), foreign=foreign,
                         left_out=left_out, padded=0)
    padding_bound = sum(w * batch for w, *_ in worlds)
    if check.ok and (len(padded) >= padding_bound or (plan.policy == "drop" and len(padded))):
        check = Check(name, False, f"{len(padded)} padding rows, the bound is {padding_bound - 1}")
    elif check.ok:
        check = Check(name, True, f"no row twice, {left_out} left out (bound {last - 1}), {len(padded)} padded, "
                                  f"served by worlds {[w for w, *_ in worlds]}")
    return checks + [check]


def _fixed_batch(layout: Layout) -> int:
    if layout.batch_size is None:
        raise InvalidValueError("the pass check replays fixed-size batches; a token-budget layout (max_batch_cost, "
                                "batch_size=None) is not supported: check the plan with a batch size")
    return layout.batch_size


def _delivery_order(rows: int, layout: Layout, epoch: int, stage: int, rank: int, slot: int) -> np.ndarray:
    """Slot positions in the order the loaders deliver them (fixed-window shuffle), via ``WindowBatcher``."""
    if rows == 0:
        return np.zeros(0, dtype=np.int64)
    batch = _fixed_batch(layout)
    size = window_rows(batch, layout.shuffle_window, layout.shuffle)
    start = start_point(np.array([rows]), batch_size=batch, window_rows=size, batches_done=0,
                        shuffle=layout.shuffle)
    batcher = WindowBatcher(total_rows=rows, batch_size=batch, window_rows=size, start=start,
                            key=layout.key(epoch, slot, stage, rank) if layout.shuffle else None)
    runs = [run["i"] for run in batcher.push({"i": np.arange(rows, dtype=np.int64)})]
    batcher.finish()
    return np.concatenate(runs)
