"""The doc-block harness (scripts/doc_blocks.py): the fence syntax, blocks run verbatim, and a stale example fails.

The harness itself runs every block of README.md and docs/*.md in the user tier (scripts/user_tier.sh), against
the installed wheel; here it runs small Markdown files with this stack's interpreter.
"""
import importlib.util
import os
import subprocess
import sys

import pytest

from tests.support.jobs import ROOT

SCRIPT = os.path.join(ROOT, "scripts", "doc_blocks.py")
spec = importlib.util.spec_from_file_location("doc_blocks", SCRIPT)
doc_blocks = importlib.util.module_from_spec(spec)
sys.modules["doc_blocks"] = doc_blocks  # dataclasses look their module up
spec.loader.exec_module(doc_blocks)


def test_fences_say_what_runs():
    text = ("```python\nprint(1)\n```\n\n```bash norun: needs a YARN cluster\nspark-submit x\n```\n"
            "```text\n$ petastorm-balanced inspect\n```\n```\nbare\n```\n  ```console\n  $ echo hi\n  hi\n  ```\n")
    blocks = doc_blocks.parse("x.md", text)
    assert [(b.line, b.lang, b.runnable, b.norun) for b in blocks] == [
        (1, "python", True, None), (5, "bash", False, "needs a YARN cluster"), (8, "text", False, None),
        (11, "bare", False, None), (14, "console", True, None)]
    assert doc_blocks.console_commands(blocks[-1].code) == "echo hi\n"


@pytest.mark.parametrize("text, problem", [("```python norun\nx\n```\n", "needs a reason"),
                                           ("```bash\necho never closed\n", "never closed")])
def test_malformed_fences_are_errors(text, problem):
    with pytest.raises(doc_blocks.FenceError, match=problem):
        doc_blocks.parse("x.md", text)


def test_torchrun_blocks_name_their_process_count():
    blocks = doc_blocks.parse("x.md", "```python torchrun: 2\nprint(1)\n```\n")
    assert blocks[0].ranks == 2 and blocks[0].runnable
    for bad in ("```python torchrun\nx\n```\n", "```bash torchrun: 2\nx\n```\n", "```python torchrun: two\nx\n```\n"):
        with pytest.raises(doc_blocks.FenceError, match="torchrun"):
            doc_blocks.parse("x.md", bad)
    with pytest.raises(doc_blocks.FenceError, match="unknown fence option"):
        doc_blocks.parse("x.md", "```python nrun: typo\nx\n```\n")


def run(tmp_path, markdown):
    doc = tmp_path / "doc.md"
    doc.write_text(markdown)
    return subprocess.run([sys.executable, SCRIPT, "--bin", os.path.dirname(sys.executable), str(doc)],
                          capture_output=True, text=True, timeout=300)


def test_a_stale_example_fails_and_a_good_one_passes(tmp_path):
    """Blocks run verbatim, in order, in one working directory per file: what a block writes the next reads, and
    nothing is defined or rewritten for them (a cluster URL stays a cluster URL, an undefined name fails)."""
    good = ("```bash\nmkdir -p data && echo hi > data/x.txt\n```\n"
            "```python\nassert open('data/x.txt').read() == 'hi\\n'\nassert 'train_step' not in dir()\n```\n"
            "```python norun: a fragment\nthis is not python\n```\n")
    result = run(tmp_path, good)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "2 blocks run, 0 failed, 1 marked norun" in result.stdout
    stale = good + "```python\nfrom petastorm_balanced import remote   # moved to petastorm_balanced.io\n```\n"
    result = run(tmp_path, stale)
    assert result.returncode == 1
    assert "FAILED" in result.stdout and "ImportError" in result.stdout
    assert result.stderr.strip().endswith("doc.md:11")  # the stale block's fence line
    for undefined in ("```python\nfor epoch in range(epochs):\n    pass\n```\n",
                      "```python\nimport pyarrow.dataset as ds\nds.dataset('hdfs:///data/reviews')\n```\n"):
        result = run(tmp_path, undefined)
        assert result.returncode == 1, result.stdout  # the old harness defined `epochs` and mapped hdfs:// paths


def test_a_torchrun_block_runs_as_that_many_ranks(tmp_path):
    ranks = ("```python torchrun: 2\nimport os\nopen(f\"rank{os.environ['RANK']}-of-{os.environ['WORLD_SIZE']}\", "
             "'w').close()\n```\n```bash\ntest -f rank0-of-2 && test -f rank1-of-2\n```\n")
    result = run(tmp_path, ranks)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "2 blocks run, 0 failed" in result.stdout
