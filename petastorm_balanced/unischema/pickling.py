"""The stored Unischema (``_common_metadata`` key ``dataset-toolkit.unischema.v1``) read and written safely.

Why not ``pickle.loads``: a pickle is a program. Whoever can write a dataset's ``_common_metadata`` could run
anything on every rank that opens it. Petastorm 0.12.1 restricts the *top-level package* (``petastorm``,
``numpy``, ``pyspark``, ``collections``, ``builtins``, ...), which still lets ``builtins.exec`` and ``eval``
through. We allow exact ``(module, name)`` pairs only, the classes a Unischema pickle names, and build our own
classes for Petastorm's (so nothing of Petastorm, and no pyspark code, runs while the schema loads). Any other
global raises ``UnsafeDatasetError`` before it is looked up, so nothing it names runs.

Why the allow-list is enough: a pickle calls only what ``find_class`` hands it (REDUCE/NEWOBJ/INST/OBJ call
objects from the stack, which come from ``find_class`` or from calling those), and ``BUILD`` sets state on
objects of allowed classes, none of which defines a ``__setstate__`` that runs user code. Extension codes and
persistent ids go through ``find_class`` or are refused.

Writing: ``dumps`` pickles our objects under Petastorm's class paths (``petastorm.unischema.Unischema``,
``petastorm.codecs.NdarrayCodec``, ``pyspark.sql.types.LongType``), the bytes Petastorm itself writes, so Petastorm
0.12.1 reads a dataset we write.
"""
from __future__ import annotations

import builtins
import collections
import copyreg
import decimal
import importlib
import io
import pickle
from collections.abc import Callable
from typing import Any

import numpy as np

from ..errors import InvalidValueError, UnsafeDatasetError
from . import codecs, schema, spark_types

PETASTORM_MODULES = {"petastorm.unischema": schema, "petastorm.codecs": codecs}
# Petastorm's own legacy names (datasets written before the package was renamed), read as today's.
LEGACY_PACKAGES = ("av.experimental.deepdrive.dataset_toolkit", "av.ml.dataset_toolkit")
NUMPY_TYPES = ("bool_", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64", "float16",
               "float32", "float64", "longdouble", "complex64", "complex128", "str_", "bytes_", "object_",
               "datetime64", "timedelta64", "void", "intc", "uintc", "int_", "uint", "longlong", "ulonglong",
               "half", "single", "double", "csingle", "cdouble", "byte", "ubyte", "short", "ushort")
# Names other numpy versions pickle: numpy 1's aliases, and numpy 2's ``numpy.bool`` (which numpy 1.26 lacks).
NUMPY_ALIASES = {"unicode_": "str_", "string_": "bytes_", "bool8": "bool_", "float_": "float64",
                 "complex_": "complex128", "object0": "object_", "bool": "bool_"}
SAFE_BUILTINS = ("str", "bytes", "bytearray", "int", "float", "complex", "bool", "object", "tuple", "list", "dict",
                 "set", "frozenset")


def _numpy_internals() -> dict[str, Callable]:
    try:  # numpy >= 2 (by name: each numpy's stubs know only one of the two paths)
        multiarray: Any = importlib.import_module("numpy._core.multiarray")
    except ImportError:  # numpy 1
        multiarray = importlib.import_module("numpy.core.multiarray")
    return {"_reconstruct": multiarray._reconstruct, "scalar": multiarray.scalar}


def allowed_globals() -> dict[tuple[str, str], object]:
    """Every ``(module, name)`` a stored Unischema may name, and what it loads as (our classes for Petastorm's)."""
    table: dict[tuple[str, str], object] = {}
    for module in ("petastorm.unischema", "petastorm.codecs"):
        names = ("Unischema", "UnischemaField") if module.endswith("unischema") else \
            ("NdarrayCodec", "CompressedNdarrayCodec", "CompressedImageCodec", "ScalarCodec")
        for name in names:
            target = getattr(PETASTORM_MODULES[module], name)
            table[(module, name)] = target
            for legacy in LEGACY_PACKAGES:
                table[(f"{legacy}.{module.split('.')[1]}", name)] = target
    for name, stand_in in spark_types.STAND_INS.items():
        table[("pyspark.sql.types", name)] = stand_in
    for name in NUMPY_TYPES:
        if hasattr(np, name):
            table[("numpy", name)] = getattr(np, name)
    for old, new in NUMPY_ALIASES.items():
        table[("numpy", old)] = getattr(np, new)
    table[("numpy", "dtype")] = np.dtype
    table[("numpy", "ndarray")] = np.ndarray
    for module in ("numpy.core.multiarray", "numpy._core.multiarray"):
        for name, target in _numpy_internals().items():
            table[(module, name)] = target
    for module in ("builtins", "__builtin__"):
        for name in SAFE_BUILTINS:
            table[(module, name)] = getattr(builtins, name)
    table[("collections", "OrderedDict")] = collections.OrderedDict
    table[("decimal", "Decimal")] = decimal.Decimal
    for module in ("copyreg", "copy_reg"):
        table[(module, "_reconstructor")] = copyreg._reconstructor  # type: ignore[attr-defined]
    return table


ALLOWED = allowed_globals()


