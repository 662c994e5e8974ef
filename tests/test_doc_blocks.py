"""The doc-block harness (scripts/doc_blocks.py): the fence syntax, the URL mapping, and that a stale example fails.

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


def test_cluster_urls_and_masters_map_to_the_scratch_folder():
    code = ("plan_shards('hdfs:///data/reviews', output_url='s3://bucket/plans/x')\n"
            "spark-submit --master yarn --deploy-mode cluster job.py hdfs://nn:8020/data/reviews /tmp/reviews\n"
            "pip install 'petastorm-balanced[torch,spark]'\n")
    out = doc_blocks.localize(code, "/scratch/F")
    assert "file:///scratch/F/data/reviews" in out and "file:///scratch/F/plans/x" in out
    assert "--master local[2] --deploy-mode client" in out and "/scratch/F/tmp/reviews" in out
    assert "file:///scratch/F/data/reviews /scratch" in out  # hdfs://nn:8020/ loses its authority
    assert 'pip install "$PB_WHEEL[torch,spark]"' in out
    assert "hdfs:" not in out and "s3:" not in out and "yarn" not in out


def run(tmp_path, markdown):
    doc = tmp_path / "doc.md"
    doc.write_text(markdown)
    return subprocess.run([sys.executable, SCRIPT, "--bin", os.path.dirname(sys.executable), str(doc)],
                          capture_output=True, text=True, timeout=300)


def test_a_stale_example_fails_and_a_good_one_passes(tmp_path):
    good = ("```python\nimport pyarrow.dataset as ds\n"
            "assert ds.dataset('hdfs:///data/reviews').count_rows() > 0   # the generated dataset, mapped\n```\n"
            "```bash\ntest -d /tmp/ && ls reviews | grep -q parquet\n```\n"
            "```python norun: a fragment\nthis is not python\n```\n")
    result = run(tmp_path, good)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "2 blocks run, 0 failed, 1 marked norun" in result.stdout
    stale = good + "```python\nfrom petastorm_balanced import remote   # moved to petastorm_balanced.io\n```\n"
    result = run(tmp_path, stale)
    assert result.returncode == 1
    assert "FAILED" in result.stdout and "ImportError" in result.stdout
    assert result.stderr.strip().endswith("doc.md:11")  # the stale block's fence line
