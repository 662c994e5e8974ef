"""The packing stage (``make_loader(..., pack="tokens", seq_len=L, batch_size=S)``): each step's documents, chosen
per shuffle window by ``core/packing.py``, become ``S`` sequences of exactly ``L`` tokens.

What a packed batch holds (``loader.schema``), every array ``(S, L)`` but the last:

- ``tokens``: the documents' values, 0 where padding;
- ``tokens__segments`` (int32): 0 = padding, ``k > 0`` = the k-th document piece of that row;
- ``tokens__positions`` (int32): the position inside the piece, restarting at 0 at each piece (the padding tail of
  a row counts as one more run), what rotary embeddings and Hugging Face's packed ``position_ids`` take;
- ``tokens__cu_seqlens`` (int32, ``(S, L + 1)``): each row's piece boundaries ``[0, e1, ..., L]``, the padding tail
  as one run, padded with ``L``: flash-attention's varlen ``cu_seqlens`` for the whole batch is
  ``unique(cu + L * arange(S)[:, None])`` (``varlen_inputs``), fixed-shape per row so ``torch.compile`` sees one
  shape;
- every other column read (numbers, one value per document): that document's value at each of its tokens, 0 at
  padding. Text, list and nullable columns have no per-token form and are refused by name.
"""
from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import replace

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ...core.cost.options import CostOptions
from ...core.cost.spec import COST_COLUMN, parse_cost
from ...core.packing import Packing, pack_step, window_steps
from ...core.params import check_int
from ...errors import InvalidValueError
from ...plan.model import ShardPlan
from ..fields.schema import PADDING, TENSOR, BatchSchema, ColumnSchema, tensor_dtype
from ..options import LoaderOptions

SEGMENTS, POSITIONS, CU_SEQLENS = "__segments", "__positions", "__cu_seqlens"
_LIST_FUNCTIONS = ("size", "cardinality")


def resolve(plan: ShardPlan, options: LoaderOptions, cost: CostOptions | None) -> Packing:
    """The loader's ``Packing``, every combination it cannot serve exactly refused here, naming the parameter."""
    column, seq_len = options.pack, options.seq_len
    if column is None:
        raise AssertionError("packing.resolve called without pack=")
    if seq_len is None:
        raise InvalidValueError(f"pack={column!r} needs seq_len= (tokens per packed sequence, e.g. seq_len=2048)")
    check_int("seq_len", seq_len, minimum=1, hint=" (tokens per packed sequence)")
    sequences = check_int("batch_size", options.batch_size, minimum=1,
                          hint=f" (packed sequences of {seq_len} tokens per step, with pack=)") \
        if options.batch_size is not None else None
    if sequences is None:
        raise InvalidValueError(f"pack={column!r} needs batch_size= (sequences of seq_len tokens per step)")
    for name, value, fix in (("max_batch_cost", options.max_batch_cost, None),
                             ("partition_epoch", options.partition_epoch, 1), ("padding_mask", options.padding_mask,
                                                                               False),
                             ("transform_spec", options.transform_spec, None), ("shuffle", options.shuffle, True)):
        if value != fix:
            raise InvalidValueError(f"{name}={value!r} with pack={column!r}: packing deals each shuffle window's "
                                    f"documents into steps, which {name} would change; leave {name}={fix!r}"
                                    + (" (padding is where tokens__segments == 0)" if name == "padding_mask" else ""))
    fields = options.schema_fields
    if fields is not None and all(isinstance(f, str) for f in fields) and \
            not any(f == column or re.fullmatch(f, column) for f in fields):
        raise InvalidValueError(f"pack={column!r} is not among the columns read (schema_fields={list(fields)!r}); "
                                "add it to schema_fields")
    if cost is None or plan.cost is None:
        raise InvalidValueError(f"pack={column!r} needs each document's length from the plan: plan with "
                                f"cost='size({column})' (or a column of token counts, cost='n_tokens') and keep "
                                "balance='auto' or 'cost'")
    spec = parse_cost(plan.cost)
    if spec.function is not None and (spec.column != column or spec.function not in _LIST_FUNCTIONS):
        raise InvalidValueError(f"pack={column!r} with a plan whose cost is {plan.cost!r}: the cost must count the "
                                f"tokens of {column!r}; re-plan with cost='size({column})' or a column of its "
                                "lengths (cost='n_tokens')")
    if options.long_documents == "split" and (plan.max_row_cost or 0) > seq_len * sequences:
        raise InvalidValueError(f"the plan's longest document has {plan.max_row_cost} tokens, more than a step's "
                                f"batch_size x seq_len = {sequences} x {seq_len}; raise batch_size or seq_len, pass "
                                "long_documents='drop', or filter when planning (where='size(tokens) <= ...')")
    mean = float(plan.catalog.cost_sums().sum()) / max(plan.total_rows, 1)
    return Packing(column, seq_len, sequences, mean, options.long_documents)


