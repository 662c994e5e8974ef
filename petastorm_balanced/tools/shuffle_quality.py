"""How random a plan's batches will be, measured before training (``petastorm-balanced inspect --shuffle-quality``).

The loader's order is a function of the plan, the epoch, the world and the shuffle window alone (G4), so reading
one column with the same window gives exactly the batches training will see. Their label histograms are compared
with batches cut from a uniform random permutation of the same rows (``core/quality.py``): per rank, and for the
global batch (every rank's batch of one step together, what a DDP gradient averages over).
"""
from __future__ import annotations

import tempfile
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import numpy as np

from ..core.quality import Quality
from ..errors import InvalidValueError
from ..plan.load import resolve_plan
from ..reading.front.loader import make_loader
from ..reading.mixing.mixture import MixtureSettings
from ..reading.options import SHUFFLE_BUDGET, LoaderOptions
from ..reading.source.settings import Settings
from ..world import World

BINS = 64  # quantile bins for a numeric column of many distinct values (a histogram of raw floats says nothing)


@dataclass(frozen=True)
class ShuffleQuality:
    """Batch quality of one epoch of a plan for one column (``Quality``: mean TV, the uniform baseline, ratio)."""

    column: str
    world_size: int
    batch_size: int
    epoch: int
    shuffle_window: int
    windows_per_rank: int
    rank: Quality
    global_batch: Quality
    clustered: dict[str, float] = field(default_factory=dict)
    # with a spill folder (``make_loader(shuffle_spill_dir=)``): its window, the quality measured with it, and the
    # local disk a rank's windows take (decoded bytes of the loader's columns); None where it changes nothing
    spill_window: int | None = None
    spill_rank: Quality | None = None
    spill_global_batch: Quality | None = None
    spill_disk_bytes: int | None = None

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["rank"]["ratio"], out["global_batch"]["ratio"] = self.rank.ratio, self.global_batch.ratio
        if self.spill_rank is not None and self.spill_global_batch is not None:
            out["spill_rank"]["ratio"] = self.spill_rank.ratio
            out["spill_global_batch"]["ratio"] = self.spill_global_batch.ratio
        return out

    def format(self) -> str:
        lines = [f"shuffle quality of {self.column!r}, epoch {self.epoch}, world {self.world_size}, batch "
                 f"{self.batch_size}: windows of {self.shuffle_window:,} rows, {self.windows_per_rank} per rank",
                 "  mean TV distance of a batch's histogram from the epoch's (1.00x = a uniform permutation's):"]
        for name, q in (("per rank", self.rank), ("global batch", self.global_batch)):
            lines.append(f"  {name:<13} TV {q.tv:.3f} vs uniform {q.uniform_tv:.3f} = {q.ratio:.2f}x; distinct values "
                         f"per batch {q.distinct:.1f} vs {q.uniform_distinct:.1f}")
        if self.clustered:
            names = ", ".join(f"{k!r} ({v:.0%} of its range per row group)" for k, v in self.clustered.items())
            lines.append(f"  stored sorted or clustered by {names}")
        if self.spill_rank is not None and self.spill_global_batch is not None and self.spill_disk_bytes:
            lines.append(f"  with a spill folder (shuffle_spill_dir=, windows of {self.spill_window:,} rows, about "
                         f"{self.spill_disk_bytes / 2**30:.2f} GiB of local disk per rank): per rank "
                         f"{self.spill_rank.ratio:.2f}x, global batch {self.spill_global_batch.ratio:.2f}x")
        if self.windows_per_rank > 1 and self.rank.ratio > 1.15:
            lines.append("  each rank's rows need several windows: raise shuffle_budget (or read fewer columns) so "
                         "they fit one, or write a shuffled copy once (petastorm_balanced.spark.make_shuffled_copy)")
        if self.world_size > 1 and self.rank.ratio > 1.15 >= self.global_batch.ratio:
            lines.append("  per rank, batches hold only the rank's row groups (ranks read disjoint row groups); the "
                         "global batch, which a DDP gradient averages over, is as random as a uniform permutation's")
        return "\n".join(lines)


