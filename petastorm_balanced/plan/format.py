"""Plan format version 2: how plans are written and checked (spec: docs/plan-format.md; ``load.py`` reads them).

A plan is a directory holding ``catalog.parquet``, ``assignment.parquet`` and ``plan.json``. ``plan.json`` is
written last and records the sha256 of the other two, so its presence commits the plan and a plan cut short by a
crash, a truncated copy or an edited file is refused rather than read as valid.
"""
from __future__ import annotations

import hashlib
import io
import itertools
import json
import os
import uuid
from json.encoder import encode_basestring_ascii as _json_str
from typing import TYPE_CHECKING, Protocol

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from .._version import __version__
from ..core import balance
from ..core.catalog import Catalog, FileInfo, RowGroups
from ..errors import InvalidValueError, PlanIntegrityError, StalePlanError, StorageUnavailableError
from ..io import fs as fsutil
from ..io import retry
from ..io.dataset import list_data_files
from ..io.location import DatasetLocation

if TYPE_CHECKING:
    from os import PathLike

    from ..core.predicate_info import PredicateInfo
    from ..io.tables import TableRef


class ShardPlan(Protocol):
    """What this module reads of a ``model.ShardPlan``. A structural type rather than an import: the model calls
    into this module (``save``, ``checksum``), so importing it back, even for types only, would be a circle."""

    @property
    def dataset_url(self) -> str: ...
    @property
    def catalog(self) -> Catalog: ...
    @property
    def world_size(self) -> int: ...
    @property
    def batch_size(self) -> int | None: ...
    @property
    def policy(self) -> str: ...
    @property
    def seed(self) -> int: ...
    @property
    def predicate(self) -> PredicateInfo: ...
    @property
    def dataset_fingerprint(self) -> str: ...
    @property
    def total_rows(self) -> int: ...
    @property
    def table(self) -> TableRef | None: ...
    @property
    def extends(self) -> tuple[str, ...]: ...
    @property
    def location(self) -> DatasetLocation: ...
    def pieces(self, *, batch_size: int | None = None) -> balance.Pieces: ...


FORMAT_NAME = "petastorm-balanced-plan"
FORMAT_VERSION = 2
# Version 1 plans still load: their dataset_files lack the footer digest and modification time (G15 unchecked).
READABLE_VERSIONS = (1, 2)
PLAN_JSON = "plan.json"
CATALOG = "catalog.parquet"
ASSIGNMENT = "assignment.parquet"

_CHECKSUM_CHUNK = 1 << 15  # row groups hashed per Arrow pass: bounds the temporary memory
_EMPTY_DIGEST = hashlib.sha256(b"").digest()
_CATALOG_SCHEMA = pa.schema([("file", pa.string()), ("row_group", pa.int32()), ("total_rows", pa.int64()),
                             ("matching_rows", pa.int64()), ("selection", pa.binary())])
# A cost plan's catalog has two more columns; a plan without a cost is written exactly as before.
_COST_SCHEMA = _CATALOG_SCHEMA.append(pa.field("cost_sum", pa.int64())).append(pa.field("cost_max", pa.int64()))


def dataset_fingerprint(files) -> str:
    """sha256 over every data file's path, size and row group sizes (each as ``json.dumps([path, size, rows])``).

    Footer digests and modification times are not in it (``content_fingerprint`` covers them): they do not decide
    which rows go where, so the same data planned on a local disk and on S3 keeps one fingerprint and checksum.

    The text is built column-wise with Arrow (same bytes as formatting each file in Python, several times faster
    for a million row groups).
    """
    files = sorted(files, key=lambda f: f.path)
    per_file = np.fromiter((len(f.row_group_rows) for f in files), np.int64, len(files))
    rows = np.fromiter(itertools.chain.from_iterable(f.row_group_rows for f in files), np.int64, int(per_file.sum()))
    offsets = pa.array(np.concatenate(([0], np.cumsum(per_file))), pa.int64())
    lists = pa.LargeListArray.from_arrays(offsets, pc.cast(pa.array(rows), pa.string()))
    text = pc.binary_join_element_wise(
        "[", pa.array([_json_str(f.path) for f in files], pa.string()), ", ",
        pc.cast(pa.array([int(f.size) for f in files], pa.int64()), pa.string()), ", [",
        pc.binary_join(lists, ", "), "]]", "")
    digest = hashlib.sha256()
    digest.update(_values(text))
    return digest.hexdigest()


