"""``LoaderOptions``: the one definition of what a user chooses for a loader, checked once where it is given.

``make_loader`` and ``BalancedIterableDataset`` keep their keyword signatures (the public contract) and build
their options here with ``LoaderOptions.of(arguments)``, so an option, its default and its check are written once;
``tests/reading/test_loader_options.py`` holds both signatures to this definition. The checks that need the plan
(the batch size's default, cost, sub-epochs against the steps, a transform's columns) are ``settings.Settings``'.
"""
from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields, replace
from decimal import Decimal
from numbers import Integral
from typing import Any, Final, Literal

from ..core.balance import RESHUFFLES
from ..core.cost.arrangement import REDUCES, REDUCES_MEANING
from ..core.cost.spec import BALANCE, BALANCE_MEANING
from ..core.packing import LONG_DOCUMENTS, LONG_DOCUMENTS_MEANING
from ..core.params import check_choice, check_int
from ..core.shuffle import DEFAULT_BUDGET
from ..errors import InvalidTypeError, InvalidValueError
from .fields.list_shapes import ListOptions

TORCH: Final = "torch"
NUMPY: Final = "numpy"
BATCH_FORMATS = (TORCH, NUMPY)  # tensors.py makes each

# The named choices, typed: each is checked against its accepted values once, in ``LoaderOptions``.
Reshuffle = Literal["epoch", "fixed"]
Balance = Literal["auto", "cost", "rows"]
CostReduce = Literal["sum", "max"]
BatchFormat = Literal["torch", "numpy"]
LongDocuments = Literal["split", "drop"]

SHUFFLE_BUDGET = DEFAULT_BUDGET  # default bytes of decoded rows one rank's shuffle may hold (``core/shuffle.py``)
# default bytes of local disk one rank's shuffle windows may take (``reading/windows/spill.py``)
SPILL_BUDGET = 64 * 2**30


@dataclass(frozen=True)
class LoaderOptions:
    """What a user chose for a loader, checked once where it is given (``make_loader``,
    ``BalancedIterableDataset``) and handed down whole to ``settings.Settings``, which checks it against the plan.

    One object instead of a dozen keyword arguments relayed by hand through every layer: a new option is added
    here, with its check and its default, then to both signatures (the test above fails until it is), and reaches
    every loader. These checks need nothing but the values.
    """

    batch_size: int | None = None
    shuffle: bool = True
    reshuffle: Reshuffle = "epoch"
    shuffle_window: int | None = None  # rows; None: as many as ``shuffle_budget`` holds
    shuffle_budget: int | str = SHUFFLE_BUDGET
    # local disk for windows larger than memory (``reading/windows/spill.py``): None: windows sized by memory, what goes
    # beyond it anyway (rows larger than sampled) to the system temp folder; a folder: windows up to a rank's
    # share, within ``shuffle_spill_budget`` bytes of it; False: never on disk
    shuffle_spill_dir: Any = None
    shuffle_spill_budget: int | str = SPILL_BUDGET
    schema_fields: Sequence[Any] | None = None
    padding_mask: bool = False
    partition_epoch: int = 1
    balance: Balance = "auto"
    cost_reduce: CostReduce = "sum"
    max_batch_cost: int | None = None
    transform_spec: Any = None
    list_format: Any = "auto"
    list_shapes: Any = None
    batch_format: BatchFormat = TORCH  # tensors.py
    pack: str | None = None  # a list column to pack into sequences of seq_len tokens (reading/batches/packing.py)
    seq_len: int | None = None
    long_documents: LongDocuments = "split"  # documents longer than seq_len (core/packing.py)

    def __post_init__(self) -> None:
        check_choice("reshuffle", self.reshuffle, RESHUFFLES, "'epoch' (new assignment every epoch) or 'fixed' (the "
                     "epoch-0 assignment, for caching)")
        check_choice("balance", self.balance, BALANCE, BALANCE_MEANING)
        check_choice("cost_reduce", self.cost_reduce, REDUCES, REDUCES_MEANING)
        if not isinstance(self.shuffle, bool):
            raise InvalidTypeError(f"shuffle={self.shuffle!r} must be True or False")
        if self.shuffle_window is not None:
            check_int("shuffle_window", self.shuffle_window, minimum=1, hint=" (rows per shuffle window; None: as "
                      "many as shuffle_budget holds)")
        object.__setattr__(self, "shuffle_budget", parse_bytes("shuffle_budget", self.shuffle_budget))
        object.__setattr__(self, "shuffle_spill_budget", parse_bytes("shuffle_spill_budget",
                                                                     self.shuffle_spill_budget))
        spill = self.shuffle_spill_dir
        if not (spill is None or spill is False or (isinstance(spill, (str, os.PathLike)) and str(spill))):
            raise InvalidValueError(f"shuffle_spill_dir={spill!r} must be a local folder (a str or path), None "
                                    "(windows sized by memory, overflow to the system temp folder) or False (never "
                                    "on disk)")
        if isinstance(spill, (str, os.PathLike)) and "://" in str(spill):
            raise InvalidValueError(f"shuffle_spill_dir={spill!r} must be a folder on local disk (windows are read "
                                    "back memory-mapped), not a URL; pass a path such as '/local_disk0/tmp'")
        object.__setattr__(self, "padding_mask", bool(self.padding_mask))
        check_choice("batch_format", self.batch_format, BATCH_FORMATS, "'torch' gives tensors, 'numpy' numpy arrays "
                     "(no torch needed); text is a list of str in both")
        _check_pack(self.pack, self.seq_len, self.long_documents)
        self.lists  # noqa: B018  (checked here, where the user gave them)

    @classmethod
    def of(cls, arguments: Mapping[str, Any]) -> LoaderOptions:
        """The options among a loader's keyword ``arguments`` (its ``locals()``); the others are not options."""
        return cls(**{f.name: arguments[f.name] for f in fields(cls) if f.name in arguments})

    @property
    def lists(self) -> ListOptions:
        """How list columns of numbers are delivered (``list_shapes.py``); a packed column is read as Arrow lists
        (its lengths are the plan's cost: no scan of them when the loader is made)."""
        lists = ListOptions.of(self.list_format, self.list_shapes)
        if self.pack is None:
            return lists
        return replace(lists, formats=tuple(sorted({**dict(lists.formats), self.pack: "python"}.items())),
                       shapes=tuple((n, s) for n, s in lists.shapes if n != self.pack))


