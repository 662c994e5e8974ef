"""Where an input pipeline's time goes: per-stage seconds, the training loop's waits, and what bounded throughput.

Why it is built this way: statistics must be cheap enough to be always on (<= 0.5% of CPU per row,
``benchmarks/bench_stats.py``), so nothing is counted per row. Each thread adds to its own cell (a dict owned by
that thread, no lock, no shared counter): the reading threads once per bundle (``read``, ``decode``,
``transform``), the consuming thread once per run or batch (``batch``, ``convert``, ``device``). A reader sums
the cells when ``loader.stats()`` is asked. Seconds are wall seconds of the thread doing the stage, *exclusive* of
the stages nested in it (``timed`` subtracts what the inner stages of the same thread recorded), so the stages of
one thread add up to its time.

The loader wraps its batches in ``Recorder.measured``: ``wait_s`` is the time from the training loop asking for a
batch to the batch returned, ``training_s`` the time between a batch handed out and the next one asked for; or, with
no batch held ahead for a device, in ``Recorder.grouped``: the same per list of batches made ahead (no Python per
batch), the making of a list waited for, the batches counted as they leave the list. While a
``next()`` runs, the recorder is this thread's ``current()``, which is how the readers built inside it (backends,
mixture sources) find it without being handed it through every signature.

``limit``: ``"training"`` when the loop waited less than ``STALL`` of its time; else the stage with the most
seconds per thread that did it (reading threads work side by side, the consuming thread alone), with the evidence.
"""
from __future__ import annotations

import itertools
import logging
import os
import threading
from collections.abc import Callable, Generator, Iterable, Iterator
from operator import length_hint
from time import perf_counter
from typing import Any, cast

ENABLED = os.environ.get("PB_STATS", "1") != "0"  # PB_STATS=0: nothing timed (the benchmark's baseline)
STALL = 0.2  # the loop waited at least this share of its time: the input pipeline bounded throughput
TRAINING = "training"
STAGES = ("list", "read", "decode", "transform", "batch", "convert", "device")
FILL_LOG_S = 10.0  # a first window filling longer than this says how far it got, every FILL_LOG_S (remote storage)
PROGRESS = logging.getLogger("petastorm_balanced.progress")
_LOCAL = threading.local()  # .recorder: the recorder of the next() running in this thread


def current() -> Recorder | None:
    """The recorder of the loader whose ``next()`` runs in this thread (None outside one: nothing is counted)."""
    return getattr(_LOCAL, "recorder", None) if ENABLED else None


class Cell:
    """One thread's figures: ``stages[name] = [seconds, calls]``, ``counts[name] = n`` (rows, bytes, requests),
    and ``inner``: the seconds this thread's stages recorded (what an enclosing ``timed`` subtracts)."""

    __slots__ = ("stages", "counts", "inner", "thread")

    def __init__(self, thread: threading.Thread | None = None):
        self.stages: dict[str, list] = {}
        self.counts: dict[str, int] = {}
        self.inner = 0.0
        self.thread = thread

    def add(self, stage: str, seconds: float) -> None:
        entry = self.stages.get(stage)
        if entry is None:
            self.stages[stage] = [seconds, 1]
        else:
            entry[0] += seconds
            entry[1] += 1
        self.inner += seconds

    def since(self, stage: str, start: float, inner: float) -> None:
        """Count to ``stage`` the seconds since ``start`` (``perf_counter()``), less what stages nested in it in
        this thread recorded since ``inner`` (this cell's ``inner`` at ``start``)."""
        self.add(stage, perf_counter() - start - (self.inner - inner))

    def count(self, name: str, n: int) -> None:
        self.counts[name] = self.counts.get(name, 0) + n

    def copy(self) -> Cell:
        other = Cell()
        other.stages = {k: list(v) for k, v in self.stages.items()}
        other.counts = dict(self.counts)
        return other


