"""The backends that read planned fragments, as a registry looked up by ``backend=`` (resolved: ``"arrow"`` or
``"petastorm"``, ``reading/options.resolve_backend``). Each entry returns the same ``stream.Chunks``: a function from
one slot's fragments to their column chunks in plan order (``transform``: a TransformSpec applied to each), so the
loaders never branch on the backend. Petastorm is imported only when its entry runs."""
from __future__ import annotations

from typing import Any

from ...core.registry import Algorithm, Registry


def _arrow(plan, columns, options: dict, keeper: Any = None, *, transform: Any = None):
    """pyarrow threads (``arrow.py``), any stack; ``keeper`` is not needed (no pool lives between epochs)."""
    from .arrow import arrow_chunks
    return arrow_chunks(plan, columns, transform=transform, **options)


def _petastorm(plan, columns, options: dict, keeper: Any = None, *, transform: Any = None):
    """Petastorm's reader and pools (``petastorm.py``); ``keeper`` keeps the reader from epoch to epoch."""
    from .petastorm import petastorm_chunks
    return petastorm_chunks(plan, columns, options, keeper, transform=transform)


BACKENDS = Registry("backend", "backend", {
    "arrow": Algorithm("arrow", 1, _arrow),
    "petastorm": Algorithm("petastorm", 1, _petastorm),
})