def shuffle_quality(plan, column: str, *, world_size: int | None = None, batch_size: int | None = None,
                    epoch: int = 0, schema_fields: Sequence[Any] | None = None,
                    shuffle_budget: int | str = SHUFFLE_BUDGET, shuffle_window: int | None = None,
                    seed: int = 0, weights: Sequence[float] | None = None,
                    epoch_steps: int | None = None, workers: int = 1) -> ShuffleQuality:
    """Read ``column`` in the order the loader will deliver it (every rank of ``world_size``, ``epoch``) and measure
    how far its batches are from i.i.d. ``schema_fields``, ``shuffle_budget`` and ``shuffle_window`` are the
    loader's (they decide the window); ``seed`` seeds the uniform baseline. ``plan`` may be a list of plans with
    ``weights`` (and ``epoch_steps``): a mixture, measured on the mixture loader's own batches, or with ``workers``
    DataLoader workers per rank on theirs (each rank's slots of ``world_size x workers``, round robin)."""
    mixture = isinstance(plan, (list, tuple))
    plan = [resolve_plan(p) for p in plan] if mixture else resolve_plan(plan)
    world = world_size or (plan[0] if mixture else plan).world_size
    options = LoaderOptions(batch_size=batch_size, schema_fields=schema_fields, shuffle_budget=shuffle_budget,
                            shuffle_window=shuffle_window)
    if mixture:
        settings: Any = MixtureSettings(plan, weights, World(0, world), options, epoch_steps=epoch_steps,
                                        backend="arrow")
        names = settings.names
        clustered = {k: v for source in settings.sources for k, v in source.columns.clustered.items()}
        rank_rows = max(settings.mixture.rows_per_pass)  # each source a slot of one row per batch per rank
    else:
        settings = Settings(plan, World(0, world), options)
        names, clustered = settings.columns.names, dict(settings.columns.clustered)
        rank_rows = plan.rows_per_rank(world, settings.batch_size)
    if column not in names:
        raise InvalidValueError(f"column={column!r} is not among the loader's columns {list(names)}")
    mixing = dict(weights=weights, epoch_steps=epoch_steps)
    if mixture and workers > 1:  # each worker a slot of world x workers (MixtureSettings.slots), taken round robin
        settings.slots(workers)  # (refuses epoch_steps that the workers do not divide)
        mixing["epoch_steps"] = None if epoch_steps is None else epoch_steps // workers
        slots = _read(plan, world * workers, column, settings, epoch, settings.shuffle_window, mixing)
        per_rank = [[slots[r * workers + b % workers][b // workers] for b in range(workers * len(slots[r * workers]))]
                    for r in range(world)]
    else:
        per_rank = _read(plan, world, column, settings, epoch, settings.shuffle_window, mixing)
    reference = np.concatenate([b for batches in per_rank for b in batches])
    binned = _binner(reference)
    spill: tuple = (None,) * 4
    folder = tempfile.gettempdir()
    if mixture and workers == 1:  # each source's window with a spill folder (window_budget.mixture_windows): measure it
        blend = MixtureSettings(plan, weights, World(0, world), replace(options, shuffle_spill_dir=folder),
                                epoch_steps=epoch_steps, backend="arrow")
        windows = [layout.shuffle_window for layout in blend.layouts]
        if max(windows) > settings.shuffle_window:
            rows = _read(plan, world, column, settings, epoch, options.shuffle_window,
                         {**mixing, "shuffle_spill_dir": folder})
            disk = sum(min(n, w) * s.row_bytes for n, w, s in
                       zip(settings.mixture.rows_per_pass, windows, blend.sources, strict=True))
            spill = (max(windows), *_qualities(rows, binned, reference, seed), int(disk))
    elif not mixture and rank_rows > settings.shuffle_window:  # a spill folder's window would hold more: measure it
        spilled = Settings(plan, World(0, world), replace(options, shuffle_spill_dir=tempfile.gettempdir()))
        if spilled.shuffle_window > settings.shuffle_window:
            rows = _read(plan, world, column, settings, epoch, spilled.shuffle_window)
            spill = (spilled.shuffle_window, *_qualities(rows, binned, reference, seed),
                     int(min(rank_rows, spilled.shuffle_window) * spilled.row_bytes))
    return ShuffleQuality(column, world, int(settings.batch_size or 1), epoch, settings.shuffle_window,
                          -(-rank_rows // settings.shuffle_window),
                          *_qualities(per_rank, binned, reference, seed), clustered, *spill)


def _read(plan, world: int, column: str, settings: Any, epoch: int, window: int | None,
          mixing: dict | None = None) -> list:
    """Per rank, the values of ``column`` of each batch of ``epoch`` with windows of ``window`` rows (those the
    memory budget cannot hold on local disk: the system temp folder, removed when read; None: as the budget sizes
    them); ``mixing``: a mixture's ``weights`` and ``epoch_steps`` (and its ``shuffle_spill_dir``)."""
    per_rank = []
    for rank in range(world):
        with make_loader(rank, world, plan=plan, batch_size=settings.batch_size, epoch=epoch, schema_fields=[column],
                         shuffle_window=window, shuffle_budget=settings.shuffle_budget, backend="arrow",
                         **(mixing or {})) as loader:
            per_rank.append([_values(batch[column]) for batch in loader])
    return per_rank


def _qualities(per_rank: list, binned, reference: np.ndarray, seed: int) -> tuple[Quality, Quality]:
    per_rank = [[binned(b) for b in batches] for batches in per_rank]
    reference = binned(reference)
    return (Quality.of([b for batches in per_rank for b in batches], reference, seed),
            Quality.of([np.concatenate(step) for step in zip(*per_rank, strict=True)], reference, seed))


def _values(values) -> np.ndarray:
    """A batch's column as a numpy array whose values sort (None and other objects as their text)."""
    array = values.numpy() if hasattr(values, "numpy") else np.asarray(values, dtype=object)
    if array.dtype == object:
        array = np.array([repr(v) for v in array])
    return array.reshape(len(array), -1)[:, 0] if array.ndim > 1 else array


def _binner(reference: np.ndarray):
    """Values to histogram keys: as they are, or quantile bins for a numeric column of many distinct values."""
    if reference.dtype.kind not in "fiu" or len(np.unique(reference)) <= 4 * BINS:
        return lambda values: values
    edges = np.unique(np.quantile(reference, np.linspace(0, 1, BINS + 1)[1:-1]))
    return lambda values: np.searchsorted(edges, values, side="right")
