"""Doc blocks that need a framework (```python needs: MODULE): run where it imports, skipped and reported where it
does not; docs/frameworks.md's TensorFlow and JAX examples run on the modern stack (the user tier skips them)."""
import importlib.util
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "scripts", "doc_blocks.py")
spec = importlib.util.spec_from_file_location("doc_blocks_needs", SCRIPT)
doc_blocks = importlib.util.module_from_spec(spec)
sys.modules["doc_blocks_needs"] = doc_blocks
spec.loader.exec_module(doc_blocks)


def run(*args):
    return subprocess.run([sys.executable, SCRIPT, "--bin", os.path.dirname(sys.executable), *args],
                          capture_output=True, text=True, timeout=600, cwd=ROOT)


def test_needs_names_modules():
    blocks = doc_blocks.parse("x.md", "```python needs: json, csv\nprint(1)\n```\n")
    assert blocks[0].needs == ("json", "csv") and blocks[0].runnable
    with pytest.raises(doc_blocks.FenceError, match="`needs` names modules"):
        doc_blocks.parse("x.md", "```python needs:\nx\n```\n")


@pytest.mark.slow
@pytest.mark.stack
def test_the_framework_examples_run_where_tensorflow_and_jax_are_installed(tmp_path):
    pytest.importorskip("tensorflow")
    pytest.importorskip("jax")
    doc = tmp_path / "doc.md"
    doc.write_text("```python needs: no_such_module_here\nraise SystemExit(1)\n```\n")
    done = run(os.path.join(ROOT, "docs", "frameworks.md"), str(doc))
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-3000:]
    assert "skipped: needs no_such_module_here" in done.stdout
    ran = len([b for b in doc_blocks.parse("f.md", open(os.path.join(ROOT, "docs", "frameworks.md")).read())
               if b.runnable])
    assert f"{ran} blocks run, 0 failed" in done.stdout and " 1 skipped for a missing module" in done.stdout, \
        done.stdout
