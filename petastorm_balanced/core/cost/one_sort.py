"""Fixed-size batches inside one shuffle window from one sort and one random stream: the version 2 arrangements
(``"round-lpt"`` and ``"sorted-buckets"`` v2, ``ARRANGEMENTS`` in ``arrangement.py``), which balance as the first
versions do for less work per window.

The rules are those of ``arrangement.py`` (``"sum"``: a round-wise LPT, then batches served heaviest-quantile alike
on every rank; ``"max"``: cost-sorted buckets served in an order every rank draws alike). What changes is how:

- **one random stream** per window, drawn from the key *without* the rank, ``[seed, epoch, slot, window]``: its
  first ``n`` words break cost ties (their high bits) and shuffle rows inside batches (their low bits), the next
  ``k`` order the steps. Every rank draws the same words; its window holds other rows, so its batches differ. The
  step order must be the same on every rank anyway, and one stream starts one generator instead of three.
- **one sort**: each row's key packs its cost, random tie bits and its position into one 64-bit word, and the keys
  are sorted once (unique keys: any sort algorithm gives the same order, on every NumPy). The positions and the
  costs of the sorted rows are read back from the keys, with no gather. Costs too wide to fit beside 16 random
  bits and the position are compared by their high bits (an order only a little coarser, for costs beyond about
  ``2**28`` per row in a window of ``2**19`` rows).
- the LPT rounds sort the batches' loads as 16-bit digits (the loads' spread cut to its top 16 bits: one radix
  pass, exact while the spread is below ``2**16``); a load's rank is then off by less than ``spread / 2**15``, so the
  bound ``max batch - min batch <= largest row`` becomes ``<= largest row / (1 - 2**-15)``.
- rows inside each batch are shuffled by a Fisher-Yates pass run over all batches at once (one vector step per row
  of a batch), instead of two sorts of the whole window.

The result is a function of the window's costs and the key alone, as before: resuming re-reads the window and gets
the same batches (G4, G6), on every backend (G12).

>>> import numpy as np
>>> costs = np.array([9, 1, 1, 1, 5, 5, 3, 3])
>>> order = arrange_sum(costs, 4, (0, 0, 0, 0, 0))
>>> sorted(int(costs[order[i:i + 4]].sum()) for i in range(0, 8, 4))
[14, 14]
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ...errors import InvalidValueError
from ..shuffle import _VECTOR_SORT, raw_words

STREAM = 7  # generator key tag (``arrangement.py`` uses 1-4, ``pieces.py`` 5-6)
TIE_BITS = 16  # random bits that order equal costs (ties beyond: by position)
_LOW32 = np.uint64(0xFFFFFFFF)
_SHUFFLE_BY_SORT = 64  # batches of more rows are shuffled inside by one sort, not a Fisher-Yates pass per row


def _rank_free(key: Sequence[int]) -> tuple[int, ...]:
    """The window key ``(seed, epoch, rank, slot[, stage], window)`` without the rank: the same on every rank."""
    return (*key[:2], *key[3:])


def _stream(key: Sequence[int], count: int) -> np.ndarray:
    return raw_words((*_rank_free(key), STREAM), count)


def _whole_batches(costs, batch_size: int) -> tuple[np.ndarray, int]:
    costs = np.asarray(costs, dtype=np.int64)
    k = len(costs) // batch_size
    if k * batch_size != len(costs):
        raise InvalidValueError(f"a window of {len(costs)} rows is not whole batches of {batch_size}")
    return costs, k


def sorted_rows(costs: np.ndarray, words: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(rows, keys)``: the rows by cost, cheapest first, equal costs by the words' top 16 bits, then by position;
    ``keys`` are the costs as compared (``costs >> s``, ``s`` 0 unless the costs are too wide to pack beside the
    16 bits and the position), in the rows' order.

    The order is that of the unique 64-bit keys ``(cost, tie, position)``, however it is computed: one sort of the
    packed keys where NumPy sorts 64-bit integers with vector code (NumPy 2), else 16-bit stable radix passes,
    least significant first (NumPy 1 radix-sorts 16-bit keys; its 64-bit sort is about 2x slower for 10,000 rows).
    """
    n = len(costs)
    row_bits = max(1, (n - 1).bit_length())
    values = costs.astype(np.uint64)  # (a negative cost, which check_costs refuses, wraps)
    cost_bits = int(values.max()).bit_length() if n else 0
    cut = max(0, cost_bits - (63 - row_bits - TIE_BITS))  # low cost bits left out of the key
    if cut:
        values >>= np.uint64(cut)
    cost_bits -= cut
    if not _VECTOR_SORT:
        rows = np.argsort((words >> np.uint64(64 - TIE_BITS)).astype(np.uint16), kind="stable")
        for shift in range(0, cost_bits, 16):
            digits = (values[rows] >> np.uint64(shift)).astype(np.uint16)
            rows = rows[np.argsort(digits, kind="stable")]
        return rows, values[rows].astype(np.int64)
    packed = (values << np.uint64(TIE_BITS + row_bits)) | ((words >> np.uint64(64 - TIE_BITS)) << np.uint64(row_bits))
    packed |= np.arange(n, dtype=np.uint64)
    packed.sort()
    rows = (packed & np.uint64((1 << row_bits) - 1)).astype(np.intp)
    return rows, (packed >> np.uint64(TIE_BITS + row_bits)).astype(np.int64)


