"""The package's shape (issue: one package a newcomer can read): no import cycles, nothing imports upward, pure
modules stay pure, every module imports on its own in a fresh interpreter, the docstring examples run, and the
Petastorm internals we depend on still exist."""
import ast
import doctest
import importlib
import inspect
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest
from stacks import HAVE_PETASTORM, petastorm_only

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE = os.path.join(ROOT, "petastorm_balanced")
# Layers, bottom up: a module may import its own layer and the ones below, never one above.
LAYERS = {"io": 0, "unischema": 0, "errors": 0, "params": 0, "_version": 0, "world": 0,
          "plan": 1, "predicates": 1, "planning": 2, "reading": 2, "tools": 3, "lightning": 3,
          "datagen": 3, "__main__": 3, "spark": 3, "__init__": 4}
PURE = ["plan.balance", "plan.elastic", "plan.shuffle", "plan.cost_order", "plan.selection", "plan.predicate",
        "reading.batching", "tools.coverage", "params", "plan.deletes"]
NEEDS_PETASTORM = {"petastorm_balanced.reading.petastorm_backend", "petastorm_balanced.reading.ordering",
                   "petastorm_balanced.io.remote"}


def modules():
    out = {}
    for folder, _, names in os.walk(PACKAGE):
        for name in names:
            if name.endswith(".py"):
                rel = os.path.relpath(os.path.join(folder, name), ROOT)[:-3].replace(os.sep, ".")
                out[rel[:-9] if rel.endswith(".__init__") else rel] = os.path.join(folder, name)
    return out


def imports(module, path, known):
    """Modules of the package that ``module`` imports (anywhere in the file, TYPE_CHECKING blocks aside)."""
    tree = ast.parse(open(path).read())
    skip = {id(n) for node in ast.walk(tree) if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.dump(node.test)
            for n in ast.walk(node)}
    package = module if path.endswith("__init__.py") else module.rsplit(".", 1)[0]
    found = set()
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.ImportFrom):
            base = ".".join(package.split(".")[:len(package.split(".")) - node.level + 1]) if node.level else ""
            target = ".".join(p for p in (base, node.module or "") if p)
            candidates = [target] + [f"{target}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Import):
            candidates = [a.name for a in node.names]
        else:
            continue
        found.update(c for c in candidates if c in known and c != module and not c.startswith(module + "."))
    return found


def test_no_import_cycles():
    known = modules()
    graph = {m: imports(m, p, known) for m, p in known.items()}
    state, cycles = {}, []

    def visit(node, stack):
        state[node] = "open"
        for nxt in sorted(graph[node]):
            if state.get(nxt) == "open":
                cycles.append(stack[stack.index(nxt):] + [nxt])
            elif nxt not in state:
                visit(nxt, stack + [nxt])
        state[node] = "done"

    for node in sorted(graph):
        if node not in state:
            visit(node, [node])
    assert not cycles, "import cycles: " + "; ".join(" -> ".join(c) for c in cycles)


def layer(module):
    parts = module.split(".")
    return LAYERS[parts[1] if len(parts) > 1 else "__init__"]


def test_nothing_imports_upward():
    known = modules()
    upward = [(m, t) for m, p in known.items() for t in imports(m, p, known)
              if layer(t) > layer(m) and not (m.endswith("petastorm_balanced.datagen"))]
    assert not upward, "\n".join(f"{m} imports {t} (a higher layer)" for m, t in upward)


@pytest.mark.parametrize("name", PURE)
def test_pure_modules_do_no_io(name):
    tree = ast.parse(open(os.path.join(PACKAGE, *name.split(".")) + ".py").read())
    imported = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names} | \
        {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module and not n.level}
    io = ("pyarrow.fs", "pyarrow.parquet", "pyarrow.dataset", "os", "io", "shutil", "urllib")  # Arrow arrays are fine
    banned = {m for m in imported if m.split(".")[0] in ("torch", "pyspark", "petastorm") or m in io}
    assert not banned, f"{name} imports {sorted(banned)}"


@pytest.mark.slow
def test_every_module_imports_alone_in_a_fresh_interpreter():
    names = [m for m in modules() if not m.endswith("__main__") and (HAVE_PETASTORM or m not in NEEDS_PETASTORM)]

    def attempt(name):
        done = subprocess.run([sys.executable, "-c", f"import {name}"], cwd=ROOT, capture_output=True, text=True,
                              env=dict(os.environ, PYTHONPATH=ROOT), timeout=120)
        return name, done.returncode, done.stderr.strip().splitlines()[-1:] if done.returncode else ""

    with ThreadPoolExecutor(4) as pool:
        failed = [r for r in pool.map(attempt, sorted(names)) if r[1]]
    assert not failed, failed


def test_docstring_examples_run():
    results = []
    for name in modules():
        if name.endswith("__main__") or (not HAVE_PETASTORM and name in NEEDS_PETASTORM):
            continue
        try:
            module = importlib.import_module(name)
        except ImportError as exc:  # an optional dependency (torch, pyspark, lightning) is missing here
            results.append((name, f"skipped: {exc}"))
            continue
        failures, _ = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
        assert failures == 0, f"{name}: {failures} docstring example(s) failed"
        results.append((name, "ok"))
    assert sum(r == "ok" for _, r in results) >= 6  # balance, batching, selection, predicate, params, coverage...


@petastorm_only
def test_the_petastorm_internals_we_use_still_exist():
    from petastorm_balanced.reading.petastorm_backend import PETASTORM_PRIVATE
    missing = []
    for owner, name, how in PETASTORM_PRIVATE:
        module_name, _, attr = owner.rpartition(".")
        if how == "function":
            if not hasattr(importlib.import_module(owner), name):
                missing.append((owner, name))
            continue
        cls = getattr(importlib.import_module(module_name), attr)
        if how == "method":
            ok = callable(getattr(cls, name, None))
        else:  # set on the instance by some method of the class or its bases
            ok = any(f"self.{name} =" in inspect.getsource(k) for k in cls.__mro__
                     if k.__module__.startswith("petastorm"))
        if not ok:
            missing.append((owner, name))
    assert not missing, f"Petastorm no longer has {missing}: update petastorm_backend.py or bound the version"
