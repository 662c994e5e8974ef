"""Peak anonymous memory of one loader epoch, in a fresh process: ``python -m tests.support.peak_memory PLAN_URL
--budget 16MiB [--spill DIR] [--workers 2] [--backend
arrow|petastorm] [--sources N]`` (``--sources``: a mixture of the plan N times, equal weights)
prints a JSON line with ``peak_anon`` (bytes of anonymous memory, the
resident memory that is not a file's page: ``RssAnon`` in ``/proc/self/status``, sampled every millisecond by a
thread) above ``baseline`` (after the loader was made, before its first batch), and the epoch's ``rows``.

Why anonymous memory: a window on local disk is read back memory-mapped, and its pages are the page cache's (the
kernel drops them under pressure); what a loader must bound is the memory only it holds."""
import argparse
import gc
import json
import threading
import time


def rss_anon() -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no RssAnon in /proc/self/status (Linux only)")


class Sampler:
    def __init__(self):
        self.peak, self._stop = 0, threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while not self._stop.is_set():
            self.peak = max(self.peak, rss_anon())
            time.sleep(0.001)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, rss_anon())


def main(argv=None):
    parser = argparse.ArgumentParser()
    parser.add_argument("plan")
    parser.add_argument("--budget", required=True)
    parser.add_argument("--spill", default=None)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--backend", default="arrow")
    parser.add_argument("--sources", type=int, default=0)
    args = parser.parse_args(argv)
    from petastorm_balanced import load_plan, make_loader
    plan = load_plan(args.plan)
    kwargs: dict = {} if args.spill is None else {"shuffle_spill_dir": args.spill}
    if args.sources:
        plan, kwargs["weights"] = [plan] * args.sources, [1 / args.sources] * args.sources
    loader = make_loader(0, 1, plan=plan, shuffle_budget=args.budget, backend=args.backend, batch_format="numpy",
                         workers_count=args.workers, **kwargs)
    gc.collect()
    baseline = rss_anon()
    rows = 0
    with Sampler() as sampler:
        for batch in loader:
            rows += len(next(iter(batch.values())))
        loader.close()
    print(json.dumps({"peak_anon": sampler.peak - baseline, "baseline": baseline, "rows": rows,
                      "window": loader.shuffle_window}))


if __name__ == "__main__":
    main()