def of_epoch(packing: Packing, plan: ShardPlan, pieces, window_rows: int) -> Packing:
    """``packing`` with the steps of each window of one epoch (``core.packing.window_steps``), from every rank's
    ``pieces`` (``plan.pieces``): a piece holding a row group's matching rows counts the plan's exact tokens, a
    part of one its mean tokens per row times its rows; padding rows (policy="pad") none."""
    counts = plan.catalog.matching_counts().astype(np.float64)  # (row groups,)
    sums = plan.catalog.cost_sums().astype(np.float64)
    rows = pieces.num_rows
    group = pieces.catalog_row
    tokens = np.where(rows == counts[group], sums[group], sums[group] * rows / np.maximum(counts[group], 1))
    tokens[pieces.padding] = 0.0
    steps = window_steps(pieces.rank, rows, tokens, world_size=pieces.world_size, window_rows=window_rows,
                         step_tokens=packing.step_tokens)
    return replace(packing, window_steps=steps)


def packed_schema(packing: Packing, schema: BatchSchema, pack_type: pa.DataType | None) -> BatchSchema:
    """What every packed batch holds, from the unpacked schema of the columns read and the packed column's Arrow
    type."""
    length = packing.seq_len
    out: list[ColumnSchema] = []
    names = set(schema.names)
    if packing.column not in names or pack_type is None:
        raise InvalidValueError(f"pack={packing.column!r} is not among the columns read; add it to schema_fields")
    for column in schema:
        if column.name in (PADDING, COST_COLUMN):
            continue
        if column.name == packing.column:
            leaf = pack_type.value_type if pa.types.is_list(pack_type) or pa.types.is_large_list(pack_type) else None
            dtype = None if leaf is None or not (pa.types.is_integer(leaf) or pa.types.is_floating(leaf)) \
                else tensor_dtype(leaf)
            if dtype is None:
                raise InvalidValueError(f"pack={packing.column!r} is {pack_type}; a packed column must be a list of "
                                        "integers or floats (token ids)")
            out.append(ColumnSchema(column.name, column.arrow_type, TENSOR, dtype, (length,), False, "never"))
            for suffix, width in ((SEGMENTS, length), (POSITIONS, length), (CU_SEQLENS, length + 1)):
                if column.name + suffix in names:
                    raise InvalidValueError(f"the dataset has a column named {column.name + suffix!r}, which pack="
                                            f"{column.name!r} delivers; rename it or leave it out of schema_fields")
                out.append(ColumnSchema(column.name + suffix, "int32", TENSOR, "int32", (width,), False, "never"))
            continue
        if column.kind != TENSOR or column.shape or column.nullable or column.dtype is None:
            raise InvalidValueError(f"column {column.name!r} ({column.arrow_type}) has no per-token form in packed "
                                    f"sequences (numbers without nulls only); leave it out: schema_fields="
                                    f"[{packing.column!r}, ...]")
        out.append(ColumnSchema(column.name, column.arrow_type, TENSOR, column.dtype, (length,), False, "never"))
    return BatchSchema(tuple(out))


def packed_runs(runs: Iterator[dict], packing: Packing, schema: BatchSchema) -> Iterator[dict]:
    """Each step's run of documents (``stream.slot_runs`` under a ``Packing``) as a run of ``S`` sequences."""
    try:
        for run in runs:
            yield pack_run(run, packing, schema)
    finally:  # closing this closes the reading under it
        close = getattr(runs, "close", None)
        if close is not None:
            close()


