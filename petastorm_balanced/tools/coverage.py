"""The one coverage checker: G1 (equal steps, full batches) and G2 (no row twice, bounded left-out and padding) on
rows that were actually delivered, whoever delivered them.

``verify --read``, the training examples (after an all_gather) and the tests all judge delivered rows here, so a
rule is written once and a bug in it shows up everywhere. Pure numpy: no I/O, no torch.

>>> import numpy as np
>>> check = coverage_check([np.array([1, 2]), np.array([3, 4])], [np.zeros(2, bool)] * 2, expected=np.arange(1, 6),
...                        policy="drop", global_batch=4, name="G2")
>>> check.ok, check.detail
(True, 'no row twice, 1 left out, 0 padded (bound 3)')
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    detail: str

    def line(self) -> str:
        return f"{'ok  ' if self.ok else 'FAIL'}  {self.name}: {self.detail}"


def steps_check(batch_sizes: Sequence[Sequence[int]], *, steps: int, batch_size: int, name: str) -> Check:
    """G1: every rank delivered ``steps`` batches of exactly ``batch_size`` rows (``batch_sizes``: per rank)."""
    for rank, sizes in enumerate(batch_sizes):
        if len(sizes) != steps or any(n != batch_size for n in sizes):
            short = [n for n in sizes if n != batch_size]
            return Check(name, False, f"rank {rank} delivered {len(sizes)} batches ({len(short)} not of {batch_size} "
                                      f"rows); every rank must deliver {steps} x {batch_size}")
    return Check(name, True, f"every rank delivered {steps} full batches of {batch_size} rows")


def coverage_check(ids: Sequence[np.ndarray], padding: Sequence[np.ndarray], *, expected, policy: str,
                   global_batch: int, name: str) -> Check:
    """G2 over every rank's delivered row ids (``ids``, with their padding flags) of one epoch.

    ``expected`` are the ids that may be delivered (the matching rows), or only their number when the caller
    cannot list them (a training job): then padding must repeat delivered ids. Policy ``drop``: no row twice, no
    padding, fewer than ``global_batch`` left out. Policy ``pad``: every expected row delivered, fewer than
    ``global_batch`` padding rows, each a repeat of an expected row.
    """
    all_ids = np.concatenate(list(ids)) if len(ids) else np.zeros(0, np.int64)
    flags = np.concatenate(list(padding)).astype(bool) if len(padding) else np.zeros(0, bool)
    real, padded = all_ids[~flags], all_ids[flags]
    unique = np.unique(real)
    if np.ndim(expected) == 0:  # a count: ids outside the matching rows cannot be told, padding must repeat them
        foreign, left_out = len(np.setdiff1d(padded, unique)), int(expected) - len(unique)
    else:
        foreign = len(np.setdiff1d(np.concatenate([unique, padded]), expected))
        left_out = len(np.setdiff1d(expected, unique))
    return bounds_check(name, policy, global_batch, duplicates=len(real) - len(unique), foreign=foreign,
                        left_out=left_out, padded=len(padded))


def bounds_check(name: str, policy: str, global_batch: int, *, duplicates: int, foreign: int, left_out: int,
                 padded: int) -> Check:
    """G2 from counts (what ``coverage_check`` counts on rows, and ``verify`` on the plan's row ranges)."""
    problems = []
    if duplicates:
        problems.append(f"{duplicates} row(s) delivered twice")
    if foreign:
        problems.append(f"{foreign} row(s) that should not be delivered")
    if policy == "drop" and not 0 <= left_out < global_batch:
        problems.append(f"{left_out} matching row(s) left out, policy 'drop' allows fewer than {global_batch}")
    if policy == "pad" and left_out:
        problems.append(f"{left_out} matching row(s) never delivered, policy 'pad' delivers every one")
    if padded >= global_batch or (policy == "drop" and padded):
        problems.append(f"{padded} padding row(s), the bound is {0 if policy == 'drop' else global_batch - 1}")
    if problems:
        return Check(name, False, "; ".join(problems))
    return Check(name, True, f"no row twice, {left_out} left out, {padded} padded (bound {global_batch - 1})")
