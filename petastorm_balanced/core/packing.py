"""Packed sequences (``make_loader(pack="tokens", seq_len=L, batch_size=S)``): every step is ``S`` sequences of
exactly ``L`` tokens, the same number of steps on every rank, each step about the same attention cost on every rank.
Pure numpy over document lengths: no I/O, no torch.

Why decided per shuffle window from what the plan knows: a rank must know its steps before the epoch
(``len(loader)``) and agree with every other rank without communication. Every rank reads the same number of
documents (the plan balances rows, one by one), in windows of the same number of rows, and the plan knows every
row group's tokens (its cost, ``cost="n_tokens"`` or ``"size(tokens)"``) and which rows each rank reads. So every
rank computes, for each window, the tokens every rank's window holds (exact for whole row groups, a row group cut
by a window's or a rank's boundary counted at its mean) and gives the window enough steps for the fullest rank,
plus ``ESTIMATE_SLACK`` (``window_steps``). A position is still an epoch and a count of steps: resuming re-reads one
window and packs it again, identically. Padding is then the ranks' spread of tokens (the plan's cost order keeps
every rank's stretch within about one row group of the mean, ``cost/order.py``); a document is left out only where
a cut row group held more than its mean share beyond the slack, and the loader warns when that happens
(``reading/batches/packing_check.py``). Without per-rank estimates (``Packing.window_steps`` None), a window of ``R``
documents gets ``ceil(R x mean x (1 + PACK_SLACK) / (S x L))`` steps.

Inside a window (``pack_window``), documents are dealt to steps by a capacity-constrained LPT on attention cost
(the sum over pieces of piece length squared, what causal attention over a piece costs): documents in decreasing
length (ties in a seeded random order), each to the step with the lowest attention cost that still has room for
its tokens; the shortest come last and fill the rooms left. Every step then holds close to ``S x L`` tokens and
close to the window's mean attention per step; every rank's window mean is the same up to sampling noise, so the
steps that meet across ranks cost about the same. Inside a step (``pack_step``), pieces go into the ``S``
sequences best-fit decreasing; a piece that fits no gap is cut over the largest gaps (so a step never overflows).

Documents longer than ``L`` are cut into consecutive pieces of ``L`` tokens and a remainder (``long_documents=
"split"``, the default: every token is trained on, and a piece of ``L`` tokens is exactly one sequence with no
padding); ``"drop"`` leaves them out instead (a model that must never see a cut document). A document longer than
a whole step (``S x L``) cannot be packed into one step and is refused when the loader is made.

>>> import numpy as np
>>> lengths = np.array([700, 300, 200, 120, 100, 90, 80, 60, 40, 30, 20, 8])
>>> packing = Packing("tokens", seq_len=256, sequences=4, mean_tokens=float(lengths.mean()))
>>> packing.steps(len(lengths))  # 1,748 tokens: two steps of 4 x 256
2
>>> order, rows_per_step = packing.arrange(lengths, (0, 0, 0, 0, 0))
>>> int(lengths[order].sum()) == int(lengths.sum())  # every token placed
True
>>> steps = np.split(order, np.cumsum(rows_per_step)[:-1])
>>> [int(lengths[step].sum()) for step in steps]  # tokens per step (at most 4 x 256)
[728, 1020]
>>> [int(attention_cost(lengths[step], 256).sum()) for step in steps]  # what attention costs: close
[166880, 152472]
>>> layout = pack_step(lengths[order[:rows_per_step[0]]], seq_len=256, sequences=4)
>>> bool((np.bincount(layout.sequence, weights=layout.length, minlength=4) <= 256).all())
True
"""
from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ..errors import InvalidValueError
from .params import check_choice
from .shuffle import raw_words, window_permutation

PACKING_VERSION = 1  # of the rule that makes a window's steps; a saved position names it
PACK_SLACK = 0.005  # room for windows with more tokens than the mean says: about 0.5% padding, rarely a left-out doc
ESTIMATE_SLACK = 0.002  # room for the estimate of a row group split between slots (``window_steps``)
LONG_DOCUMENTS = ("split", "drop")
LONG_DOCUMENTS_MEANING = ("'split' cuts a document longer than seq_len into consecutive pieces, 'drop' leaves "
                          "it out")
# generator key tags (distinct from cost/arrangement.py's)
_ORDER, _STEPS, _TIE = 11, 12, 13


def attention_cost(lengths: np.ndarray, seq_len: int) -> np.ndarray:
    """Causal attention cost of each document once cut into pieces of at most ``seq_len``: sum of squares."""
    lengths = np.asarray(lengths, dtype=np.int64)
    full, rest = np.divmod(lengths, seq_len)
    return full * seq_len * seq_len + rest * rest


