"""The backends that read planned fragments, as a registry looked up by ``backend=`` (resolved once, where a
loader is made, by ``resolve_backend``: ``"arrow"`` or ``"petastorm"``). Each entry returns the same
``stream.Chunks``: a function from one slot's fragments to their column chunks in plan order (``transform``: a
TransformSpec applied to each), so the loaders never branch on the backend. Petastorm is imported only when its
entry runs."""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ...core.params import check_choice
from ...core.registry import Algorithm, Registry
from ...errors import InvalidValueError, MissingDependencyError

BACKEND_NAMES = ("auto", "petastorm", "arrow")  # what backend= accepts (the readers: ``BACKENDS``)


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


def petastorm_importable() -> bool:
    """Whether Petastorm imports here (it does not on pyarrow >= 16: ``No module named 'pyarrow.filesystem'``)."""
    try:
        import petastorm.reader  # noqa: F401
    except ImportError:
        return False
    return True


def resolve_backend(backend, table=None, petastorm_arguments: Sequence[str] = ()) -> str:
    """``"petastorm"`` or ``"arrow"``: ``auto`` takes the Arrow backend, which gives the same batches as Petastorm's
    reader (G12) for less CPU per row, unless the call passes ``petastorm_arguments`` (reader arguments only
    Petastorm's reader honours, ``reader_arguments.petastorm_only``: its process pool, ``hdfs_driver``, a
    ``filesystem``, ...) and Petastorm imports here.

    A Delta/Iceberg snapshot plan (``table``, ``plan.table``) is read by the Arrow backend: Petastorm's reader lists
    every Parquet file of the folder, files the table removed included, so it cannot serve one snapshot.
    """
    check_choice("backend", backend, BACKEND_NAMES, "'arrow' reads with pyarrow alone (any stack), 'petastorm' "
                 "with Petastorm's reader (pyarrow < 15), 'auto' picks Arrow unless a Petastorm-only reader argument "
                 "is given")
    if table is not None and table.format != "parquet":
        if backend == "petastorm":
            raise InvalidValueError(f"backend='petastorm' cannot serve a plan of {table.describe()}: Petastorm's "
                                    "reader lists every Parquet file in the folder, files the table removed "
                                    "included; use backend='arrow' or 'auto' (the same batches)")
        return "arrow"
    if backend == "auto":
        return "petastorm" if petastorm_arguments and petastorm_importable() else "arrow"
    if backend == "petastorm" and not petastorm_importable():
        raise MissingDependencyError("backend='petastorm' needs Petastorm, which cannot be imported here (Petastorm "
                                     "needs pyarrow < 15); use backend='arrow' (same batches), or install the "
                                     "petastorm stack: pip install 'petastorm-balanced[petastorm]' (docs/stacks.md)")
    return backend
