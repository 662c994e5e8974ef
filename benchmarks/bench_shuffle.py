"""Random batches from sorted data (G16): batch quality, model accuracy, throughput and memory, in one run.

Not a test: run it standalone (``python benchmarks/bench_shuffle.py``). The dataset is stored as users store it:
sorted by ``label`` (``label = id * 100 // rows``, 100 classes in order), 4 files, 32 float features drawn
around one Gaussian centre per class. Every figure is a ratio against a baseline run in this process:

- batch quality: mean TV distance of a batch's label histogram from the dataset's, as a ratio to batches of the
  same size cut from a uniform random permutation (what ``DistributedSampler`` gives), per rank and for the global
  batch of all ranks (world 1 and 4, row groups of 5,000 and 50,000 rows); distinct labels per batch. Default
  ``make_loader`` against the fixed 10,000-row window (``shuffle_window=10_000``, the earlier default) and
  Petastorm's own shuffling queue (``make_batch_reader(shuffle_row_groups=True)`` + ``BatchedDataLoader(
  shuffling_queue_capacity=10000)``, on the petastorm stack);
- accuracy: a softmax regression (Adam, 2 epochs, batch 256) trained through each loader, against the same model
  trained on a global permutation of the same rows; test accuracy on i.i.d. rows of the same distribution;
- throughput on unsorted data: rows per CPU-second of one rank's epoch, default against ``shuffle_window=10_000``
  (median over interleaved rounds of each round's ratio);
- peak RSS of one epoch (a fresh process each) with the dataset at 1x and 10x, against the default budget.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
import warnings

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
warnings.simplefilter("ignore")

CLASSES, FEATURES, BATCH = 100, 32, 256
GOALS = {"rank": 1.15, "global": 1.10, "accuracy": 0.97, "throughput": 0.9}
OLD_WINDOW = 10_000


def permuted_batches(url, names):
    """The baseline: every epoch's batches cut from one uniform permutation of all rows (features, label)."""
    import pyarrow.dataset as ds
    import torch
    table = ds.dataset(url).to_table(columns=names + ["label"])
    x = np.stack([table[n].to_numpy() for n in names], 1)
    y = table["label"].to_numpy()

    def permuted(epoch):
        order = np.random.default_rng([7, epoch]).permutation(len(y))
        for i in range(0, len(y) - BATCH + 1, BATCH):
            idx = order[i:i + BATCH]
            yield torch.from_numpy(x[idx]), torch.from_numpy(y[idx])
    return permuted