def content_fingerprint(files) -> str:
    """sha256 of ``json.dumps([[path, footer digest, mtime_ns], ...])`` over the files sorted by path (format
    version 2), a file with a content fingerprint (``FileInfo.content``) as ``[path, footer, mtime_ns, content]``:
    what makes an edited digest, time or fingerprint in ``plan.json`` an edited plan."""
    text = ", ".join([f"[{_json_str(f.path)}, {_json_str(f.footer)}, {'null' if f.mtime_ns is None else f.mtime_ns}"
                      + (f", {_json_str(f.content)}]" if f.content else "]")
                      for f in sorted(files, key=lambda f: f.path)])  # json.dumps's bytes, built faster
    return hashlib.sha256(f"[{text}]".encode()).hexdigest()


def content_checksum(plan: ShardPlan, version: int = FORMAT_VERSION) -> str:
    """sha256 over everything that decides what rows go where; not over file bytes, which writers may vary.

    Per row group it hashes ``json.dumps([path, row_group, total_rows, matching_rows])`` and the selection's
    sha256. The bytes are built column-wise with Arrow (same bytes as formatting each row group in Python, about
    10x faster: a million row groups in well under a second). A cost plan also hashes ``json.dumps([cost_sum,
    cost_max])`` per row group (and its header names the cost); a plan without a cost hashes exactly what it did
    before costs existed.
    """
    digest = hashlib.sha256(json.dumps(_header(plan, version), sort_keys=True).encode())
    rows = plan.catalog.row_groups
    paths = pa.array([_json_str(p) for p in rows.paths], pa.string())
    for start in range(0, len(rows), _CHECKSUM_CHUNK):
        digest.update(_row_group_bytes(rows, paths, start, min(start + _CHECKSUM_CHUNK, len(rows)),
                                       with_cost=plan.catalog.cost is not None))
    return digest.hexdigest()


def _row_group_bytes(rows: RowGroups, paths: pa.Array, start: int, stop: int, with_cost: bool = False) -> memoryview:
    """For row groups ``start:stop``: ``[path, row_group, total_rows, matching_rows]`` as JSON text followed by
    the sha256 of the selection (then ``[cost_sum, cost_max]`` for a cost plan), concatenated (``paths``: each of
    ``rows.paths`` as a JSON string)."""
    n = stop - start
    quoted = paths.take(pa.array(rows.path_index[start:stop]))
    ints = [pc.cast(pa.array(a[start:stop]), pa.string()) for a in (rows.row_group, rows.total_rows,
                                                                     rows.matching_rows)]
    text = pc.binary_join_element_wise("[", quoted, ", ", ints[0], ", ", ints[1], ", ", ints[2], "]", "")
    selection = rows.selection.slice(start, n)
    offsets = np.frombuffer(selection.buffers()[1], np.int64)[selection.offset:selection.offset + n + 1]
    data = memoryview(selection.buffers()[2] or b"")
    # digests: (row groups, 32) uint8
    digests = np.empty((n, 32), np.uint8)
    digests[:] = np.frombuffer(_EMPTY_DIGEST, np.uint8)
    chosen = np.flatnonzero(offsets[1:] != offsets[:-1])  # row groups with a selection (not "all rows")
    if len(chosen):
        sha256 = hashlib.sha256
        hashed = b"".join([sha256(data[a:b]).digest() for a, b in zip(offsets[chosen].tolist(),
                                                                        offsets[chosen + 1].tolist(), strict=True)])
        digests[chosen] = np.frombuffer(hashed, np.uint8).reshape(-1, 32)
    fixed = pa.FixedSizeBinaryArray.from_buffers(pa.binary(32), n, [None, pa.py_buffer(digests)])
    parts = [text.cast(pa.large_binary()), fixed.cast(pa.large_binary())]
    if with_cost:
        if rows.cost_sum is None or rows.cost_max is None:
            raise InvalidValueError("a cost plan's catalog has no cost statistics")
        costs = [pc.cast(pa.array(a[start:stop]), pa.string()) for a in (rows.cost_sum, rows.cost_max)]
        parts.append(pc.binary_join_element_wise("[", costs[0], ", ", costs[1], "]", "").cast(pa.large_binary()))
    joined = pc.binary_join_element_wise(*parts, pa.scalar(b"", pa.large_binary()))
    return _values(joined)


