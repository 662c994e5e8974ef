"""Packing never leaves a document out silently: ``warn_left_out`` names what a window could not place.

Separate from ``packing.py`` because ``stream.py`` (which arranges windows) calls it and ``packing.py`` imports
``stream``; this module imports neither.
"""
from __future__ import annotations

import warnings
from collections.abc import Sequence

import numpy as np

from ...core.packing import Packing
from ...errors import PackingWarning


def warn_left_out(packing: Packing, lengths, order: np.ndarray, key: Sequence[int]) -> None:
    """A ``PackingWarning`` when the window ``key`` (its last word: the window's number) placed fewer documents
    than it could: ones the policy drops (empty, or longer than ``seq_len`` with ``long_documents="drop"``) are not
    counted."""
    lengths = np.asarray(lengths, dtype=np.int64)
    eligible = lengths > 0
    if packing.long_documents == "drop":
        eligible &= lengths <= packing.seq_len
    missing = int(eligible.sum()) - len(order)
    if missing <= 0:
        return
    tokens = int(lengths[eligible].sum() - lengths[order].sum())
    warnings.warn(PackingWarning(
        f"packing left {missing} document(s), {tokens} tokens, of shuffle window {int(key[-1])} (epoch "
        f"{int(key[1]) if len(key) > 1 else '?'}) out of this epoch: the window held more tokens than the "
        f"{packing.steps_of_window(int(key[-1]), len(lengths))} steps of {packing.sequences} x {packing.seq_len} the "
        "plan gave it (a row group cut by a window's or a rank's boundary held more than its mean share); a larger "
        "shuffle window, or smaller row groups when writing, make it rarer"), stacklevel=2)
