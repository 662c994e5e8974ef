"""The user's door: the wheel a pip user gets, installed into a fresh venv, driven through its INSTALLED
console command from a folder outside the checkout, with the checkout nowhere on ``sys.path``.

The venv holds only the wheel; its dependencies come from this stack's site-packages through a ``.pth`` line that
sits after the venv's own site-packages, so the wheel's copy of the package is the one imported (checked). The full
user tier (a fresh venv resolving the extras itself, every doc block) is ``scripts/user_tier.sh``.
"""
import json
import os
import subprocess
import sys
import sysconfig
import zipfile

import pyarrow.compute as pc
import pyarrow.dataset as pads
import pytest

from petastorm_balanced import datagen, load_plan
from tests.support.jobs import ROOT


def _clean_copy(dest):
    """The checkout's tracked and new (not ignored) files: what a clean clone builds from (no stale build/)."""
    listed = subprocess.run(["git", "ls-files", "-z", "-co", "--exclude-standard"], cwd=ROOT, check=True,
                            capture_output=True).stdout.decode().split("\0")
    for rel in filter(None, listed):
        src = os.path.join(ROOT, rel)
        if os.path.isfile(src):
            os.makedirs(os.path.dirname(os.path.join(dest, rel)), exist_ok=True)
            with open(src, "rb") as f, open(os.path.join(dest, rel), "wb") as g:
                g.write(f.read())


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("user")
    _clean_copy(tmp / "src")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                    "-w", str(tmp / "dist"), str(tmp / "src")], check=True)
    (wheel,) = (tmp / "dist").glob("petastorm_balanced-*.whl")
    venv = tmp / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    site = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          check=True, capture_output=True, text=True).stdout.strip()
    subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-deps",
                    "--no-index", "--ignore-installed", str(wheel)], check=True)
    # Then the dependencies (after: pip must not see this stack's editable install as already satisfying it).
    with open(os.path.join(site, "zz_stack_dependencies.pth"), "w") as f:
        f.write(sysconfig.get_paths()["purelib"] + "\n")  # appended after the venv's own site-packages
    cwd = tmp / "elsewhere"
    cwd.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(PATH=f"{venv / 'bin'}{os.pathsep}{env['PATH']}", PYSPARK_PYTHON=str(python),
               PYSPARK_DRIVER_PYTHON=str(python), SPARK_LOCAL_IP="127.0.0.1")

    def run(*argv, check=True):
        result = subprocess.run(list(argv), cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
        if check and result.returncode:
            raise AssertionError(f"{argv} exited {result.returncode}:\n{result.stdout}\n{result.stderr}")
        return result

    return {"venv": venv, "python": str(python), "cli": str(venv / "bin" / "petastorm-balanced"), "run": run,
            "wheel": wheel, "tmp": tmp}


def test_the_wheel_carries_license_typing_and_the_spark_job(installed):
    names = zipfile.ZipFile(installed["wheel"]).namelist()
    assert "petastorm_balanced/py.typed" in names
    assert "petastorm_balanced/tools/spark_job.py" in names
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names)
    assert not any(n.startswith("tests/") for n in names)
    metadata = zipfile.ZipFile(installed["wheel"]).read(
        next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
    assert "License-Expression: Apache-2.0" in metadata
    assert f"Requires-Python: >={sys.version_info.major}.{sys.version_info.minor}" in metadata


def test_installed_console_command_imports_the_wheel_not_the_checkout(installed):
    where = installed["run"](installed["python"], "-c", "import petastorm_balanced; print(petastorm_balanced.__file__)")
    assert where.stdout.strip().startswith(str(installed["venv"])), where.stdout
    helped = installed["run"](installed["cli"], "--help")
    for command in ("plan", "inspect", "verify", "compare", "spark-job-path"):
        assert command in helped.stdout
    job = installed["run"](installed["cli"], "spark-job-path").stdout.strip()
    assert job.startswith(str(installed["venv"])) and os.path.isfile(job), job


def test_installed_plan_and_inspect_on_a_generated_dataset(installed):
    ds = datagen.make_plain_dataset(installed["tmp"] / "ds", num_files=4, total_rows=3000, seed=11)
    plan_url = str(installed["tmp"] / "plan")
    out = installed["run"](installed["cli"], "plan", ds.url, "--world-size", "3", "--batch-size", "16",
                           "--engine", "local", "--output", plan_url)
    assert "planned" in out.stdout
    report = json.loads(installed["run"](installed["cli"], "inspect", plan_url, "--json").stdout)
    plan = load_plan(plan_url)  # the checkout's loader reads what the installed command wrote
    assert plan.total_rows == report["matching_rows"] == pads.dataset(ds.path).count_rows()
    steps = {r["steps"] for r in report["ranks"]}
    assert steps == {plan.steps_per_epoch()} and len(report["ranks"]) == 3
    bad = installed["run"](installed["cli"], "inspect", str(installed["tmp"] / "nothing-here"), check=False)
    assert bad.returncode == 2 and "error" in bad.stderr and "Traceback" not in bad.stderr


@pytest.mark.slow
def test_installed_spark_job_runs_under_spark_submit(installed, plain_dataset):
    pytest.importorskip("pyspark")
    submit = os.path.join(os.path.dirname(sys.executable), "spark-submit")
    if not os.path.exists(submit):
        pytest.skip("no spark-submit next to this python")
    job = installed["run"](installed["cli"], "spark-job-path").stdout.strip()
    plan_url = str(installed["tmp"] / "spark-plan")
    out = installed["run"](submit, "--master", "local[2]", "--conf", "spark.ui.enabled=false", job,
                           plain_dataset.url, "--world-size", "2", "--batch-size", "8", "--where", "lang = 'en'",
                           "--output", plan_url)
    assert "plan_shards: wrote" in out.stdout, out.stdout + out.stderr
    plan = load_plan(plan_url)
    expected = pads.dataset(plain_dataset.path).to_table(columns=["lang"], filter=pc.field("lang") == "en").num_rows
    assert plan.total_rows == expected