def _values(array: pa.Array) -> memoryview:
    """The concatenated values of a string or binary array, without a copy."""
    width = 8 if pa.types.is_large_binary(array.type) or pa.types.is_large_string(array.type) else 4
    ends = np.frombuffer(array.buffers()[1], np.int64 if width == 8 else np.int32)[array.offset:
                                                                                   array.offset + len(array) + 1]
    return memoryview(array.buffers()[2] or b"")[int(ends[0]):int(ends[-1])] if len(array) else memoryview(b"")


def write_plan(plan: ShardPlan, output_url: str | PathLike[str]) -> str:
    """Write ``plan`` under ``output_url``; returns the normalized URL. Overwrites an older plan there.

    Every byte is made before the first is written (a value JSON cannot hold fails with nothing written), and a
    location inside the dataset is refused first (``check_output``).
    """
    url = check_output(output_url, plan.dataset_url)
    filesystem, root = fsutil.resolve(url, name="output_url")
    data = {CATALOG: _parquet_bytes(_catalog_table(plan.catalog)), ASSIGNMENT: _parquet_bytes(assignment_table(plan))}
    digests = {name: hashlib.sha256(payload).hexdigest() for name, payload in data.items()}
    document = json.dumps(plan_document(plan, digests), indent=1, sort_keys=True, allow_nan=False).encode()
    filesystem.create_dir(root, recursive=True)
    if filesystem.get_file_info(f"{root}/{PLAN_JSON}").type != pafs.FileType.NotFound:
        filesystem.delete_file(f"{root}/{PLAN_JSON}")  # uncommit first: a crash below leaves no valid plan
    for name, payload in data.items():
        _put(filesystem, f"{root}/{name}", payload)
    _put(filesystem, f"{root}/{PLAN_JSON}", document, atomic=True)
    return url


def check_output(output_url, dataset_url: str) -> str:
    """The normalized ``output_url``, refused when it is the dataset or inside it: the plan's files would become
    data files of the dataset it describes (the plan is then stale at once, and re-planning reads plan.json as
    Parquet)."""
    url = fsutil.normalize_url(output_url, name="output_url")
    dataset = fsutil.normalize_url(dataset_url)
    inside = url == dataset or url.startswith(dataset.rstrip("/") + "/")
    if not inside and fsutil.is_local(url) and fsutil.is_local(dataset):  # aliases through symlinks, too
        out, data = os.path.realpath(fsutil.local_path(url)), os.path.realpath(fsutil.local_path(dataset))
        inside = out == data or out.startswith(data.rstrip("/") + "/")
    if inside:
        raise InvalidValueError(f"output_url={output_url!r} is inside the dataset {dataset}; write the plan "
                                "beside the dataset (for example <dataset>-plan), never into it")
    return url


def plan_document(plan: ShardPlan, digests: dict | None = None) -> dict:
    """The content of ``plan.json``."""
    return {
        **_header(plan),
        "package_version": __version__,
        "checksum": content_checksum(plan),
        "content_fingerprint": content_fingerprint(plan.catalog.files),
        "dataset_files": [[f.path, f.size, list(f.row_group_rows), f.footer, f.mtime_ns, *([f.content] if f.content
                                                                                           else [])]
                          for f in plan.catalog.files],
        "totals": totals(plan),
        "files": digests or {},
        **({"extends": list(plan.extends)} if plan.extends else {}),
    }


def planned_pieces(plan: ShardPlan) -> balance.Pieces:
    """Epoch 0 for the planned world size and one worker per rank; a batch-less plan is balanced per row."""
    return plan.pieces(batch_size=plan.batch_size or 1)


def totals(plan: ShardPlan, pieces: balance.Pieces | None = None) -> dict:
    """What the planned world size gets at epoch 0 (what ``inspect`` shows); ``pieces``: ``planned_pieces``."""
    pieces = planned_pieces(plan) if pieces is None else pieces
    delivered = int(pieces.num_rows[~pieces.padding].sum())
    return {"scanned_rows": plan.catalog.scanned_rows, "matching_rows": plan.total_rows,
            "row_groups": len(plan.catalog.row_groups), "rows_per_rank": pieces.steps_per_rank * pieces.batch_size,
            "steps_per_epoch": pieces.steps_per_rank, "padded_rows": int(pieces.num_rows[pieces.padding].sum()),
            "dropped_rows": plan.total_rows - delivered, "split_row_groups": split_row_groups(pieces),
            **(_cost_totals(plan, pieces) if plan.catalog.cost is not None else {})}


