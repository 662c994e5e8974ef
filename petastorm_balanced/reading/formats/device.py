"""Feeding an accelerator: pinned host batches, and the next batch copied ahead on a side CUDA stream.

``make_loader(..., pin_memory=True, device="cuda")`` (and ``BalancedDataLoader(..., device=...)``) wrap the
loader's batches in ``feed``: each batch's tensors are copied into page-locked memory and, with a CUDA device, sent
with ``non_blocking=True`` on a stream of their own while the training step computes on the previous batch, so a
step never waits for a host-to-device copy. The pieces that make this exact:

- the copy of batch ``k + 1`` is enqueued (and its host side read) before batch ``k`` is handed over; batch ``k``
  is handed over only after the consumer's current stream is told to wait for the event recorded after its copy
  (``wait_event``), so no kernel of the step reads a tensor before its copy finished;
- every device tensor is marked used by the consumer's stream (``record_stream``), so the caching allocator does
  not give its memory to the next copy while the step still reads it; the pinned host batch is kept referenced
  until its copy's event was waited for;
- the loaders count a batch as consumed when it is *delivered*, after ``feed``: the one batch ``feed`` holds ahead
  is not consumed, so ``state_dict()`` and resuming are what they are without a device, and ``len()`` is unchanged.

``device="cpu"`` runs the same one-ahead path with no copy (``Tensor.to("cpu")`` is the tensor itself): the batches
are exactly those without a device, which is how CPU CI checks the bookkeeping. torch is imported only here and in
``tensors.py``.
"""
from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from time import perf_counter
from typing import Any

from ...errors import InvalidTypeError, InvalidValueError, MissingDependencyError
from ..stats import current

torch: Any = None  # imported by check_feed when a batch is to be fed: a loader that feeds nothing never imports it

DEVICE_TYPES = ("cpu", "cuda")


@dataclass(frozen=True)
class Feed:
    """What ``feed`` does to a stream of batches: pin their tensors, and/or copy them ahead to ``device``."""

    pin_memory: bool = False
    device: Any | None = None  # a torch.device, already checked

    @property
    def active(self) -> bool:
        return self.pin_memory or self.device is not None


NO_FEED = Feed()


def check_feed(pin_memory: Any = False, device: Any = None) -> Feed:
    """``pin_memory`` and ``device`` checked once at the boundary; errors name the parameter and the fix.

    ``device`` takes what ``torch.device`` takes (``"cuda"``, ``"cuda:1"``, ``torch.device(...)``, a CUDA index)
    for CPU or CUDA; pinning needs CUDA (it is for host-to-device copies), so both refuse a machine without it
    instead of silently doing nothing.
    """
    if not isinstance(pin_memory, bool):
        raise InvalidTypeError(f"pin_memory must be a bool, got {pin_memory!r} ({type(pin_memory).__name__})")
    if not pin_memory and device is None:
        return NO_FEED
    _import_torch(pin_memory, device)
    resolved = None if device is None else _check_device(device)
    on_cuda = resolved is not None and resolved.type == "cuda"
    if pin_memory and not (on_cuda or (resolved is None and torch.cuda.is_available())):
        where = f"device={device!r}" if resolved is not None else "no CUDA device is available"
        raise InvalidValueError(f"pin_memory=True is for copies to a CUDA device, but {where}; pass "
                                "pin_memory=torch.cuda.is_available() (or False)")
    return Feed(pin_memory=pin_memory, device=resolved)


def _import_torch(pin_memory: bool, device: Any) -> None:
    global torch
    if torch is None:
        try:
            import torch as module
        except ImportError:
            raise MissingDependencyError(f"pin_memory={pin_memory!r}, device={device!r} need torch; install it "
                                         "(pip install 'petastorm-balanced[torch]')") from None
        torch = module


def _check_device(device: Any):
    if isinstance(device, bool) or not isinstance(device, (str, int, torch.device)):
        raise InvalidTypeError(f"device must be a str, int or torch.device, got {device!r} "
                               f"({type(device).__name__})")
    try:
        resolved = torch.device("cuda", device) if isinstance(device, int) else torch.device(device)
    except (RuntimeError, ValueError, TypeError) as exc:
        raise InvalidValueError(f"device={device!r} is not a device torch knows ({exc}); pass e.g. 'cuda', "
                                "'cuda:0' or 'cpu'") from None
    if resolved.type not in DEVICE_TYPES:
        raise InvalidValueError(f"device={device!r} is not supported: batches are copied ahead to "
                                f"{' or '.join(DEVICE_TYPES)} devices; move them yourself for {resolved.type!r}")
    if resolved.type == "cuda":
        if not torch.cuda.is_available():
            raise InvalidValueError(f"device={device!r} needs CUDA, but torch.cuda.is_available() is False "
                                    f"(torch {torch.__version__}, CUDA build {torch.version.cuda}); pass "
                                    "device=None or 'cpu' on this machine")
        if resolved.index is None:
            resolved = torch.device("cuda", torch.cuda.current_device())
        if resolved.index >= torch.cuda.device_count():
            raise InvalidValueError(f"device={device!r}: this machine has {torch.cuda.device_count()} CUDA "
                                    f"device(s) (indices 0 to {torch.cuda.device_count() - 1})")
    return resolved


