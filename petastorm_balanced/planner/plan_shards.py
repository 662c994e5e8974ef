"""``plan_shards``: normalize the inputs once, let an engine build the catalog, balance, save."""
from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..core import balance
from ..core.catalog import Catalog
from ..core.cost.spec import FUNCTIONS, parse_cost
from ..core.deletes import without_rows
from ..core.predicate_info import PredicateInfo, predicate_info
from ..errors import InvalidValueError
from ..io import fs as fsutil
from ..io import tables
from ..io.tables import TableRef
from ..plan.format import check_output, dataset_fingerprint
from ..plan.model import ShardPlan
from .contents import with_contents
from .stored_order import warn_stored_order

if TYPE_CHECKING:
    from os import PathLike

ENGINES = ("spark", "local")
log = logging.getLogger(__name__)


def plan_shards(dataset_url: str | PathLike[str], world_size: int, *, where: str | None = None,
                predicate: Any = None, batch_size: int | None = None, policy: str = "drop", seed: int = 0,
                engine: str = "spark", spark: Any = None, output_url: str | PathLike[str] | None = None,
                progress: Callable[[int], object] | None = None, cost: str | None = None,
                table_version: int | None = None, snapshot_id: int | None = None,
                table_format: str | None = None, update: Any = None) -> ShardPlan:
    """Scan ``dataset_url``, keep the rows that match ``where`` (Spark SQL) or ``predicate`` (Petastorm), and
    balance them over ``world_size`` ranks; saves the plan when ``output_url`` is given.

    ``batch_size`` may be left out and given to the loader instead; the plan then balances rows, not batches.
    ``progress``, a callable taking a count, hears of each footer the local engine reads (the CLI's progress line).
    ``cost`` (a numeric column, ``length(col)``/``size(col)``, or with ``engine="spark"`` any Spark SQL numeric
    expression) records each row group's cost sum and largest row cost, so loaders can balance cost per step.

    A Delta table (a folder holding ``_delta_log/``) is planned at its latest version or ``table_version``; an
    Iceberg table (its ``.../metadata/*.metadata.json`` URL, or a pyiceberg ``Table``) at its current snapshot or
    ``snapshot_id``: exactly that snapshot's files, recorded in the plan (docs/tables.md). ``table_format='parquet'``
    reads a table folder's raw Parquet files instead, files the table removed included.

    ``update`` (a ``ShardPlan`` or a plan URL made with the same parameters): when the dataset only gained files
    since that plan (a new partition, a Delta commit or Iceberg snapshot that only appended), only the added files'
    footers are read and only their rows filtered and costed; the plan is the one planning from scratch would write
    (same checksum), and it records the old plan's checksum, so a loader state saved on the old plan resumes on it
    at an epoch boundary. Anything but added files is refused with ``PlanUpdateError`` (``planner/update.py``).
    """
    balance.check_params(world_size=world_size, seed=seed, **({} if batch_size is None else
                                                                {"batch_size": batch_size}))
    # numpy integers are accepted as the loader accepts them, and stored as Python ints (JSON holds no numpy)
    world_size, seed = int(world_size), int(seed)
    batch_size = None if batch_size is None else int(batch_size)
    balance.check_policy(policy)
    if engine not in ENGINES:
        raise InvalidValueError(f"engine={engine!r} is not one of {ENGINES}")
    if where is not None and predicate is not None:
        raise InvalidValueError("pass where= (Spark SQL) or predicate= (Petastorm), not both")
    if where is not None and (not isinstance(where, str) or not where.strip()):
        raise InvalidValueError(f"where={where!r} must be a non-empty Spark SQL boolean expression")
    snapshot = tables.resolve(dataset_url, table_format=table_format, table_version=table_version,
                              snapshot_id=snapshot_id)
    table = None if snapshot is None else snapshot.ref
    url = fsutil.normalize_url(dataset_url) if table is None else table.location
    if table is not None:
        log.info("planning %s", table.describe())
    if output_url is not None:
        check_output(output_url, url)  # before any work, and long before anything is written
    timings = {"footers": 0.0}
    described = predicate_info(where, predicate)  # before scanning: a predicate we cannot fingerprint fails fast
    cost_spec = None if cost is None else parse_cost(cost)
    if cost_spec is not None and engine == "local" and not cost_spec.loader_evaluable:
        raise InvalidValueError(f"cost={cost!r} is a Spark SQL expression and needs engine='spark'; with "
                                f"engine='local' pass a numeric column or one of {', '.join(FUNCTIONS)} of a column")
    if engine == "local" and where is not None:
        raise InvalidValueError("where= is Spark SQL and needs engine='spark'; with engine='local' pass a "
                                "Petastorm predicate= instead")
    old, only = None, None
    if update is not None:
        from . import update as updates
        old = updates.old_plan(update)
        updates.check_parameters(old, url=url, table=table, world_size=world_size, batch_size=batch_size,
                                 policy=policy, seed=seed, predicate=described,
                                 cost=None if cost_spec is None else cost_spec.text)
        only, every_path = updates.added_paths(old, url, snapshot)
        log.info("updating a plan of %d files: %d files added", len(old.catalog.files), len(only))
    if old is not None and not only:
        catalog = old.catalog  # nothing added: the same catalog (a table version may still be newer)
    else:
        catalog = _catalog(url, engine=engine, where=where, predicate=predicate, spark=spark, progress=progress,
                           table=table, snapshot=snapshot, cost_spec=cost_spec, timings=timings, only=only)
    if old is not None and only:
        from ..core.catalog import merge_catalogs
        from . import update as updates
        updates.check_added(old, catalog, every_path, reads_partitions=where is not None or predicate is not None
                            or cost_spec is not None, table=table)
        catalog = merge_catalogs(old.catalog, catalog)
    started = time.perf_counter()
    plan = make_plan(url, catalog, world_size=world_size, batch_size=batch_size, policy=policy, seed=seed,
                     predicate=described, table=table,
                     extends=() if old is None else (*old.extends, old.checksum))
    timings["balance"] = time.perf_counter() - started
    if output_url is not None:
        started = time.perf_counter()
        plan.save(output_url)
        timings["write"] = time.perf_counter() - started
    log.info("time: %s", time_summary(timings))
    warn_stored_order(plan)
    return plan


