"""``make_reader`` on any stack: Petastorm's reader where Petastorm imports, else the same rows through pyarrow.

What the Arrow reader yields is what Petastorm's readers yield, so a loop written for ``petastorm.make_reader``
runs unchanged on pyarrow >= 16: a namedtuple per row, decoded by the Unischema's codecs (``unischema/decode.py``
gives Petastorm's ``decode_row`` values), for Petastorm datasets; one namedtuple of column arrays per fragment
(``make_batch_reader``'s conversion) for plain Parquet. The rows are the plan's, in plan order, padding included,
with the same ``shuffle_rows`` permutation as the Petastorm backend; fragments are read (and rows decoded) by a
few threads, in order, at most ``workers_count + 2`` fragments ahead.
"""
from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from typing import Any, cast

import numpy as np
import pyarrow as pa

from ...core.shuffle import window_permutation
from ...errors import InvalidTypeError, InvalidValueError
from ...io.row_group_cache import CacheSettings
from ...plan.model import Fragment, ShardPlan
from ...unischema import Unischema, UnischemaField
from ...unischema.decode import rows as decoded_rows
from ..backends import petastorm_importable, resolve_backend
from ..backends.arrow import BundleReader, in_order
from ..backends.reader_arguments import arrow_cache, check_petastorm_kwargs, check_pool_options, planned_rows
from ..rows.columns import Columns, dataset_columns
from ..rows.transform import as_spec, check_rows, transformed_unischema

ARROW_READER_ARGUMENTS = ("schema_fields", "reader_pool_type", "workers_count", "results_queue_size",
                          "shuffle_rows", "seed", "transform_spec", "cache_type", "cache_location", "cache_size_limit")


class ArrowReader:
    """Iterate for rows (Unischema datasets) or per-fragment batches (plain Parquet); a context manager, with
    Petastorm's ``stop()``, ``join()``, ``schema`` and ``batched_output``."""

    def __init__(self, plan: ShardPlan, fragments: list[Fragment], *, schema_fields: Sequence[Any] | None = None,
                 workers_count: int = 10, reader_pool_type: str = "thread", shuffle_key: Sequence[int] | None = None,
                 transform_spec: Any = None, cache: CacheSettings | None = None):
        check_pool_options(reader_pool_type, workers_count, "arrow")
        self.fragments = list(fragments)
        self._columns = dataset_columns(plan, schema_fields)
        self.batched_output = plan.catalog.kind != "petastorm"
        self.schema = _schema_of(self._columns, plan, schema_fields is not None)
        self._transform = as_spec(transform_spec)
        if self._transform is not None:  # Petastorm's transform_schema: the rows' fields after the transform
            self.schema = transformed_unischema(self.schema, self._transform)
        self._reader = BundleReader(plan, self._columns.spec, self._columns.fields, cache=cache)
        self._shuffle_key = shuffle_key
        self._results = in_order(self._read, list(enumerate(self.fragments)),
                                 workers_count=0 if reader_pool_type == "dummy" else workers_count,
                                 ahead=workers_count + 2)
        self._pending: Iterator = iter(())
        self.stopped = False

    def _read(self, item) -> list:
        sequence, fragment = item
        indices = None
        if self._shuffle_key is not None:
            indices = fragment.row_indices()
            indices = indices[window_permutation(len(indices), (*self._shuffle_key, sequence))]
        table = self._reader.table([fragment], indices=indices)
        if self._transform is not None:
            return self._transformed(table)
        if self.batched_output:
            return [self.schema.make_namedtuple(**batch_columns(table))]
        make = self.schema._get_namedtuple()
        return [make(**row) for row in decoded_rows(table, self.schema)]

    def _transformed(self, table: pa.Table) -> list:
        """Petastorm's readers' transform: ``make_batch_reader`` calls ``func`` on the fragment's DataFrame (the
        same rows in the same order, checked), ``make_reader`` on each decoded row's dict."""
        spec, names = self._transform, list(self.schema.fields)
        assert spec is not None
        if self.batched_output:
            frame = table.to_pandas()
            returned = frame if spec.func is None else spec.func(frame)
            check_rows(frame, returned)
            missing = [n for n in names if n not in returned.columns]
            if missing:
                raise InvalidValueError(f"transform_spec.func returned no column {missing[0]!r}, which the "
                                        "transformed schema holds; return it, or list it in removed_fields")
            columns = batch_columns(pa.Table.from_pandas(returned[names], preserve_index=False))
            for name, _dtype, shape, _ in spec.edit_fields:  # Arrow flattens arrays of 2+ dimensions: reshape
                if name in columns and len(shape) > 1 and all(d is not None for d in shape):
                    columns[name] = np.asarray(list(columns[name])).reshape((-1, *shape))
            return [self.schema.make_namedtuple(**columns)]
        make, out = self.schema._get_namedtuple(), []
        for row in decoded_rows(table, self._columns_schema()):
            row = row if spec.func is None else spec.func(row)
            if not isinstance(row, dict):
                raise InvalidTypeError(f"transform_spec.func returned {type(row).__name__} for a row; make_reader "
                                       "calls it on each row's dict (as Petastorm's make_reader does) and takes a "
                                       "dict back")
            try:
                out.append(make(**{n: row[n] for n in names}))
            except KeyError as exc:
                raise InvalidValueError(f"transform_spec.func returned a row without {exc.args[0]!r}, which the "
                                        "transformed schema holds; return it, or list it in removed_fields") from None
        return out

    def _columns_schema(self) -> Unischema:
        return Unischema("read", [self._columns.fields[n] for n in self._columns.names]) if self._columns.fields \
            else self.schema

    def __iter__(self) -> ArrowReader:
        return self

    def __next__(self) -> Any:
        while not self.stopped:
            for value in self._pending:
                return value
            self._pending = iter(next(self._results))  # StopIteration ends the reader
        raise StopIteration

    def stop(self) -> None:
        """Stop reading: iteration ends; reads in flight finish and the threads end at ``join()``."""
        self.stopped = True

    def join(self) -> None:
        self.stopped = True
        self._results.close()

    def __enter__(self) -> ArrowReader:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()
        self.join()


