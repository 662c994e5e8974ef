"""Reading plans: ``read_plan`` refuses every defect with a ``PlanError``; ``load_plan`` also refuses a plan that no
longer describes what the caller is about to read."""
from __future__ import annotations

import hashlib
import itertools
import json
import os
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from .._version import __version__
from ..core import balance
from ..core.catalog import Catalog, FileInfo
from ..core.predicate_info import PredicateInfo, predicate_info
from ..errors import (
    InvalidTypeError,
    InvalidValueError,
    PlanError,
    PlanIntegrityError,
    PlanVersionError,
    StalePlanError,
)
from ..io import fs as fsutil
from ..io.footer import open_file
from ..io.tables import TableRef
from .format import (
    ASSIGNMENT,
    CATALOG,
    FORMAT_NAME,
    PLAN_JSON,
    READABLE_VERSIONS,
    assignment_table,
    catalog_row_groups,
    check_predicate,
    content_checksum,
    content_fingerprint,
    dataset_fingerprint,
    get_bytes,
    planned_pieces,
    totals,
)
from .format import check_dataset as _check_dataset
from .model import ShardPlan

if TYPE_CHECKING:
    from os import PathLike


def load_plan(plan_url: str | PathLike[str] | ShardPlan, *, check_dataset: bool = True,
              dataset_url: str | PathLike[str] | None = None, where: str | None = None,
              predicate: Any = None) -> ShardPlan:
    """Load the plan at ``plan_url`` (or take a ``ShardPlan`` as is).

    ``check_dataset`` compares the dataset's files (paths, sizes) with the plan's (G7; the reader compares row
    group sizes as it reads). Passing ``dataset_url``, ``where`` or ``predicate`` also asserts that the plan was
    made for that dataset and that filter, so a training script that still names them cannot silently train on a
    plan made for something else.
    """
    plan = plan_url if isinstance(plan_url, ShardPlan) else read_plan(plan_url)
    if dataset_url is not None and _dataset_names(plan, dataset_url) != plan.dataset_url:
        raise StalePlanError(f"the plan was made for {plan.dataset_url}, not dataset_url="
                             f"{_dataset_names(plan, dataset_url)!r}; plan that dataset")
    if where is not None or predicate is not None:
        check_predicate(plan, predicate_info(where, predicate))
    if check_dataset:
        _check_dataset(plan)
        if plan.catalog.kind == "petastorm":
            plan.unischema  # noqa: B018  (UnsafeDatasetError for a stored schema off the allow-list)
    return plan


def resolve_plan(plan) -> ShardPlan:
    """A ShardPlan as is, or a plan URL loaded and checked against its dataset (``StalePlanError``)."""
    if isinstance(plan, ShardPlan):
        return plan
    if plan is None:
        raise InvalidValueError("plan=None: pass a ShardPlan or the URL of a saved plan (plan_shards(output_url=...))")
    if not isinstance(plan, (str, os.PathLike)) or isinstance(plan, bytes) or not plan:
        raise InvalidTypeError(f"plan={plan!r} ({type(plan).__name__}) must be a ShardPlan or the URL or path of a "
                               "saved plan (plan_shards(output_url=...))")
    return load_plan(plan)


def _dataset_names(plan: ShardPlan, dataset_url) -> str:
    """The dataset location ``dataset_url`` names: an Iceberg table's metadata JSON (any version) or a pyiceberg
    ``Table`` names its table's location, which is what a table plan records."""
    if hasattr(dataset_url, "metadata_location") and hasattr(dataset_url, "location"):
        return fsutil.normalize_url(dataset_url.location())
    url = fsutil.normalize_url(dataset_url)
    if plan.table is not None and plan.table.metadata and url.endswith(".metadata.json"):
        metadata_folder = plan.table.location + "/metadata/"
        return plan.table.location if url.startswith(metadata_folder) else url
    return url


