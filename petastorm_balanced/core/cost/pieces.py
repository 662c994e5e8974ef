"""Cost balance inside a mixture's source (G11 for G17): one shuffle window arranged into the pieces its batches take.

A mixture's batch holds ``floor`` or ``ceil`` of each source's share, so a source's window does not split into
batches of one size: batch ``t`` takes the source's rows from counter ``b(t)`` to ``b(t + 1)`` (the schedule's
boundaries, the same on every rank), and a window's rows fall into *pieces*: the parts of the batches it covers,
the first and last possibly cut by the window's edges. ``arrange_pieces`` permutes the window so that each piece,
in step order, gets the rows a fixed-size arrangement (``arrangement.py``) would give a batch:

- ``"sum"``: rows dealt in rounds, largest first; round ``j`` gives one row to every piece with more than ``j``
  rows, the largest to the piece lightest so far (the round-wise LPT of ``arrange_sum``). Then, among the pieces of
  one size, the heaviest is served first in an order drawn from a key without the rank, so the heavy pieces of all
  ranks (a row costlier than a mean piece) meet in the same steps.
- ``"max"``: rows sorted by cost are cut into consecutive runs of the pieces' sizes, the pieces taking the runs in
  an order drawn without the rank: at every step all ranks serve the same quantile of their windows.

Every rank's pieces have the same sizes (the schedule and each source's counter are the same on every rank), so
the ranks' parts of a batch cost about the same, as single-plan batches do. The permutation depends on the window's
costs, the sizes and the key alone: re-reading a window after a resume gives the same pieces (G6).

>>> import numpy as np
>>> costs = np.array([9, 1, 1, 1, 5, 5, 3, 3, 2])
>>> order = arrange_pieces(costs, [3, 2, 4], "sum", (0, 0, 0, 0, 0))
>>> sorted(len(p) for p in np.split(costs[order], [3, 5]))
[2, 3, 4]
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ...errors import InvalidValueError
from ..shuffle import raw_words, window_permutation
from .arrangement import _ascending, descending

PIECE_ORDER, IN_PIECE = 5, 6  # generator key tags (arrangement.py uses 1-4)


def _rank_free(key: Sequence[int]) -> tuple[int, ...]:
    """The key without its rank (``slot_key``'s third entry): the same on every rank for the same window."""
    return (*key[:2], *key[3:])


def arrange_pieces(costs: np.ndarray, pieces: Sequence[int] | np.ndarray, reduce: str,
                   key: Sequence[int]) -> np.ndarray:
    """A permutation of the window's rows: consecutive runs of ``pieces`` rows (the pieces, in step order) of
    near-equal cost per row (``"sum"``) or of similar costs (``"max"``)."""
    costs = np.asarray(costs, dtype=np.int64)
    sizes = np.asarray(pieces, dtype=np.int64)
    if int(sizes.sum()) != len(costs) or (sizes < 0).any():
        raise InvalidValueError(f"pieces of {sizes.tolist()} rows do not make a window of {len(costs)} rows")
    k = len(sizes)
    piece = np.empty(len(costs), dtype=np.int64)  # the piece (in step order) each row goes to
    if reduce == "max":
        order = _ascending(costs, key)
        served = window_permutation(k, (*_rank_free(key), PIECE_ORDER))  # run m (cheapest first) -> piece served[m]
        piece[order] = np.repeat(served, sizes[served])
    elif reduce == "sum":
        order = descending(costs, key)
        loads = np.zeros(k, dtype=np.int64)
        taken = 0
        for j in range(int(sizes.max()) if k else 0):
            active = np.flatnonzero(sizes > j)
            rows = order[taken:taken + len(active)]
            taken += len(active)
            lightest = active[np.argsort(loads[active], kind="stable")] if j else active
            piece[rows] = lightest
            loads[lightest] += costs[rows]
        # among pieces of one size, heaviest first, served in an order drawn without the rank
        target = np.arange(k)
        for size in np.unique(sizes):
            slots = np.flatnonzero(sizes == size)
            ranked = slots[np.argsort(-loads[slots], kind="stable")]
            draw = window_permutation(len(slots), (*_rank_free(key), PIECE_ORDER, int(size)))
            target[ranked] = slots[draw]
        piece = target[piece]
    else:
        raise InvalidValueError(f"cost_reduce={reduce!r} is not 'sum' or 'max'")
    # rows of a piece in a seeded order: pieces in step order, a random word inside each
    words = raw_words((*key, IN_PIECE), len(costs))
    return np.lexsort((words, piece))


def window_pieces(first: int, last: int, cuts: np.ndarray) -> np.ndarray:
    """Sizes of the pieces of a window holding counters ``first..last-1``, given the batch boundaries ``cuts``
    (sorted counters) inside it."""
    if last <= first:
        return np.empty(0, dtype=np.int64)
    inner = cuts[(cuts > first) & (cuts < last)]
    return np.diff(np.concatenate(([first], inner, [last])))
