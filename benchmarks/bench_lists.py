"""List columns as tensors, measured beside Petastorm and beside plain numeric columns, in one process.

Not a test: run it standalone (``python benchmarks/bench_lists.py``); every ratio compares figures measured in the
same process, interleaved round by round (medians), on the same rows with the same workers.

- ``vec``: the dataset of a Spark user with an embedding column: ``id``, ``length`` and ``vec: list<float>`` of 4
  items in every row (248,064 rows by default; one row group per file, as Spark writes small files). World 1, batch
  256, 2 workers: ``make_loader`` (backend auto, and arrow) against Petastorm's ``make_batch_reader`` +
  ``BatchedDataLoader`` on those columns, rows/s; the loader's batches are first checked to be ``(256, 4)`` float32
  tensors equal to the files' values. Goal: >= 8x Petastorm with the default backend.
- ``per value``: rows per CPU-second of list columns against the same number of numbers stored as plain columns:
  ``vec`` (4 floats per row) against ``f0..f3``, and variable-length ``tokens`` (0 to 8 int32, 4 on average;
  ``list_format="padded"``) against ``t0..t3`` (the numbers it stores) and ``t0..t7`` (the numbers its padded form
  delivers, 8 per row); goal: a list column costs at most 1.3x its plain columns per CPU-second.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
import warnings

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
warnings.simplefilter("ignore")

VEC = ["id", "length", "vec"]
SPEED_GOAL, COST_GOAL = 8.0, 1.3


def vec_dataset(path: str, rows: int, files: int = 16, seed: int = 3) -> str:
    """``id``, ``length`` (4), ``vec`` (list<float> of 4), the plain twins ``f0..f3``, variable-length ``tokens``
    (list<int32>, 0 to 8 items) and plain int32 columns ``t0..t7`` (as many numbers as it stores on average, and as
    its padded form delivers); one row group per file."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    if os.path.exists(os.path.join(path, "_SUCCESS")):
        return "file://" + path
    os.makedirs(path, exist_ok=True)
    rng = np.random.default_rng(seed)
    for i, ids in enumerate(np.array_split(np.arange(rows, dtype=np.int64), files)):
        n = len(ids)
        vec = rng.standard_normal((n, 4)).astype(np.float32)
        lengths = rng.integers(0, 9, n)
        offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
        tokens = pa.ListArray.from_arrays(pa.array(offsets), pa.array(rng.integers(0, 30_000, int(offsets[-1]),
                                                                                   dtype=np.int32)))
        columns = {"id": ids, "length": np.full(n, 4, dtype=np.int32),
                   "vec": pa.ListArray.from_arrays(pa.array(np.arange(0, 4 * n + 1, 4, dtype=np.int32)),
                                                   pa.array(vec.ravel())),
                   "tokens": tokens}
        columns.update({f"f{j}": vec[:, j] for j in range(4)})
        columns.update({f"t{j}": rng.integers(0, 30_000, n, dtype=np.int32) for j in range(8)})
        pq.write_table(pa.table(columns), os.path.join(path, f"part-{i:05d}.parquet"), row_group_size=n)
    open(os.path.join(path, "_SUCCESS"), "w").close()
    return "file://" + path


def measure(repeats: int, contenders: dict) -> tuple[dict, dict]:
    """Rows/s and rows per CPU-second of each ``name -> fn`` per round, interleaved, a warm-up round dropped."""
    wall: dict = {n: [] for n in contenders}
    cpu: dict = {n: [] for n in contenders}
    for round_ in range(repeats + 1):
        for name, fn in contenders.items():
            start, start_cpu = time.perf_counter(), time.process_time()
            rows = fn()
            seconds, cpu_seconds = time.perf_counter() - start, time.process_time() - start_cpu
            if round_:
                wall[name].append(rows / seconds)
                cpu[name].append(rows / max(cpu_seconds, 1e-9))
    return wall, cpu


def ratio(rates: dict, a: str, b: str) -> float:
    return float(np.median(np.array(rates[a]) / np.array(rates[b])))


def petastorm_batched(url: str, workers: int, batch: int, columns=VEC) -> int:
    from petastorm import make_batch_reader
    from petastorm.pytorch import BatchedDataLoader
    rows = 0
    with make_batch_reader(url, schema_fields=columns, workers_count=workers, num_epochs=1,
                           shuffle_row_groups=False) as reader:
        for b in BatchedDataLoader(reader, batch_size=batch):
            rows += len(b["id"])
    return rows


def loader_epoch(plan, workers: int, batch: int, columns, backend: str = "auto", **kwargs) -> int:
    """One epoch of a new ``make_loader`` (its setup counted: footers, the list lengths' pass)."""
    from petastorm_balanced import make_loader
    loader = make_loader(0, 1, plan=plan, batch_size=batch, workers_count=workers, shuffle=False,
                         schema_fields=columns, backend=backend, **kwargs)
    return sum(len(b["id"]) for b in loader)


def made_once(plan, workers: int, batch: int, columns, backend: str = "auto", **kwargs):
    """Epochs of one loader made before the rounds, as a training loop has it."""
    from petastorm_balanced import make_loader
    loader = make_loader(0, 1, plan=plan, batch_size=batch, workers_count=workers, shuffle=False,
                         schema_fields=columns, backend=backend, **kwargs)

    def epoch():
        loader.set_epoch(0)
        return sum(len(b["id"]) for b in loader)
    return epoch