@dataclass(frozen=True)
class Packing:
    """How a loader packs column ``column``: ``sequences`` (S) sequences of ``seq_len`` (L) tokens per step;
    ``mean_tokens`` is the plan's tokens per document (its cost per matching row)."""

    column: str
    seq_len: int
    sequences: int
    mean_tokens: float
    long_documents: str = "split"
    version: int = PACKING_VERSION
    # steps of each window of this epoch, the same on every rank (``window_steps``); None: from the mean alone
    window_steps: tuple[int, ...] | None = None

    def __post_init__(self):
        check_choice("long_documents", self.long_documents, LONG_DOCUMENTS, LONG_DOCUMENTS_MEANING)

    @property
    def step_tokens(self) -> int:
        return self.seq_len * self.sequences

    def steps(self, rows: int) -> int:
        """Steps a window of ``rows`` documents becomes from the plan's mean tokens alone (without
        ``window_steps``): the same on every rank."""
        if rows <= 0:
            return 0
        expected = rows * self.mean_tokens * (1 + PACK_SLACK)
        return int(max(1, np.ceil(expected / self.step_tokens)))

    def steps_of_window(self, window: int, rows: int) -> int:
        """Steps of window number ``window`` (of ``rows`` documents) of this epoch."""
        if self.window_steps is None:
            return self.steps(rows)
        return self.window_steps[window] if rows > 0 else 0

    def arrange(self, lengths: np.ndarray, key: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
        """``(order, rows_per_step)`` of one window (``pack_window`` with this packing's settings); the key's last
        word is the window's number."""
        return pack_window(lengths, steps=self.steps_of_window(int(key[-1]), len(lengths)), seq_len=self.seq_len,
                           sequences=self.sequences, key=key, long_documents=self.long_documents)


def window_steps(rank: np.ndarray, rows: np.ndarray, tokens: np.ndarray, *, world_size: int, window_rows: int,
                 step_tokens: int, slack: float = ESTIMATE_SLACK) -> tuple[int, ...]:
    """Steps of each window of an epoch, from every rank's pieces (``rank``, ``rows``, estimated ``tokens``; all
    (pieces,), each rank's in delivery order): enough for the rank whose window holds the most tokens, plus
    ``slack``. Every rank computes the same from the plan, so steps stay equal; a rank's window then overflows only
    where a piece's estimate (a row group split between slots, counted at its mean) fell short by more than the
    slack. Every rank holds the same rows, so the windows line up.

    >>> window_steps(np.array([0, 0, 1]), np.array([4, 4, 8]), np.array([900.0, 100.0, 1200.0]), world_size=2,
    ...              window_rows=4, step_tokens=512)
    (2, 2)
    """
    rank, rows = np.asarray(rank, dtype=np.int64), np.asarray(rows, dtype=np.int64)
    tokens = np.asarray(tokens, dtype=np.float64)
    per_rank = np.bincount(rank, weights=rows, minlength=world_size)
    total = int(per_rank.max(initial=0))
    bounds = np.minimum(np.arange(0, total + window_rows, window_rows), total)  # (windows + 1,)
    most = np.zeros(max(len(bounds) - 1, 0))
    for r in range(world_size):
        mine = rank == r
        x = np.r_[0, np.cumsum(rows[mine])].astype(np.float64)
        y = np.r_[0, np.cumsum(tokens[mine])]
        most = np.maximum(most, np.diff(np.interp(bounds, x, y)))  # tokens per window, linear inside a piece
    steps = np.ceil(most * (1 + slack) / step_tokens).astype(np.int64)
    return tuple(int(s) for s in np.maximum(steps, (np.diff(bounds) > 0).astype(np.int64)))


def pack_window(lengths: np.ndarray, *, steps: int, seq_len: int, sequences: int, key: Sequence[int],
                long_documents: str = "split") -> tuple[np.ndarray, np.ndarray]:
    """The documents of one window dealt to ``steps`` steps of ``sequences x seq_len`` tokens.

    ``order`` lists the kept documents (indices into ``lengths``) step after step, ``rows_per_step`` (steps,) how
    many each step holds. Left out: empty documents (no token), documents longer than ``seq_len`` under
    ``long_documents="drop"``, and documents that fit in no step (the window held more tokens than its steps).
    """
    lengths = np.asarray(lengths, dtype=np.int64)
    capacity = seq_len * sequences
    if lengths.size and int(lengths.max()) > capacity and long_documents == "split":
        raise InvalidValueError(f"a document of {int(lengths.max())} tokens is longer than a step's "
                                f"{sequences} x {seq_len} tokens; raise batch_size or seq_len, or pass "
                                "long_documents='drop'")
    keep = lengths > 0
    if long_documents == "drop":
        keep &= lengths <= seq_len
    attention = attention_cost(lengths, seq_len)
    # longest first (ties in a seeded random order): the last documents placed are the shortest, which fit the
    # rooms the others left, so a window whose steps hold its tokens leaves nothing out
    words = raw_words((*key, _ORDER), len(lengths))
    candidates = np.lexsort((words, -lengths))
    candidates = candidates[keep[candidates]]
    tie = window_permutation(steps, (*key, _TIE)).tolist()
    load = [0] * steps  # attention so far per step
    room = [capacity] * steps
    lightest = [(0, tie[s], s) for s in range(steps)]  # lazy min-heap of (load, tie, step); stale when load moved
    roomiest = [(-capacity, s) for s in range(steps)]  # lazy max-heap of room, for a document the lightest refuse
    members: list[list[int]] = [[] for _ in range(steps)]
    length_list, attention_list = lengths.tolist(), attention.tolist()
    for doc in candidates.tolist():
        size = length_list[doc]
        step = _lightest_with_room(lightest, load, room, size)
        if step is None:
            step = _roomiest(roomiest, room, size)
            if step is None:
                continue  # no step has room: left out of this epoch
        members[step].append(doc)
        load[step] += attention_list[doc]
        room[step] -= size
        heapq.heappush(lightest, (load[step], tie[step], step))
        heapq.heappush(roomiest, (-room[step], step))
    served = window_permutation(steps, (*key, _STEPS)).tolist()
    groups = [np.asarray(members[s], dtype=np.int64) for s in served]
    counts = np.fromiter((len(g) for g in groups), dtype=np.int64, count=steps)
    order = np.concatenate(groups) if groups else np.zeros(0, dtype=np.int64)
    return order, counts


_PROBES = 32  # lightest steps tried before the roomiest one (near a window's end most steps are nearly full)


def _lightest_with_room(heap: list, load: list[int], room: list[int], size: int) -> int | None:
    """The lightest step (of the first ``_PROBES`` valid entries) with ``size`` tokens of room; its entry is
    consumed (the caller pushes the new one). Full steps leave the heap for good."""
    refused: list[tuple[int, int, int]] = []
    found = None
    while heap and len(refused) < _PROBES:
        entry = heapq.heappop(heap)
        step = entry[2]
        if entry[0] != load[step] or room[step] == 0:
            continue  # stale, or full
        if room[step] >= size:
            found = step
            break
        refused.append(entry)
    for entry in refused:
        heapq.heappush(heap, entry)
    return found


def _roomiest(heap: list, room: list[int], size: int) -> int | None:
    """The step with the most room if ``size`` tokens fit there (its entry stays: the caller pushes a newer one)."""
    while heap:
        negative, step = heap[0]
        if -negative != room[step]:
            heapq.heappop(heap)  # stale
            continue
        return step if room[step] >= size else None
    return None


@dataclass(frozen=True)
class StepLayout:
    """Where each piece of a step's documents goes: piece ``i`` is tokens ``[start[i], start[i] + length[i])`` of
    document ``row[i]`` (an index into the step's documents), at ``offset[i]`` of sequence ``sequence[i]``, and is
    the ``segment[i]``-th piece of that sequence (1-based, in offset order). All arrays are (pieces,) int64."""

    row: np.ndarray
    start: np.ndarray
    length: np.ndarray
    sequence: np.ndarray
    offset: np.ndarray
    segment: np.ndarray


def pack_step(lengths: np.ndarray, *, seq_len: int, sequences: int) -> StepLayout:
    """The pieces of one step's documents (``lengths``, in delivery order) in ``sequences`` sequences of
    ``seq_len`` tokens: pieces of ``seq_len`` fill a sequence each, the remainders go best-fit decreasing into the
    rest, and a remainder that fits no gap is cut over the largest gaps. A function of ``lengths`` alone (ties by
    position), so a resumed window gives the same layout."""
    lengths = np.asarray(lengths, dtype=np.int64)
    total = int(lengths.sum())
    if total > seq_len * sequences:
        raise InvalidValueError(f"a step of {total} tokens does not fit {sequences} x {seq_len}")
    pieces: list[tuple[int, int, int, int, int]] = []  # (row, start, length, sequence, offset)
    fill = [0] * sequences
    nxt = 0
    for row, length in enumerate(lengths.tolist()):
        for start in range(0, length - length % seq_len, seq_len):  # whole pieces, one sequence each
            pieces.append((row, start, seq_len, nxt, 0))
            fill[nxt] = seq_len
            nxt += 1
    rests = sorted(((length % seq_len, row) for row, length in enumerate(lengths.tolist()) if length % seq_len),
                   key=lambda item: (-item[0], item[1]))
    for size, row in rests:
        start = int(lengths[row]) - size
        best = -1
        for s in range(nxt, sequences):
            gap = seq_len - fill[s]
            if gap >= size and (best < 0 or gap < seq_len - fill[best]):
                best = s
        if best >= 0:
            pieces.append((row, start, size, best, fill[best]))
            fill[best] += size
            continue
        while size:  # cut over the largest gaps, in order
            s = max(range(nxt, sequences), key=lambda q: (seq_len - fill[q], -q))
            take = min(size, seq_len - fill[s])
            pieces.append((row, start, take, s, fill[s]))
            fill[s] += take
            start += take
            size -= take
    table = np.asarray(pieces, dtype=np.int64).reshape(-1, 5)
    table = table[np.lexsort((table[:, 4], table[:, 3]))]  # by sequence, then offset
    first = np.r_[True, table[1:, 3] != table[:-1, 3]] if len(table) else np.zeros(0, dtype=bool)
    index = np.arange(len(table))
    segment = index - np.maximum.accumulate(np.where(first, index, 0)) + 1
    return StepLayout(row=table[:, 0], start=table[:, 1], length=table[:, 2], sequence=table[:, 3],
                      offset=table[:, 4], segment=segment.astype(np.int64))