class Recorder:
    """A loader's figures, for the epoch in progress and since it was made. Not pickled with its state: a copy in
    a DataLoader worker starts empty and sends what it adds (``worker_stats.py``; ``merge`` takes it in)."""

    def __init__(self) -> None:
        self._local = threading.local()
        self._lock = threading.Lock()
        self._cells: list[Cell] = []
        self._base: dict[int, Cell] = {}  # each live cell as it stood when the epoch began
        self._closed = View()  # the epochs before this one
        self._remote = View()  # sent by DataLoader workers, this epoch
        self._remote_ids: dict[str, set] = {}  # the workers' threads that sent each stage, this epoch
        self.epoch: int | None = None
        self.loop = [0.0, 0.0, 0, 0.0]  # wait_s, training_s, batches, first batch's wait (this epoch)
        self._handing: tuple | None = None  # (batches, size) of the group ``grouped`` hands out now
        self._fill = [0, perf_counter(), perf_counter()]  # rows read before the first batch, started, last logged

    def __getstate__(self) -> dict:
        return {}  # a copy (a spawned DataLoader worker's) starts empty: figures travel by ``worker_stats``

    def __setstate__(self, state: dict) -> None:
        vars(self).update(vars(Recorder()))

    def cell(self) -> Cell:
        """This thread's cell (made and registered on its first use)."""
        try:
            return self._local.cell
        except AttributeError:
            cell = self._local.cell = Cell(threading.current_thread())
            with self._lock:
                self._cells.append(cell)
            return cell

    def add(self, stage: str, seconds: float) -> None:
        self.cell().add(stage, seconds)

    def cells(self) -> list[Cell]:
        """Every thread's cell, as registered now (a worker sends what each added since its last message)."""
        with self._lock:
            return list(self._cells)

    # -- epochs -------------------------------------------------------------------------------------------------

    def begin(self, epoch: int) -> None:
        """The loader starts iterating ``epoch``: a new epoch closes the previous one's figures."""
        if self.epoch == epoch:
            return
        if self.epoch is not None:
            self._closed.merge(self.view(epoch_only=True), longest=True)
        with self._lock:  # cells of finished threads are in the closed figures: dropped; live ones re-based
            self._cells = [c for c in self._cells if c.thread is None or c.thread.is_alive()]
            self._base = {id(c): c.copy() for c in self._cells}
        self._remote, self._remote_ids = View(), {}
        self.loop = [0.0, 0.0, 0, 0.0]
        self._handing = None
        self.epoch = epoch
        self._fill = [0, perf_counter(), perf_counter()]  # rows read before the first batch, started, last logged

    def filling(self, rows: int, window: int) -> None:
        """``rows`` more were read (a chunk, in the loop's thread): while no batch of the epoch was delivered, a
        log line every ``FILL_LOG_S`` says how far the first shuffle window (``window`` rows) got."""
        fill = self._fill
        if self.loop[2]:
            return
        fill[0] += rows
        now = perf_counter()
        if now - fill[2] >= FILL_LOG_S:
            fill[2] = now
            PROGRESS.info("filling the first shuffle window of epoch %s: %d of %d rows read (%.0f s)", self.epoch,
                          fill[0], window, now - fill[1])

    def merge(self, sent: dict) -> None:
        """Figures a DataLoader worker sent (``WorkerSink``): added to this epoch's; a stage's threads are those
        of every worker that sent it (a worker sends several times: counted once)."""
        view = View.of(sent)
        for stage, tags in sent.get("ids", {}).items():
            self._remote_ids.setdefault(stage, set()).update(tags)
        view.threads = {}
        self._remote.merge(view, longest=False)
        self._remote.threads = {stage: len(tags) for stage, tags in self._remote_ids.items()}

    # -- the loop -----------------------------------------------------------------------------------------------

    def measured(self, batches: Iterable[Any], *, loop: bool = True) -> Generator[Any, None, None]:
        """``batches``, timing the loop around them (``wait_s``, ``training_s``; not with ``loop=False``: inside
        a DataLoader worker); this recorder is ``current()`` in this thread while each ``next()`` runs."""
        if not ENABLED:
            return cast(Generator, batches if isinstance(batches, Generator) else (b for b in batches))
        return self._measured(batches, loop)

    def _measured(self, batches: Iterable[Any], loop: bool) -> Generator[Any, None, None]:
        source = iter(batches)
        local, clock, pull = _LOCAL, perf_counter, source.__next__
        handed = 0.0
        try:
            while True:
                asked = clock()
                previous = getattr(local, "recorder", None)
                local.recorder = self
                try:
                    batch = pull()
                except StopIteration:
                    if handed and loop:  # the loop's time on the last batch
                        self.loop[1] += asked - handed
                    return
                finally:
                    local.recorder = previous
                if loop:
                    now = clock()
                    times = self.loop  # read each time: ``begin`` (inside the first next()) replaces it
                    if handed:
                        times[1] += asked - handed  # the loop's own time since the last batch
                    else:
                        times[3] = now - asked
                    times[0] += now - asked
                    times[2] += 1
                    handed = now
                yield batch
        finally:
            close = getattr(source, "close", None)
            if close is not None:
                close()

    def grouped(self, groups: Iterator[Iterator[Any]], length: Callable[[], int] | None = None) -> Iterator[Any]:
        """The batches of ``groups`` (iterators of a list's batches, such as ``iter(list)``), chained in C: the loop
        is timed per group, not per batch (``measured`` costs about 0.4 us a batch, a tenth of a numeric epoch's
        hand loop). A group's batches are made before it is handed out, so the time between two groups is the
        loop's own (``training_s``) and a group's making is waited for (``wait_s``); the batches count as they
        leave the group's iterator (``view`` reads how many did). Closing the result closes ``groups``; ``len()``
        of it is ``length()``."""
        if not ENABLED:
            return chained(groups, groups, length)
        return chained(self._groups(groups), groups, length)

    def _groups(self, groups: Iterator[Iterator[Any]]) -> Generator[Iterator[Any], None, None]:
        local, clock, pull = _LOCAL, perf_counter, groups.__next__
        handed = 0.0
        while True:
            asked = clock()
            previous = getattr(local, "recorder", None)
            local.recorder = self
            try:
                batches = pull()
            except StopIteration:
                self._handed()
                if handed:
                    self.loop[1] += asked - handed
                return
            finally:
                local.recorder = previous
            now = clock()
            self._handed()
            times = self.loop  # read each time: ``begin`` (inside the first pull) replaces it
            if handed:
                times[1] += asked - handed
            else:
                times[3] = now - asked
            times[0] += now - asked
            self._handing = (batches, length_hint(batches))
            handed = now
            yield batches

    def _handed(self) -> None:
        """The group handed out before is done with (spent, or its iteration abandoned): its batches counted."""
        handing = self._handing
        if handing is not None:
            self.loop[2] += handing[1] - length_hint(handing[0])
            self._handing = None

    def timed(self, items: Iterable[Any], stage: str) -> Iterator[Any]:
        """``items``, the time of each ``next()`` counted to ``stage`` (less what stages nested in it recorded)."""
        if not ENABLED:
            return iter(items)
        return self._timed(items, stage)

    def _timed(self, items: Iterable[Any], stage: str) -> Iterator[Any]:
        source = iter(items)
        cell = self.cell()
        try:
            while True:
                start, inner = perf_counter(), cell.inner
                try:
                    item = next(source)
                except StopIteration:
                    cell.since(stage, start, inner)
                    return
                cell.since(stage, start, inner)
                yield item
        finally:
            close = getattr(source, "close", None)
            if close is not None:
                close()

    # -- views --------------------------------------------------------------------------------------------------

    def view(self, *, epoch_only: bool) -> View:
        """This epoch's figures (``epoch_only``) or every epoch's."""
        out = View()
        with self._lock:
            cells, base = list(self._cells), dict(self._base)
        for cell in cells:
            out.add_cell(cell, base.get(id(cell)))
        out.merge(self._remote, longest=False)
        out.loop = list(self.loop)
        handing = self._handing
        if handing is not None:  # the group being handed out: its batches that left its iterator
            out.loop[2] += handing[1] - length_hint(handing[0])
        if not epoch_only:
            out.merge(self._closed, longest=True)
        return out

    def stats(self, extra: dict | None = None) -> dict:
        """``loader.stats()``: the epoch so far at the top level and under ``"epoch"``, every epoch under
        ``"total"`` (docs/stats.md)."""
        epoch = self.view(epoch_only=True).summary()
        total = self.view(epoch_only=False).summary()
        return {**epoch, "epoch": epoch, "total": total, "epoch_index": self.epoch, **(extra or {})}