def write_sorted(path, rows=400_000, *, files=4, row_group=50_000, seed=0, sort=True):
    """``id``, ``label`` and ``x0..x31``, stored sorted by label (``sort=False``: rows in random order)."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    rng = np.random.default_rng(seed)
    centres = np.random.default_rng(1234).normal(0, 1, (CLASSES, FEATURES)).astype(np.float32)
    ids = np.arange(rows, dtype=np.int64)
    label = ids * CLASSES // rows
    if not sort:
        order = rng.permutation(rows)
        ids, label = ids[order], label[order]
    os.makedirs(path, exist_ok=True)
    for i, part in enumerate(np.array_split(np.arange(rows), files)):
        x = centres[label[part]] + rng.normal(0, 2.5, (len(part), FEATURES)).astype(np.float32)
        columns = {"id": ids[part], "label": label[part]}
        columns.update({f"x{j}": x[:, j] for j in range(FEATURES)})
        pq.write_table(pa.table(columns), os.path.join(path, f"part-{i:05d}.parquet"), row_group_size=row_group)
    return path


def test_set(rows=20_000):
    rng = np.random.default_rng(99)
    centres = np.random.default_rng(1234).normal(0, 1, (CLASSES, FEATURES)).astype(np.float32)
    label = rng.integers(0, CLASSES, rows)
    return (centres[label] + rng.normal(0, 2.5, (rows, FEATURES))).astype(np.float32), label


def plan_of(path, world):
    from petastorm_balanced import plan_shards
    return plan_shards(path, world, batch_size=BATCH, engine="local")


def loader_labels(plan, world, epoch=1, **kwargs):
    """Per rank, the label arrays of its batches in ``epoch`` (all columns read: the window is the default's)."""
    from petastorm_balanced import make_loader
    out = []
    for rank in range(world):
        with make_loader(rank, world, plan=plan, backend="arrow", epoch=epoch, **kwargs) as loader:
            out.append([b["label"].numpy() for b in loader])
    return out


def petastorm_labels(path):
    from petastorm import make_batch_reader
    from petastorm.pytorch import BatchedDataLoader
    out = []
    with make_batch_reader("file://" + path, num_epochs=1, shuffle_row_groups=True, seed=1,
                           schema_fields=["label"]) as reader:
        for batch in BatchedDataLoader(reader, batch_size=BATCH, shuffling_queue_capacity=10_000):
            if len(batch["label"]) == BATCH:
                out.append(batch["label"].numpy())
    return out


def quality_rows(path, world, every):
    """(name, rank Quality, global Quality) per loader."""
    from petastorm_balanced.core.quality import Quality
    plan = plan_of(path, world)
    import pyarrow.dataset as ds
    reference = ds.dataset(path).to_table(columns=["label"])["label"].to_numpy()
    rows = []
    loaders = (("make_loader default", {}), (f"shuffle_window={OLD_WINDOW:,}", {"shuffle_window": OLD_WINDOW}))
    for name, kwargs in loaders:
        per_rank = loader_labels(plan, world, **kwargs)
        rank_q = Quality.of([b for r in per_rank for b in r], reference)
        global_q = Quality.of([np.concatenate(step) for step in zip(*per_rank, strict=True)], reference)
        rows.append((name, rank_q, global_q))
    if every and world == 1:
        try:
            rows.append(("Petastorm queue 10,000", Quality.of(petastorm_labels(path), reference), None))
        except ImportError:
            pass
    return rows


def train(batches_of_epoch, epochs=2, seed=0):
    """Softmax regression trained on the batches ``batches_of_epoch(epoch)`` yields; test accuracy."""
    import torch
    torch.set_num_threads(1)  # a tiny model: more threads only contend with the loader's
    torch.manual_seed(seed)
    model = torch.nn.Linear(FEATURES, CLASSES)
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    for epoch in range(epochs):
        for x, y in batches_of_epoch(epoch):
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
    xt, yt = test_set()
    with torch.no_grad():
        return float((model(torch.from_numpy(xt)).argmax(1).numpy() == yt).mean())


def accuracies(path):
    import torch

    from petastorm_balanced import make_loader
    plan = plan_of(path, 1)
    names = [f"x{j}" for j in range(FEATURES)]

    def through(**kwargs):
        loader = make_loader(0, 1, plan=plan, backend="arrow", **kwargs)

        def epoch_batches(epoch):
            loader.set_epoch(epoch)
            for b in loader:
                yield torch.stack([b[n] for n in names], 1), b["label"]
        return train(epoch_batches)

    permuted = permuted_batches(path, names)
    return {"global permutation": train(permuted), "make_loader default": through(),
            f"shuffle_window={OLD_WINDOW:,}": through(shuffle_window=OLD_WINDOW)}


def throughput(path, rounds):
    """Median over interleaved rounds of (default rows per CPU-second / old window's)."""
    from petastorm_balanced import make_loader
    plan = plan_of(path, 1)
    loaders = {"default": make_loader(0, 1, plan=plan, backend="arrow"),
               "old": make_loader(0, 1, plan=plan, backend="arrow", shuffle_window=OLD_WINDOW)}
    ratios = []
    for r in range(rounds):
        speed = {}
        for name, loader in loaders.items():
            loader.set_epoch(r)
            cpu = time.process_time()
            rows = sum(len(b["id"]) for b in loader)
            speed[name] = rows / (time.process_time() - cpu)
        ratios.append(speed["default"] / speed["old"])
    for loader in loaders.values():
        loader.close()
    return float(np.median(ratios)), loaders["default"].shuffle_window


def rss_child(path):
    """One epoch of the default loader in this process; prints the peak RSS growth in MiB."""
    from petastorm_balanced import make_loader
    plan = plan_of(path, 1)
    loader = make_loader(0, 1, plan=plan, backend="arrow")
    base = peak_kib()
    rows = sum(len(b["id"]) for b in loader)
    peak = peak_kib()
    print(json.dumps({"rows": rows, "base_mib": base / 1024, "growth_mib": (peak - base) / 1024,
                      "window": loader.shuffle_window, "budget_mib": loader.shuffle_budget / 2**20}))


def peak_kib():
    """This process's peak resident KiB: ``VmHWM`` where Linux has it (``ru_maxrss`` keeps the peak of the process
    that ran ``exec``, here the parent that wrote the 10x dataset, which hid every growth below it)."""
    try:
        with open("/proc/self/status") as status:
            return next(int(line.split()[1]) for line in status if line.startswith("VmHWM:"))
    except (OSError, StopIteration):
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def rss(path):
    out = subprocess.run([sys.executable, __file__, "--rss-child", path], capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=400_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--parts", default="quality,accuracy,throughput,rss",
                        help="comma-separated: quality, accuracy, throughput, rss, spill (windows on local disk)")
    parser.add_argument("--rss-child", help=argparse.SUPPRESS)
    parser.add_argument("--spill-child", nargs=3, help=argparse.SUPPRESS)
    parser.add_argument("--steady-child", nargs=4, help=argparse.SUPPRESS)
    parser.add_argument("--scales", default="1,10", help="spill: data sizes, as multiples of --rows")
    parser.add_argument("--pairs", type=int, default=None,
                        help="spill: pairs of epochs in one process (default 2 x (rounds // 2) + 1); at 100,000 rows "
                             "an epoch is too short for a pair to mean much: use --rows 1000000 or more")
    parser.add_argument("--speed-only", action="store_true",
                        help="spill: only the one-process throughput pairs (no quality, model, fresh processes)")
    args = parser.parse_args()
    if args.rss_child:
        return rss_child(args.rss_child)
    if args.spill_child:
        return spill_child(args.spill_child[0], int(args.spill_child[1]), args.spill_child[2])
    if args.steady_child:
        path, budget, folder, pairs = args.steady_child
        return steady_child(path, int(budget), folder, int(pairs))
    parts = set(args.parts.split(","))
    tmp = tempfile.mkdtemp(prefix="bench_shuffle_")
    if "spill" in parts:
        spill(tmp, args.rows, [int(v) for v in args.scales.split(",")], max(1, args.rounds // 2), args.pairs,
              args.speed_only)
        if parts == {"spill"}:
            return None
    sorted_50k = write_sorted(os.path.join(tmp, "sorted-50000"), args.rows, row_group=50_000)
    if "quality" in parts:
        quality(tmp, args.rows)
    if "accuracy" in parts:
        acc = accuracies(sorted_50k)
        base = acc["global permutation"]
        for name, value in acc.items():
            print(f"  accuracy {name:<24} {value:.3f} ({value / base:.2f}x of the global permutation; goal >= "
                  f"{GOALS['accuracy']})")
    if "throughput" in parts:
        unsorted = write_sorted(os.path.join(tmp, "unsorted"), args.rows, row_group=50_000, sort=False)
        ratio, window = throughput(unsorted, args.rounds)
        print(f"throughput on unsorted data, rows per CPU-second, default (window {window:,} rows) / shuffle_window="
              f"{OLD_WINDOW:,}: {ratio:.2f}x (median of {args.rounds} interleaved rounds; goal >= "
              f"{GOALS['throughput']})")
    if "rss" in parts:
        big = write_sorted(os.path.join(tmp, "sorted-10x"), args.rows * 10, row_group=50_000)
        small, large = rss(sorted_50k), rss(big)
        print(f"peak RSS growth over one epoch: 1x {small['growth_mib']:.0f} MiB (window {small['window']:,} rows), "
              f"10x {large['growth_mib']:.0f} MiB (window {large['window']:,} rows); budget "
              f"{large['budget_mib']:.0f} MiB; 10x / 1x = {large['growth_mib'] / max(small['growth_mib'], 1):.2f}")


def spill_child(path, budget, spill_dir):
    """One epoch in this process at ``budget`` bytes, windows on ``spill_dir`` ("": none): first-batch latency,
    rows per CPU-second, peak anonymous memory (RssAnon sampled every millisecond) and peak spill disk use."""
    import threading

    from petastorm_balanced import make_loader
    plan = plan_of(path, 1)
    loader = make_loader(0, 1, plan=plan, backend="arrow", shuffle_budget=budget,
                         shuffle_spill_dir=spill_dir or False)
    base, peak, disk, stop = anon_bytes(), [0], [0], threading.Event()

    def sample():  # (this thread's CPU counts to the epoch's: the folder is walked every 10th sample only, since a
        count = 0  # walk every 2 ms cost the spill runs about 2% more CPU than the memory runs)
        while not stop.is_set():
            peak[0] = max(peak[0], anon_bytes())
            if spill_dir and count % 10 == 0:  # a window's files stay until it is served: none is missed
                disk[0] = max(disk[0], sum(os.path.getsize(os.path.join(d, n)) for d, _, names in os.walk(spill_dir)
                                           for n in names if os.path.exists(os.path.join(d, n))))
            count += 1
            time.sleep(0.002)
    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    wall, cpu = time.perf_counter(), time.process_time()
    rows, first = 0, None
    for b in loader:
        first = first if first is not None else time.perf_counter() - wall
        rows += len(b["id"])
    cpu = time.process_time() - cpu
    stop.set()
    thread.join()
    loader.close()
    print(json.dumps({"rows": rows, "first_s": first, "rows_per_cpu_s": rows / cpu, "window": loader.shuffle_window,
                      "peak_anon_mib": (peak[0] - base) / 2**20, "disk_mib": disk[0] / 2**20}))


def steady_child(path, budget, folder, pairs):
    """Both loaders in this process, one warm-up epoch each, then ``pairs`` pairs of epochs (which runs first
    alternates): per pair, spill / memory rows per CPU-second. What a training job sees after its first epoch,
    without the start-up of a fresh process, and both halves of a pair under the same load."""
    from petastorm_balanced import make_loader
    plan = plan_of(path, 1)
    loaders = {"memory": make_loader(0, 1, plan=plan, backend="arrow", shuffle_budget=budget, shuffle_spill_dir=False),
               "spill": make_loader(0, 1, plan=plan, backend="arrow", shuffle_budget=budget, shuffle_spill_dir=folder)}

    def speed(name, epoch):
        loader = loaders[name]
        loader.set_epoch(epoch)
        cpu = time.process_time()
        rows = sum(len(b["id"]) for b in loader)
        return rows / (time.process_time() - cpu)
    for name in loaders:
        speed(name, 0)
    ratios = []
    for epoch in range(1, pairs + 1):
        first, second = ("memory", "spill") if epoch % 2 else ("spill", "memory")
        measured = {first: speed(first, epoch), second: speed(second, epoch)}
        ratios.append(measured["spill"] / measured["memory"])
    for loader in loaders.values():
        loader.close()
    print(json.dumps({"ratios": ratios}))


def anon_bytes():
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) * 1024 for line in status if line.startswith("RssAnon:"))