class _RestrictedUnpickler(pickle.Unpickler):
    def __init__(self, payload: bytes, where: str):
        super().__init__(io.BytesIO(payload))
        self._where = where

    def find_class(self, module: str, name: str):
        target = ALLOWED.get((module, name))
        if target is None:
            raise UnsafeDatasetError(
                f"{self._where}: the stored Unischema (_common_metadata key dataset-toolkit.unischema.v1) names "
                f"{module}.{name}, which is not a Unischema, codec, numpy or Spark SQL type; loading it could run "
                "code, so the dataset is refused and nothing in it ran. Rewrite _common_metadata from a trusted "
                "schema (petastorm_balanced.unischema.materialize_dataset) or ask who wrote the dataset")
        return target

    def persistent_load(self, pid):
        raise UnsafeDatasetError(f"{self._where}: the stored Unischema uses a persistent id ({pid!r}), which no "
                                 "Unischema pickle has; refused")


def loads(payload: bytes, where: str = "the dataset") -> schema.Unischema:
    """The Unischema in ``payload``, built from our classes; ``UnsafeDatasetError`` for anything off the list."""
    try:
        value = _RestrictedUnpickler(payload, where).load()
    except UnsafeDatasetError:
        raise
    except Exception as exc:  # a truncated or foreign pickle: corrupt, not hostile
        raise InvalidValueError(f"{where}: the stored Unischema (_common_metadata) cannot be read "
                                f"({type(exc).__name__}: {exc}); the file is corrupt: regenerate it") from None
    check_loaded(value, where)
    return value


def check_loaded(value: Any, where: str) -> None:
    """A loaded Unischema holds fields of our field class with our codecs (or none): nothing else."""
    if not isinstance(value, schema.Unischema) or not isinstance(getattr(value, "_fields", None),
                                                                  collections.OrderedDict):
        raise UnsafeDatasetError(f"{where}: the stored Unischema is a {type(value).__name__}, not a Unischema; "
                                 "refused")
    for name, field in value.fields.items():
        if not isinstance(field, schema.UnischemaField) or field.name != name:
            raise UnsafeDatasetError(f"{where}: the stored Unischema's field {name!r} is not a UnischemaField; refused")
        if field.codec is not None and not isinstance(field.codec, codecs.CODECS):
            raise UnsafeDatasetError(f"{where}: field {name!r} has codec {type(field.codec).__name__}, not one of "
                                     "Petastorm's codecs; refused")


# Writing: our classes under Petastorm's paths.
_WRITE_AS = {getattr(PETASTORM_MODULES[m], n): (m, n) for (m, n) in ALLOWED
             if m in PETASTORM_MODULES}
_WRITE_AS.update({cls: ("pyspark.sql.types", name) for name, cls in spark_types.STAND_INS.items()})
_WRITE_AS[np.bool_] = ("numpy", "bool_")  # numpy 2 names it numpy.bool, which numpy 1 (Petastorm's stack) cannot load


_Python: Any = pickle._Pickler  # the Python pickler, whose save_global can be overridden


class _PetastormPickler(_Python):
    # Our own dispatch table, not pickle._Pickler's: importing dill (Petastorm does) rewrites that one in place, and
    # would pickle our classes by value under dill's names instead of Petastorm's paths.
    dispatch = {type(None): _Python.save_none, bool: _Python.save_bool, int: _Python.save_long,
                float: _Python.save_float, bytes: _Python.save_bytes, bytearray: _Python.save_bytearray,
                str: _Python.save_str, tuple: _Python.save_tuple, list: _Python.save_list, dict: _Python.save_dict,
                set: _Python.save_set, frozenset: _Python.save_frozenset,
                type: lambda self, obj: self.save_global(obj)}

    def save_global(self, obj, name=None):
        target = _WRITE_AS.get(obj) if isinstance(obj, type) else None
        if target is None:
            return super().save_global(obj, name)
        module, qualname = target
        self.save(module)
        self.save(qualname)
        self.write(pickle.STACK_GLOBAL)
        self.memoize(obj)


def dumps(unischema: Any) -> bytes:
    """``unischema`` pickled as Petastorm pickles its own (protocol 4, Petastorm's class paths)."""
    memfile = io.BytesIO()
    _PetastormPickler(memfile, protocol=4).dump(unischema)
    return memfile.getvalue()


def harden_petastorm_unpickler() -> None:
    """Make Petastorm's own ``RestrictedUnpickler`` (``petastorm.etl.legacy``) refuse what ours refuses.

    Petastorm 0.12.1 admits every global of its listed top-level packages, ``builtins.exec`` included. The
    Petastorm backend checks the bytes with ``loads`` before a Reader opens the dataset; this closes the window
    in which the file could change in between: Petastorm's loader then names the same allow-list (and still builds
    Petastorm's own classes). Idempotent; only tightens.
    """
    from petastorm.etl import legacy
    unpickler = legacy.RestrictedUnpickler
    if getattr(unpickler, "_petastorm_balanced_hardened", False):
        return
    original = unpickler.find_class

    def find_class(self, module, name):
        if (module, name) not in ALLOWED:
            raise UnsafeDatasetError(f"the stored Unischema names {module}.{name}, which is not a Unischema, codec, "
                                     "numpy or Spark SQL type; refused before Petastorm loads it")
        return original(self, module, name)

    unpickler.find_class = find_class
    unpickler._petastorm_balanced_hardened = True