def _catalog(url, *, engine, where, predicate, spark, progress, table, snapshot, cost_spec, timings, only):
    """The catalog of the dataset, or with ``only`` (an update) of those files alone: rows filtered, deletes
    applied, costs added."""
    def build() -> Catalog:
        if engine == "local":
            from .engines.local import build_catalog as local_catalog
            started = time.perf_counter()
            built = local_catalog(url, predicate=predicate, progress=progress, table=table, only=only)
            timings["predicate" if predicate is not None else "footers"] = time.perf_counter() - started
            return built
        from .engines.spark import build_catalog as spark_catalog
        return spark_catalog(url, where=where, predicate=predicate, spark=spark, timings=timings, table=table,
                             only=only)
    catalog = with_contents(url, build, table=table, only=only)  # G15: ETags, or digests where asked for
    deleted = {} if snapshot is None else snapshot.deleted_rows()
    if deleted:
        catalog = without_rows(catalog, deleted)  # position deletes: both engines, one rule
    if cost_spec is not None:
        started = time.perf_counter()
        catalog = _add_costs(url, catalog, cost_spec, engine=engine, where=where, predicate=predicate, spark=spark,
                             table=table, deletes=bool(deleted), partial=only is not None)
        timings["cost"] = time.perf_counter() - started
    return catalog


def _add_costs(url, catalog, spec, *, engine, where, predicate, spark, table=None, deletes=False, partial=False):
    """The catalog with cost statistics: Spark SQL evaluates the cost unless a Petastorm predicate chose the rows
    (Spark cannot name those) or a table's position deletes removed some (Spark reads them), then this process reads
    the cost column for the catalog's rows. ``partial``: the catalog holds some of the dataset's files (an update),
    which Spark then reads by name."""
    from .cost_stats import local_cost_stats, with_costs
    if deletes and not spec.loader_evaluable:
        raise InvalidValueError(f"cost={spec.text!r} is a Spark SQL expression, and {table.describe()} has position "
                                "deletes that Spark would count; pass a numeric column or a function of one")
    if not len(catalog.row_groups):  # an update whose added files match no row: nothing to cost
        return with_costs(catalog, spec, {})
    if engine == "local" or predicate is not None or deletes:
        return with_costs(catalog, spec, local_cost_stats(url, catalog, spec))
    from ..io.dataset import list_data_files, relative_path
    from .engines.spark import get_session
    from .engines.spark_cost import spark_cost_stats
    _, root, entries = list_data_files(url, table=table)
    every_path = [relative_path(e.path, root) for e in entries] if partial else None
    stats = spark_cost_stats(get_session(spark), url, root, catalog.files, spec, where, table=table,
                             every_path=every_path)
    return with_costs(catalog, spec, stats)


def time_summary(timings: dict) -> str:
    """One line saying where planning's time went, steps in pipeline order."""
    steps = [k for k in ("session", "footers", "where", "encode", "predicate", "cost", "balance", "write")
             if k in timings]
    text = ", ".join(f"{k} {timings[k]:.2f} s" for k in steps if k != "session" or timings[k] >= 0.005)
    return f"{text}; total {sum(timings.values()):.2f} s"


def make_plan(url: str, catalog: Catalog, *, world_size: int, batch_size: int | None, policy: str, seed: int,
              predicate: PredicateInfo, table: TableRef | None = None, extends: tuple[str, ...] = ()) -> ShardPlan:
    """The plan for a catalog, refusing parameters that would give zero steps; ``extends``: the checksums of the
    plans it updates (``ShardPlan.extends``)."""
    if catalog.total_rows == 0:
        what = f"the predicate {predicate.text!r}" if predicate.kind != "none" else "the dataset"
        raise InvalidValueError(f"{what} matches no row of {url}; nothing to balance")
    balance.check_fills_a_step(catalog.total_rows, world_size, batch_size or 1)
    return ShardPlan(url, catalog, world_size, batch_size, policy, seed, predicate,
                     dataset_fingerprint(catalog.files), table, extends)
