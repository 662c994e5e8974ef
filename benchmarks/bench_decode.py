"""Decode speed over a Unischema dataset with PNG and JPEG image fields: make_loader / BalancedIterableDataset beside
Petastorm's own make_reader + petastorm.pytorch.DataLoader (thread and process pools), on the same rows.

Not a test: run it standalone (``python benchmarks/bench_decode.py``) on either stack; every ratio compares figures
measured in the same process, on the same rows, with the same worker count. Printed per reader: rows/s and images/s
(wall), CPU seconds (this process and its finished children: Petastorm's process pool, DataLoader workers), and rows
per CPU-second; ``ratio`` is ours over Petastorm's thread pool (per CPU-second and per wall second). On a stack
without Petastorm only ours run, and the ratio is left to the petastorm stack's run.

The dataset is written without Spark (our codecs and ``write_metadata``: the same cells and ``_common_metadata`` as
Petastorm's ``materialize_dataset``), one PNG and one JPEG field per row, plus a label.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import tempfile
import time
import warnings

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
warnings.simplefilter("ignore")


def schema(side):
    from petastorm_balanced.unischema import CompressedImageCodec, ScalarCodec, Unischema, UnischemaField
    from petastorm_balanced.unischema.spark_types import spark_type
    return Unischema("Images", [
        UnischemaField("id", np.int64, (), ScalarCodec(spark_type("LongType")), False),
        UnischemaField("png", np.uint8, (side, side, 3), CompressedImageCodec("png"), False),
        UnischemaField("jpg", np.uint8, (side, side, 3), CompressedImageCodec("jpeg", 90), False),
    ])


def write(path, rows, side, files=4, row_group=256):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from petastorm_balanced.unischema import pickling
    from petastorm_balanced.unischema.write import write_metadata
    if os.path.exists(os.path.join(path, "_common_metadata")):
        return "file://" + path
    os.makedirs(path, exist_ok=True)
    the_schema = schema(side)
    fields = the_schema.fields
    y, x = np.mgrid[0:side, 0:side]
    arrow = pa.schema([("id", pa.int64()), ("png", pa.binary()), ("jpg", pa.binary())])
    per_file = rows // files
    for f in range(files):
        ids = np.arange(f * per_file, (f + 1) * per_file)
        rng = np.random.default_rng(f)
        pictures = [(np.stack([x + i % 50, y * 2 % 256, (x + y) // 2], -1) % 256).astype(np.uint8) +
                    rng.integers(0, 4, (side, side, 3), dtype=np.uint8) for i in ids]
        table = pa.table({"id": ids,
                          "png": [bytes(fields["png"].codec.encode(fields["png"], p)) for p in pictures],
                          "jpg": [bytes(fields["jpg"].codec.encode(fields["jpg"], p)) for p in pictures]},
                         schema=arrow)
        pq.write_table(table, os.path.join(path, f"part-{f:05d}.parquet"), row_group_size=row_group)
    write_metadata("file://" + path, pickling.dumps(the_schema))
    return "file://" + path


def cpu() -> float:
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def measure(name, run, rows):
    start_wall, start_cpu = time.perf_counter(), cpu()
    seen = run()
    wall, used = time.perf_counter() - start_wall, cpu() - start_cpu
    assert rows - 256 < seen <= rows, (name, seen, rows)  # a planned loader drops the last partial step
    return {"reader": name, "rows": seen, "rows_s": seen / wall, "images_s": 2 * seen / wall, "cpu_s": used,
            "rows_per_cpu_s": seen / used, "wall_s": wall}


def ours_loader(url, workers, batch):
    from petastorm_balanced import make_loader, plan_shards
    plan = plan_shards(url, 1, batch_size=batch, engine="local")

    def run():
        loader = make_loader(0, 1, plan=plan, backend="arrow", workers_count=workers, shuffle=False)
        return sum(len(b["id"]) for b in loader)
    return run


def ours_iterable(url, workers, batch):
    import torch

    from petastorm_balanced import BalancedIterableDataset, plan_shards
    plan = plan_shards(url, 1, batch_size=batch, engine="local")

    def run():
        dataset = BalancedIterableDataset(plan, 0, 1, shuffle=False)
        loader = torch.utils.data.DataLoader(dataset, batch_size=None, num_workers=workers)
        return sum(len(b["id"]) for b in loader)
    return run


def petastorm_reader(url, workers, batch, pool):
    from petastorm import make_reader
    from petastorm.pytorch import DataLoader

    def run():
        with make_reader(url, reader_pool_type=pool, workers_count=workers, num_epochs=1,
                         shuffle_row_groups=False) as reader:
            return sum(len(b["id"]) for b in DataLoader(reader, batch_size=batch))
    return run


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=4000)
    parser.add_argument("--side", type=int, default=64, help="images are side x side x 3")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--workdir", default=None)
    args = parser.parse_args(argv)
    workdir = args.workdir or tempfile.mkdtemp(prefix="bench_decode_")
    url = write(os.path.join(workdir, f"images_{args.rows}_{args.side}"), args.rows, args.side)
    rows = (args.rows // 4) * 4
    from petastorm_balanced.reading.backends import petastorm_importable
    from petastorm_balanced.unischema.codecs import image_library
    readers = {"make_loader[arrow]": ours_loader(url, args.workers, args.batch),
               "BalancedIterableDataset+DataLoader(workers)": ours_iterable(url, args.workers, args.batch)}
    if petastorm_importable():
        readers["petastorm make_reader[thread]+DataLoader"] = petastorm_reader(url, args.workers, args.batch, "thread")
        readers["petastorm make_reader[process]+DataLoader"] = petastorm_reader(url, args.workers, args.batch,
                                                                                "process")
    results = {}
    for _ in range(args.repeats):  # best of N per reader, interleaved so drift hits all alike
        for name, run in readers.items():
            figure = measure(name, run, rows)
            if name not in results or figure["rows_per_cpu_s"] > results[name]["rows_per_cpu_s"]:
                results[name] = figure
    import pyarrow as pa
    print(f"stack: pyarrow {pa.__version__}, numpy {np.__version__}, images by {image_library()}; "
          f"{rows} rows of {args.side}x{args.side}x3 PNG + JPEG, workers={args.workers}, batch={args.batch}")
    print(f"{'reader':48s} {'rows/s':>9s} {'images/s':>9s} {'CPU s':>7s} {'rows/CPU-s':>11s}")
    for figure in results.values():
        print(f"{figure['reader']:48s} {figure['rows_s']:9.0f} {figure['images_s']:9.0f} {figure['cpu_s']:7.2f} "
              f"{figure['rows_per_cpu_s']:11.0f}")
    base = results.get("petastorm make_reader[thread]+DataLoader")
    if base:
        for name in ("make_loader[arrow]", "BalancedIterableDataset+DataLoader(workers)"):
            ours = results[name]
            print(f"ratio {name} / Petastorm thread pool: per CPU-second "
                  f"{ours['rows_per_cpu_s'] / base['rows_per_cpu_s']:.2f}x, "
                  f"wall {ours['rows_s'] / base['rows_s']:.2f}x")
        process = results["petastorm make_reader[process]+DataLoader"]
        print(f"ratio make_loader[arrow] / Petastorm process pool: per CPU-second "
              f"{results['make_loader[arrow]']['rows_per_cpu_s'] / process['rows_per_cpu_s']:.2f}x, wall "
              f"{results['make_loader[arrow]']['rows_s'] / process['rows_s']:.2f}x")
    print(json.dumps(results))


if __name__ == "__main__":
    main()
