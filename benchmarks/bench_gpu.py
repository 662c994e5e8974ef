"""Feeding a GPU: how much of a training step is spent waiting for data, make_loader against torch's DataLoader.

Not a test: run it on a machine with CUDA (``python benchmarks/bench_gpu.py``, about 10 minutes in all with the
defaults; it prints ``SKIPPED`` and exits 0 without CUDA). ``--device cpu --rows 20000`` runs every part end to end
on CPU as a smoke test (no pinning there; the figures mean nothing).

The model is a small MLP over ``--features`` float32 columns (a ``torch.stack`` of the batch's columns, then
``--hidden`` wide layers, cross entropy on ``label``, Adam). For each loader, every step is ``next()`` on the
loader, then forward, backward and optimizer step, with no synchronisation inside the loop (as in real training:
the host prepares data while the GPU computes) and one ``torch.cuda.synchronize()`` at the end. Figures:

- ``step_ms``: wall time per step over ``--steps`` steps after ``--warmup`` steps;
- ``data_wait``: the fraction of step time spent waiting for data, ``1 - compute_ms / step_ms``, where
  ``compute_ms`` is the same loop over one batch already on the device (no data at all);
- ``host_next``: the fraction of wall time the training thread spent inside ``next()``.

Loaders, all over the same rows of one Parquet dataset (world size 1, batch ``--batch``):

- ``ours[device]``: ``make_loader(..., pin_memory=True, device="cuda")``: batches arrive on the GPU, the next one
  copied ahead on a side stream;
- ``ours[host]``: ``make_loader(...)`` and ``batch[k].to("cuda", non_blocking=True)`` in the loop (pageable);
- ``ours[dataloader]``: ``BalancedIterableDataset(...).dataloader(num_workers=W, pin_memory=True, device="cuda")``;
- ``torch``: ``DataLoader(ds, batch_size=B, shuffle=True, num_workers=W, pin_memory=True)`` over the same rows
  held in memory as numpy (a map-style dataset with ``__getitems__``, so a batch is one fancy index per column,
  torch's fastest path), and ``.to("cuda", non_blocking=True)`` in the loop: the usual recipe, given the advantage
  of rows already decoded in memory.

Before timing, the batches of ``ours[device]`` are checked equal (values, dtypes) to those of ``ours[host]``.
Goal: ``ours[device]`` waits for data no more than ``torch`` (data_wait ratio <= 1), at every model width.

    python benchmarks/bench_gpu.py [--rows 2000000] [--features 64] [--batch 1024] [--hidden 256,2048,8192]

On one H200 with 16 CPUs the defaults should take 5-8 minutes (an estimate: never run on a GPU yet); ``--json``
prints one object for the record.
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


def write_dataset(path: str, rows: int, features: int, *, files: int = 16, row_group: int = 65_536,
                  seed: int = 0) -> str:
    """``id``, ``label`` (10 classes) and ``f0..f{features-1}`` float32; written once per folder."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    done = os.path.join(path, "_SUCCESS")
    if os.path.exists(done):
        return "file://" + path
    os.makedirs(path, exist_ok=True)
    rng = np.random.default_rng(seed)
    per_file = -(-rows // files)
    for f in range(files):
        lo, hi = f * per_file, min(rows, (f + 1) * per_file)
        if lo >= hi:
            break
        n = hi - lo
        columns = {"id": np.arange(lo, hi, dtype=np.int64), "label": rng.integers(0, 10, n).astype(np.int64)}
        block = rng.standard_normal((n, features), dtype=np.float32)
        columns.update({f"f{j}": block[:, j] for j in range(features)})
        pq.write_table(pa.table(columns), os.path.join(path, f"part-{f:03d}.parquet"), row_group_size=row_group)
    open(done, "w").close()
    return "file://" + path


class InMemoryRows:
    """The same rows for torch's DataLoader: numpy columns, a batch per ``__getitems__`` (one take per column)."""

    def __init__(self, url: str, columns):
        import pyarrow.dataset as pads
        table = pads.dataset(url.replace("file://", ""), format="parquet").to_table(columns=list(columns))
        self.columns = {name: table.column(name).to_numpy() for name in columns}
        self.rows = table.num_rows

    def __len__(self):
        return self.rows

    def __getitems__(self, indices):
        import torch
        index = np.asarray(indices)
        return {name: torch.from_numpy(values[index]) for name, values in self.columns.items()}


def _as_is(batch):
    return batch


def model_for(features: int, hidden: int, device):
    import torch
    net = torch.nn.Sequential(torch.nn.Linear(features, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, hidden),
                              torch.nn.ReLU(), torch.nn.Linear(hidden, 10)).to(device)
    return net, torch.optim.Adam(net.parameters(), lr=1e-3)


def train(batches, names, net, opt, device, *, steps: int, warmup: int, move: bool):
    """Run ``warmup + steps`` steps; return (wall s, s inside next()) of the timed steps."""
    import torch
    loss_fn = torch.nn.CrossEntropyLoss()
    it = iter(batches)
    wait = 0.0
    started = None
    for step in range(warmup + steps):
        if step == warmup:
            _sync(device)
            started, wait = time.perf_counter(), 0.0
        t0 = time.perf_counter()
        batch = next(it)
        if move:
            batch = {k: v.to(device, non_blocking=True) for k, v in batch.items() if isinstance(v, torch.Tensor)}
        wait += time.perf_counter() - t0
        x = torch.stack([batch[n] for n in names], 1)
        loss = loss_fn(net(x), batch["label"])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    _sync(device)
    close = getattr(it, "close", None)
    if close is not None:
        close()
    return time.perf_counter() - started, wait


def _sync(device) -> None:
    import torch
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def forever(make):
    """Epoch after epoch of ``make()``'s iterable (a loader's next iter() is its next epoch)."""
    loader = make()
    while True:
        yield from loader


def check_device_batches(plan, device, batch, count: int = 20) -> int:
    """The first ``count`` batches with pin_memory + device equal the host batches (values and dtypes)."""
    from itertools import islice

    import torch

    from petastorm_balanced import make_loader
    host = list(islice(make_loader(0, 1, plan=plan, batch_size=batch, backend="arrow"), count))
    fed = list(islice(make_loader(0, 1, plan=plan, batch_size=batch, backend="arrow", device=device,
                                  pin_memory=device.type == "cuda"), count))
    assert len(host) == len(fed) == count
    for a, b in zip(host, fed, strict=True):
        assert a.keys() == b.keys()
        for name, value in a.items():
            if isinstance(value, torch.Tensor):
                assert b[name].device.type == device.type, (name, b[name].device)
                assert b[name].dtype == value.dtype and torch.equal(b[name].cpu(), value), name
            else:
                assert b[name] == value, name
    return count


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--rows", type=int, default=2_000_000)
    parser.add_argument("--features", type=int, default=64)
    parser.add_argument("--batch", type=int, default=1024)
    parser.add_argument("--hidden", default="256,2048,8192",
                        help="model widths (comma list): data-bound, balanced, compute-bound")
    parser.add_argument("--steps", type=int, default=1500)
    parser.add_argument("--warmup", type=int, default=100)
    parser.add_argument("--workers", type=int, default=4, help="reader threads / DataLoader workers")
    parser.add_argument("--repeat", type=int, default=3, help="interleaved rounds; the median is reported")
    parser.add_argument("--workdir", default=os.path.join(tempfile.gettempdir(), "bench_gpu"))
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)

    import torch
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print(f"bench_gpu: SKIPPED: no CUDA device (torch {torch.__version__}, CUDA build {torch.version.cuda}); "
              "run it on a GPU machine, or with --device cpu as a smoke test")
        return 0
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    cuda = device.type == "cuda"

    from petastorm_balanced import BalancedIterableDataset, make_loader, plan_shards
    started = time.perf_counter()
    url = write_dataset(os.path.join(args.workdir, f"ds-{args.rows}-{args.features}"), args.rows, args.features)
    plan = plan_shards(url, 1, batch_size=args.batch, seed=1, engine="local")
    names = [f"f{j}" for j in range(args.features)]
    memory = InMemoryRows(url, ["label", *names])
    setup_s = time.perf_counter() - started
    checked = check_device_batches(plan, device, args.batch)

    common = {"plan": plan, "batch_size": args.batch, "backend": "arrow", "schema_fields": ["label", *names],
              "workers_count": args.workers, "shuffle_window": 16 * args.batch}
    contenders = {
        "ours[device]": (lambda: make_loader(0, 1, pin_memory=cuda, device=device, **common), False),
        "ours[host]": (lambda: make_loader(0, 1, **common), True),
        "ours[dataloader]": (lambda: BalancedIterableDataset(
            plan, 0, 1, batch_size=args.batch, backend="arrow", schema_fields=["label", *names],
            shuffle_window=16 * args.batch).dataloader(num_workers=args.workers, pin_memory=cuda, device=device),
            False),
        "torch": (lambda: torch.utils.data.DataLoader(memory, batch_size=args.batch, shuffle=True,
                                                      num_workers=args.workers, pin_memory=cuda,
                                                      collate_fn=_as_is, drop_last=True), True),
    }
    results = []
    for hidden in [int(h) for h in args.hidden.split(",")]:
        net, opt = model_for(args.features, hidden, device)
        resident = {k: v.to(device) for k, v in next(iter(make_loader(0, 1, **common))).items()
                    if isinstance(v, torch.Tensor)}

        def compute_only(resident=resident, net=net, opt=opt):
            return train(iter(lambda: resident, None), names, net, opt, device, steps=args.steps,
                         warmup=args.warmup, move=False)

        rounds = {name: [] for name in ["compute", *contenders]}
        for _ in range(args.repeat):  # interleaved, so drift on the machine hits every contender alike
            rounds["compute"].append(compute_only())
            for name, (make, move) in contenders.items():
                rounds[name].append(train(forever(make), names, net, opt, device, steps=args.steps,
                                          warmup=args.warmup, move=move))
        compute_ms = 1000 * float(np.median([wall for wall, _ in rounds["compute"]])) / args.steps
        row = {"hidden": hidden, "compute_ms": round(compute_ms, 3), "loaders": {}}
        for name in contenders:
            walls = np.array([wall for wall, _ in rounds[name]])
            waits = np.array([wait for _, wait in rounds[name]])
            step_ms = 1000 * float(np.median(walls)) / args.steps
            row["loaders"][name] = {"step_ms": round(step_ms, 3),
                                    "data_wait": round(max(0.0, 1 - compute_ms / step_ms), 3),
                                    "host_next": round(float(np.median(waits / walls)), 3),
                                    "rows_per_s": round(args.batch * args.steps / float(np.median(walls)))}
        ours, theirs = row["loaders"]["ours[device]"], row["loaders"]["torch"]
        row["step_ratio_vs_torch"] = round(ours["step_ms"] / theirs["step_ms"], 3)
        row["goal_met"] = ours["data_wait"] <= theirs["data_wait"] + 0.01
        results.append(row)
        print(f"bench_gpu: {json.dumps(row)}", file=sys.stderr, flush=True)  # kept if a later width fails

    result = {"device": str(device), "name": torch.cuda.get_device_name(device) if cuda else "cpu",
              "torch": torch.__version__, "rows": args.rows, "features": args.features, "batch": args.batch,
              "steps": args.steps, "workers": args.workers, "cpus": os.cpu_count(), "setup_s": round(setup_s, 1),
              "device_batches_checked": checked, "results": results}
    if args.json:
        print(json.dumps(result))
        return 0
    print(f"bench_gpu on {result['name']} ({device}), torch {result['torch']}, {os.cpu_count()} CPUs: {args.rows:,} "
          f"rows x {args.features} float32 features, batch {args.batch}, {args.workers} workers, median of "
          f"{args.repeat} interleaved rounds of {args.steps} steps; {checked} device batches checked equal to host")
    for row in results:
        print(f"  MLP hidden {row['hidden']}: compute only {row['compute_ms']:.3f} ms/step")
        for name, figures in row["loaders"].items():
            print(f"    {name:17s} {figures['step_ms']:8.3f} ms/step  waiting for data {figures['data_wait']:6.1%}"
                  f"  in next() {figures['host_next']:6.1%}  {figures['rows_per_s']:>12,} rows/s")
        print(f"    goal (ours[device] waits no more than torch's DataLoader(pin_memory=True)): "
              f"{'met' if row['goal_met'] else 'NOT met'}; step time ratio {row['step_ratio_vs_torch']:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
