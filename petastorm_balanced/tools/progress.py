"""A one-line progress indicator on stderr, silent when stderr is not a terminal (logs, CI, pipes).

No dependency: long CLI work (reading thousands of footers, ``verify --read``) shows it is alive without
polluting captured output.
"""
from __future__ import annotations

import sys
import time
from typing import TextIO


class Progress:
    """``with Progress("footers", total) as bar: bar(1)``; redraws at most ten times a second."""

    def __init__(self, label: str, total: int | None = None, *, stream: TextIO | None = None,
                 enabled: bool | None = None):
        self.label, self.total, self.done = label, total, 0
        self.stream = sys.stderr if stream is None else stream
        self.enabled = _is_tty(self.stream) if enabled is None else enabled
        self._last = 0.0

    def __call__(self, n: int = 1) -> None:
        self.done += n
        now = time.monotonic()
        if self.enabled and (now - self._last >= 0.1 or self.done == self.total):
            self._last = now
            self.stream.write("\r" + self._text())
            self.stream.flush()

    def _text(self) -> str:
        if self.total:
            width = 24
            filled = int(width * min(self.done, self.total) / self.total)
            return f"{self.label} [{'#' * filled}{'.' * (width - filled)}] {self.done}/{self.total}"
        return f"{self.label} {self.done}"

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc) -> None:
        if self.enabled and self.done:
            self.stream.write("\r" + " " * len(self._text()) + "\r")
            self.stream.flush()


def _is_tty(stream) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False