def check_vec(url: str, plan, batch: int) -> dict:
    """The loader's ``vec`` batches: (batch, 4) float32 tensors equal to the files' values, every row once."""
    import pyarrow.dataset as pads
    import torch

    from petastorm_balanced import make_loader
    table = pads.dataset(url.replace("file://", ""), format="parquet").to_table(columns=["id", "vec"])
    order = np.argsort(table.column("id").to_numpy())
    files = np.stack(table.column("vec").to_numpy(zero_copy_only=False))[order]
    loader = make_loader(0, 1, plan=plan, batch_size=batch, workers_count=2, schema_fields=VEC)
    seen = 0
    for b in loader:
        assert b["vec"].shape == (batch, 4) and b["vec"].dtype == torch.float32, (b["vec"].shape, b["vec"].dtype)
        assert np.array_equal(b["vec"].numpy(), files[b["id"].numpy()]), "vec differs from the files"
        seen += len(b["id"])
    return {"backend": loader.backend, "batches_checked": len(loader), "rows_checked": seen,
            "schema": [f"{c.name}: {c.kind} {c.dtype} {c.shape}" for c in loader.schema]}


def vec_case(url: str, args) -> dict:
    from petastorm_balanced import plan_shards
    from petastorm_balanced.reading.backends import petastorm_importable
    plan = plan_shards(url, 1, batch_size=args.batch, engine="local")
    w, b = args.workers, args.batch
    out = {"rows": plan.total_rows, "row_groups": len(plan.catalog.row_groups), "workers": w, "batch_size": b,
           "check": check_vec(url, plan, b)}
    contenders = {"make_loader(auto)": lambda: loader_epoch(plan, w, b, VEC),
                  "make_loader(arrow)": lambda: loader_epoch(plan, w, b, VEC, backend="arrow"),
                  "make_loader(auto) made once": made_once(plan, w, b, VEC),
                  "make_loader(auto), id and length": lambda: loader_epoch(plan, w, b, VEC[:2])}
    if petastorm_importable():
        contenders["petastorm BatchedDataLoader"] = lambda: petastorm_batched(url, w, b)
        contenders["petastorm BatchedDataLoader, id and length"] = lambda: petastorm_batched(url, w, b, VEC[:2])
    wall, cpu = measure(args.repeats, contenders)
    out["median_rows_per_s"] = {n: round(float(np.median(r))) for n, r in wall.items()}
    out["median_rows_per_cpu_s"] = {n: round(float(np.median(r))) for n, r in cpu.items()}
    if petastorm_importable():
        base = "petastorm BatchedDataLoader"
        out["ratios (median of rounds)"] = {
            f"{n} / {base}": round(ratio(wall, n, base), 2) for n in
            ("make_loader(auto)", "make_loader(arrow)", "make_loader(auto) made once")}
        out["ratios (median of rounds)"]["make_loader(auto), id and length / same columns in Petastorm"] = round(
            ratio(wall, "make_loader(auto), id and length", f"{base}, id and length"), 2)
        out["rows per CPU-second ratios (median of rounds)"] = {
            f"{n} / {base}": round(ratio(cpu, n, base), 2) for n in
            ("make_loader(auto)", "make_loader(arrow)", "make_loader(auto) made once")}
        speed = out["ratios (median of rounds)"][f"make_loader(auto) / {base}"]
        out["goal"] = f"{speed}x Petastorm ({'met' if speed >= SPEED_GOAL else 'NOT met'}: >= {SPEED_GOAL}x)"
    return out


def per_value(url: str, args) -> dict:
    """Rows per CPU-second of list columns against the same numbers as plain columns (made-once loaders)."""
    from petastorm_balanced import plan_shards
    plan = plan_shards(url, 1, batch_size=args.batch, engine="local")
    w, b = args.workers, args.batch
    pairs = {"vec (list<float> of 4)": (["id", "vec"], ["id", "f0", "f1", "f2", "f3"], {}),
             "tokens (list<int32> of 0-8, padded) vs 4 columns": (["id", "tokens"], ["id", "t0", "t1", "t2", "t3"],
                                                                  {"list_format": "padded"}),
             "tokens (list<int32> of 0-8, padded) vs 8 columns": (["id", "tokens"],
                                                                  ["id"] + [f"t{j}" for j in range(8)],
                                                                  {"list_format": "padded"})}
    out: dict = {}
    for backend in args.backends:
        contenders = {}
        for name, (lists, plain, kwargs) in pairs.items():
            if name.endswith("vs 8 columns"):  # the same list contender as "vs 4 columns"
                contenders[f"{name} [{backend}]"] = contenders[f"{name[:-len('8 columns')]}4 columns [{backend}]"]
            else:
                contenders[f"{name} [{backend}]"] = made_once(plan, w, b, lists, backend, **kwargs)
            contenders[f"plain twins of {name} [{backend}]"] = made_once(plan, w, b, plain, backend)
        _, cpu = measure(args.repeats, contenders)
        for name in pairs:
            value = ratio(cpu, f"{name} [{backend}]", f"plain twins of {name} [{backend}]")
            cost = 1 / value
            out[f"{name} [{backend}]: list cost / plain cost per CPU-second"] = (
                f"{cost:.2f}x ({'met' if cost <= COST_GOAL else 'NOT met'}: <= {COST_GOAL}x)")
    return out


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=248_064)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--workdir", default=None, help="keep the generated dataset here between runs")
    parser.add_argument("--skip-per-value", action="store_true")
    args = parser.parse_args(argv)
    from petastorm_balanced.reading.backends import petastorm_importable
    args.backends = ["arrow", "petastorm"] if petastorm_importable() else ["arrow"]
    workdir = args.workdir or tempfile.mkdtemp(prefix="bench_lists_")
    url = vec_dataset(os.path.join(workdir, f"vec_{args.rows}"), args.rows)
    results = {"vec": vec_case(url, args)}
    if not args.skip_per_value:
        results["per value"] = per_value(url, args)
    print(json.dumps(results, indent=1))
    return results


if __name__ == "__main__":
    main()