def read_plan(plan_url: str | PathLike[str]) -> ShardPlan:
    """Load and fully check a plan; every defect raises a ``PlanError`` subclass."""
    url = fsutil.normalize_url(plan_url, name="plan_url")
    filesystem, root = fsutil.resolve(url, name="plan_url")
    raw = get_bytes(filesystem, f"{root}/{PLAN_JSON}", url)
    try:
        document = json.loads(raw.to_pybytes())
        if not isinstance(document, dict):
            raise InvalidValueError("not an object")
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:  # deep nesting: RecursionError
        raise PlanIntegrityError(f"{url}/{PLAN_JSON} is not valid JSON ({type(exc).__name__}: {exc}); re-run "
                                 "planning") from None
    if document.get("format") != FORMAT_NAME:
        raise PlanError(f"{url} is not a petastorm-balanced plan (format={document.get('format')!r})")
    version = document.get("format_version")
    if type(version) is not int or version not in READABLE_VERSIONS:
        raise PlanVersionError(f"{url} has plan format version {version!r}; this petastorm-balanced "
                               f"{__version__} reads versions {', '.join(map(str, READABLE_VERSIONS))}; upgrade the "
                               "package or re-plan")
    try:
        return _plan_from(document, filesystem, root, url, version)
    except PlanError:
        raise
    except (KeyError, TypeError, ValueError, IndexError, AttributeError, RecursionError, pa.ArrowException) as exc:
        raise PlanIntegrityError(f"{url} is malformed ({type(exc).__name__}: {exc}); re-run planning") from None


def _plan_from(document, filesystem, root, url, version) -> ShardPlan:
    digests = document["files"]
    tables = {}
    for name in (CATALOG, ASSIGNMENT):
        data = get_bytes(filesystem, f"{root}/{name}", url)
        if hashlib.sha256(data).hexdigest() != digests[name]:
            raise PlanIntegrityError(f"{url}/{name} does not match the sha256 in plan.json (truncated, edited or "
                                     "from another plan); re-run planning")
        # ParquetFile, not read_table: read_table's dataset scanner releases its file source later on an Arrow
        # pool thread, and when that happens during interpreter exit its PyBuffer takes the GIL and aborts the
        # process ("terminate called without an active exception", ~5% of runs). ParquetFile reads synchronously.
        # Paths as a dictionary: a million row groups share tens of thousands of paths, so no string per row group.
        as_dictionary = ["file"] if name == CATALOG else None
        tables[name] = open_file(pa.BufferReader(data), read_dictionary=as_dictionary).read()
    params, dataset, predicate = document["parameters"], document["dataset"], document["predicate"]
    if not balance.BALANCERS.holds(params["algorithm"], params["algorithm_version"]):
        raise PlanVersionError(f"{url} was balanced by {params['algorithm']} v{params['algorithm_version']}; this "
                               f"package has {balance.ALGORITHM} v{balance.ALGORITHM_VERSION}; re-plan")
    files = tuple(_file_info(entry, version) for entry in document["dataset_files"])
    check_paths(files, tables[CATALOG], url)
    if not set(map(type, itertools.chain.from_iterable(f.row_group_rows for f in files))) <= {int}:  # not bool
        raise PlanIntegrityError(f"{url}/plan.json lists a row group size that is not an integer; re-run planning")
    cost = document.get("cost")  # absent from plans without a cost (and from plans older than costs)
    if cost is not None:
        from ..core.cost.order import ORDER_NAME, ORDER_VERSION, ROW_GROUP_ORDERS
        if not ROW_GROUP_ORDERS.holds(cost["order"], cost["order_version"]):
            raise PlanVersionError(f"{url} orders cost by {cost['order']} v{cost['order_version']}; this package has "
                                   f"{ORDER_NAME} v{ORDER_VERSION}; re-plan")
    catalog = Catalog(files, catalog_row_groups(tables[CATALOG]), dataset["kind"],
                      tuple(dataset["partition_columns"]), None if cost is None else cost["text"])
    extends = document.get("extends", [])  # present in updated plans only
    if not isinstance(extends, list) or not all(isinstance(c, str) and len(c) == 64 for c in extends):
        raise PlanIntegrityError(f"{url}/plan.json has an 'extends' that is not a list of plan checksums; re-run "
                                 "planning")
    plan = ShardPlan(dataset["url"], catalog, params["world_size"], params["batch_size"], params["policy"],
                     params["seed"], PredicateInfo(**predicate), dataset["fingerprint"],
                     TableRef.from_json(dataset["table"]) if "table" in dataset else None, tuple(extends))
    # The checksum (Arrow kernels, sha256) runs beside the fingerprint and the balancing (NumPy sorts): both release
    # the GIL for most of their time, and every rank waits for both (a million row groups: load_plan 1.9 s with
    # them in a row, 1.3 s side by side; benchmarks/bench_scale.py).
    edited = f"{url}/plan.json does not match its recorded checksum (edited?); re-run planning"
    with ThreadPoolExecutor(1) as pool:
        pending = pool.submit(content_checksum, plan, version)
        try:
            fingerprint: str | None = dataset_fingerprint(files)
            if version >= 2 and document["content_fingerprint"] != content_fingerprint(files):
                fingerprint = None  # an edited footer digest or modification time: an edited plan.json
            pieces = planned_pieces(plan)  # balanced once for both checks below
            assignment_ok = assignment_table(plan, pieces).equals(tables[ASSIGNMENT])
            totals_ok = document["totals"] == totals(plan, pieces)  # not in the checksum, but shown to users
        except Exception:
            if pending.result() != document["checksum"]:  # an edited plan.json: say that, not what it broke
                raise PlanIntegrityError(edited) from None
            raise
        checksum = pending.result()
    if checksum != document["checksum"] or fingerprint != dataset["fingerprint"]:
        raise PlanIntegrityError(edited)
    if not assignment_ok:
        raise PlanIntegrityError(f"{url}/{ASSIGNMENT} disagrees with the catalog and parameters; re-run planning")
    if not totals_ok:
        raise PlanIntegrityError(f"{url}/plan.json totals disagree with its catalog (edited?); re-run planning")
    # Decoding and checking a large plan leaves Arrow's allocator holding freed memory (130 MB for a million row
    # groups with mimalloc); every rank loads a plan, so give it back now.
    pa.default_memory_pool().release_unused()
    return plan


