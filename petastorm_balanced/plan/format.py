"""Plan format version 1: how plans are written and checked (spec: docs/plan-format.md; ``load.py`` reads them).

A plan is a directory holding ``catalog.parquet``, ``assignment.parquet`` and ``plan.json``. ``plan.json`` is
written last and records the sha256 of the other two, so its presence commits the plan and a plan cut short by a
crash, a truncated copy or an edited file is refused rather than read as valid.
"""
from __future__ import annotations

import hashlib
import io
import json
import os
import uuid
from json.encoder import encode_basestring_ascii as _json_str
from typing import TYPE_CHECKING, Optional

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from .._version import __version__
from . import balance
from ..io import fs as fsutil
from .catalog import Catalog, FileInfo
from ..errors import PlanIntegrityError, StalePlanError
from ..io.dataset import list_data_files

if TYPE_CHECKING:  # the model calls into this module (save, checksum); load.py builds models from it
    from .model import ShardPlan
    from .predicate import PredicateInfo

FORMAT_NAME = "petastorm-balanced-plan"
FORMAT_VERSION = 1
PLAN_JSON = "plan.json"
CATALOG = "catalog.parquet"
ASSIGNMENT = "assignment.parquet"

_CATALOG_SCHEMA = pa.schema([("file", pa.string()), ("row_group", pa.int32()), ("total_rows", pa.int64()),
                             ("matching_rows", pa.int64()), ("selection", pa.binary())])
# A cost plan's catalog has two more columns; a plan without a cost is written exactly as before.
_COST_SCHEMA = _CATALOG_SCHEMA.append(pa.field("cost_sum", pa.int64())).append(pa.field("cost_max", pa.int64()))


def dataset_fingerprint(files) -> str:
    """sha256 over every data file's path, size and row group sizes (each as ``json.dumps([path, size, rows])``)."""
    digest = hashlib.sha256()
    for f in sorted(files, key=lambda f: f.path):
        rows = ", ".join(str(int(n)) for n in f.row_group_rows)
        digest.update(f"[{_json_str(f.path)}, {int(f.size)}, [{rows}]]".encode())
    return digest.hexdigest()


def content_checksum(plan: ShardPlan) -> str:
    """sha256 over everything that decides what rows go where; not over file bytes, which writers may vary.

    Per row group it hashes ``json.dumps([path, row_group, total_rows, matching_rows])`` and the selection's
    sha256; the JSON text is formatted directly (same bytes), which is 3x faster for plans of many row groups.
    A cost plan also hashes ``json.dumps([cost_sum, cost_max])`` per row group (and its header names the cost);
    a plan without a cost hashes exactly what it did before costs existed.
    """
    digest = hashlib.sha256(json.dumps(_header(plan), sort_keys=True).encode())
    with_cost = plan.catalog.cost is not None
    for r in plan.catalog.row_groups:
        digest.update(f"[{_json_str(r.path)}, {int(r.row_group)}, {int(r.total_rows)}, "
                      f"{int(r.matching_rows)}]".encode())
        digest.update(hashlib.sha256(r.selection).digest())
        if with_cost:
            digest.update(f"[{int(r.cost_sum)}, {int(r.cost_max)}]".encode())
    return digest.hexdigest()


def write_plan(plan: ShardPlan, output_url: str) -> str:
    """Write ``plan`` under ``output_url``; returns the normalized URL. Overwrites an older plan there."""
    url = fsutil.normalize_url(output_url)
    filesystem, root = fsutil.resolve(url)
    filesystem.create_dir(root, recursive=True)
    if filesystem.get_file_info(f"{root}/{PLAN_JSON}").type != pafs.FileType.NotFound:
        filesystem.delete_file(f"{root}/{PLAN_JSON}")  # uncommit first: a crash below leaves no valid plan
    digests = {CATALOG: _put(filesystem, f"{root}/{CATALOG}", _parquet_bytes(_catalog_table(plan.catalog))),
               ASSIGNMENT: _put(filesystem, f"{root}/{ASSIGNMENT}", _parquet_bytes(assignment_table(plan)))}
    document = plan_document(plan, digests)
    _put(filesystem, f"{root}/{PLAN_JSON}", json.dumps(document, indent=1, sort_keys=True).encode(), atomic=True)
    return url


