"""``plan_shards``: normalize the inputs once, let an engine build the catalog, balance, save."""
from __future__ import annotations

import logging
import time
from typing import Optional

from ..io import fs as fsutil
from ..plan import balance
from ..plan.catalog import Catalog
from ..plan.format import dataset_fingerprint
from ..plan.model import ShardPlan
from ..plan.predicate import PredicateInfo, predicate_info

ENGINES = ("spark", "local")
log = logging.getLogger(__name__)


def plan_shards(dataset_url, world_size: int, *, where: Optional[str] = None, predicate=None,
                batch_size: Optional[int] = None, policy: str = "drop", seed: int = 0, engine: str = "spark",
                spark=None, output_url=None, progress=None) -> ShardPlan:
    """Scan ``dataset_url``, keep the rows that match ``where`` (Spark SQL) or ``predicate`` (Petastorm), and
    balance them over ``world_size`` ranks; saves the plan when ``output_url`` is given.

    ``batch_size`` may be left out and given to the loader instead; the plan then balances rows, not batches.
    ``progress``, a callable taking a count, hears of each footer the local engine reads (the CLI's progress line).
    """
    balance.check_params(world_size=world_size, seed=seed, **({} if batch_size is None else
                                                                {"batch_size": batch_size}))
    balance.check_policy(policy)
    if engine not in ENGINES:
        raise ValueError(f"engine={engine!r} is not one of {ENGINES}")
    if where is not None and predicate is not None:
        raise ValueError("pass where= (Spark SQL) or predicate= (Petastorm), not both")
    if where is not None and (not isinstance(where, str) or not where.strip()):
        raise ValueError(f"where={where!r} must be a non-empty Spark SQL boolean expression")
    url = fsutil.normalize_url(dataset_url)
    timings = {"footers": 0.0}
    described = predicate_info(where, predicate)  # before scanning: a predicate we cannot fingerprint fails fast
    if engine == "local":
        if where is not None:
            raise ValueError("where= is Spark SQL and needs engine='spark'; with engine='local' pass a Petastorm "
                             "predicate= instead")
        from .engines.local import build_catalog
        started = time.perf_counter()
        catalog = build_catalog(url, predicate=predicate, progress=progress)
        timings["predicate" if predicate is not None else "footers"] = time.perf_counter() - started
    else:
        from .engines.spark import build_catalog
        catalog = build_catalog(url, where=where, predicate=predicate, spark=spark, timings=timings)
    started = time.perf_counter()
    plan = make_plan(url, catalog, world_size=world_size, batch_size=batch_size, policy=policy, seed=seed,
                     predicate=described)
    timings["balance"] = time.perf_counter() - started
    if output_url is not None:
        started = time.perf_counter()
        plan.save(output_url)
        timings["write"] = time.perf_counter() - started
    log.info("time: %s", time_summary(timings))
    return plan


def time_summary(timings: dict) -> str:
    """One line saying where planning's time went, steps in pipeline order (``encode`` is task time, summed over
    tasks, inside ``where``)."""
    steps = [k for k in ("session", "footers", "where", "encode", "predicate", "balance", "write") if k in timings]
    text = ", ".join(f"{k} {timings[k]:.2f} s" for k in steps if k != "session" or timings[k] >= 0.005)
    return f"{text}; total {sum(v for k, v in timings.items() if k != 'encode'):.2f} s"


def make_plan(url: str, catalog: Catalog, *, world_size: int, batch_size: Optional[int], policy: str, seed: int,
              predicate: PredicateInfo) -> ShardPlan:
    """The plan for a catalog, refusing parameters that would give zero steps."""
    if catalog.total_rows == 0:
        what = f"the predicate {predicate.text!r}" if predicate.kind != "none" else "the dataset"
        raise ValueError(f"{what} matches no row of {url}; nothing to balance")
    needed = world_size * (batch_size or 1)
    if catalog.total_rows < needed:
        raise ValueError(f"{catalog.total_rows} matching rows cannot give one step to world_size={world_size} x "
                         f"batch_size={batch_size or 1}; lower batch_size or world_size")
    return ShardPlan(url, catalog, world_size, batch_size, policy, seed, predicate,
                     dataset_fingerprint(catalog.files))
