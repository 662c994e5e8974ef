"""Which rows a plan kept, as a value the plan stores and compares: ``PredicateInfo`` and how it is made.

A plan's catalog holds only the rows its predicate kept, so serving it for another predicate would deliver the
wrong rows (G7). The fingerprint must therefore be (a) the same for the same predicate in every process, Python
version and machine, and (b) different whenever the predicate would keep other rows. So it is built from what a
person would read, never from bytecode (which changes between Python versions) or ``repr`` of arbitrary objects
(which may hold memory addresses):

- functions and lambdas: their source text, normalized through ``ast`` (formatting and comments do not count),
  plus the values they close over, their defaults and the plain module globals they read;
- Petastorm predicates: the class name and attributes, each described the same way;
- numpy arrays: dtype, shape and a digest of their bytes; containers element by element.

Anything else whose ``repr`` is not a stable value (it shows a memory address) is refused before any scanning
starts, with what to do instead.

>>> info = predicate_info("lang = 'en'", None)
>>> (info.kind, info.text)
('sql', "lang = 'en'")
"""
from __future__ import annotations

import ast
import functools
import gc
import hashlib
import inspect
import linecache
import re
import types
from dataclasses import dataclass

import numpy as np

from ..errors import InvalidTypeError

TEXT_LIMIT = 2000  # characters of the description kept in plan.json (the fingerprint covers all of it)
_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")


@dataclass(frozen=True)
class PredicateInfo:
    """Which rows planning kept: ``kind`` is 'none', 'sql' (a Spark SQL ``where``) or 'petastorm'."""

    kind: str = "none"
    text: str = ""
    fingerprint: str = ""


def predicate_info(where: str | None, predicate) -> PredicateInfo:
    """The ``PredicateInfo`` of a ``where`` (Spark SQL) or a Petastorm ``predicate``; raises ``TypeError`` for a
    predicate that cannot be described stably (see the module docstring)."""
    if where is not None:
        return PredicateInfo("sql", where, hashlib.sha256(where.strip().encode()).hexdigest())
    if predicate is not None:
        if not hasattr(predicate, "get_fields") or not hasattr(predicate, "do_include"):
            raise InvalidTypeError(f"predicate={predicate!r} is not a Petastorm PredicateBase (get_fields, "
                                   "do_include); wrap a function with petastorm_balanced.predicates.in_lambda, or use "
                                   "where= for Spark SQL")
        text = describe(predicate)
        return PredicateInfo("petastorm", text[:TEXT_LIMIT], hashlib.sha256(text.encode()).hexdigest())
    return PredicateInfo()


def describe(obj) -> str:
    """A canonical text for a predicate or a value it holds."""
    if isinstance(obj, (types.FunctionType, types.LambdaType)):
        return _describe_function(obj)
    if isinstance(obj, functools.partial):
        return f"partial({describe(obj.func)},{describe(obj.args)},{describe(obj.keywords)})"
    if isinstance(obj, np.ndarray):
        data = np.ascontiguousarray(obj)
        payload = data.tobytes() if data.dtype != object else describe(data.tolist()).encode()
        return f"ndarray({data.dtype.str},{list(data.shape)},{hashlib.sha256(payload).hexdigest()})"
    if isinstance(obj, np.generic):
        return f"{type(obj).__name__}({obj.item()!r})"
    if isinstance(obj, (set, frozenset)):
        return "{" + ",".join(sorted(describe(v) for v in obj)) + "}"
    if isinstance(obj, (list, tuple)):
        return "[" + ",".join(describe(v) for v in obj) + "]"
    if isinstance(obj, dict):
        items = sorted(obj.items(), key=lambda kv: str(kv[0]))
        return "{" + ",".join(f"{describe(k)}:{describe(v)}" for k, v in items) + "}"
    if isinstance(obj, (types.BuiltinFunctionType, type)):
        return f"{getattr(obj, '__module__', None) or 'builtins'}.{obj.__qualname__}"
    if isinstance(obj, types.ModuleType):
        return f"module({obj.__name__})"
    if hasattr(obj, "__dict__") and hasattr(obj, "do_include"):
        return f"{type(obj).__qualname__}({describe(vars(obj))})"
    text = repr(obj)
    if _ADDRESS.search(text):
        raise InvalidTypeError(f"predicate holds {text}, which has no stable description (its repr is a memory "
                               "address), so a saved plan could not tell it from another predicate; pass plain values "
                               "(numbers, strings, lists, sets, numpy arrays) or a PredicateBase subclass whose "
                               "attributes are plain values")
    return text


def _describe_function(fn) -> str:
    """Source (normalized), closure values, defaults and the plain globals the function reads."""
    source = _source_of(fn)
    cells = [describe(c.cell_contents) for c in (fn.__closure__ or ())]
    defaults = [describe(fn.__defaults__ or ()), describe(fn.__kwdefaults__ or {})]
    reads = {name: fn.__globals__[name] for name in _global_names(fn.__code__) if name in fn.__globals__}
    return f"fn({source},{cells},{defaults},{describe(reads)})"


