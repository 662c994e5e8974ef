"""Packed sequences (``make_loader(pack=..., seq_len=..., batch_size=...)``): padding, attention balance, speed.

Not a test: run it standalone (``python benchmarks/bench_pack.py``). Figures, for two length distributions
(``lognormal``: median 90 tokens, sigma 1, clipped to [1, 3 L]; ``web-like``: 70% lognormal median 230 sigma 1.1
and 30% lognormal median 40 sigma 0.8, clipped the same way, the shape of web text and chat turns), L = 512 and
16 sequences a step:

- padding fraction (slots holding no token / all slots) of our packing against Grain's ``FirstFitPackIterDataset``
  and ``BestFitPackIterDataset`` (16 bins, the documents of each rank in the same shuffled order, cut at L like ours
  so every packer sees the same pieces); Grain is optional: without it the line says "grain not installed";
- the slowest rank's attention cost (sum over pieces of length squared) over the ranks' mean, per step: the mean and
  the worst over the epoch's steps, at 8 and 64 ranks, and the share of tokens left out (documents that found no
  room in their window's steps). The ranks' documents are dealt as a plan deals them: row groups of 1,000
  documents in the cost-dealt order (``core/cost/order.cost_order``), equal documents per rank, one window per
  rank, and the steps are the loader's: enough for the rank the plan says holds the most tokens
  (``core/packing.window_steps``);
- tokens per CPU-second of a packed loader against the unpacked one (``list_format="padded"``, batches of 16
  documents) over the same Parquet dataset, in one process, interleaved rounds (``--rounds``).
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
import warnings

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
warnings.simplefilter("ignore")

from petastorm_balanced.core.cost.order import cost_order  # noqa: E402
from petastorm_balanced.core.packing import Packing, pack_step, window_steps  # noqa: E402

SEQ_LEN, SEQUENCES, ROW_GROUP = 512, 16, 1000


def lengths_of(kind: str, count: int, rng: np.random.Generator) -> np.ndarray:
    if kind == "lognormal":
        raw = rng.lognormal(np.log(90), 1.0, count)
    else:
        web = rng.random(count) < 0.7
        raw = np.where(web, rng.lognormal(np.log(230), 1.1, count), rng.lognormal(np.log(40), 0.8, count))
    return np.clip(raw.astype(np.int64), 1, 3 * SEQ_LEN)


def ranks_windows(lengths: np.ndarray, world: int, seed: int = 0) -> tuple[list[np.ndarray], np.ndarray]:
    """Each rank's documents as a plan deals them (row groups in the cost-dealt order, equal rows per rank), and
    the tokens the plan estimates for each rank (exact for whole row groups, a split one at its mean)."""
    groups = np.array_split(lengths, max(1, len(lengths) // ROW_GROUP))
    counts = np.array([len(g) for g in groups])
    sums = np.array([int(g.sum()) for g in groups])
    order = cost_order(counts, sums, seed=seed, epoch=0)
    dealt = np.concatenate([groups[i] for i in order])
    per_rank = len(dealt) // world
    x = np.r_[0, np.cumsum(counts[order])].astype(np.float64)  # rows and tokens at row group boundaries
    y = np.r_[0, np.cumsum(sums[order])].astype(np.float64)
    estimates = np.diff(np.interp(np.arange(world + 1) * per_rank, x, y))
    return [dealt[r * per_rank:(r + 1) * per_rank] for r in range(world)], estimates


def ours(windows: list[np.ndarray], mean: float, estimates: np.ndarray, ranks: int | None = None) -> dict:
    """Our packing of each rank's window, with the loader's steps: from every rank's estimated tokens."""
    world = len(windows)
    steps_rule = window_steps(np.arange(world), np.full(world, len(windows[0])), estimates, world_size=world,
                              window_rows=len(windows[0]), step_tokens=SEQ_LEN * SEQUENCES)
    packing = Packing("tokens", SEQ_LEN, SEQUENCES, mean, window_steps=steps_rule)
    steps = packing.steps_of_window(0, len(windows[0]))
    ranks = world if ranks is None else ranks
    attention = np.zeros((ranks, steps))
    padding = left = 0
    for rank, lengths in enumerate(windows[:ranks]):
        order, counts = packing.arrange(lengths, (0, 0, rank, 0, 0))
        left += int(lengths.sum() - lengths[order].sum())
        ends = np.cumsum(counts)
        for step, (end, count) in enumerate(zip(ends, counts, strict=True)):
            layout = pack_step(lengths[order[end - count:end]], seq_len=SEQ_LEN, sequences=SEQUENCES)
            attention[rank, step] = float((layout.length.astype(np.float64) ** 2).sum())
            padding += SEQ_LEN * SEQUENCES - int(layout.length.sum())
    ratio = attention.max(axis=0) / attention.mean(axis=0)
    tokens = sum(int(w.sum()) for w in windows[:ranks])
    return {"steps": steps, "padding": padding / (ranks * steps * SEQ_LEN * SEQUENCES),
            "left_out": left / tokens, "ratio_mean": float(ratio.mean()), "ratio_worst": float(ratio.max())}


