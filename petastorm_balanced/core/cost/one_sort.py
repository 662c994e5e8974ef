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
- rows inside each batch are shuffled by one sort per batch of packed ``(random, position)`` keys, all batches in
  one NumPy call, instead of two stable sorts of the whole window.

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
from ..shuffle import raw_words
from ..sorting import VECTOR_SORT

STREAM = 7  # generator key tag (``arrangement.py`` uses 1-4, ``pieces.py`` 5-6)
TIE_BITS = 16  # random bits that order equal costs (ties beyond: by position)
_LOW32 = np.uint64(0xFFFFFFFF)


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
    packed keys where NumPy sorts 64-bit integers with vector code (``sorting.vector_sort``: NumPy 2, or NumPy 1.26
    on AVX-512), else 16-bit stable radix passes, least significant first (NumPy 1 radix-sorts 16-bit keys; its
    scalar 64-bit sort is about 2x slower for 10,000 rows).
    """
    n = len(costs)
    row_bits = max(1, (n - 1).bit_length())
    values = costs.astype(np.uint64)  # (a negative cost, which check_costs refuses, wraps)
    cost_bits = int(values.max()).bit_length() if n else 0
    cut = max(0, cost_bits - (63 - row_bits - TIE_BITS))  # low cost bits left out of the key
    if cut:
        values >>= np.uint64(cut)
    cost_bits -= cut
    if not VECTOR_SORT:
        rows = np.argsort((words >> np.uint64(64 - TIE_BITS)).astype(np.uint16), kind="stable")
        for shift in range(0, cost_bits, 16):
            digits = (values[rows] >> np.uint64(shift)).astype(np.uint16)
            rows = rows[np.argsort(digits, kind="stable")]
        return rows, values[rows].astype(np.int64)
    values <<= np.uint64(TIE_BITS + row_bits)  # the packed keys, built in place: (cost, tie, position)
    tie = words >> np.uint64(64 - TIE_BITS)
    tie <<= np.uint64(row_bits)
    values |= tie
    values |= np.arange(n, dtype=np.uint64)
    values.sort()
    rows = (values & np.uint64((1 << row_bits) - 1)).view(np.int64)
    values >>= np.uint64(TIE_BITS + row_bits)
    return rows.astype(np.intp, copy=False), values.view(np.int64)


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


def shuffle_rows(rows: np.ndarray, steps: np.ndarray, size: int, words: np.ndarray, *, row_stride: int,
                 batch_stride: int) -> np.ndarray:
    """The batches ``steps`` (batch indices, in serving order) of ``size`` rows each, as one flat array of ``rows``'
    entries: row ``p`` of batch ``b`` is ``rows[p * row_stride + b * batch_stride]``; each batch's rows in the order
    of the low 32 bits of ``words`` (one word per entry, step after step; ties by position).

    One sort per batch of packed keys ``(random bits, position)``, run by NumPy over every batch in one call: a
    batch's keys stay in one or two cache lines, where a Fisher-Yates pass over all batches at once (a vector step
    per row) strides across the whole window at every step (about 2x slower at 400,000 rows). The serving order and
    the shuffle are one gather from ``rows`` (the picks carry the batch's offset), not a gather of the served batches
    and then another of their shuffled rows."""
    k = len(steps)
    bits = max(1, (size - 1).bit_length())
    if bits <= 16:  # 32-bit keys: at least 16 random bits beside the position (the words' low 32 bits, position bits
        keys = words[:k * size].astype(np.uint32)  # cleared)
        keys &= np.uint32(~((1 << bits) - 1) & 0xFFFFFFFF)
        keys = keys.reshape(k, size)
        keys |= np.arange(size, dtype=np.uint32)
    else:
        keys = ((words[:k * size] & _LOW32) << np.uint64(bits)).reshape(k, size) | np.arange(size, dtype=np.uint64)
    keys.sort(axis=1)
    picks = (keys & keys.dtype.type((1 << bits) - 1)).astype(np.intp)
    if row_stride != 1:
        picks *= row_stride
    picks += (np.asarray(steps, dtype=np.intp) * batch_stride)[:, None]
    return rows.reshape(-1).take(picks.reshape(-1))


def arrange_sum(costs: np.ndarray, batch_size: int, key: Sequence[int]) -> np.ndarray:
    """A permutation of the window's rows whose consecutive ``batch_size`` runs have near-equal cost sums."""
    costs, k = _whole_batches(costs, batch_size)
    n = len(costs)
    words = _stream(key, n + k)
    rows, sorted_costs = sorted_rows(costs, words[:n])  # cheapest first

    def largest(j: int, values: np.ndarray) -> np.ndarray:  # round j: the j-th k largest, largest first (a view)
        return values[n - (j + 1) * k:n - j * k][::-1]

    members = np.empty((batch_size, k), dtype=np.intp)  # members[j, b]: round j's row in batch b
    members[0] = largest(0, rows)
    loads = largest(0, sorted_costs).copy()
    # Loads that stay below 2**16 (the largest row of every round summed) are sorted as they are, in 16 bits: the
    # same order as their 16-bit digits, without computing the digits each round.
    small = bool(k) and int(sorted_costs[k - 1::k].sum()) < 1 << 16
    if small:
        loads = loads.astype(np.uint16)
    for j in range(1, batch_size if k else 0):  # the largest row of a round -> the lightest batch so far
        lightest = np.argsort(loads if small else _digits16(loads), kind="stable")
        members[j, lightest] = largest(j, rows)
        loads[lightest] += largest(j, sorted_costs).astype(loads.dtype, copy=False)
    loads = loads.astype(np.int64)
    # batches heaviest first (ties: lower batch), served in an order drawn without the rank
    heaviest = np.argsort(~_digits16(loads), kind="stable") if k else np.zeros(0, dtype=np.intp)
    # step s serves batch heaviest[permutation[s]], whose row p is members[p, batch]
    return shuffle_rows(members, heaviest[permutation(words[n:])], batch_size, words, row_stride=k, batch_stride=1)


def arrange_max(costs: np.ndarray, batch_size: int, key: Sequence[int]) -> np.ndarray:
    """A permutation whose batches are cost-sorted buckets, served in an order every rank draws alike."""
    costs, k = _whole_batches(costs, batch_size)
    n = len(costs)
    words = _stream(key, n + k)
    rows, _ = sorted_rows(costs, words[:n])
    # step s serves bucket permutation[s] (bucket q: the q-th cheapest run of batch_size rows)
    return shuffle_rows(rows, permutation(words[n:]), batch_size, words, row_stride=1, batch_stride=batch_size)