class _Chained(itertools.chain):
    """``chain.from_iterable`` (batches handed out in C) that also closes its source (``chained``)."""

    _closing: tuple = ()
    _length: Callable[[], int] | None = None

    def __len__(self) -> int:
        if self._length is None:
            raise TypeError("this iterator has no len()")
        return self._length()

    def close(self) -> None:
        for part in self._closing:
            close = getattr(part, "close", None)
            if close is not None:
                close()


def chained(groups: Iterable[Iterable[Any]], source: Any, length: Callable[[], int] | None = None) -> Iterator[Any]:
    """The items of ``groups`` chained in C; closing the result closes ``groups`` and ``source``."""
    out = cast(_Chained, _Chained.from_iterable(groups))
    out._closing, out._length = (groups, source), length
    return out


class View:
    """Figures summed over threads (and epochs): seconds and threads per stage, counts, the loop's times."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self.calls: dict[str, int] = {}
        self.threads: dict[str, int] = {}
        self.counts: dict[str, int] = {}
        self.loop = [0.0, 0.0, 0, 0.0]

    def add_cell(self, cell: Cell, base: Cell | None) -> None:
        for stage, (seconds, calls) in list(cell.stages.items()):
            before = base.stages.get(stage, (0.0, 0)) if base is not None else (0.0, 0)
            if calls > before[1]:
                self.seconds[stage] = self.seconds.get(stage, 0.0) + seconds - before[0]
                self.calls[stage] = self.calls.get(stage, 0) + calls - before[1]
                self.threads[stage] = self.threads.get(stage, 0) + 1
        for name, n in list(cell.counts.items()):
            self.counts[name] = self.counts.get(name, 0) + n - (base.counts.get(name, 0) if base is not None else 0)

    def merge(self, other: View, *, longest: bool) -> None:
        """Add ``other``; threads per stage: the larger of the two (``longest``: other epochs) or their sum."""
        for stage, seconds in other.seconds.items():
            self.seconds[stage] = self.seconds.get(stage, 0.0) + seconds
            self.calls[stage] = self.calls.get(stage, 0) + other.calls.get(stage, 0)
            mine, theirs = self.threads.get(stage, 0), other.threads.get(stage, 0)
            self.threads[stage] = max(mine, theirs) if longest else mine + theirs
        for name, n in other.counts.items():
            self.counts[name] = self.counts.get(name, 0) + n
        if longest or other.loop[2]:
            first = self.loop[3] if self.loop[2] else other.loop[3]
            self.loop = [self.loop[0] + other.loop[0], self.loop[1] + other.loop[1], self.loop[2] + other.loop[2],
                         first]

    def sent(self) -> dict:
        """What a DataLoader worker sends (plain types)."""
        return {"seconds": self.seconds, "calls": self.calls, "threads": self.threads, "counts": self.counts}

    @classmethod
    def of(cls, sent: dict) -> View:
        view = cls()
        view.seconds, view.calls = dict(sent["seconds"]), dict(sent["calls"])
        view.threads, view.counts = dict(sent["threads"]), dict(sent["counts"])
        return view

    def summary(self) -> dict:
        wait, training, batches, first = self.loop
        stages = {name: round(self.seconds[name], 6) for name in _ordered(self.seconds)}
        limit, evidence = bounded_by(self.seconds, self.threads, wait, training)
        return {"wait_s": round(wait, 6), "training_s": round(training, 6), "batches": batches,
                "first_batch_s": round(first, 6), "stages": stages,
                "threads": {name: self.threads[name] for name in stages},
                "calls": {name: self.calls[name] for name in stages}, "limit": limit, "evidence": evidence,
                **{name: self.counts.get(name, 0) for name in ("rows", "bytes", "requests", "retries")}}


def _ordered(names: Iterable[str]) -> list[str]:
    known = [s for s in STAGES if s in names]
    return known + sorted(set(names) - set(known))


def bounded_by(seconds: dict[str, float], threads: dict[str, int], wait_s: float,
               training_s: float) -> tuple[str | None, dict]:
    """What bounded throughput, and why: ``"training"`` when the loop waited less than ``STALL`` of its time,
    else the stage with the most seconds per thread doing it. ``evidence``: the loop's share spent waiting
    (``wait_fraction``) and each stage's share of the stages' seconds per thread (``stage_share``)."""
    per_thread = {s: v / max(1, threads.get(s, 1)) for s, v in seconds.items() if v > 0}
    whole = sum(per_thread.values())
    share = {s: round(v / whole, 4) for s, v in sorted(per_thread.items(), key=lambda kv: -kv[1])} if whole else {}
    loop = wait_s + training_s
    fraction = wait_s / loop if loop > 0 else 0.0
    evidence = {"wait_fraction": round(fraction, 4), "stage_share": share}
    if loop <= 0 and not share:
        return None, evidence  # nothing ran yet
    if loop > 0 and fraction < STALL:
        return TRAINING, evidence
    if not share:
        return None, evidence
    return next(iter(share)), evidence
