"""``plan_shards``: normalize the inputs once, let an engine build the catalog, balance, save."""
from __future__ import annotations

from typing import Optional

from ..io import fs as fsutil
from ..plan import balance
from ..plan.catalog import Catalog
from ..plan.format import dataset_fingerprint
from ..plan.model import ShardPlan
from ..plan.predicate import PredicateInfo, predicate_info

ENGINES = ("spark", "local")


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
    described = predicate_info(where, predicate)  # before scanning: a predicate we cannot fingerprint fails fast
    if engine == "local":
        if where is not None:
            raise ValueError("where= is Spark SQL and needs engine='spark'; with engine='local' pass a Petastorm "
                             "predicate= instead")
        from .engines.local import build_catalog
        catalog = build_catalog(url, predicate=predicate, progress=progress)
    else:
        from .engines.spark import build_catalog
        catalog = build_catalog(url, where=where, predicate=predicate, spark=spark)
    plan = make_plan(url, catalog, world_size=world_size, batch_size=batch_size, policy=policy, seed=seed,
                     predicate=described)
    if output_url is not None:
        plan.save(output_url)
    return plan


def make_plan(url: str, catalog: Catalog, *, world_size: int, batch_size: Optional[int], policy: str, seed: int,
              predicate: PredicateInfo) -> ShardPlan:
    """The plan for a catalog, refusing parameters that would give zero steps."""
    if catalog.total_rows == 0:
        what = f"the predicate {predicate.text!r}" if predicate.kind != "none" else "the dataset"
        raise ValueError(f"{what} matches no row of {url}; nothing to balance")
    balance.check_fills_a_step(catalog.total_rows, world_size, batch_size or 1)
    return ShardPlan(url, catalog, world_size, batch_size, policy, seed, predicate,
                     dataset_fingerprint(catalog.files))
