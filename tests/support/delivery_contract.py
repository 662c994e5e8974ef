"""One delivery contract (G1, G2, G4) for everything that delivers planned rows: loaders of both backends, the
iterable dataset, ``make_reader``.

``read(rank, world, epoch)`` returns an iterable of batches (dicts with ``id`` and ``_padding``); the contract reads
every rank of each world size and epoch and judges the rows with the package's own coverage checker
(``tools/coverage.py``), then reads one rank again to check the same inputs give the same batches (G4).
"""
import os

import numpy as np
import pyarrow.dataset as pads
import pyarrow.parquet as pq

from petastorm_balanced.tools.coverage import coverage_check, steps_check


def matching_ids(path, lang=None) -> np.ndarray:
    """Ground truth from the files themselves: every id, or those whose ``lang`` is ``lang``."""
    table = pads.dataset(str(path), format="parquet", partitioning="hive").to_table(columns=["id", "lang"])
    ids = table.column("id").to_numpy()
    if lang is None:
        return np.sort(ids)
    return np.sort(ids[table.column("lang").to_numpy(zero_copy_only=False) == lang])


def planned_ids(root, fragments) -> np.ndarray:
    """The ids a list of fragments delivers, in order, read straight with pyarrow from the dataset at ``root``."""
    return np.concatenate([pq.ParquetFile(os.path.join(str(root), f.path)).read_row_group(f.row_group, columns=["id"])
                           .column("id").to_numpy()[f.row_indices()] for f in fragments])


def check_planned(plan, per_rank_fragments, *, world: int, batch_size: int, name: str = "G2"):
    """G2 on what a plan assigns (fragments, not delivered batches), judged by ``tools/coverage.py``: every
    catalog row a number, padding fragments flagged; expected = every matching row the catalog lists."""
    keys = [(r.path, r.row_group) for r in plan.catalog.row_groups]
    first, total = {}, 0
    for r, key in zip(plan.catalog.row_groups, keys, strict=True):
        first[key] = total
        total += r.total_rows
    expected = np.concatenate([first[k] + (r.positions() if r.selection else np.arange(r.total_rows))
                               for r, k in zip(plan.catalog.row_groups, keys, strict=True)] or [np.zeros(0, np.int64)])
    ids, padding = [], []
    for fragments in per_rank_fragments:
        rows = [first[(f.path, f.row_group)] + f.row_indices() for f in fragments]
        flags = [np.full(f.num_rows, f.padding) for f in fragments]
        ids.append(np.concatenate(rows or [np.zeros(0, np.int64)]))
        padding.append(np.concatenate(flags or [np.zeros(0, bool)]))
    return coverage_check(ids, padding, expected=expected, policy=plan.policy, global_batch=world * batch_size,
                          name=name)


def _ids_of(batches):
    ids, padding, sizes = [], [], []
    for batch in batches:
        sizes.append(len(batch["id"]))
        ids.append(np.asarray(batch["id"]))
        padding.append(np.asarray(batch["_padding"], dtype=bool))
    empty = np.zeros(0, np.int64)
    return np.concatenate(ids or [empty]), np.concatenate(padding or [np.zeros(0, bool)]), sizes


def check_delivery(plan, expected: np.ndarray, read, *, worlds=(1, 2, 3), epochs=(0, 1)) -> None:
    batch = plan.batch_size
    for world in worlds:
        if plan.total_rows < world * batch:
            continue
        steps = plan.steps_per_epoch(world)
        for epoch in epochs:
            per_rank = [_ids_of(read(rank, world, epoch)) for rank in range(world)]
            name = f"world {world} epoch {epoch}"
            g1 = steps_check([sizes for _, _, sizes in per_rank], steps=steps, batch_size=batch, name=f"G1 {name}")
            assert g1.ok, g1.detail
            g2 = coverage_check([i for i, _, _ in per_rank], [p for _, p, _ in per_rank], expected=expected,
                                policy=plan.policy, global_batch=world * batch, name=f"G2 {name}")
            assert g2.ok, g2.detail
            again = _ids_of(read(world - 1, world, epoch))
            assert all(np.array_equal(a, b) for a, b in zip(again[:2], per_rank[-1][:2], strict=True)), f"G4 {name}"