def plan_document(plan: ShardPlan, digests: Optional[dict] = None) -> dict:
    """The content of ``plan.json``."""
    return {
        **_header(plan),
        "package_version": __version__,
        "checksum": content_checksum(plan),
        "dataset_files": [[f.path, f.size, list(f.row_group_rows)] for f in plan.catalog.files],
        "totals": totals(plan),
        "files": digests or {},
    }


def totals(plan: ShardPlan) -> dict:
    """What the planned world size gets at epoch 0 (what ``inspect`` shows)."""
    pieces = plan.pieces(batch_size=plan.batch_size or 1)
    delivered = int(pieces.num_rows[~pieces.padding].sum())
    return {"scanned_rows": plan.catalog.scanned_rows, "matching_rows": plan.total_rows,
            "row_groups": len(plan.catalog.row_groups), "rows_per_rank": pieces.steps_per_rank * pieces.batch_size,
            "steps_per_epoch": pieces.steps_per_rank, "padded_rows": int(pieces.num_rows[pieces.padding].sum()),
            "dropped_rows": plan.total_rows - delivered, "split_row_groups": split_row_groups(pieces),
            **(_cost_totals(plan, pieces) if plan.catalog.cost is not None else {})}


def _cost_totals(plan: ShardPlan, pieces: balance.Pieces) -> dict:
    """Cost side of the totals: the whole cost, the largest row's, and each rank's estimated share (each piece
    counted at its row group's mean cost per row; exact for whole row groups)."""
    from .cost_report import rank_costs
    return {"total_cost": int(plan.catalog.cost_sums().sum()), "max_row_cost": plan.catalog.max_row_cost,
            "cost_per_rank": [int(round(c)) for c in rank_costs(plan.catalog, pieces)]}


def split_row_groups(pieces: balance.Pieces) -> int:
    """Row groups whose non-padding rows go to more than one slot."""
    real = ~pieces.padding
    slot = pieces.rank[real] * pieces.num_workers + pieces.worker[real]
    pairs = np.unique(np.stack([pieces.catalog_row[real], slot]), axis=1)
    return int(len(pairs[0]) - len(np.unique(pairs[0])))


def check_dataset(plan: ShardPlan, *, files=None) -> None:
    """Raise ``StalePlanError`` naming the first difference between the plan's files and the dataset's.

    Without ``files`` the dataset is listed and paths and sizes are compared; ``files`` (``FileInfo``s from a fresh
    footer scan, as ``verify`` passes) also compares row group sizes (the reader compares those anyway for the row
    groups it reads).
    """
    footers = files is not None
    if footers:
        current = {f.path: f for f in files}
    else:
        try:
            _, root, entries = list_data_files(plan.dataset_url)
        except ValueError as exc:
            raise StalePlanError(f"the plan's dataset is gone: {exc}") from None
        current = {e.path[len(root):].lstrip("/"): FileInfo(e.path[len(root):].lstrip("/"), e.size, ())
                   for e in entries}
    planned = {f.path: f for f in plan.catalog.files}
    for path in sorted(set(planned) | set(current)):
        if path not in current:
            raise StalePlanError(f"{path!r} was removed from {plan.dataset_url} since planning; re-run planning")
        if path not in planned:
            raise StalePlanError(f"{path!r} was added to {plan.dataset_url} since planning; re-run planning")
        if current[path].size != planned[path].size:
            raise StalePlanError(f"{path!r} changed size ({planned[path].size} -> {current[path].size} bytes) "
                                 "since planning; re-run planning")
        if footers and current[path].row_group_rows != planned[path].row_group_rows:
            raise StalePlanError(f"{path!r} changed row groups ({list(planned[path].row_group_rows)} -> "
                                 f"{list(current[path].row_group_rows)} rows) since planning; re-run planning")


