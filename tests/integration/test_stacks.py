"""Across stacks (G12): a plan made on one stack serves the other with the same checksum and the same batches;
Parquet that only modern writers produce is planned and read on the modern stack and explained on the old one;
Petastorm (Unischema) datasets written by either stack read on both with Petastorm's values.

Each side runs in its own stack's interpreter (``tests/support/stack_side.py``): ``scripts/test.sh`` sets
``PB_PETASTORM_PYTHON`` and ``PB_MODERN_PYTHON`` when both venvs exist; without both, these tests skip.
"""
import json
import os
import subprocess

import pytest

from tests.support.jobs import ROOT
from tests.support.stacks import HAVE_PETASTORM

# Both sides run in subprocesses, so the suite of one stack is enough: the modern stack's (CI runs it there).
pytestmark = [pytest.mark.slow, pytest.mark.stack,
              pytest.mark.skipif(HAVE_PETASTORM, reason="cross-stack tests run from the modern stack's suite")]

OLD, NEW = os.environ.get("PB_PETASTORM_PYTHON"), os.environ.get("PB_MODERN_PYTHON")
both = pytest.mark.skipif(not (OLD and NEW and os.path.exists(OLD) and os.path.exists(NEW)),
                          reason="needs both stacks' pythons (PB_PETASTORM_PYTHON, PB_MODERN_PYTHON: scripts/test.sh "
                                 "sets them once both venvs exist)")


def side(python, *args) -> dict:
    done = subprocess.run([python, os.path.join(ROOT, "tests", "support", "stack_side.py"), *map(str, args)],
                          capture_output=True, text=True, timeout=300, env=dict(os.environ, PYTHONWARNINGS="ignore"))
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def plan_in(python, data, plan, *, batch_size):
    """``plan_shards(data, 2, ...)`` written to ``plan`` by ``python``'s stack, in process (engine='local')."""
    subprocess.run([python, "-c", "import sys; sys.path.insert(0, sys.argv[4]); from petastorm_balanced import "
                    "plan_shards; plan_shards(sys.argv[1], 2, batch_size=int(sys.argv[3]), engine='local', "
                    "output_url=sys.argv[2])", str(data), str(plan), str(batch_size), str(ROOT)],
                   check=True, timeout=300)


@both
@pytest.mark.parametrize("writer", ["petastorm", "modern"])
def test_plan_from_one_stack_serves_the_other_with_the_same_batches(tmp_path, writer):
    maker, other = (OLD, NEW) if writer == "petastorm" else (NEW, OLD)
    data, plan = tmp_path / "data", tmp_path / "plan"
    assert side(OLD, "data", data)["pyarrow"].startswith("14.")  # old writer: both stacks can read the files
    made = side(maker, "plan", data, plan, 3)
    assert side(other, "load", plan)["checksum"] == made["checksum"]
    assert side(other, "plan", data, tmp_path / "again", 3)["checksum"] == made["checksum"]  # G8 across stacks
    for epoch in (0, 2):
        arrow_new = side(NEW, "batches", plan, 3, epoch, "arrow")
        assert arrow_new["steps"] == [arrow_new["steps"][0]] * 3
        for backend in ("arrow", "petastorm"):
            old = side(OLD, "batches", plan, 3, epoch, backend)
            assert (old["digest"], old["steps"]) == (arrow_new["digest"], arrow_new["steps"]), backend
    # a plan for 3 ranks serves 2 on the other stack too (G9)
    new_side, old_side = side(NEW, "batches", plan, 2, 1, "arrow"), side(OLD, "batches", plan, 2, 1, "petastorm")
    assert new_side["digest"] == old_side["digest"]


@both
def test_view_types_plan_and_read_on_modern_and_are_explained_on_old(tmp_path):
    data = tmp_path / "views"
    made = side(NEW, "view-types", data)
    assert "string_view" in made["schema"] and "binary_view" in made["schema"]
    new = side(NEW, "plan-any", data)
    assert "checksum" in new, new
    old = side(OLD, "plan-any", data)["error"]
    assert "part-0.parquet" in old and "upgrade pyarrow" in old and "remove it" not in old, old
    plan = tmp_path / "plan"
    plan_in(NEW, data, plan, batch_size=16)
    read = side(NEW, "batches", plan, 2, 0, "arrow")
    assert read["steps"] == [1500 // 32] * 2


@both
def test_unischema_dataset_from_petastorm_reads_on_modern_with_petastorms_values(tmp_path):
    """Written by real Petastorm (materialize_dataset, every codec), read on the modern stack without Petastorm:
    every field of every row equals what Petastorm's make_reader gives, and the loaders agree across stacks."""
    data = tmp_path / "pet"
    side(OLD, "unischema-write", data, "petastorm")
    theirs = side(OLD, "unischema-read", data, "petastorm")["rows"]
    ours = side(NEW, "unischema-read", data, "ours")["rows"]
    assert len(theirs) == 60 and ours == theirs
    plan = tmp_path / "plan"
    plan_in(NEW, data, plan, batch_size=8)
    new = side(NEW, "batches", plan, 2, 0, "arrow")
    assert new["steps"] == [60 // 16] * 2
    for backend in ("arrow", "petastorm"):
        old = side(OLD, "batches", plan, 2, 0, backend)
        assert (old["digest"], old["steps"]) == (new["digest"], new["steps"]), backend


@both
def test_unischema_dataset_written_on_modern_without_petastorm_is_read_by_petastorm(tmp_path):
    """Our materialize_dataset on Spark 4.3 (no Petastorm installed): Petastorm 0.12.1 reads it, values equal."""
    data = tmp_path / "ours"
    side(NEW, "unischema-write", data, "ours")
    theirs = side(OLD, "unischema-read", data, "petastorm")["rows"]
    assert len(theirs) == 60 and side(NEW, "unischema-read", data, "ours")["rows"] == theirs
