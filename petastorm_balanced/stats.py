"""Input-pipeline statistics across ranks: which rank is the straggler, and what limits it.

With equal steps every rank waits for the slowest one at each all-reduce, so one slow rank (a slow disk, a hot
object-store prefix, a share of heavier rows) slows the whole job. ``gather(loader)``, called by every rank at an
epoch's end, collects each rank's ``loader.stats()`` and names the rank whose training loop waited longest for its
batches (the others wait for it inside the all-reduce, which their loaders count as training time) and the stage
that bounded it. It is a collective: every rank must call it, like ``all_reduce``.

Transport, the first that applies: ``torch.distributed`` when it is initialized (``all_gather_object``), Horovod
when it is initialized (``horovod.torch.allgather_object``), else JSON files in ``folder`` (a directory every rank
can read: a shared disk), else, with one rank, nothing.
"""
from __future__ import annotations

import json
import logging
import os
import time
from typing import Any

from .errors import InvalidValueError

LOG = logging.getLogger("petastorm_balanced.stats")
POLL_S = 0.05


def gather(loader: Any, *, folder: str | os.PathLike[str] | None = None, timeout_s: float = 600.0,
           log: bool = True) -> dict:
    """Every rank's ``loader.stats()`` for the epoch so far, and who bounded the job.

    Returns ``{"ranks": [stats of rank 0, rank 1, ...], "slowest_rank": r, "limit": that rank's limit,
    "wait_s": [per rank], "spread": the slowest's wait over the median rank's, "epoch_index": e}`` on every rank;
    with ``log`` (default) it is also logged (``logging``, logger ``petastorm_balanced.stats``, level INFO) as one
    line by rank 0. ``folder``: where ranks exchange files when no distributed framework is initialized (each rank
    writes ``stats-e<epoch>-r<rank>.json`` and waits up to ``timeout_s`` for the others').
    """
    mine = loader.stats()
    rank, world = int(mine["rank"]), int(mine["world_size"])
    ranks = _exchange(mine, rank, world, folder, timeout_s)
    report = across(ranks)
    if log and rank == 0:
        LOG.info(describe(report))
    return report


def across(ranks: list[dict]) -> dict:
    """Who bounded the job among ``ranks`` (each a ``loader.stats()``, in rank order): the rank that waited
    longest for batches, its limiting stage, and how far it is from the median rank."""
    waits = [float(r["wait_s"]) for r in ranks]
    slowest = max(range(len(ranks)), key=lambda i: (waits[i], -i))
    ordered = sorted(waits)
    median = ordered[len(ordered) // 2]
    spread = waits[slowest] / median if median > 0 else (1.0 if waits[slowest] == 0 else float("inf"))
    return {"ranks": ranks, "slowest_rank": int(ranks[slowest].get("rank", slowest)),
            "limit": ranks[slowest].get("limit"), "wait_s": waits, "spread": round(spread, 3),
            "epoch_index": ranks[slowest].get("epoch_index")}


def describe(report: dict) -> str:
    """One line for a log: the slowest rank, its limit and the evidence."""
    r = report["ranks"][report["slowest_rank"]] if report["slowest_rank"] < len(report["ranks"]) else {}
    share = r.get("evidence", {}).get("stage_share", {})
    top = ", ".join(f"{k} {v:.0%}" for k, v in list(share.items())[:3])
    waits = " ".join(f"{w:.2f}" for w in report["wait_s"])
    return (f"input pipeline, epoch {report['epoch_index']}: slowest rank {report['slowest_rank']} waited "
            f"{report['wait_s'][report['slowest_rank']]:.2f} s for batches ({report['spread']}x the median rank; "
            f"waits per rank: {waits} s), limited by {report['limit']!r} (stage shares: {top or 'none'})")


def _exchange(mine: dict, rank: int, world: int, folder, timeout_s: float) -> list[dict]:
    if world == 1:
        return [mine]
    gathered = _torch(mine, world)
    if gathered is None:
        gathered = _horovod(mine, world)
    if gathered is None and folder is not None:
        gathered = _files(mine, rank, world, os.fspath(folder), timeout_s)
    if gathered is None:
        raise InvalidValueError(f"gather() over {world} ranks needs torch.distributed or Horovod initialized, or "
                                "folder= a directory every rank can read and write (a shared disk)")
    return sorted(gathered, key=lambda s: s["rank"])


def _torch(mine: dict, world: int) -> list[dict] | None:
    try:
        import torch.distributed as dist
    except ImportError:
        return None
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() != world:
        return None
    out: list[Any] = [None] * world
    dist.all_gather_object(out, mine)
    return out


def _horovod(mine: dict, world: int) -> list[dict] | None:
    try:
        import horovod.torch as hvd
        if not hvd.is_initialized() or hvd.size() != world:
            return None
    except (ImportError, ValueError):
        return None
    return list(hvd.allgather_object(mine))


def _files(mine: dict, rank: int, world: int, folder: str, timeout_s: float) -> list[dict]:
    """Each rank writes its file (atomically: written aside, then renamed) and reads every rank's."""
    os.makedirs(folder, exist_ok=True)
    epoch = mine.get("epoch_index")

    def path(r: int) -> str:
        return os.path.join(folder, f"stats-e{epoch}-r{r}.json")
    aside = path(rank) + f".{os.getpid()}.tmp"
    with open(aside, "w") as f:
        json.dump(mine, f)
    os.replace(aside, path(rank))
    deadline = time.monotonic() + timeout_s
    out: list[dict] = []
    for r in range(world):
        while not os.path.exists(path(r)):
            if time.monotonic() > deadline:
                raise TimeoutError(f"gather(folder={folder!r}): rank {r} wrote no {os.path.basename(path(r))} "
                                   f"within {timeout_s} s; every rank must call gather() at the same epoch's end")
            time.sleep(POLL_S)
        with open(path(r)) as f:
            out.append(json.load(f))
    return out