def spill(tmp, rows, scales, rounds, pairs=None, speed_only=False):
    """At budgets of 1/8 and 1/64 of a slot's decoded rows, sorted data (row groups of 20,000 rows): quality, model
    accuracy, throughput, first-batch latency, memory and disk, with a spill folder against the memory window."""
    from petastorm_balanced import make_loader
    from petastorm_balanced.core.quality import Quality
    from petastorm_balanced.core.shuffle import WINDOW_COPIES
    print(f"windows on local disk: sorted by label, {CLASSES} classes, row groups of 20,000 rows, batch {BATCH}, "
          f"world 1; ratios against a uniform permutation (goals: labels >= 0.9x, TV <= 1.15x, model >= 0.97x, "
          f"throughput >= 0.9x the memory window's)")
    for scale in scales:
        path = write_sorted(os.path.join(tmp, f"spill-{scale}x"), rows * scale, row_group=20_000)
        plan = plan_of(path, 1)
        with make_loader(0, 1, plan=plan, backend="arrow") as probe:
            row = probe._settings.row_bytes  # decoded bytes per row, as the loader measured them
        import pyarrow.dataset as ds
        reference = ds.dataset(path).to_table(columns=["label"])["label"].to_numpy()
        for fraction in (8, 64):
            budget = int(rows * scale * row * WINDOW_COPIES / fraction)
            folder = tempfile.mkdtemp(prefix="spill-", dir=tmp)
            kinds = {"memory": {"shuffle_spill_dir": False}, "spill": {"shuffle_spill_dir": folder}}
            line = [f"  {scale}x ({rows * scale:,} rows) budget 1/{fraction} ({budget / 2**20:.1f} MiB):"]
            if scale == scales[0] and not speed_only:
                for name, kwargs in kinds.items():
                    per_rank = loader_labels(plan, 1, shuffle_budget=budget, **kwargs)
                    q = Quality.of(per_rank[0], reference)
                    line.append(f"{name} labels/batch {q.distinct / q.uniform_distinct:.2f}x TV {q.ratio:.2f}x")
                line.append(accuracy_ratios(plan, budget, kinds))
            runs: dict = {name: [] for name in kinds}
            for _ in range(0 if speed_only else rounds):  # interleaved, each a fresh process
                for name, kwargs in kinds.items():
                    runs[name].append(rss_spill(path, budget, kwargs["shuffle_spill_dir"] or ""))
            steady = subprocess.run([sys.executable, __file__, "--steady-child", path, str(budget),
                                     tempfile.mkdtemp(prefix="spill-", dir=tmp), str(pairs or 2 * rounds + 1)],
                                    capture_output=True, text=True, check=True)
            ratios = json.loads(steady.stdout.strip().splitlines()[-1])["ratios"]
            fresh = ""
            if not speed_only:
                speed = np.median([s["rows_per_cpu_s"] / m["rows_per_cpu_s"]
                                   for s, m in zip(runs["spill"], runs["memory"], strict=True)])
                fresh = f"fresh processes, one epoch each {speed:.2f}x (median of {rounds} pairs); "
                for name, measured in runs.items():
                    last = measured[-1]
                    line.append(f"{name}: window {last['window']:,} rows, first batch {last['first_s']:.2f} s, peak "
                                f"anon +{last['peak_anon_mib']:.0f} MiB, disk {last['disk_mib']:.0f} MiB")
            line.append(f"spill / memory rows per CPU-second: {fresh}one process, epochs after the first "
                        f"{np.median(ratios):.2f}x (median of {len(ratios)} pairs, {min(ratios):.2f}-"
                        f"{max(ratios):.2f}); load average {os.getloadavg()[0]:.1f}")
            print("\n    ".join(line))