def _global_names(code) -> list:
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names.update(_global_names(const))
    return sorted(names)


def _source_of(fn) -> str:
    """The function's own definition as normalized source (``ast.unparse``), found in its file's syntax tree by its
    first line; several lambdas on one line are told apart by their compiled code (compared in this interpreter)."""
    tree = _module_tree(fn)
    line = fn.__code__.co_firstlineno
    lam = fn.__name__ == "<lambda>"
    defs = [n for n in ast.walk(tree) if isinstance(n, (ast.Lambda, ast.FunctionDef, ast.AsyncFunctionDef))]
    nodes: list[ast.Lambda | ast.FunctionDef | ast.AsyncFunctionDef] = [
        n for n in defs if n.lineno == line and
        (isinstance(n, ast.Lambda) if lam else not isinstance(n, ast.Lambda) and n.name == fn.__name__)]
    if not nodes and not lam:  # decorated: the code starts at the first decorator's line
        nodes = [n for n in defs if not isinstance(n, ast.Lambda)
                 and n.name == fn.__name__ and n.decorator_list and n.decorator_list[0].lineno == line]
    if len(nodes) > 1:  # same first line: same argument names, then the innermost node holding the code
        code = fn.__code__
        names = list(code.co_varnames[:code.co_argcount + code.co_kwonlyargcount])
        nodes = [n for n in nodes if [a.arg for a in n.args.args + n.args.kwonlyargs] == names] or nodes
        enclosing = sorted((n for n in nodes if _encloses(n, fn)), key=lambda n: (n.lineno, n.col_offset))
        nodes = enclosing[-1:] or [n for n in nodes if _same_code(n, fn)] or nodes
        if len({ast.unparse(n) for n in nodes}) > 1:
            raise InvalidTypeError(f"predicate function {fn.__qualname__!r} shares line {line} with other lambdas that "
                                   "cannot be told apart; put it on a line of its own")
    if not nodes:
        raise InvalidTypeError(f"the source of predicate function {fn.__qualname__!r} could not be found (file changed "
                               "since it was imported?); define it in a module file")
    node = nodes[0]
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        node.decorator_list = []
    return ast.unparse(node)


def _module_tree(fn):
    """The syntax tree of the source that defines ``fn``: its module's file, or, for code with no file of its own
    (an IPython/Jupyter/Databricks notebook cell, whose module is ``__main__``), the cell's text, which IPython
    keeps in ``linecache`` under the name in ``fn.__code__.co_filename``. Code with no source anywhere (``exec``
    of a string, a plain ``python`` prompt) is refused: it cannot be fingerprinted stably."""
    filename = fn.__code__.co_filename
    module = inspect.getmodule(fn)
    own_file = module is not None and getattr(module, "__file__", None) == filename
    source = _module_source(module) if own_file else None
    if source is None:  # a notebook cell (or code compiled from another file name): linecache holds its text
        source = "".join(linecache.getlines(filename)) or None
    if source is None and module is not None and not own_file:
        source = _module_source(module)
    if source is None:
        raise InvalidTypeError(f"predicate function {fn.__qualname__!r} has no source ({filename!r}: defined by exec "
                               "or at a plain python prompt?), so it cannot be fingerprinted stably; define it in a "
                               "module file or a notebook cell, or use petastorm_balanced.predicates.in_set / a "
                               "PredicateBase subclass with plain attributes")
    return parse(source)


def parse(source: str) -> ast.Module:
    """``ast.parse`` with the garbage collector paused: on CPython <= 3.11.7 (gh-106905) a collection during the
    parse whose finalizers parse too (a traceback printed by an unraisable-exception hook does, in 3.11) leaves
    the parse failing with "AST constructor recursion depth mismatch"."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        return ast.parse(source)
    finally:
        if enabled:
            gc.enable()


def _module_source(module) -> str | None:
    try:
        return inspect.getsource(module)
    except (OSError, TypeError):
        return None


def _encloses(node, fn) -> bool:
    """Whether every source position of ``fn``'s instructions lies inside ``node`` (Python >= 3.11)."""
    positions = getattr(fn.__code__, "co_positions", None)
    if positions is None:
        return False
    spans = [(line, col) for line, _, col, _ in positions() if line is not None and col is not None]
    start, end = (node.lineno, node.col_offset), (node.end_lineno, node.end_col_offset)
    return bool(spans) and all(start <= span < end for span in spans if span >= start) and \
        any(start <= span < end for span in spans)


def _same_code(node, fn) -> bool:
    try:
        expr = ast.Expression(node) if isinstance(node, ast.Lambda) else ast.Module([node], [])
        compiled = compile(ast.fix_missing_locations(expr), "<predicate>", "eval" if isinstance(node, ast.Lambda)
                           else "exec")
    except (SyntaxError, ValueError, TypeError):
        return False
    codes = [c for c in compiled.co_consts if isinstance(c, types.CodeType)]
    return any(c.co_code == fn.__code__.co_code for c in codes)