def check_paths(files, catalog: pa.Table, url: str) -> None:
    """G14: a plan names only plain paths inside its dataset root, each file once, and its row groups only in
    those files. A plan is data that may arrive over S3 or HDFS; it must not choose what a training job reads
    (``../secret.parquet``, ``/etc/x``, ``s3://other/x``), whatever its checksums say."""
    paths = [f.path for f in files]
    if not all(isinstance(p, str) for p in paths):
        raise PlanIntegrityError(f"{url}/plan.json lists a data file path that is not a string; re-run planning")
    bad = fsutil.first_not_relative(paths)
    if bad is not None:
        try:
            fsutil.check_relative(bad)
            detail = f"file path {bad!r} is not a plain path inside the dataset root"
        except InvalidValueError as exc:
            detail = str(exc)
        raise PlanIntegrityError(f"{url}/plan.json lists a data file outside the dataset root: {detail}; the plan "
                                 "was edited or forged: re-run planning") from None
    if len(set(paths)) != len(paths):
        raise PlanIntegrityError(f"{url}/plan.json lists a data file twice; re-run planning")
    named = set(catalog.column("file").unique().to_pylist()) if "file" in catalog.schema.names else set()
    stray = sorted(map(str, named - set(paths)))
    if stray:
        raise PlanIntegrityError(f"{url}/catalog.parquet names {stray[0]!r}, which is not one of the plan's data "
                                 "files; re-run planning")


def _file_info(entry, version: int) -> FileInfo:
    """One ``dataset_files`` entry: ``[path, size, rows]`` in version 1, ``[path, size, rows, footer sha256,
    mtime_ns or null]`` in version 2, followed by the content fingerprint where the plan recorded one."""
    if version == 1:
        path, size, rows = entry
        return FileInfo(path, int(size), tuple(rows))
    path, size, rows, footer, mtime_ns, *rest = entry
    content = rest[0] if len(rest) == 1 else None if rest else ""
    if not isinstance(footer, str) or (mtime_ns is not None and type(mtime_ns) is not int) or \
            not isinstance(content, str) or (rest and not content):
        raise PlanIntegrityError(f"dataset_files entry {entry!r} has a footer digest, modification time or content "
                                 "fingerprint of the wrong type; re-run planning")
    return FileInfo(path, int(size), tuple(rows), footer, mtime_ns, content)