def accuracy_ratios(plan, budget, kinds):
    import torch

    from petastorm_balanced import make_loader
    names = [f"x{j}" for j in range(FEATURES)]

    def through(**kwargs):
        loader = make_loader(0, 1, plan=plan, backend="arrow", shuffle_budget=budget, **kwargs)

        def epoch_batches(epoch):
            loader.set_epoch(epoch)
            for b in loader:
                yield torch.stack([b[n] for n in names], 1), b["label"]
        return train(epoch_batches)
    base = train(permuted_batches(plan.dataset_url, names))
    return "model accuracy / a permutation's: " + ", ".join(
        f"{name} {through(**kwargs) / base:.2f}x" for name, kwargs in kinds.items())


def rss_spill(path, budget, folder):
    out = subprocess.run([sys.executable, __file__, "--spill-child", path, str(budget), folder], capture_output=True,
                         text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def quality(tmp, rows):
    print(f"sorted by label: {rows:,} rows, {CLASSES} classes, 4 files, batch {BATCH}; TV ratio = mean batch "
          "TV / a uniform permutation's (goal: rank <= 1.15, global <= 1.10)")
    met = True
    for row_group in (5_000, 50_000):
        path = write_sorted(os.path.join(tmp, f"sorted-{row_group}"), rows, row_group=row_group)
        for world in (1, 4):
            for name, rank_q, global_q in quality_rows(path, world, every=row_group == 50_000):
                line = (f"  rg {row_group:>6,} world {world}  {name:<24} rank TV {rank_q.tv:.3f} "
                        f"({rank_q.ratio:.2f}x; uniform {rank_q.uniform_tv:.3f}), labels/batch {rank_q.distinct:5.1f} "
                        f"(uniform {rank_q.uniform_distinct:5.1f})")
                if global_q is not None and world > 1:
                    line += f"; global TV {global_q.tv:.3f} ({global_q.ratio:.2f}x)"
                print(line)
                if name == "make_loader default":
                    met &= rank_q.ratio <= GOALS["rank"] or world > 1
                    met &= global_q is None or global_q.ratio <= GOALS["global"]
    print(f"quality goals at world 1 (rank) and the global batch of world 4: {'met' if met else 'NOT met'}")


if __name__ == "__main__":
    main()
