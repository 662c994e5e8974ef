"""Read throughput, decode work, memory and resume latency of make_loader, measured beside Petastorm.

Not a test: run it standalone (``python benchmarks/bench_read.py``); every ratio compares figures measured in the
same process, on the same rows, with the same worker count.

- rows/s: raw pyarrow ``read_row_group`` + numpy (one thread, every row group) vs Petastorm
  ``make_batch_reader`` + ``petastorm.pytorch.BatchedDataLoader`` (unshuffled, and with a shuffling queue) vs
  ``make_loader`` with each backend (``[arrow]``, ``[petastorm]``; unshuffled, and with a shuffle window of the
  same size). World size 1, so all read every row group of the dataset. Numeric columns only where
  BatchedDataLoader takes part (it cannot batch strings). On a stack without Petastorm only the Arrow backend and
  raw pyarrow run.
- rows per CPU-second (``process_time``: every thread of the process) of the same runs, and their ratios against
  raw pyarrow (the goal: >= 0.9x for numeric, shuffled, all columns and the conformance types: strings,
  lists, nullable columns with their ``__valid`` masks), plus raw pyarrow without its own decode threads, raw
  pyarrow reading in as many threads as the loader (what parallel reading itself costs per CPU-second), and raw
  pyarrow with a NumPy shuffle of the same window (what shuffling rows itself costs). Twice:
  ``make_loader`` and one epoch per round (its setup, footers read for the batch schema, counted each time), and
  ``_made``: epochs of one loader made before the rounds, as a training loop has it.
- rows decoded per row delivered, for a plan with a predicate (plain) and a Petastorm dataset with codecs.
- peak RSS of one rank reading a whole epoch, for the dataset and one ``--scale`` times larger (subprocesses).
- time to the first batch after resuming at 90% of an epoch, against a fresh start.
- list columns (``bench_lists.per_value``): rows per CPU-second of a fixed-length ``list<float>`` of 4 (a
  ``(batch, 4)`` tensor) and a variable-length ``list<int32>`` (``list_format="padded"``) against the same numbers
  stored as plain columns (goal: at most 1.3x their cost).
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys
import tempfile
import time
import warnings

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
warnings.simplefilter("ignore")

NUMERIC = ["id", "value", "label"]
# the conformance columns but the list column: Python lists (the delivered type of a list column) are GC-tracked
# objects, one per row, where raw pyarrow's to_numpy gives numpy arrays the collector never scans
NOT_LISTS = ["id", "name", "count", "score", "flag"]
CPU_GOAL = 0.9  # the Arrow backend's rows per CPU-second against raw pyarrow's


def dataset(path, rows, seed=7, kind="plain"):
    """The skewed generator with its default row group sizes (32 to 4096 rows, lognormal file sizes)."""
    from petastorm_balanced import datagen
    if os.path.isdir(path) and os.path.exists(os.path.join(path, "_SUCCESS")):
        return "file://" + path
    make = datagen.make_petastorm_dataset if kind == "petastorm" else datagen.make_plain_dataset
    return make(path, num_files=max(4, rows // 20_000), total_rows=rows, seed=seed).url


def measure(repeats, contenders, cpu_rates=None, cpu_clock=time.process_time):
    """Rows/s of each ``name -> fn`` (``fn`` returns the rows it delivered) per round; runs are interleaved, so a
    burst of load on a shared machine hits every contender alike, and a first warm-up round is dropped.
    ``cpu_rates`` (a dict) also gets rows per CPU-second of this process (all its threads: ``process_time``), the
    figure a shared machine disturbs least and the one that counts our reader threads against raw's one. Each run
    starts after a full garbage collection, so none pays for cycles another left. ``cpu_clock``: another CPU clock
    (``bench_layouts`` counts the DataLoader's worker processes too)."""
    rates = {name: [] for name in contenders}
    if cpu_rates is not None:
        cpu_rates.update({name: [] for name in contenders})
    for round_ in range(repeats + 1):
        for name, fn in contenders.items():
            # the garbage an earlier contender left (Petastorm's reader leaves reference cycles) is collected here,
            # untimed, rather than by whichever contender's allocations trigger the next collection
            gc.collect()
            start, start_cpu = time.perf_counter(), cpu_clock()
            rows = fn()
            wall, cpu = time.perf_counter() - start, cpu_clock() - start_cpu
            if round_:
                rates[name].append(rows / wall)
                if cpu_rates is not None:
                    cpu_rates[name].append(rows / max(cpu, 1e-9))
    return rates


def ratio(rates, numerator, denominator):
    """Median over rounds of the per-round ratio (robust to load bursts that best-of would reward)."""
    return float(np.median(np.array(rates[numerator]) / np.array(rates[denominator])))


def raw_pyarrow(plan, columns=NUMERIC, use_threads=True):
    """The floor: one thread, each file opened once, ``read_row_group`` of every row group, columns to numpy
    (pyarrow's defaults; ``use_threads=False`` also turns off pyarrow's own decode threads)."""
    import pyarrow.parquet as pq

    from petastorm_balanced.io import fs as fsutil
    _, root = fsutil.resolve(plan.dataset_url)
    rows, files = 0, {}
    for group in plan.catalog.row_groups:
        if group.path not in files:
            files[group.path] = pq.ParquetFile(f"{root}/{group.path}")
        table = files[group.path].read_row_group(group.row_group, columns=columns, use_threads=use_threads)
        arrays = [table.column(c).to_numpy() for c in table.column_names]
        rows += len(arrays[0])
    return rows


def raw_pyarrow_shuffled(plan, window, columns=NUMERIC):
    """``raw_pyarrow`` with the cheapest row shuffle one could write over it: rows gathered into windows of
    ``window`` rows, each window permuted by NumPy's ``Generator.permutation`` (whose stream NumPy does not promise
    across versions, so a loader cannot resume by it) and every column gathered by it. No goal: it tells what
    shuffling rows itself costs per CPU-second against reading them."""
    import pyarrow.parquet as pq

    from petastorm_balanced.io import fs as fsutil
    _, root = fsutil.resolve(plan.dataset_url)
    rng = np.random.default_rng(0)
    rows, files, pending, held = 0, {}, [], 0

    def flush():
        columns_ = [np.concatenate(parts) for parts in zip(*pending, strict=True)]
        order = rng.permutation(len(columns_[0]))
        return len([column[order] for column in columns_][0])
    for group in plan.catalog.row_groups:
        if group.path not in files:
            files[group.path] = pq.ParquetFile(f"{root}/{group.path}")
        table = files[group.path].read_row_group(group.row_group, columns=columns)
        pending.append([table.column(c).to_numpy() for c in table.column_names])
        held += table.num_rows
        if held >= window:
            rows += flush()
            pending, held = [], 0
    return rows + (flush() if pending else 0)


def raw_pyarrow_threads(plan, workers, columns=NUMERIC):
    """``raw_pyarrow`` in ``workers`` threads, as the loader reads (each thread its own open files, no decode
    threads): the same reads with nothing of ours, to tell what reading in parallel costs per CPU-second on this
    machine (threads that run at once share caches and memory bandwidth, or SMT cores) from what our code adds."""
    import threading
    from concurrent.futures import ThreadPoolExecutor

    import pyarrow.parquet as pq

    from petastorm_balanced.io import fs as fsutil
    _, root = fsutil.resolve(plan.dataset_url)
    local = threading.local()

    def read(group):
        files = local.__dict__.setdefault("files", {})
        if group.path not in files:
            files[group.path] = pq.ParquetFile(f"{root}/{group.path}")
        table = files[group.path].read_row_group(group.row_group, columns=columns, use_threads=False)
        return len([table.column(c).to_numpy() for c in table.column_names][0])
    with ThreadPoolExecutor(workers) as pool:
        return sum(pool.map(read, plan.catalog.row_groups))


def petastorm_batched(url, workers, batch, queue):
    from petastorm import make_batch_reader
    from petastorm.pytorch import BatchedDataLoader
    rows = 0
    with make_batch_reader(url, schema_fields=NUMERIC, workers_count=workers, num_epochs=1,
                           shuffle_row_groups=queue > 0) as reader:
        for b in BatchedDataLoader(reader, batch_size=batch, shuffling_queue_capacity=queue):
            rows += len(b["id"])
    return rows


def balanced(plan, workers, batch, shuffle, window, columns=NUMERIC, pool="thread", backend="auto"):
    """One epoch of a new ``make_loader`` (its setup, reading the footers for the batch schema, included)."""
    from petastorm_balanced import make_loader
    rows = 0
    for b in make_loader(0, 1, plan=plan, batch_size=batch, workers_count=workers, shuffle=shuffle,
                         shuffle_window=window, schema_fields=columns, reader_pool_type=pool, backend=backend):
        rows += len(b["id"])
    return rows


def epochs_of(plan, workers, batch, shuffle, window, columns=NUMERIC, backend="arrow"):
    """A function reading one epoch of a loader made once (as a training loop does: setup paid before the first
    epoch, not per epoch); each call serves epoch 0 again, so every round reads the same rows."""
    from petastorm_balanced import make_loader
    loader = make_loader(0, 1, plan=plan, batch_size=batch, workers_count=workers, shuffle=shuffle,
                         shuffle_window=window, schema_fields=columns, backend=backend)

    def epoch():
        loader.set_epoch(0)
        return sum(len(b["id"]) for b in loader)
    return epoch


def conformance_dataset(path, rows, seed=11):
    """The conformance suite's column types at benchmark size: strings, variable-length lists, a
    nullable int (delivered with its ``__valid`` mask), a nullable float (NaN), a nullable bool (mask); row
    groups of 256 to 4096 rows over several files."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    if os.path.exists(os.path.join(path, "_SUCCESS")):
        return "file://" + path
    os.makedirs(path, exist_ok=True)
    rng = np.random.default_rng(seed)
    for i, part in enumerate(np.array_split(np.arange(rows, dtype=np.int64), max(4, rows // 25_000))):
        n = len(part)
        lengths = rng.integers(0, 9, n)
        offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
        items = pa.array(rng.integers(0, 1000, int(lengths.sum())).astype(np.int32))
        words = np.array(["alpha", "beta", "gamma", "delta", "epsilon-long-word", ""])
        table = pa.table({
            "id": part,
            "name": pa.array(words[rng.integers(0, len(words), n)].tolist()),
            "tokens": pa.ListArray.from_arrays(pa.array(offsets), items),
            "count": pa.array(rng.integers(0, 100, n), mask=rng.random(n) < 0.1),
            "score": pa.array(rng.random(n), mask=rng.random(n) < 0.1),
            "flag": pa.array(rng.random(n) < 0.5, mask=rng.random(n) < 0.1),
        })
        pq.write_table(table, os.path.join(path, f"part-{i:05d}.parquet"),
                       row_group_size=int(rng.choice([256, 1024, 4096])))
    open(os.path.join(path, "_SUCCESS"), "w").close()
    return "file://" + path


def per_cpu_table(cpu, pairs):
    """Median over rounds of the per-round ratio of rows per CPU-second, with the goal (>= 0.9x) met or not."""
    out = {}
    for ours, base in pairs:
        value = ratio(cpu, ours, base)
        out[f"{ours} / {base}"] = f"{value:.2f}x ({'met' if value >= CPU_GOAL else 'NOT met'}: goal >= {CPU_GOAL}x)"
    return out


def throughput(url, args):
    from petastorm_balanced import plan_shards
    plan = plan_shards(url, 1, batch_size=args.batch, engine="local")
    out = {"rows": plan.total_rows, "row_groups": len(plan.catalog.row_groups), "workers": args.workers,
           "batch_size": args.batch, "shuffle_rows": args.window}
    w, b, q = args.workers, args.batch, args.window
    from petastorm_balanced.reading.backends import petastorm_importable
    backends = ["arrow", "petastorm"] if petastorm_importable() else ["arrow"]
    conformance_url = conformance_dataset(os.path.join(args.workdir_path, f"conformance_{args.rows}"), args.rows)
    conformance_plan = plan_shards(conformance_url, 1, batch_size=args.batch, engine="local")
    contenders = {"raw_pyarrow": lambda: raw_pyarrow(plan),
                  "raw_pyarrow_all_columns": lambda: raw_pyarrow(plan, columns=None),
                  "raw_pyarrow_conformance": lambda: raw_pyarrow(conformance_plan, columns=None),
                  "raw_pyarrow_no_decode_threads": lambda: raw_pyarrow(plan, use_threads=False),
                  "raw_pyarrow_all_columns_no_decode_threads": lambda: raw_pyarrow(plan, columns=None,
                                                                                   use_threads=False),
                  "raw_pyarrow_shuffled": lambda: raw_pyarrow_shuffled(plan, q),
                  "raw_pyarrow_all_columns_shuffled": lambda: raw_pyarrow_shuffled(plan, q, columns=None),
                  "raw_pyarrow_in_reader_threads": lambda: raw_pyarrow_threads(plan, w),
                  "raw_pyarrow_all_columns_in_reader_threads": lambda: raw_pyarrow_threads(plan, w, columns=None)}
    if "petastorm" in backends:
        contenders["petastorm"] = lambda: petastorm_batched(url, w, b, 0)
        contenders["petastorm_shuffled"] = lambda: petastorm_batched(url, w, b, q)
    for name in backends:
        contenders.update({
            f"balanced[{name}]": lambda name=name: balanced(plan, w, b, False, q, backend=name),
            f"balanced[{name}]_shuffled": lambda name=name: balanced(plan, w, b, True, q, backend=name),
            f"balanced[{name}]_all_columns": lambda name=name: balanced(plan, w, b, False, q, columns=None,
                                                                        backend=name),
            f"balanced[{name}]_all_columns_shuffled": lambda name=name: balanced(plan, w, b, True, q, columns=None,
                                                                                 backend=name),
        })
    contenders["balanced[arrow]_conformance"] = lambda: balanced(conformance_plan, w, b, False, q, columns=None,
                                                                 backend="arrow")
    contenders["balanced[arrow]_conformance_shuffled"] = lambda: balanced(conformance_plan, w, b, True, q,
                                                                          columns=None, backend="arrow")
    made = {"_made": (plan, False, NUMERIC), "_made_shuffled": (plan, True, NUMERIC),
            "_made_all_columns": (plan, False, None), "_made_all_columns_shuffled": (plan, True, None),
            "_made_conformance": (conformance_plan, False, None),
            "_made_conformance_shuffled": (conformance_plan, True, None),
            "_made_conformance_without_lists": (conformance_plan, False, NOT_LISTS)}
    contenders["raw_pyarrow_conformance_without_lists"] = lambda: raw_pyarrow(conformance_plan, columns=NOT_LISTS)
    for suffix, (which, shuffled, columns) in made.items():
        contenders[f"balanced[arrow]{suffix}"] = epochs_of(which, w, b, shuffled, q, columns)
    cpu: dict = {}
    rates = measure(args.repeats, contenders, cpu)
    out["median_rows_per_s"] = {name: float(np.median(r)) for name, r in rates.items()}
    out["median_rows_per_cpu_s"] = {name: float(np.median(r)) for name, r in cpu.items()}
    pairs = []
    for name in backends:
        ours = f"balanced[{name}]"
        pairs += [(ours, "raw_pyarrow"), (f"{ours}_shuffled", "raw_pyarrow"),
                  (f"{ours}_all_columns", "raw_pyarrow_all_columns"),
                  (f"{ours}_all_columns_shuffled", "raw_pyarrow_all_columns")]
    pairs += [("balanced[arrow]_conformance", "raw_pyarrow_conformance"),
              ("balanced[arrow]_conformance_shuffled", "raw_pyarrow_conformance")]
    out["rows per CPU-second ratios, make_loader + one epoch (median of rounds)"] = per_cpu_table(cpu, pairs)
    made_pairs = [(f"balanced[arrow]{suffix}", f"raw_pyarrow{suffix[len('_made'):].replace('_shuffled', '')}"
                   if "conformance" in suffix else "raw_pyarrow_all_columns" if "all_columns" in suffix
                   else "raw_pyarrow") for suffix in made]
    out["rows per CPU-second ratios, epochs of a loader made once (median of rounds)"] = per_cpu_table(cpu,
                                                                                                       made_pairs)
    references = {  # rows per CPU-second against other raw pyarrow readings
        "without its decode threads (stricter, no goal)": [
            ("balanced[arrow]", "raw_pyarrow_no_decode_threads"),
            ("balanced[arrow]_all_columns", "raw_pyarrow_all_columns_no_decode_threads")],
        "with a NumPy shuffle of the same window (no goal)": [
            ("balanced[arrow]_shuffled", "raw_pyarrow_shuffled"),
            ("balanced[arrow]_made_shuffled", "raw_pyarrow_shuffled"),
            ("balanced[arrow]_all_columns_shuffled", "raw_pyarrow_all_columns_shuffled"),
            ("balanced[arrow]_made_all_columns_shuffled", "raw_pyarrow_all_columns_shuffled"),
            ("raw_pyarrow_shuffled", "raw_pyarrow"),
            ("raw_pyarrow_all_columns_shuffled", "raw_pyarrow_all_columns")],
        "reading in as many threads as ours (no goal)": [
            ("balanced[arrow]", "raw_pyarrow_in_reader_threads"),
            ("balanced[arrow]_made", "raw_pyarrow_in_reader_threads"),
            ("balanced[arrow]_all_columns", "raw_pyarrow_all_columns_in_reader_threads"),
            ("balanced[arrow]_made_all_columns", "raw_pyarrow_all_columns_in_reader_threads"),
            ("raw_pyarrow_in_reader_threads", "raw_pyarrow")]}
    for against, pairs_ in references.items():
        out[f"rows per CPU-second against raw pyarrow {against}"] = {
            f"{ours} / {base}": round(ratio(cpu, ours, base), 2) for ours, base in pairs_}
    ratios = {}
    for name in backends:
        ours = f"balanced[{name}]"
        if "petastorm" in backends:
            ratios[f"{ours} / petastorm BatchedDataLoader"] = ratio(rates, ours, "petastorm")
            ratios[f"{ours}_shuffled / petastorm_shuffled"] = ratio(rates, f"{ours}_shuffled", "petastorm_shuffled")
        ratios[f"{ours} / raw_pyarrow"] = ratio(rates, ours, "raw_pyarrow")
        ratios[f"{ours}_shuffled / raw_pyarrow"] = ratio(rates, f"{ours}_shuffled", "raw_pyarrow")
        ratios[f"{ours}_all_columns / raw_pyarrow_all_columns"] = ratio(rates, f"{ours}_all_columns",
                                                                        "raw_pyarrow_all_columns")
    if len(backends) == 2:  # the goal: the Arrow backend at least as fast as the Petastorm backend
        for suffix in ("", "_shuffled", "_all_columns", "_all_columns_shuffled"):
            ratios[f"balanced[arrow]{suffix} / balanced[petastorm]{suffix}"] = ratio(
                rates, f"balanced[arrow]{suffix}", f"balanced[petastorm]{suffix}")
    out["ratios (median of rounds)"] = ratios
    return out


def decode_work(plain_url, petastorm_url, args):
    """Rows turned into arrays (plain) or through codecs (Petastorm) per row delivered, with a predicate plan."""
    from petastorm.codecs import NdarrayCodec

    from petastorm_balanced import make_loader, plan_shards
    from petastorm_balanced.predicates import in_lambda
    from petastorm_balanced.reading.rows import fragments
    english = in_lambda(["lang"], lambda lang: lang == "en")
    out = {}
    converted = []
    original_to_columns = fragments.to_columns

    def counting_to_columns(table, *args, **kwargs):
        converted.append(table.num_rows)
        return original_to_columns(table, *args, **kwargs)

    calls = [0]
    original_decode = NdarrayCodec.decode

    def counting_decode(self, field, value):
        calls[0] += 1
        return original_decode(self, field, value)

    fragments.to_columns, NdarrayCodec.decode = counting_to_columns, counting_decode
    try:
        plan = plan_shards(plain_url, 2, batch_size=args.batch, predicate=english, engine="local")
        delivered = sum(len(b["id"]) for b in make_loader(0, 2, plan=plan, workers_count=args.workers))
        out["plain_predicate_rows_converted_per_row_delivered"] = sum(converted) / delivered
        out["plain_predicate_matching_fraction"] = plan.total_rows / plan.catalog.scanned_rows
        plan = plan_shards(petastorm_url, 2, batch_size=args.batch, predicate=english, engine="local")
        delivered = sum(len(b["id"]) for b in make_loader(0, 2, plan=plan, workers_count=args.workers,
                                                           schema_fields=["id", "vec", "image"]))
        out["petastorm_codec_rows_decoded_per_row_delivered"] = calls[0] / 2 / delivered  # vec and image
    finally:
        fragments.to_columns, NdarrayCodec.decode = original_to_columns, original_decode
    return out


def peak_rss(url, args):
    """Memory of a child process reading one rank's epoch (MiB): ru_maxrss, and the resident size sampled while
    reading minus the size before the first batch (what reading adds on top of the imports and the plan)."""
    code = (f"import os, sys, resource, warnings; warnings.simplefilter('ignore'); sys.path.insert(0, {ROOT!r})\n"
            "from petastorm_balanced import plan_shards, make_loader\n"
            "page = os.sysconf('SC_PAGE_SIZE')\n"
            "def rss(): return int(open('/proc/self/statm').read().split()[1]) * page\n"
            f"plan = plan_shards({url!r}, 2, batch_size={int(args.batch)}, engine='local')\n"
            f"loader = make_loader(0, 2, plan=plan, workers_count={int(args.workers)}, "
            f"shuffle_window={int(args.window)})\n"
            "base, top, n = rss(), 0, 0\n"
            "for i, b in enumerate(loader):\n"
            "    n += len(b['id'])\n"
            "    top = max(top, rss()) if i % 20 == 0 else top\n"
            "print(n, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, base, top)\n")
    rows, peak, base, top = map(int, subprocess.run([sys.executable, "-c", code], check=True, capture_output=True,
                                                    text=True).stdout.split())
    mib = 1024 * 1024
    return {"rows": rows, "peak_rss_mib": peak / mib, "reading_adds_mib": (top - base) / mib}


def resume_latency(url, args):
    from petastorm_balanced import make_loader, plan_shards
    plan = plan_shards(url, 2, batch_size=args.batch, engine="local")
    loader = make_loader(0, 2, plan=plan, workers_count=args.workers, shuffle_window=args.window)
    resume_at = int(len(loader) * 0.9)

    def first_batch(state=None):
        if state is not None:
            loader.load_state_dict(state)
        else:
            loader.set_epoch(0)
        start = time.perf_counter()
        next(iter(loader))
        elapsed = time.perf_counter() - start
        loader.close()
        return elapsed

    state = {**loader.state_dict(), "batches": resume_at}
    first_batch()  # warm up
    fresh, resumed = [], []
    for _ in range(args.repeats + 2):
        fresh.append(first_batch())
        resumed.append(first_batch(state))
    fresh, resumed = min(fresh), min(resumed)
    return {"steps": len(loader), "resume_at_batch": resume_at, "fresh_first_batch_s": fresh,
            "resumed_first_batch_s": resumed, "ratio_resumed_vs_fresh": resumed / fresh}


def list_costs(workdir, args):
    """List columns against plain columns of the same numbers, per CPU-second (``bench_lists.py``)."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import bench_lists

    from petastorm_balanced.reading.backends import petastorm_importable
    url = bench_lists.vec_dataset(os.path.join(workdir, f"lists_{args.rows}"), args.rows)
    options = argparse.Namespace(workers=args.workers, batch=args.batch, repeats=args.repeats,
                                 backends=["arrow", "petastorm"] if petastorm_importable() else ["arrow"])
    return bench_lists.per_value(url, options)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=250_000)
    parser.add_argument("--scale", type=int, default=10, help="RSS check: the larger dataset is this many times larger")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--window", type=int, default=10_000, help="shuffle window / shuffling queue rows")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--workdir", default=None, help="keep generated datasets here between runs")
    parser.add_argument("--skip-rss", action="store_true")
    parser.add_argument("--throughput-only", action="store_true", help="only the rows/s and rows per CPU-second")
    parser.add_argument("--skip-lists", action="store_true", help="leave out the list columns' per-value costs")
    args = parser.parse_args(argv)
    workdir = args.workdir or tempfile.mkdtemp(prefix="bench_read_")
    os.makedirs(workdir, exist_ok=True)
    args.workdir_path = workdir
    url = dataset(os.path.join(workdir, f"plain_{args.rows}"), args.rows)
    results = {"throughput": throughput(url, args)}
    if not args.skip_lists:
        results["lists"] = list_costs(workdir, args)
    if args.throughput_only:
        print(json.dumps(results, indent=1))
        return results
    from petastorm_balanced.reading.backends import petastorm_importable
    if petastorm_importable():  # codec decoding is Petastorm's
        pet_url = dataset(os.path.join(workdir, f"petastorm_{args.rows // 10}"), args.rows // 10, kind="petastorm")
        results["decode"] = decode_work(url, pet_url, args)
    results["resume"] = resume_latency(url, args)
    if not args.skip_rss:
        big = dataset(os.path.join(workdir, f"plain_{args.rows * args.scale}"), args.rows * args.scale, seed=8)
        small, large = peak_rss(url, args), peak_rss(big, args)
        results["rss"] = {"scale": args.scale, "1x": small, f"{args.scale}x": large,
                          "peak_ratio": large["peak_rss_mib"] / small["peak_rss_mib"]}
    print(json.dumps(results, indent=1))
    return results


if __name__ == "__main__":
    main()