def pack_run(run: dict, packing: Packing, schema: BatchSchema) -> dict:
    """One step: the documents of ``run`` placed by ``core.packing.pack_step``, as ``schema``'s columns."""
    length, rows = packing.seq_len, packing.sequences
    values, offsets = _flat(run[packing.column], packing.column)
    lengths = np.diff(offsets)
    expected = run.get(COST_COLUMN)
    if expected is not None and not np.array_equal(np.asarray(expected, dtype=np.int64), lengths):
        bad = int(np.argmax(np.asarray(expected, dtype=np.int64) != lengths))
        raise InvalidValueError(f"the plan's cost says a document has {int(expected[bad])} tokens but its "
                                f"{packing.column!r} holds {int(lengths[bad])}; the cost column must count the "
                                f"packed column's items: re-plan with cost='size({packing.column})'")
    padding = np.asarray(run.get(PADDING, np.zeros(len(lengths), dtype=bool)), dtype=bool)
    lengths = np.where(padding, 0, lengths)  # a plan's padding rows (policy="pad") repeat a document: not packed
    if packing.long_documents == "drop":
        lengths = np.where(lengths > length, 0, lengths)
    layout = pack_step(lengths, seq_len=length, sequences=rows)
    count = layout.length
    total = int(count.sum())
    within = np.arange(total, dtype=np.int64) - np.repeat(np.cumsum(count) - count, count)  # (tokens,)
    dst = np.repeat(layout.sequence * length + layout.offset, count) + within  # flat (S * L) index of each token
    src = np.repeat(offsets[:-1][layout.row] + layout.start, count) + within
    out: dict[str, np.ndarray] = {}
    for column in schema:
        name = column.name
        if name == packing.column:
            flat = np.zeros(rows * length, dtype=np.dtype(column.dtype))
            flat[dst] = values[src]
        elif name == packing.column + SEGMENTS:
            flat = np.zeros(rows * length, dtype=np.int32)
            flat[dst] = np.repeat(layout.segment, count)
        elif name == packing.column + POSITIONS:
            flat = _positions(dst, within, rows, length)
        elif name == packing.column + CU_SEQLENS:
            out[name] = _cu_seqlens(layout, rows, length)
            continue
        else:
            flat = np.zeros(rows * length, dtype=np.dtype(column.dtype))
            flat[dst] = np.repeat(np.asarray(run[name])[layout.row], count)
        out[name] = flat.reshape(rows, length)
    out[PADDING] = np.zeros(rows, dtype=bool)  # the loader cuts runs by this column's length; never delivered
    return out


def _flat(column, name: str) -> tuple[np.ndarray, np.ndarray]:
    """``(values, offsets)`` of a list column's rows (an Arrow list array, or an object array of sequences)."""
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    if isinstance(column, pa.Array):
        if column.null_count:
            raise InvalidValueError(f"column {name!r} holds a null list where pack={name!r}; fill or filter it")
        flat = column.flatten()
        if flat.null_count:
            raise InvalidValueError(f"column {name!r} holds a null token where pack={name!r}; fill or filter it")
        lengths = pc.list_value_length(column).to_numpy(zero_copy_only=False).astype(np.int64)
        offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        return flat.to_numpy(zero_copy_only=False), offsets
    items = [np.asarray(v) for v in column]
    offsets = np.zeros(len(items) + 1, dtype=np.int64)
    np.cumsum([len(v) for v in items], out=offsets[1:])
    return (np.concatenate(items) if items else np.zeros(0)), offsets


def _positions(dst: np.ndarray, within: np.ndarray, rows: int, length: int) -> np.ndarray:
    """Position inside each piece; the padding tail of a row counts 0, 1, ... as one run."""
    flat = np.zeros(rows * length, dtype=np.int32)
    taken = np.zeros(rows * length, dtype=bool)
    flat[dst] = within  # (within restarts at each piece)
    taken[dst] = True
    grid = taken.reshape(rows, length)
    used = grid.sum(axis=1)  # pieces fill each row from offset 0, so the tail starts at used
    tail = np.arange(length)[None, :] - used[:, None]
    out = flat.reshape(rows, length)
    out[~grid] = tail[~grid]
    return out.reshape(-1)


def _cu_seqlens(layout, rows: int, length: int) -> np.ndarray:
    """(S, L + 1): each row's boundaries 0, piece ends, L (its padding tail one run), then L repeated."""
    out = np.full((rows, length + 1), length, dtype=np.int32)
    out[:, 0] = 0
    ends = layout.offset + layout.length
    for row in range(rows):
        mine = np.sort(ends[layout.sequence == row])
        mine = mine[mine < length]
        out[row, 1:1 + len(mine)] = mine
    return out


def varlen_inputs(batch: dict, column: str = "tokens") -> dict:
    """Flash-attention varlen inputs of a packed batch (numpy arrays or torch tensors): ``cu_seqlens`` (int32,
    boundaries over the flattened ``S x L`` tokens, each piece and each row's padding tail one sequence),
    ``max_seqlen`` (an int, at most ``L``) and ``position_ids`` (``(S, L)``)."""
    cu = batch[column + CU_SEQLENS]
    rows, width = cu.shape
    starts = (np.arange(rows, dtype=np.int64) * (width - 1))[:, None]  # each row's first token in the flat batch
    if hasattr(cu, "new_tensor"):  # a torch tensor (torch is not imported here)
        flat = (cu.long() + cu.new_tensor(starts).long()).reshape(-1).unique().int()
    else:
        flat = np.unique((np.asarray(cu, dtype=np.int64) + starts).reshape(-1)).astype(np.int32)
    max_seqlen = int((flat[1:] - flat[:-1]).max()) if len(flat) > 1 else 0
    return {"cu_seqlens": flat, "max_seqlen": max_seqlen, "position_ids": batch[column + POSITIONS]}