def _schema_of(columns: Columns, plan: ShardPlan, viewed: bool) -> Unischema:
    """The Unischema rows carry: the stored one (its view with ``schema_fields``, named as Petastorm names it) for
    Petastorm datasets; for plain Parquet one like ``make_batch_reader``'s inferred schema (names only)."""
    if columns.fields:
        from ...unischema.storage import load_unischema
        name = load_unischema(plan.dataset_url)._name
        return Unischema(f"{name}_view" if viewed else name, [columns.fields[n] for n in columns.names])
    return Unischema("inferred_schema", [UnischemaField(n, None, ()) for n in columns.names])


def batch_columns(table: pa.Table) -> dict:
    """A table's columns as ``make_batch_reader`` gives them: pandas' values, strings as a ``str_`` array, equal
    length lists stacked into a matrix."""
    out: dict = {}
    for name in table.column_names:
        column = table.column(name)
        values = (column.chunk(0) if column.num_chunks == 1 else column).to_pandas()
        values = values.values if hasattr(values, "values") else values
        if pa.types.is_string(column.type) or pa.types.is_large_string(column.type):
            out[name] = np.asarray(values).astype(np.str_)
        elif pa.types.is_list(column.type) or pa.types.is_large_list(column.type):
            out[name] = np.vstack(list(values)) if len(values) else np.empty((0, 0))
        else:
            out[name] = np.asarray(values)
    return out


def make_reader(rank: int | None = None, world: int | None = None, *, plan: ShardPlan | str, epoch: int = 0,
                batch_size: int | None = None, reshuffle: str = "epoch", backend: str = "auto",
                **reader_kwargs: Any) -> Any:  # Petastorm's Reader (backend "petastorm") or an ArrowReader
    """Rank ``rank``'s planned rows of ``epoch``, as Petastorm's ``make_reader`` (Unischema datasets) or
    ``make_batch_reader`` (plain Parquet) yields them.

    ``backend='auto'`` takes Petastorm's reader where Petastorm imports (its pools, cache and ``transform_spec``),
    else the Arrow reader; ``'arrow'`` and ``'petastorm'`` choose. Both give the same rows in the same order.

    ``transform_spec`` (``TransformSpec``, ours or Petastorm's) follows the Petastorm reader this one stands for:
    on a Unischema dataset ``func`` gets each decoded row's dict and returns a dict (``make_reader``); on plain
    Parquet it gets each fragment's rows as a DataFrame (``make_batch_reader``) and must return the same rows in
    the same order (checked). The rows' schema is the transformed one.
    """
    # make_reader stands for Petastorm's: "auto" takes Petastorm's reader wherever it imports
    backend = resolve_backend("petastorm" if backend == "auto" and petastorm_importable() else backend)
    if backend == "petastorm":
        from ..backends.petastorm import make_reader as petastorm_make_reader
        return petastorm_make_reader(rank, world, plan=plan, epoch=epoch, batch_size=batch_size, reshuffle=reshuffle,
                                     **reader_kwargs)
    check_petastorm_kwargs(reader_kwargs)
    refused = sorted(set(reader_kwargs) - set(ARROW_READER_ARGUMENTS))
    if refused:
        raise InvalidValueError(f"{refused[0]}={reader_kwargs[refused[0]]!r} is not accepted by make_reader with "
                                "backend='arrow': it configures Petastorm's reader; use backend='petastorm' (the "
                                "petastorm stack), or leave it out")
    schema_fields = reader_kwargs.get("schema_fields")
    plan, frags, key = planned_rows(rank, world, plan, epoch=epoch, batch_size=batch_size, reshuffle=reshuffle,
                                    seed=reader_kwargs.get("seed"), shuffle_rows=reader_kwargs.get("shuffle_rows"),
                                    schema_fields=schema_fields)
    if schema_fields is not None:
        # names, patterns, UnischemaFields (namedtuples: ours or Petastorm's)
        schema_fields = [re.escape(cast(Any, f).name) if isinstance(f, tuple) else f for f in schema_fields]
    return ArrowReader(plan, frags, schema_fields=schema_fields, workers_count=reader_kwargs.get("workers_count", 10),
                       reader_pool_type=reader_kwargs.get("reader_pool_type", "thread"), shuffle_key=key,
                       transform_spec=reader_kwargs.get("transform_spec"), cache=arrow_cache(reader_kwargs))


__all__ = ["ArrowReader", "make_reader"]
