"""The problem petastorm-balanced fixes, shown with plain Petastorm: per-rank step counts under
``cur_shard``/``shard_count``.

Every rank of a DDP job must take the same number of steps, because each step is an all-reduce that all ranks
join. Petastorm shards by whole row groups, round robin, before the predicate runs, so one rank can get many
more matching rows than another. A job started that way hangs (or times out) at the first step the shortest rank
does not take. To show this without hanging anything, this script opens one real Petastorm reader per rank, one
after another in a single process, and counts what each rank would get through ``petastorm.pytorch``'s
``BatchedDataLoader`` (which yields a final short batch, as it does in training).

    python examples/petastorm_imbalance.py DATASET_URL --world-size 2 --batch-size 32 [--lang en] [--plan PLAN]

With ``--plan`` the balanced plan's steps per epoch are printed beside, for the same world size and batch size.
``--json`` prints one JSON object instead of the table (for scripts and tests).
"""
from __future__ import annotations

import argparse
import json
import sys
import warnings

# Petastorm 0.12.1 on pyarrow 14 warns about its legacy dataset API on every row group; the counts are the point.
warnings.filterwarnings("ignore", category=FutureWarning)
warnings.filterwarnings("ignore", message="The given NumPy array is not writable")


def lang_predicate(lang: str | None):
    """``lang == <lang>`` as a Petastorm predicate, or None for no filtering.

    ``in_lambda`` hands the batch reader a pandas Series, and ``==`` is vectorized over it, so the same lambda
    works for ``make_batch_reader`` (a Series) and for per-row evaluation (a scalar).
    """
    if not lang:
        return None
    from petastorm.predicates import in_lambda
    return in_lambda(["lang"], lambda value: value == lang)


def petastorm_rank_counts(dataset_url: str, world_size: int, batch_size: int, predicate=None) -> list:
    """What each rank gets from ``make_batch_reader(cur_shard=rank, shard_count=world_size)`` for one epoch.

    Returns one dict per rank: ``rank``, ``rows`` (rows delivered), ``steps`` (batches ``BatchedDataLoader``
    yields, the last one possibly short) and ``full_steps`` (batches with ``drop_last``). Readers run one after
    another, so nothing waits on anything else.
    """
    from petastorm import TransformSpec, make_batch_reader
    from petastorm.pytorch import BatchedDataLoader

    from petastorm_balanced.io.fs import normalize_url

    dataset_url = normalize_url(dataset_url)  # Petastorm refuses scheme-less paths
    # Only ``id`` becomes a tensor (``lang`` is a string). Petastorm 0.12.1 calls the spec's func unconditionally
    # when a predicate is set and before dropping unselected columns, so the func drops them itself.
    _ids_only = TransformSpec(lambda frame: frame[["id"]], selected_fields=["id"])
    fields = ["id"] + (sorted(set(predicate.get_fields()) - {"id"}) if predicate is not None else [])
    counts = []
    for rank in range(world_size):
        rows = steps = 0
        with make_batch_reader(dataset_url, schema_fields=fields, predicate=predicate, num_epochs=1,
                               cur_shard=rank, shard_count=world_size, shuffle_row_groups=False,
                               reader_pool_type="thread", workers_count=2,
                               transform_spec=_ids_only) as reader:
            for batch in BatchedDataLoader(reader, batch_size=batch_size):
                rows += len(batch["id"])
                steps += 1
        counts.append({"rank": rank, "rows": rows, "steps": steps, "full_steps": rows // batch_size})
    return counts


def balanced_steps(plan_url: str, world_size: int, batch_size: int) -> int:
    from petastorm_balanced import load_plan
    return load_plan(plan_url).steps_per_epoch(world_size=world_size, batch_size=batch_size)


def format_report(counts: list, batch_size: int, balanced: int | None) -> str:
    steps = [c["steps"] for c in counts]
    lines = [f"plain Petastorm cur_shard/shard_count, world_size={len(counts)}, batch_size={batch_size}",
             f"{'rank':>4} {'rows':>8} {'steps':>6} {'full':>6}" + ("  balanced" if balanced is not None else "")]
    for c in counts:
        lines.append(f"{c['rank']:>4} {c['rows']:>8} {c['steps']:>6} {c['full_steps']:>6}"
                     + (f"  {balanced:>8}" if balanced is not None else ""))
    lo, hi = min(steps), max(steps)
    if lo == hi:
        lines.append(f"petastorm: every rank takes {lo} steps (this data happens to shard evenly)")
    else:
        short = [c["rank"] for c in counts if c["steps"] == lo]
        lines.append(f"petastorm: steps per rank range {lo}..{hi}; under DDP rank(s) {short} finish after {lo} "
                     f"steps and the others block in all-reduce at step {lo + 1} until the process group times "
                     f"out ({hi - lo} step(s) of difference)")
    if balanced is not None:
        lines.append(f"balanced plan: every rank takes {balanced} steps of exactly {batch_size} rows")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("dataset_url")
    parser.add_argument("--world-size", type=int, required=True)
    parser.add_argument("--batch-size", type=int, required=True)
    parser.add_argument("--lang", default="en", help="keep rows with this lang (empty string: keep all rows)")
    parser.add_argument("--plan", help="a balanced plan URL to print its steps per epoch beside")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    if args.world_size < 1 or args.batch_size < 1:
        parser.error(f"--world-size={args.world_size} and --batch-size={args.batch_size} must both be >= 1")
    counts = petastorm_rank_counts(args.dataset_url, args.world_size, args.batch_size, lang_predicate(args.lang))
    balanced = balanced_steps(args.plan, args.world_size, args.batch_size) if args.plan else None
    if args.json:
        print(json.dumps({"world_size": args.world_size, "batch_size": args.batch_size, "ranks": counts,
                          "balanced_steps": balanced}))
    else:
        print(format_report(counts, args.batch_size, balanced))
    return 0


if __name__ == "__main__":
    sys.exit(main())