def _check_pack(pack, seq_len, long_documents) -> None:
    """``pack``, ``seq_len`` and ``long_documents`` on their own (``reading/batches/packing.resolve`` checks them
    against the plan)."""
    if pack is None:
        if seq_len is not None:
            raise InvalidValueError(f"seq_len={seq_len!r} without pack=: name the list column to pack, e.g. "
                                    "pack='tokens'")
        return
    if not isinstance(pack, str) or not pack:
        raise InvalidTypeError(f"pack={pack!r} must be the name of a list column of token ids, e.g. pack='tokens'")
    if seq_len is None:
        raise InvalidValueError(f"pack={pack!r} needs seq_len= (tokens per packed sequence, e.g. seq_len=2048)")
    check_int("seq_len", seq_len, minimum=1, hint=" (tokens per packed sequence)")
    check_choice("long_documents", long_documents, LONG_DOCUMENTS, LONG_DOCUMENTS_MEANING)


_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
          "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}


MAX_BYTES = 2**63 - 1  # a byte count is held in int64 and divided as a float downstream


def parse_bytes(name: str, value) -> int:
    """A byte count given as an int or a string with a unit (``"512MiB"``, ``"2GB"``), at most ``MAX_BYTES``.

    The number is read as a decimal, not a float: a float of hundreds of digits is infinity, which no int holds."""
    given = value
    if isinstance(value, str):
        match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*", value)
        unit = match.group(2).lower() if match else None
        if match is None or unit not in _UNITS:
            raise InvalidValueError(f"{name}={value!r} is not a byte count: pass an int, or a number with one of the "
                                    "units B, KB, MB, GB, TB, KiB, MiB, GiB, TiB (for example '512MiB')")
        value = int(Decimal(match.group(1)) * _UNITS[unit])
    if isinstance(value, Integral) and not isinstance(value, bool) and int(value) > MAX_BYTES:
        shown = repr(given) if len(repr(given)) <= 40 else repr(given)[:37] + "..."
        raise InvalidValueError(f"{name}={shown} is more than {MAX_BYTES} bytes (8 EiB), more than any machine "
                                "holds: pass a byte count such as '512MiB'")
    return check_int(name, value, minimum=1, hint=" (bytes, or a string such as '512MiB')")


