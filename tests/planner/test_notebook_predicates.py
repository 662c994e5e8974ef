"""Predicates typed in notebook cells: a function whose module has no file but whose source IPython keeps
in ``linecache`` is fingerprinted from that source, equal to the same lambda in a .py file; code with no source at
all is still refused, clearly. The slow test runs a real Jupyter kernel (nbclient + ipykernel)."""
import importlib.util
import linecache
import os
import sys

import pytest

from petastorm_balanced import load_plan, plan_shards
from petastorm_balanced.core.predicate_info import predicate_info
from petastorm_balanced.predicates import in_lambda
from tests.support.jobs import ROOT

CELL = 'threshold = 3\npredicate = in_lambda(["label"], lambda label: label > threshold)\n'


def from_file(tmp_path, source=CELL):
    """The cell's code as a module file, imported: the reference fingerprint."""
    path = tmp_path / "file_predicates.py"
    path.write_text("from petastorm_balanced.predicates import in_lambda\n" + source)
    spec = importlib.util.spec_from_file_location("file_predicates", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.predicate


def from_cell(source=CELL, filename="/tmp/ipykernel_4242/2893561724.py"):
    """What IPython does with a cell: compile it under a made-up file name, put its lines in linecache, run it in
    ``__main__``'s namespace (no such file exists)."""
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    namespace = {"__name__": "__main__", "in_lambda": in_lambda}
    exec(compile(source, filename, "exec"), namespace)
    return namespace["predicate"]


def test_cell_source_in_linecache_fingerprints_like_the_same_file(tmp_path):
    cell = from_cell()
    assert not os.path.exists(cell._predicate_func.__code__.co_filename)  # no file: the source is linecache's
    assert predicate_info(None, cell).fingerprint == predicate_info(None, from_file(tmp_path)).fingerprint
    other = from_cell(CELL.replace("> threshold", ">= threshold"), "/tmp/ipykernel_4242/1.py")
    assert predicate_info(None, other).fingerprint != predicate_info(None, cell).fingerprint


def test_code_with_no_source_anywhere_is_refused_clearly():
    namespace = {"in_lambda": in_lambda}
    exec(compile(CELL, "<string>", "exec"), namespace)
    with pytest.raises(TypeError, match=r"has no source .*'<string>'.*define it in a module file or a notebook cell"):
        predicate_info(None, namespace["predicate"])


@pytest.mark.slow
def test_a_real_notebook_plans_with_a_cell_predicate_and_the_plan_matches_the_file_predicate(tmp_path):
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    pytest.importorskip("ipykernel")
    from petastorm_balanced import datagen
    info = datagen.make_plain_dataset(tmp_path / "ds", num_files=2, total_rows=400, seed=1)
    plan_url = str(tmp_path / "plan")
    notebook = nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_code_cell("from petastorm_balanced import plan_shards\n"
                                  "from petastorm_balanced.predicates import in_lambda"),
        nbformat.v4.new_code_cell(CELL),
        nbformat.v4.new_code_cell(f"plan = plan_shards({info.url!r}, 2, batch_size=4, engine='local', "
                                  f"predicate=predicate, output_url={plan_url!r})\nprint(plan.predicate.fingerprint)"),
    ])
    root = str(ROOT)
    env_path = os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)
    os.environ["PYTHONPATH"] = env_path  # the kernel is a child process: it imports this checkout
    client = nbclient.NotebookClient(notebook, timeout=300, kernel_name="python3", resources={"metadata": {
        "path": str(tmp_path)}})
    client.execute()
    printed = notebook.cells[2].outputs[0]["text"].strip()
    expected = predicate_info(None, from_file(tmp_path)).fingerprint
    assert printed == expected
    plan = load_plan(plan_url, predicate=from_file(tmp_path))  # the file's predicate is the cell's: accepted
    assert plan.total_rows == plan_shards(info.url, 2, batch_size=4, engine="local",
                                          predicate=from_file(tmp_path)).total_rows
    assert sys.executable  # the kernel ran this interpreter's ipykernel (kernelspec python3)
