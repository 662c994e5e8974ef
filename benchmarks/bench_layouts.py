"""Rows per CPU-second of the loaders on the layouts Spark writes (large row groups), against the loops a user
would write by hand.

Not a test: run it standalone (``python benchmarks/bench_layouts.py``). ``bench_read.py`` measures the skewed
dataset (row groups of 32 to 4,096 rows); this one generated datasets with row groups of ``--group-rows`` rows
(65,536 and 1,048,576 by default):

- ``narrow``: ``id`` int64, ``length`` int64, ``x`` float32, ``lang`` string;
- ``wide``: 50 columns: ``id``, 44 numeric ones (int64, int32, float32, float64 in turn) and 5 strings.

Each is read with its numeric columns and with all columns, world size 1, by

- ``hand``: the hand loop, unshuffled: ``read_row_group`` of every row group, ``to_numpy`` per numeric column,
  ``to_pylist`` per text column (pyarrow's defaults);
- ``hand_batches`` (no goal): the hand loop that also cuts the batches the loader hands out, one view per column
  and batch (torch tensors; ``hand_batches_numpy``: numpy arrays), so the ratio says what the loader adds;
- ``bulk``: the bulk reference, shuffled: every row group read, one uniform permutation of all rows, one ``take``,
  one conversion per column as in ``hand``;
- ``loader``: ``make_loader`` (Arrow backend, ``--workers`` reading threads, torch batches), made once, one epoch
  a round, unshuffled (``shuffle=False``) and shuffled (the default window: the rows here fit one window, so it is
  one uniform permutation, as ``bulk``); ``loader_numpy``: the same with ``batch_format="numpy"``;
- ``dl1``, ``dl2``: ``BalancedIterableDataset(...).dataloader(num_workers=K)`` (torch DataLoader worker
  processes, their start included: one epoch a round), unshuffled and shuffled.

CPU is the process's and its finished children's (``getrusage``: the DataLoader workers count), and every figure
is the median over interleaved rounds of the per-round ratio (``bench_read.measure``): the figure a shared
machine disturbs least. The goal: ``loader`` >= 0.9x ``hand`` unshuffled and >= 0.9x ``bulk`` shuffled.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import tempfile
import warnings

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_read  # noqa: E402

warnings.simplefilter("ignore")
GOAL = 0.9


def cpu_with_children() -> float:
    """CPU seconds of this process (all its threads) and of its children that were waited for."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def layout_dataset(path: str, kind: str, rows: int, group_rows: int, files: int, seed: int = 5) -> str:
    """``narrow`` or ``wide`` (module docstring), ``rows`` rows in ``files`` files, row groups of ``group_rows``."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    if os.path.exists(os.path.join(path, "_SUCCESS")):
        return "file://" + path
    os.makedirs(path, exist_ok=True)
    rng = np.random.default_rng(seed)
    langs = np.array(["en", "de", "fr", "es", "zh", "ja", "pt-BR", "sv"])
    for i, ids in enumerate(np.array_split(np.arange(rows, dtype=np.int64), files)):
        n = len(ids)
        columns: dict = {"id": ids}
        if kind == "narrow":
            columns["length"] = rng.integers(1, 4096, n)
            columns["x"] = rng.random(n, dtype=np.float32)
            columns["lang"] = pa.array(langs[rng.integers(0, len(langs), n)].tolist())
        else:
            for c in range(44):  # int64, int32, float32, float64 in turn
                columns[f"n{c:02d}"] = [rng.integers(0, 1 << 40, n), rng.integers(0, 1000, n).astype(np.int32),
                                        rng.random(n, dtype=np.float32), rng.random(n)][c % 4]
            for c in range(5):
                columns[f"s{c}"] = pa.array(langs[rng.integers(0, len(langs), n)].tolist())
        pq.write_table(pa.table(columns), os.path.join(path, f"part-{i:05d}.parquet"), row_group_size=group_rows)
    open(os.path.join(path, "_SUCCESS"), "w").close()
    return "file://" + path


def _tables(plan, columns):
    import pyarrow.parquet as pq

    from petastorm_balanced.io import fs as fsutil
    _, root = fsutil.resolve(plan.dataset_url)
    files: dict = {}
    for group in plan.catalog.row_groups:
        if group.path not in files:
            files[group.path] = pq.ParquetFile(f"{root}/{group.path}")
        yield files[group.path].read_row_group(group.row_group, columns=columns)


def _convert(table) -> int:
    import pyarrow as pa
    out = [column.to_pylist() if pa.types.is_string(column.type) else column.to_numpy() for column in table.columns]
    return len(out[0])


def hand_loop(plan, columns) -> int:
    """Unshuffled: each row group read and converted (``to_numpy``, ``to_pylist`` for text)."""
    return sum(_convert(table) for table in _tables(plan, columns))


def hand_batches(plan, columns, batch: int, batch_format: str = "torch") -> int:
    """The hand loop that also hands out batches of ``batch`` rows as the loader does: a dict of one view per column
    (``torch.from_numpy(...).split``, or numpy slices; text as list slices), the least a training loop over these
    row groups does. Each row group is cut alone (a short last batch where ``batch`` does not divide it)."""
    import pyarrow as pa
    import torch
    rows = 0
    for table in _tables(plan, columns):
        cut = {}
        for name, column in zip(table.column_names, table.columns, strict=True):
            values = column.to_pylist() if pa.types.is_string(column.type) else column.to_numpy()
            if batch_format == "torch" and isinstance(values, np.ndarray):
                cut[name] = torch.from_numpy(values).split(batch)
            else:
                cut[name] = [values[i:i + batch] for i in range(0, len(values), batch)]
        names = list(cut)
        for parts in zip(*cut.values(), strict=True):
            dict(zip(names, parts, strict=True))
        rows += table.num_rows
    return rows


def bulk_reference(plan, columns) -> int:
    """Shuffled: all row groups read, one uniform permutation, one ``take``, one conversion."""
    import pyarrow as pa
    table = pa.concat_tables(list(_tables(plan, columns)))
    order = np.random.default_rng(0).permutation(table.num_rows)
    return _convert(table.take(pa.array(order)))


def loader_epochs(plan, columns, *, shuffle: bool, workers: int, batch: int, backend: str, batch_format="torch"):
    from petastorm_balanced import make_loader
    loader = make_loader(0, 1, plan=plan, batch_size=batch, workers_count=workers, shuffle=shuffle,
                         schema_fields=columns, backend=backend, batch_format=batch_format)

    def epoch() -> int:  # every batch holds batch rows (G1); len() of a tensor costs more than reading its rows
        loader.set_epoch(0)
        return sum(1 for _ in loader) * batch
    return epoch


def dataloader_epochs(plan, columns, *, shuffle: bool, num_workers: int, batch: int, packet_bytes=None):
    """``packet_bytes=1``: the workers send one batch per message (``worker_packets.PACKET_BYTES``, which forked
    workers inherit), the baseline of ``--dataloader-baseline``."""
    from petastorm_balanced import BalancedIterableDataset
    from petastorm_balanced.reading.formats import worker_packets
    dataset = BalancedIterableDataset(plan, 0, 1, batch_size=batch, shuffle=shuffle, schema_fields=columns,
                                      backend="arrow")
    loader = dataset.dataloader(num_workers=num_workers, multiprocessing_context="fork")

    def epoch() -> int:  # every batch holds batch rows (G1); len() of a tensor costs more than reading its rows
        default = worker_packets.PACKET_BYTES
        worker_packets.PACKET_BYTES = packet_bytes or default
        try:
            loader.set_epoch(0)
            return sum(1 for _ in loader) * batch
        finally:
            worker_packets.PACKET_BYTES = default
    return epoch


def layout(url: str, columns, args) -> dict:
    """Ratios per CPU-second of one dataset and column set (``columns=None``: all)."""
    from petastorm_balanced import plan_shards
    plan = plan_shards(url, 1, batch_size=args.batch, engine="local")
    contenders = {"hand": lambda: hand_loop(plan, columns), "bulk": lambda: bulk_reference(plan, columns),
                  "hand_batches": lambda: hand_batches(plan, columns, args.batch),
                  "hand_batches_numpy": lambda: hand_batches(plan, columns, args.batch, "numpy")}
    for shuffle, suffix in ((False, ""), (True, "_shuffled")):
        contenders[f"loader{suffix}"] = loader_epochs(plan, columns, shuffle=shuffle, workers=args.workers,
                                                      batch=args.batch, backend=args.backend)
        # numpy batches: the same pipeline without torch's tensor views (about 1 us per column and batch)
        contenders[f"loader_numpy{suffix}"] = loader_epochs(plan, columns, shuffle=shuffle, workers=args.workers,
                                                            batch=args.batch, backend=args.backend,
                                                            batch_format="numpy")
        for k in args.dataloader_workers:
            contenders[f"dl{k}{suffix}"] = dataloader_epochs(plan, columns, shuffle=shuffle, num_workers=k,
                                                             batch=args.batch)
            if args.dataloader_baseline:
                contenders[f"dl{k}_per_batch{suffix}"] = dataloader_epochs(
                    plan, columns, shuffle=shuffle, num_workers=k, batch=args.batch, packet_bytes=1)
    cpu: dict = {}
    bench_read.measure(args.repeats, contenders, cpu, cpu_clock=cpu_with_children)
    out = {"rows": plan.total_rows, "row_groups": len(plan.catalog.row_groups),
           "M rows per CPU-second": {name: round(float(np.median(r)) / 1e6, 2) for name, r in cpu.items()}}
    for name in contenders:
        if name not in ("hand", "bulk") and not name.startswith("hand_"):
            base = "bulk" if name.endswith("_shuffled") else "hand"
            value = bench_read.ratio(cpu, name, base)
            met = "met" if value >= GOAL or not name.startswith("loader") else "NOT met"
            out[f"{name} / {base}"] = f"{value:.2f}x" + (f" ({met})" if name.startswith("loader") else "")
    # no goal: against the hand loop that makes the same batches (what the loader adds to the least a loop does)
    for name, base in (("loader", "hand_batches"), ("loader_numpy", "hand_batches_numpy")):
        out[f"{name} / {base}"] = f"{bench_read.ratio(cpu, name, base):.2f}x"
    return out


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--kinds", nargs="+", default=["narrow", "wide"])
    parser.add_argument("--group-rows", nargs="+", type=int, default=[65_536, 1_048_576])
    parser.add_argument("--rows", type=int, default=2_097_152, help="rows of the narrow datasets")
    parser.add_argument("--wide-rows", type=int, default=524_288, help="rows of the wide datasets")
    parser.add_argument("--files", type=int, default=4)
    parser.add_argument("--workers", type=int, default=2, help="make_loader's reading threads")
    parser.add_argument("--dataloader-workers", nargs="*", type=int, default=[1, 2])
    parser.add_argument("--dataloader-baseline", action="store_true",
                        help="also the DataLoader workers sending one batch per message (dl*_per_batch)")
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--backend", default="arrow")
    parser.add_argument("--columns", nargs="+", default=["numeric", "all"])
    parser.add_argument("--workdir", default=None, help="keep generated datasets here between runs")
    args = parser.parse_args(argv)
    workdir = args.workdir or tempfile.mkdtemp(prefix="bench_layouts_")
    import pyarrow as pa
    results: dict = {"stack": f"pyarrow {pa.__version__} / numpy {np.__version__}", "batch_size": args.batch,
                     "load_average": open("/proc/loadavg").read().split()[:3]}
    for kind in args.kinds:
        rows = args.rows if kind == "narrow" else args.wide_rows
        for group_rows in args.group_rows:
            if group_rows > rows:
                continue
            url = layout_dataset(os.path.join(workdir, f"{kind}_{rows}_{group_rows}"), kind, rows, group_rows,
                                 args.files)
            numeric = ["id", "length", "x"] if kind == "narrow" else ["id"] + [f"n{c:02d}" for c in range(44)]
            for which in args.columns:
                name = f"{kind}, row groups of {group_rows} rows, {which} columns"
                results[name] = layout(url, numeric if which == "numeric" else None, args)
                print(name, json.dumps(results[name]), flush=True, file=sys.stderr)
    results["load_average_after"] = open("/proc/loadavg").read().split()[:3]
    print(json.dumps(results, indent=1))
    return results


if __name__ == "__main__":
    main()