def feed(batches: Iterable[dict], options: Feed) -> Iterator[dict]:
    """``batches`` pinned and/or on ``options.device``, one batch copied ahead; the same batches, in order.

    Closing the returned iterator closes ``batches`` (the loader's reader stops with it).
    """
    if not options.active:
        return iter(batches)
    if options.device is None:
        return _pinned(batches)
    if options.device.type == "cpu":
        return _ahead(batches, lambda batch: (batch, None))
    return _ahead(batches, _CudaCopier(options.device, options.pin_memory))


def _pinned(batches: Iterable[dict]) -> Iterator[dict]:
    source = iter(batches)
    pin = _counted(_map_tensors)
    try:
        for batch in source:
            yield pin(batch, lambda t: t.pin_memory())
    finally:
        close_iterator(source)


def _ahead(batches: Iterable[dict], start) -> Iterator[dict]:
    """Start batch ``k + 1`` (``start``: read it, enqueue its copy) before handing over batch ``k``."""
    source = iter(batches)
    start = _counted(start)
    try:
        pending = _next_started(source, start)
        while pending is not None:
            ready = pending
            pending = _next_started(source, start)  # its copy runs while the consumer computes on `ready`
            batch, finish = ready
            yield batch if finish is None else _counted(finish)()
    finally:
        close_iterator(source)


def _counted(function):
    """``function``, its time counted to the ``device`` stage of the loader whose ``next()`` runs here
    (``reading/stats.py``); ``function`` itself when none does."""
    recorder = current()
    if recorder is None:
        return function

    def call(*args):
        cell = recorder.cell()
        start, inner = perf_counter(), cell.inner
        try:
            return function(*args)
        finally:
            cell.since("device", start, inner)
    return call


def _next_started(source: Iterator[dict], start):
    for batch in source:
        return start(batch)
    return None


class _CudaCopier:
    """Enqueue one batch's host-to-device copies on a side stream; ``finish`` makes the consumer wait for them."""

    def __init__(self, device, pin_memory: bool):
        self.device, self.pin_memory = device, pin_memory
        self.stream = torch.cuda.Stream(device=device)

    def __call__(self, batch: dict):
        host = _map_tensors(batch, lambda t: t.pin_memory()) if self.pin_memory else batch
        with torch.cuda.stream(self.stream):
            moved = _map_tensors(host, lambda t: t.to(self.device, non_blocking=True))
            copied = torch.cuda.Event()
            copied.record(self.stream)

        def finish(host=host):  # `host` (pinned) stays referenced until the consumer's stream waits for the copy
            consumer = torch.cuda.current_stream(self.device)
            consumer.wait_event(copied)
            _map_tensors(moved, lambda t: t.record_stream(consumer))
            return moved

        return batch, finish


def _map_tensors(batch: dict, fn) -> dict:
    """``fn`` applied to every tensor of a batch (a dict of tensors and lists of str; nested dicts too)."""
    out = {}
    for name, value in batch.items():
        if isinstance(value, torch.Tensor):
            result = fn(value)
            out[name] = value if result is None else result
        elif isinstance(value, dict):
            out[name] = _map_tensors(value, fn)
        else:
            out[name] = value
    return out


def delivered(batches: Iterable[dict], options: Feed, run: Any, *sources: object) -> Iterator[dict]:
    """``batches`` fed (``feed``: one may be held ahead), each counted into ``run`` (``run.delivered()``) only
    when it is handed on, so a batch held ahead is never consumed; ``sources`` are closed with it."""
    fed = feed(batches, options)
    try:
        for batch in fed:
            run.delivered()
            yield batch
    finally:
        close_iterator(fed)
        for source in sources:
            close_iterator(source)


def close_iterator(source: object) -> None:
    """Close a generator (or anything with ``close``); a plain iterator has nothing to close."""
    close = getattr(source, "close", None)
    if close is not None:
        close()


def prefetch_to_device(batches: Iterable[dict], device: Any, *, pin_memory: bool = False) -> Iterator[dict]:
    """Any iterable of batches (dicts of tensors), with the next one copied ahead to ``device``.

    For a plain ``DataLoader(BalancedIterableDataset(...), batch_size=None, pin_memory=True)``, where batches are
    pinned by the DataLoader: ``for batch in prefetch_to_device(loader, "cuda"):``. A plain DataLoader tracks no
    position, so nothing is miscounted; ``BalancedDataLoader(..., device=...)`` does the same and keeps
    ``state_dict()`` exact.
    """
    return feed(batches, check_feed(pin_memory, device))
