"""Progress of long CLI work (reading thousands of footers, ``verify --read``): a bar at a terminal, log lines
elsewhere, nothing with ``--quiet``.

At a terminal the bar is tqdm's where tqdm is installed, else a one-line bar of our own on stderr (no dependency).
Off a terminal (logs, CI, pipes) nothing is written to the stream, so captured output stays clean; instead a line
goes to the ``petastorm_balanced.progress`` logger (INFO) every ``LOG_EVERY_S`` seconds of long work, which shows
wherever the job configured logging.
"""
from __future__ import annotations

import logging
import sys
import time
from typing import Any, TextIO

LOG = logging.getLogger("petastorm_balanced.progress")
LOG_EVERY_S = 10.0
QUIET = False  # set by the CLI's --quiet: no bar and no log lines


class Progress:
    """``with Progress("footers", total) as bar: bar(1)``; redraws at most ten times a second.

    ``enabled``: draw our own bar on ``stream`` (default: when ``stream`` is a terminal, where tqdm's is used if
    installed); ``quiet``: nothing at all (default: the CLI's ``--quiet``).
    """

    def __init__(self, label: str, total: int | None = None, *, stream: TextIO | None = None,
                 enabled: bool | None = None, quiet: bool | None = None):
        self.label, self.total, self.done = label, total, 0
        self.stream = sys.stderr if stream is None else stream
        self.quiet = QUIET if quiet is None else quiet
        tty = _is_tty(self.stream)
        self.enabled = (tty if enabled is None else enabled) and not self.quiet
        self._bar = _tqdm(label, total, self.stream) if self.enabled and enabled is None else None
        self._logs = not self.quiet and not self.enabled
        self._last = 0.0
        self._started = self._logged = time.monotonic()

    def __call__(self, n: int = 1) -> None:
        self.done += n
        if self._bar is not None:
            self._bar.update(n)
            return
        now = time.monotonic()
        if self.enabled and (now - self._last >= 0.1 or self.done == self.total):
            self._last = now
            self.stream.write("\r" + self._text())
            self.stream.flush()
        elif self._logs and now - self._logged >= LOG_EVERY_S:
            self._logged = now
            LOG.info("%s (%.0f s)", self._text(), now - self._started)

    def _text(self) -> str:
        if self.total:
            width = 24
            filled = int(width * min(self.done, self.total) / self.total)
            return f"{self.label} [{'#' * filled}{'.' * (width - filled)}] {self.done}/{self.total}"
        return f"{self.label} {self.done}"

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc) -> None:
        if self._bar is not None:
            self._bar.close()
        elif self.enabled and self.done:
            self.stream.write("\r" + " " * len(self._text()) + "\r")
            self.stream.flush()
        elif self._logs and self._logged > self._started:  # long enough to have logged: say it ended
            LOG.info("%s: done in %.0f s", self._text(), time.monotonic() - self._started)


def _tqdm(label: str, total: int | None, stream: TextIO) -> Any:
    import importlib
    try:
        tqdm = importlib.import_module("tqdm").tqdm  # optional, untyped
    except ImportError:
        return None
    return tqdm(total=total, desc=label, file=stream, leave=False, dynamic_ncols=True)


def _is_tty(stream) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False