def permutation(words: np.ndarray) -> np.ndarray:
    """A permutation of ``len(words)`` from the words (one sort of their high bits packed with the position)."""
    n = len(words)
    bits = max(1, (n - 1).bit_length())
    packed = ((words >> np.uint64(bits)) << np.uint64(bits)) | np.arange(n, dtype=np.uint64)
    packed.sort()
    return (packed & np.uint64((1 << bits) - 1)).astype(np.intp)


def _digits16(values: np.ndarray) -> np.ndarray:
    """``values`` (int64) as 16-bit digits of the same order, up to their spread's top 16 bits (ties by position in
    a stable sort); exact while the spread is below ``2**16``."""
    low = values.min()
    cut = max(0, int(values.max() - low).bit_length() - 16)
    return ((values - low) >> cut).astype(np.uint16)


def shuffle_columns(members: np.ndarray, words: np.ndarray) -> np.ndarray:
    """``members`` (rows per batch, batches) with each column permuted by the low 32 bits of ``words`` (at least
    ``members.size`` of them): Fisher-Yates over every batch at once, or one sort of packed keys for long batches."""
    members = np.ascontiguousarray(members)  # (the swaps write through a flat view)
    rows, k = members.shape
    low = words[:rows * k] & _LOW32
    if rows > _SHUFFLE_BY_SORT:  # per column: rows by (random 32 bits, then row); unique keys
        bits = max(1, (rows - 1).bit_length())
        packed = (low.reshape(rows, k) << np.uint64(bits)) | np.arange(rows, dtype=np.uint64)[:, None]
        packed.sort(axis=0)
        picks = (packed & np.uint64((1 << bits) - 1)).astype(np.intp)
        return np.take_along_axis(members, picks, axis=0)
    # every step's j at once: flat positions j * k + column of row j (0 <= j <= i) in each batch
    steps = np.arange(rows - 1, 0, -1, dtype=np.uint64)  # i = rows-1 .. 1
    picks = ((low.reshape(rows, k)[rows - 1:0:-1] * (steps[:, None] + np.uint64(1))) >> np.uint64(32)).astype(np.intp)
    picks *= k
    picks += np.arange(k)
    flat = members.reshape(-1)
    for i, pick in zip(range(rows - 1, 0, -1), picks, strict=True):  # swap row i of every batch with its row j
        held = members[i].copy()
        members[i] = flat.take(pick)
        flat.put(pick, held)
    return members


def arrange_sum(costs: np.ndarray, batch_size: int, key: Sequence[int]) -> np.ndarray:
    """A permutation of the window's rows whose consecutive ``batch_size`` runs have near-equal cost sums."""
    costs, k = _whole_batches(costs, batch_size)
    n = len(costs)
    words = _stream(key, n + k)
    rows, sorted_costs = sorted_rows(costs, words[:n])
    rounds = rows[::-1].reshape(batch_size, k)  # (rounds, batches): round j holds the j-th k largest, largest first
    round_costs = sorted_costs[::-1].reshape(batch_size, k)
    members = np.empty((batch_size, k), dtype=np.intp)  # members[j, b]: round j's row in batch b
    members[0] = rounds[0]
    loads = round_costs[0].copy() if k else np.zeros(0, dtype=np.int64)
    # Loads that stay below 2**16 (the largest of every round summed) are sorted as they are, in 16 bits: the same
    # order as their 16-bit digits, without computing the digits each round.
    small = k and int(round_costs[:, 0].sum()) < 1 << 16
    if small:
        loads, round_costs = loads.astype(np.uint16), round_costs.astype(np.uint16)
    for j in range(1, batch_size if k else 0):  # the largest row of a round -> the lightest batch so far
        lightest = np.argsort(loads if small else _digits16(loads), kind="stable")
        members[j, lightest] = rounds[j]
        loads[lightest] += round_costs[j]
    loads = loads.astype(np.int64)
    # batches heaviest first (ties: lower batch), served in an order drawn without the rank
    heaviest = np.argsort(~_digits16(loads), kind="stable") if k else np.zeros(0, dtype=np.intp)
    members = members[:, heaviest[permutation(words[n:])]]
    return shuffle_columns(members, words).T.reshape(-1)


def arrange_max(costs: np.ndarray, batch_size: int, key: Sequence[int]) -> np.ndarray:
    """A permutation whose batches are cost-sorted buckets, served in an order every rank draws alike."""
    costs, k = _whole_batches(costs, batch_size)
    n = len(costs)
    words = _stream(key, n + k)
    rows, _ = sorted_rows(costs, words[:n])
    members = rows.reshape(k, batch_size)[permutation(words[n:])].T.copy()  # (rows, steps): bucket by step
    return shuffle_columns(members, words).T.reshape(-1)