def grain_padding(windows: list[np.ndarray], seed: int = 0) -> dict | None:
    """Grain's first-fit and best-fit padding on the same pieces (None without grain); Grain packs a Python dict
    per piece, so ``--grain-ranks`` limits it to the first ranks' windows."""
    try:
        import grain
    except ImportError:
        return None
    out = {}
    for name, cls in (("first-fit", grain.experimental.FirstFitPackIterDataset),
                      ("best-fit", grain.experimental.BestFitPackIterDataset)):
        slots = used = 0
        for rank, lengths in enumerate(windows):
            pieces = []
            for length in np.random.default_rng([seed, rank]).permutation(lengths).tolist():
                pieces += [SEQ_LEN] * (length // SEQ_LEN) + ([length % SEQ_LEN] if length % SEQ_LEN else [])
            source = grain.MapDataset.source([{"tokens": np.ones(n, dtype=np.int32)} for n in pieces])
            packed = cls(source.to_iter_dataset(), length_struct={"tokens": SEQ_LEN}, num_packing_bins=SEQUENCES,
                         shuffle_bins=False)
            for element in packed:
                segments = element["tokens_segment_ids"]
                slots += segments.size
                used += int((segments > 0).sum())
        out[name] = 1 - used / slots
    return out


def throughput(docs: int, rounds: int) -> dict:
    """Tokens per CPU-second, packed against unpacked (padded lists), over one rank of world 1."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from petastorm_balanced import make_loader, plan_shards
    rng = np.random.default_rng(3)
    lengths = lengths_of("lognormal", docs, rng)
    offsets = np.r_[0, np.cumsum(lengths)].astype(np.int32)
    values = rng.integers(0, 50_000, int(offsets[-1])).astype(np.int32)
    with tempfile.TemporaryDirectory() as root:
        table = pa.table({"tokens": pa.ListArray.from_arrays(pa.array(offsets), pa.array(values))})
        pq.write_table(table, os.path.join(root, "part-0.parquet"), row_group_size=ROW_GROUP)
        plan = plan_shards(root, 1, engine="local", cost="size(tokens)")
        loaders = {"packed": dict(batch_size=SEQUENCES, pack="tokens", seq_len=SEQ_LEN),
                   "unpacked": dict(batch_size=SEQUENCES, list_format="padded", balance="rows")}
        cpu: dict[str, list[float]] = {name: [] for name in loaders}
        for _ in range(rounds):
            for name, kwargs in loaders.items():
                loader = make_loader(0, 1, plan=plan, batch_format="numpy", backend="arrow", **kwargs)
                start = time.process_time()
                for _batch in loader:
                    pass
                cpu[name].append(time.process_time() - start)
        tokens = int(lengths.sum())
    rates = {name: tokens / float(np.median(times)) for name, times in cpu.items()}
    return {**rates, "ratio": rates["packed"] / rates["unpacked"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--docs-per-rank", type=int, default=20_000)
    parser.add_argument("--throughput-docs", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--skip-throughput", action="store_true")
    parser.add_argument("--grain-ranks", type=int, default=2, help="ranks whose documents Grain packs (it is slow)")
    args = parser.parse_args()
    print(f"L={SEQ_LEN}, {SEQUENCES} sequences a step; load average {os.getloadavg()[0]:.1f}")
    for kind in ("lognormal", "web-like"):
        for world in (8, 64):
            docs = args.docs_per_rank if world == 8 else max(2_000, args.docs_per_rank // 2)
            lengths = lengths_of(kind, docs * world, np.random.default_rng([world, len(kind)]))
            windows, estimates = ranks_windows(lengths, world)
            figures = ours(windows, float(lengths.mean()), estimates)
            print(f"{kind:9s} world {world:2d}: {docs:,} docs/rank, {figures['steps']} steps; padding "
                  f"{figures['padding']:.2%}, left out {figures['left_out']:.3%}; slowest rank / mean attention "
                  f"per step: mean {figures['ratio_mean']:.3f}, worst {figures['ratio_worst']:.3f}")
            if world == 8:
                grain_figures = grain_padding(windows[:args.grain_ranks]) if args.grain_ranks else None
                if grain_figures is None:
                    print("           grain not installed (pip install grain): no Grain padding to compare")
                else:
                    mine = ours(windows, float(lengths.mean()), estimates, ranks=args.grain_ranks)["padding"]
                    print(f"           the first {args.grain_ranks} ranks' documents: ours {mine:.2%}, Grain " +
                          ", ".join(f"{name} {value:.2%}" for name, value in grain_figures.items()))
    if not args.skip_throughput:
        rates = throughput(args.throughput_docs, args.rounds)
        print(f"tokens per CPU-second, one rank: packed {rates['packed']:,.0f}, unpacked (padded lists) "
              f"{rates['unpacked']:,.0f}: {rates['ratio']:.2f}x")


if __name__ == "__main__":
    main()
