"""How many rows the Arrow backend's reading threads take at a time (a *bundle*), from the decoded bytes this
slot's reads measured, adjusted after every bundle.

Why measured, not the footers: a footer counts a dictionary-encoded column's indices, not its strings (4 KB
strings drawn from 8 values weigh a few bytes a row there), and the loader's estimate reads only the first files'
footers (long strings that start later weigh what the short ones did). A bundle sized from that estimate held the
whole dataset's strings at once. Why this slot's reads only: a rank reads only its own row groups (G3), and nothing
here needs to agree between ranks, because bundles never change a batch (the batcher takes chunks in order,
whatever their cut; ``tests/reading/test_backends.py`` compares bundle sizes).

The bound, per bundle: a bundle is cut to about ``target`` measured bytes, and a reading thread stops a bundle
once it holds ``LIMIT_FACTOR x target`` bytes (``limit``), leaving its other fragments to be read where the bundle
is consumed, in bundles cut from the bytes just measured, one at a time; so a bundle holds at most ``LIMIT_FACTOR x
target`` bytes plus one fragment, even where rows grow many times over between two bundles. The first bundles,
cut before anything was measured, take ``first_rows`` rows (the loader's: one fragment each, since no estimate
bounds what a footer misjudges).

>>> from types import SimpleNamespace as F
>>> sizes = BundleSizes(target=1000, first_rows=2)
>>> cut = sizes.bundles([F(num_rows=1) for _ in range(9)])
>>> [len(next(cut)) for _ in range(2)]
[2, 2]
>>> sizes.measure(rows=4, nbytes=400)  # 100 bytes a row: 10 rows make the target
>>> [len(b) for b in cut]
[5]
"""
from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence

from ...plan.model import Fragment

LIMIT_FACTOR = 1.5  # a bundle read past this many times its target is cut short (rows far larger than measured)


class BundleSizes:
    """Rows per bundle, from the bytes per row measured on the bundles read so far (the latest measure: rows may
    shrink as well as grow along a slot's files). Reading threads call ``measure``; the consuming thread cuts."""

    def __init__(self, *, target: int, first_rows: int, max_rows: int | None = None):
        self.target = max(1, int(target))
        self._first, self._max = max(1, int(first_rows)), max_rows
        self._row_bytes: float | None = None  # decoded bytes per row, as last measured
        self._lock = threading.Lock()

    @property
    def limit(self) -> int:
        """Bytes past which a reading thread cuts its bundle short."""
        return int(LIMIT_FACTOR * self.target)

    def measure(self, *, rows: int, nbytes: int) -> None:
        if rows > 0:
            with self._lock:
                self._row_bytes = max(float(nbytes), 1.0) / rows

    def rows(self) -> int:
        with self._lock:
            row_bytes = self._row_bytes
        rows = self._first if row_bytes is None else max(1, int(self.target // row_bytes))
        return rows if self._max is None else min(rows, self._max)

    def bundles(self, fragments: Sequence[Fragment]) -> Iterator[list[Fragment]]:
        """Consecutive fragments grouped, each group cut when it is taken (so from the latest measure), as many as
        ``rows()`` rows hold (a fragment larger than that alone): a group never passes its target by a fragment."""
        i = 0
        while i < len(fragments):
            want, count = self.rows(), 0
            group: list[Fragment] = []
            while i < len(fragments) and (not group or count + fragments[i].num_rows <= want):
                group.append(fragments[i])
                count += fragments[i].num_rows
                i += 1
            yield group