def check_predicate(plan: ShardPlan, predicate_info: PredicateInfo) -> None:
    """Raise ``StalePlanError`` when ``predicate_info`` (see ``predicate.predicate_info``) is not the plan's.

    A plan's catalog holds only the rows its predicate kept, so serving it for another predicate would deliver the
    wrong rows; the kind is compared first, then the fingerprint, and the message names both texts.
    """
    planned = plan.predicate
    for name in ("kind", "fingerprint"):
        if getattr(planned, name) != getattr(predicate_info, name):
            raise StalePlanError(f"the predicate changed since planning: {name} {getattr(planned, name)!r} -> "
                                 f"{getattr(predicate_info, name)!r} (planned {planned.text!r}, given "
                                 f"{predicate_info.text!r}); re-run planning with the new predicate")


def _header(plan: ShardPlan) -> dict:
    cost = {}
    if plan.catalog.cost is not None:
        from .cost import parse_cost
        from .cost_order import NAME, VERSION
        cost = {"cost": {"text": plan.catalog.cost, "kind": parse_cost(plan.catalog.cost).kind,
                         "order": NAME, "order_version": VERSION}}
    return {
        **cost,
        "format": FORMAT_NAME, "format_version": FORMAT_VERSION,
        "dataset": {"url": plan.dataset_url, "fingerprint": plan.dataset_fingerprint, "kind": plan.catalog.kind,
                    "partition_columns": list(plan.catalog.partition_columns)},
        "predicate": {"kind": plan.predicate.kind, "text": plan.predicate.text,
                      "fingerprint": plan.predicate.fingerprint},
        "parameters": {"world_size": plan.world_size, "batch_size": plan.batch_size, "policy": plan.policy,
                       "seed": plan.seed, "algorithm": balance.ALGORITHM,
                       "algorithm_version": balance.ALGORITHM_VERSION},
    }


def _catalog_table(catalog: Catalog) -> pa.Table:
    rows = catalog.row_groups
    columns = [[r.path for r in rows], [r.row_group for r in rows], [r.total_rows for r in rows],
               [r.matching_rows for r in rows], [r.selection for r in rows]]
    if catalog.cost is None:
        return pa.table(columns, schema=_CATALOG_SCHEMA)
    return pa.table(columns + [[r.cost_sum for r in rows], [r.cost_max for r in rows]], schema=_COST_SCHEMA)


def assignment_table(plan: ShardPlan) -> pa.Table:
    """Epoch 0 for the planned world size and one worker per rank; a batch-less plan is balanced per row."""
    p = plan.pieces(batch_size=plan.batch_size or 1)  # a cost plan's is cost-balanced ("auto")
    sequence = np.arange(len(p.rank)) - np.searchsorted(p.rank, p.rank)  # position inside the rank
    return pa.table({"rank": p.rank.astype(np.int32), "worker": p.worker.astype(np.int32),
                     "sequence": sequence.astype(np.int64), "catalog_row": p.catalog_row, "start": p.start,
                     "stop": p.stop, "padding": p.padding})


def _parquet_bytes(table: pa.Table) -> bytes:
    sink = io.BytesIO()
    pq.write_table(table, sink, compression="zstd")
    return sink.getvalue()


def _put(filesystem, path: str, data: bytes, atomic: bool = False) -> str:
    """Write bytes; on local disk via a temporary name and rename, object stores publish a PUT atomically."""
    target = path
    if atomic and isinstance(filesystem, pafs.LocalFileSystem):
        target = f"{path}.{uuid.uuid4().hex}.tmp"
    with filesystem.open_output_stream(target) as out:
        out.write(data)
    if target != path:
        os.replace(target, path)
    return hashlib.sha256(data).hexdigest()


def get_bytes(filesystem, path: str, url: str) -> pa.Buffer:
    """The file's bytes as an Arrow-owned buffer.

    Parsing Parquet from a buffer that wraps Python ``bytes`` made pyarrow 14 abort the interpreter at exit now
    and then ("terminate called without an active exception"); an Arrow-allocated buffer alone was not enough
    (see ``_plan_from``: the asynchronous dataset scanner was the other half).
    """
    try:
        with filesystem.open_input_stream(path) as handle:
            return handle.read_buffer()
    except (FileNotFoundError, pa.ArrowIOError, OSError):
        name = path.rsplit("/", 1)[-1]
        hint = "not a plan, or its writing was cut short" if name == PLAN_JSON else "the plan is incomplete"
        raise PlanIntegrityError(f"{url} has no readable {name}: {hint}; re-run planning") from None