def _cost_totals(plan: ShardPlan, pieces: balance.Pieces) -> dict:
    """Cost side of the totals: the whole cost, the largest row's, and each rank's estimated share (each piece
    counted at its row group's mean cost per row; exact for whole row groups)."""
    from ..core.cost.order import rank_costs
    return {"total_cost": int(plan.catalog.cost_sums().sum()), "max_row_cost": plan.catalog.max_row_cost,
            "cost_per_rank": [int(round(c)) for c in rank_costs(plan.catalog, pieces)]}


def split_row_groups(pieces: balance.Pieces) -> int:
    """Row groups whose non-padding rows go to more than one slot."""
    real = ~pieces.padding
    slots = pieces.world_size * pieces.num_workers
    slot = pieces.rank[real] * pieces.num_workers + pieces.worker[real]
    pairs = balance.distinct(pieces.catalog_row[real] * slots + slot)  # distinct (row group, slot), one int64
    return int(len(pairs) - len(balance.distinct(pairs // slots)))


def check_dataset(plan: ShardPlan, *, files=None) -> None:
    """Raise ``StalePlanError`` naming the first difference between the plan's files and the dataset's.

    Without ``files`` the dataset is listed and paths, sizes and modification times are compared; ``files``
    (``FileInfo``s from a fresh footer scan, as ``verify`` passes) also compares row group sizes and footer digests
    (the reader compares those anyway for the files it reads). A modification time or digest the plan lacks (format
    version 1) or the filesystem does not report is not compared.
    """
    footers = files is not None
    if footers:
        current = {f.path: f for f in files}
    else:
        try:
            filesystem, root, entries = list_data_files(plan.dataset_url, table=plan.table)
        except ValueError as exc:
            what = "dataset is gone" if plan.table is None else "table snapshot can no longer be served"
            raise StalePlanError(f"the plan's {what}: {exc}") from None
        # the listing resolved the location: the plan keeps it (``ShardPlan.location``) rather than stat again
        plan.__dict__.setdefault("location", DatasetLocation(plan.dataset_url, root, filesystem))
        current = {e.path[len(root):].lstrip("/"): FileInfo(e.path[len(root):].lstrip("/"), e.size, (),
                                                            mtime_ns=e.mtime_ns)
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
        check_file(plan, planned[path], footer=current[path].footer if footers else "",
                   mtime_ns=current[path].mtime_ns)
    check_contents(plan, [f for f in plan.catalog.files if f.content])


def check_contents(plan: ShardPlan, files) -> None:
    """``StalePlanError`` for the first of ``files`` (planned, with a content fingerprint) whose fingerprint now
    differs from the plan's: a request per file on an object store (its ETag), a read of every byte where the plan
    recorded a digest (``io/content.py``)."""
    if not files:
        return
    from concurrent.futures import ThreadPoolExecutor

    from ..io import content
    filesystem, root = plan.location.filesystem, plan.location.root

    def now(info: FileInfo) -> str:
        return retry.call(lambda: content.fresh(filesystem, fsutil.join(root, info.path), info.content),
                          url=f"{plan.dataset_url}/{info.path}")
    with ThreadPoolExecutor(min(content.THREADS, len(files))) as pool:
        for info, current in zip(files, pool.map(now, files), strict=True):
            check_file(plan, info, content=current)


def check_file(plan: ShardPlan, planned: FileInfo, *, footer: str = "", mtime_ns: int | None = None,
               content: str = "") -> None:
    """``StalePlanError`` when a file's footer digest or modification time differs from the plan's (G15); a value
    either side does not know (``""``, ``None``) is not compared. A rewrite of the same size, the same row counts
    and even a byte-identical footer (the same rows in another order) changes the modification time; a copy that
    does not keep modification times makes the plan stale too (docs/plan-format.md)."""
    if footer and planned.footer and footer != planned.footer:
        raise StalePlanError(f"{planned.path!r} in {plan.dataset_url} was rewritten since planning (its Parquet "
                             "footer differs from the planned one); re-run planning")
    if mtime_ns is not None and planned.mtime_ns is not None and mtime_ns != planned.mtime_ns:
        raise StalePlanError(f"{planned.path!r} in {plan.dataset_url} was modified since planning (modification "
                             f"time {planned.mtime_ns} -> {mtime_ns} ns; a copy that does not keep modification "
                             "times changes them too); re-run planning")
    if content and planned.content and content != planned.content:
        raise StalePlanError(f"{planned.path!r} in {plan.dataset_url} was rewritten since planning (its content "
                             f"fingerprint {planned.content} -> {content}, though its size, footer and modification "
                             "time may be unchanged); re-run planning")


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


def _header(plan: ShardPlan, version: int = FORMAT_VERSION) -> dict:
    cost = {}
    if plan.catalog.cost is not None:
        from ..core.cost.order import ORDER_NAME, ORDER_VERSION
        from ..core.cost.spec import parse_cost
        cost = {"cost": {"text": plan.catalog.cost, "kind": parse_cost(plan.catalog.cost).kind,
                         "order": ORDER_NAME, "order_version": ORDER_VERSION}}
    return {
        **cost,
        "format": FORMAT_NAME, "format_version": version,
        "dataset": {"url": plan.dataset_url, "fingerprint": plan.dataset_fingerprint, "kind": plan.catalog.kind,
                    "partition_columns": list(plan.catalog.partition_columns),
                    **({} if plan.table is None else {"table": plan.table.to_json()})},
        "predicate": {"kind": plan.predicate.kind, "text": plan.predicate.text,
                      "fingerprint": plan.predicate.fingerprint},
        "parameters": {"world_size": plan.world_size, "batch_size": plan.batch_size, "policy": plan.policy,
                       "seed": plan.seed, "algorithm": balance.ALGORITHM,
                       "algorithm_version": balance.ALGORITHM_VERSION},
    }


def _catalog_table(catalog: Catalog) -> pa.Table:
    rows = catalog.row_groups
    columns = [pa.array(rows.paths, pa.string()).take(pa.array(rows.path_index)), pa.array(rows.row_group, pa.int32()),
               pa.array(rows.total_rows), pa.array(rows.matching_rows), rows.selection.cast(pa.binary())]
    if catalog.cost is None:
        return pa.table(columns, schema=_CATALOG_SCHEMA)
    return pa.table(columns + [pa.array(rows.cost_sum), pa.array(rows.cost_max)], schema=_COST_SCHEMA)


def catalog_row_groups(table: pa.Table) -> RowGroups:
    """The ``RowGroups`` of a ``catalog.parquet`` table (with cost columns for a cost plan); a null anywhere is a
    corrupt plan."""
    if table.schema.names not in (_CATALOG_SCHEMA.names, _COST_SCHEMA.names):
        raise PlanIntegrityError(f"catalog.parquet has columns {table.schema.names}, not {_CATALOG_SCHEMA.names}")
    for name in table.schema.names:
        if table.column(name).null_count:
            raise PlanIntegrityError(f"catalog.parquet has a null {name}; re-run planning")
    cost_sum, cost_max = ((table.column("cost_sum").to_numpy(), table.column("cost_max").to_numpy())
                          if "cost_sum" in table.schema.names else (None, None))  # both or neither (the schemas)
    return RowGroups.from_columns(table.column("file"), table.column("row_group").to_numpy(),
                                  table.column("total_rows").to_numpy(), table.column("matching_rows").to_numpy(),
                                  table.column("selection"), cost_sum, cost_max)


def assignment_table(plan: ShardPlan, pieces: balance.Pieces | None = None) -> pa.Table:
    """``planned_pieces`` as a table (``pieces`` when the caller has them already); a cost plan's are
    cost-balanced ("auto")."""
    p = planned_pieces(plan) if pieces is None else pieces
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
    def read() -> pa.Buffer:
        with filesystem.open_input_stream(path) as handle:
            return handle.read_buffer()
    try:  # a passing storage fault is retried, and one that outlives the policy says so (not "incomplete")
        return retry.call(read, url=f"{url}/{path.rsplit('/', 1)[-1]}")
    except StorageUnavailableError:
        raise
    except (FileNotFoundError, pa.ArrowIOError, OSError):
        name = path.rsplit("/", 1)[-1]
        hint = "not a plan, or its writing was cut short" if name == PLAN_JSON else "the plan is incomplete"
        raise PlanIntegrityError(f"{url} has no readable {name}: {hint}; re-run planning") from None
