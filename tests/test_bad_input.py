"""Bad input gives a clear error: the Python API raises ValueError/TypeError/PlanError (RuntimeError for a malformed
launcher environment) naming the parameter and the value; the CLI exits 2 with one error line and no traceback.

One parametrized test runs the API matrix; the CLI matrix runs in one helper subprocess (``cli.main`` per case, so
one Python start instead of one per case), plus two real ``python -m petastorm_balanced`` runs for the entry point.
"""
import json
import os
import shutil
import subprocess
import sys
import textwrap
from collections.abc import Callable
from dataclasses import dataclass, field

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import petastorm_balanced as pb
from petastorm_balanced import (
    PlanError,
    PlanIntegrityError,
    PlanVersionError,
    StalePlanError,
    datagen,
    load_plan,
    plan_shards,
)
from petastorm_balanced.predicates import in_lambda, in_set
from tests.support.jobs import ROOT

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning", "ignore::UserWarning")

WORLD, BATCH = 3, 16


@dataclass
class Inputs:
    """Every bad (and one good) input the cases refer to, built once per module."""

    ds: str  # a good dataset URL
    plan: object  # a good ShardPlan for it (WORLD, BATCH)
    plan_url: str  # ...saved here
    rowless_plan: object  # a good plan made without a batch size
    paths: dict = field(default_factory=dict)  # name -> path of a bad dataset or plan


@pytest.fixture(scope="module")
def inputs(plain_dataset, tmp_path_factory):
    root = tmp_path_factory.mktemp("bad")
    p = {name: root / name for name in ("empty", "not_parquet", "only_metadata", "mismatch", "plan", "newer",
                                        "mixed", "foreign", "swapped_ds", "swapped_plan", "missing")}
    p["empty"].mkdir()
    p["not_parquet"].mkdir()
    (p["not_parquet"] / "notes.txt").write_text("id,lang\n1,en\n")
    (p["not_parquet"] / "data.csv").write_text("id,lang\n1,en\n")
    p["only_metadata"].mkdir()
    for name in ("_SUCCESS", ".part-0.parquet.crc", "_common_metadata"):
        (p["only_metadata"] / name).write_bytes(b"")
    p["mismatch"].mkdir()
    pq.write_table(pa.table({"id": [1, 2], "lang": ["en", "fr"]}), p["mismatch"] / "part-0.parquet")
    pq.write_table(pa.table({"id": [3, 4], "language": ["en", "fr"]}), p["mismatch"] / "part-1.parquet")

    plan = plan_shards(plain_dataset.url, WORLD, batch_size=BATCH, engine="local", output_url=str(p["plan"]))
    shutil.copytree(p["plan"], p["newer"])
    document = json.loads((p["newer"] / "plan.json").read_text())
    document["format_version"] = 99
    (p["newer"] / "plan.json").write_text(json.dumps(document))
    (p["foreign"]).mkdir()
    (p["foreign"] / "plan.json").write_text(json.dumps({"format": "something-else", "format_version": 1}))

    # A plan for another dataset, pieced together: this plan's plan.json with another plan's catalog.
    other = datagen.make_plain_dataset(root / "other_ds", num_files=3, total_rows=500, seed=9)
    plan_shards(other.url, WORLD, batch_size=BATCH, engine="local", output_url=str(root / "other_plan"))
    shutil.copytree(p["plan"], p["mixed"])
    shutil.copy(root / "other_plan" / "catalog.parquet", p["mixed"] / "catalog.parquet")

    # The dataset at the plan's URL replaced by another dataset.
    shutil.copytree(other.path, p["swapped_ds"])
    plan_shards(str(p["swapped_ds"]), WORLD, batch_size=BATCH, engine="local", output_url=str(p["swapped_plan"]))
    shutil.rmtree(p["swapped_ds"])
    datagen.make_plain_dataset(p["swapped_ds"], num_files=4, total_rows=600, seed=10)

    rowless = plan_shards(plain_dataset.url, WORLD, engine="local")
    return Inputs(plain_dataset.url, plan, str(p["plan"]), rowless, {k: str(v) for k, v in p.items()})


@dataclass(frozen=True)
class Case:
    id: str
    call: Callable  # (inputs, monkeypatch) -> anything; must raise
    error: type
    says: tuple[str, ...]  # substrings the message must hold: the parameter and the value, or the culprit


def _loader(i, **kw):
    kw.setdefault("plan", i.plan)
    kw.setdefault("batch_size", BATCH)
    rank, world = kw.pop("rank", 0), kw.pop("world", WORLD)
    loader = pb.make_loader(rank, world, **kw)
    close = getattr(loader, "close", None) or getattr(loader, "stop", None)
    if close:
        close()
    return loader


def _env(monkeypatch, **values):
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "HOROVOD_RANK", "HOROVOD_SIZE", "OMPI_COMM_WORLD_RANK",
                 "OMPI_COMM_WORLD_SIZE", "PMI_RANK", "PMI_SIZE"):
        monkeypatch.delenv(name, raising=False)
    for name, value in values.items():
        monkeypatch.setenv(name, value)


def _plan(i, **kw):
    kw.setdefault("engine", "local")
    kw.setdefault("batch_size", BATCH)
    return plan_shards(kw.pop("url", i.ds), kw.pop("world_size", WORLD), **kw)


API_CASES = [
    # planning parameters
    Case("world_size=0", lambda i, m: _plan(i, world_size=0), ValueError, ("world_size=0",)),
    Case("world_size=-2", lambda i, m: _plan(i, world_size=-2), ValueError, ("world_size=-2",)),
    Case("world_size='3'", lambda i, m: _plan(i, world_size="3"), TypeError, ("world_size", "'3'")),
    Case("batch_size=0", lambda i, m: _plan(i, batch_size=0), ValueError, ("batch_size=0",)),
    Case("batch_size=-8", lambda i, m: _plan(i, batch_size=-8), ValueError, ("batch_size=-8",)),
    Case("batch_size=2.5", lambda i, m: _plan(i, batch_size=2.5), TypeError, ("batch_size", "2.5")),
    Case("batch larger than the rows", lambda i, m: _plan(i, batch_size=10 ** 6), ValueError,
         ("batch_size=1000000", "world_size=3")),
    Case("seed=-1", lambda i, m: _plan(i, seed=-1), ValueError, ("seed=-1",)),
    Case("unknown policy", lambda i, m: _plan(i, policy="random"), ValueError, ("policy='random'", "drop", "pad")),
    Case("unknown engine", lambda i, m: _plan(i, engine="dask"), ValueError, ("engine='dask'",)),
    Case("dataset_url=None", lambda i, m: _plan(i, url=None), TypeError, ("dataset_url", "None")),
    # datasets
    Case("missing dataset", lambda i, m: _plan(i, url=i.paths["missing"]), ValueError,
         ("dataset_url=", "missing", "does not exist")),
    Case("empty folder", lambda i, m: _plan(i, url=i.paths["empty"]), ValueError, ("empty", "no Parquet")),
    Case("only metadata files", lambda i, m: _plan(i, url=i.paths["only_metadata"]), ValueError,
         ("only_metadata", "no Parquet")),
    Case("non-Parquet files", lambda i, m: _plan(i, url=i.paths["not_parquet"]), ValueError,
         ("data.csv", "not a readable Parquet file")),
    Case("schema mismatch between files", lambda i, m: _plan(i, url=i.paths["mismatch"]), ValueError,
         ("part-1.parquet", "language", "part-0.parquet", "one schema")),
    # filters
    Case("predicate on a missing column", lambda i, m: _plan(i, predicate=in_set({"x"}, "no_such_column")),
         ValueError, ("no_such_column",)),
    Case("predicate that is a lambda", lambda i, m: _plan(i, predicate=lambda row: True), TypeError,
         ("predicate=", "PredicateBase")),
    Case("where with the local engine", lambda i, m: _plan(i, where="lang = 'en'"), ValueError,
         ("where=", "engine='local'")),
    Case("where and predicate", lambda i, m: _plan(i, where="lang = 'en'", predicate=in_set({"en"}, "lang"),
                                                   engine="spark"), ValueError, ("where=", "predicate=")),
    Case("where=''", lambda i, m: _plan(i, where="  ", engine="spark"), ValueError, ("where='  '",)),
    Case("predicate matching no row", lambda i, m: _plan(i, predicate=in_lambda(["id"], lambda v: v < 0)),
         ValueError, ("matches no row",)),
    # plans
    Case("plan URL that does not exist", lambda i, m: load_plan(i.paths["missing"]), PlanIntegrityError,
         ("missing", "plan.json")),
    Case("dataset folder given as a plan", lambda i, m: load_plan(i.ds), PlanIntegrityError, ("plan.json",)),
    Case("plan of a newer format version", lambda i, m: load_plan(i.paths["newer"]), PlanVersionError,
         ("version 99", "upgrade")),
    Case("foreign plan.json", lambda i, m: load_plan(i.paths["foreign"]), PlanError,
         ("not a petastorm-balanced plan", "something-else")),
    Case("plan pieced from another dataset's plan", lambda i, m: load_plan(i.paths["mixed"]), PlanIntegrityError,
         ("catalog.parquet", "sha256")),
    Case("plan whose dataset was replaced", lambda i, m: load_plan(i.paths["swapped_plan"]), StalePlanError,
         ("since planning",)),
    Case("assignment rank >= world", lambda i, m: i.plan.assignment(3), ValueError, ("rank=3", "world_size=3")),
    Case("rowless plan without batch_size", lambda i, m: i.rowless_plan.steps_per_epoch(), ValueError,
         ("batch_size=None",)),
    # loader: rank and world
    Case("rank >= world", lambda i, m: _loader(i, rank=3, world=3), ValueError, ("rank=3", "world_size=3")),
    Case("rank=-1", lambda i, m: _loader(i, rank=-1), ValueError, ("rank=-1",)),
    Case("world=0", lambda i, m: _loader(i, world=0), ValueError, ("world_size=0",)),
    Case("rank='0'", lambda i, m: _loader(i, rank="0"), TypeError, ("rank", "'0'")),
    Case("rank without world", lambda i, m: _loader(i, world=None), ValueError, ("world=None",)),
    Case("RANK=abc", lambda i, m: (_env(m, RANK="abc", WORLD_SIZE="2"), _loader(i, rank=None, world=None)),
         RuntimeError, ("RANK='abc'",)),
    Case("WORLD_SIZE without RANK", lambda i, m: (_env(m, WORLD_SIZE="2"), _loader(i, rank=None, world=None)),
         RuntimeError, ("RANK",)),
    Case("no launcher environment", lambda i, m: (_env(m), _loader(i, rank=None, world=None)), RuntimeError,
         ("pass rank= and world=",)),
    # loader: sizes and choices
    Case("loader batch_size=0", lambda i, m: _loader(i, batch_size=0), ValueError, ("batch_size=0",)),
    Case("loader batch larger than the rows", lambda i, m: _loader(i, plan=i.rowless_plan, batch_size=10 ** 6),
         ValueError, ("batch_size=1000000",)),
    Case("loader epoch=-1", lambda i, m: _loader(i, epoch=-1), ValueError, ("epoch=-1",)),
    Case("partition_epoch=0", lambda i, m: _loader(i, partition_epoch=0), ValueError, ("partition_epoch=0",)),
    Case("partition_epoch='2'", lambda i, m: _loader(i, partition_epoch="2"), TypeError, ("partition_epoch", "'2'")),
    Case("partition_epoch above the steps", lambda i, m: _loader(i, partition_epoch=10 ** 6), ValueError,
         ("partition_epoch=1000000", "steps per rank of a pass")),
    Case("unknown reshuffle", lambda i, m: _loader(i, reshuffle="sometimes"), ValueError, ("reshuffle='sometimes'",)),
    Case("unknown reader_pool_type", lambda i, m: _loader(i, reader_pool_type="gpu"), ValueError,
         ("reader_pool_type='gpu'",)),
    Case("workers_count=0", lambda i, m: _loader(i, workers_count=0), ValueError, ("workers_count=0",)),
    Case("plan=None", lambda i, m: _loader(i, plan=None), ValueError, ("plan=None",)),
    Case("plan URL of a stale plan", lambda i, m: _loader(i, plan=i.paths["swapped_plan"]), StalePlanError,
         ("since planning",)),
    # Petastorm arguments the wrapper owns
    Case("cur_shard", lambda i, m: _loader(i, cur_shard=0), ValueError, ("cur_shard=0", "rank=")),
    Case("shard_count", lambda i, m: _loader(i, shard_count=3), ValueError, ("shard_count=3",)),
    Case("predicate to the loader", lambda i, m: _loader(i, predicate=in_set({"en"}, "lang")), ValueError,
         ("predicate=", "plan_shards")),
    Case("num_epochs", lambda i, m: _loader(i, num_epochs=2), ValueError, ("num_epochs=2",)),
    Case("rowgroup_selector", lambda i, m: _loader(i, rowgroup_selector=object()), ValueError,
         ("rowgroup_selector=",)),
    Case("unknown keyword", lambda i, m: _loader(i, no_such_argument=1), TypeError, ("no_such_argument",)),
    Case("reader cur_shard", lambda i, m: pb.make_reader(0, WORLD, plan=i.plan, cur_shard=1), ValueError,
         ("cur_shard=1",)),  # make_reader runs on every stack (the Arrow reader without Petastorm)
]


@pytest.mark.parametrize("case", API_CASES, ids=[c.id for c in API_CASES])
def test_api_bad_input_is_a_clear_error(case, inputs, monkeypatch):
    with pytest.raises(case.error) as caught:
        case.call(inputs, monkeypatch)
    message = str(caught.value)
    missing = [s for s in case.says if s not in message]
    assert not missing, f"{type(caught.value).__name__}: {message!r} does not name {missing}"


# The CLI cases: argv (with {placeholders}) and what the error line must name.
CLI_CASES = [
    ("world-size 0", ["plan", "{ds}", "--world-size", "0", "--output", "{out}"], ("--world-size", "0")),
    ("world-size abc", ["plan", "{ds}", "--world-size", "abc", "--output", "{out}"], ("--world-size", "'abc'")),
    ("batch-size -1", ["plan", "{ds}", "--world-size", "3", "--batch-size", "-1", "--output", "{out}"],
     ("--batch-size", "-1")),
    ("unknown policy", ["plan", "{ds}", "--world-size", "3", "--policy", "random", "--output", "{out}"],
     ("--policy", "'random'")),
    ("missing dataset", ["plan", "{missing}", "--world-size", "3", "--engine", "local", "--output", "{out}"],
     ("does not exist",)),
    ("empty folder", ["plan", "{empty}", "--world-size", "3", "--engine", "local", "--output", "{out}"],
     ("no Parquet",)),
    ("non-Parquet files", ["plan", "{not_parquet}", "--world-size", "3", "--engine", "local", "--output", "{out}"],
     ("not a readable Parquet file",)),
    ("schema mismatch", ["plan", "{mismatch}", "--world-size", "3", "--engine", "local", "--output", "{out}"],
     ("one schema",)),
    ("batch larger than the rows", ["plan", "{ds}", "--world-size", "3", "--batch-size", "1000000", "--engine",
                                    "local", "--output", "{out}"], ("batch_size=1000000",)),
    ("where with the local engine", ["plan", "{ds}", "--world-size", "3", "--where", "lang = 'en'", "--engine",
                                     "local", "--output", "{out}"], ("where=",)),
    ("inspect a missing plan", ["inspect", "{missing}"], ("plan.json",)),
    ("inspect a newer plan", ["inspect", "{newer}"], ("version 99",)),
    ("inspect a pieced plan", ["inspect", "{mixed}"], ("sha256",)),
    ("inspect a foreign plan", ["inspect", "{foreign}"], ("not a petastorm-balanced plan",)),
    ("inspect world-size 0", ["inspect", "{plan}", "--world-size", "0"], ("--world-size",)),
    ("verify a missing plan", ["verify", "{missing}"], ("plan.json",)),
    ("compare world-size 0", ["compare", "{ds}", "--world-size", "0"], ("--world-size",)),
    ("unknown command", ["shard", "{ds}"], ("shard",)),
]
# Needs the Spark engine: one JVM in the same helper subprocess as the other CLI cases.
SPARK_CLI_CASE = ("invalid SQL", ["plan", "{ds}", "--world-size", "3", "--where", "lang === 'en' AND",
                                  "--engine", "spark", "--master", "local[1]", "--output", "{out}"],
                  ("where=", "lang === 'en' AND"))


def _has_pyspark() -> bool:
    try:
        import pyspark  # noqa: F401
    except ImportError:
        return False
    return True


DRIVER = textwrap.dedent("""
    import contextlib, io, json, sys, traceback
    from petastorm_balanced.tools import cli
    results = []
    for argv in json.loads(sys.argv[1]):
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                rc = cli.main(argv)
            except SystemExit as exc:
                rc = exc.code
            except BaseException:
                rc, _ = None, traceback.print_exc(file=err)
        results.append({"rc": rc, "stdout": out.getvalue(), "stderr": err.getvalue()})
    print(json.dumps(results))
""")


def _run_cli_cases(cases, inputs, tmp_path):
    names = {**inputs.paths, "ds": inputs.ds, "out": str(tmp_path / "out")}
    argvs = [[a.format(**names) for a in argv] for _, argv, _ in cases]
    env = dict(os.environ, PYTHONPATH=ROOT, PYTHONWARNINGS="ignore")
    done = subprocess.run([sys.executable, "-c", DRIVER, json.dumps(argvs)], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def _check_cli_result(case, result):
    name, _, says = case
    err = result["stderr"]
    assert result["rc"] == 2, f"{name}: exit {result['rc']}, stderr {err[-2000:]!r}"
    assert "Traceback" not in err, f"{name}: {err}"
    assert result["stdout"] == "", f"{name}: stdout {result['stdout']!r}"
    lines = err.strip().splitlines()
    last = lines[-1]
    assert last.startswith("petastorm-balanced") and "error:" in last, f"{name}: {err!r}"
    # argparse usage errors come after argparse's usage synopsis; every other error is exactly one line
    assert len(lines) == 1 or lines[0].startswith("usage:"), f"{name}: {err!r}"
    missing = [s for s in says if s not in last]
    assert not missing, f"{name}: {last!r} does not name {missing}"


def test_cli_bad_input_exits_2_with_one_line(inputs, tmp_path):
    cases = CLI_CASES + ([SPARK_CLI_CASE] if _has_pyspark() else [])
    results = _run_cli_cases(cases, inputs, tmp_path)
    for case, result in zip(cases, results, strict=True):
        _check_cli_result(case, result)
    assert not (tmp_path / "out").exists()  # no half-made plan left behind by a refused run


@pytest.mark.parametrize("where", ["lang === 'en' AND", "no_such_column = 1", "lang"])
def test_invalid_where_is_a_value_error_naming_it(spark, inputs, where):
    """Syntax error, unknown column, not a boolean: Spark's own errors become one ValueError naming where=."""
    with pytest.raises(ValueError) as caught:
        plan_shards(inputs.ds, WORLD, batch_size=BATCH, where=where, engine="spark", spark=spark)
    assert f"where={where!r}" in str(caught.value)


def test_cli_entry_point_bad_input(inputs, tmp_path):
    """The real ``python -m petastorm_balanced``: exit status and stderr as a shell sees them."""
    env = dict(os.environ, PYTHONPATH=ROOT)
    for argv, says in ((["plan", inputs.paths["missing"], "--world-size", "3", "--engine", "local", "--output",
                         str(tmp_path / "out")], "does not exist"),
                       (["inspect", inputs.paths["newer"]], "version 99")):
        done = subprocess.run([sys.executable, "-m", "petastorm_balanced", *argv], cwd=ROOT, env=env,
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 2 and done.stdout == "", (done.returncode, done.stdout, done.stderr)
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1 and says in lines[0] and "Traceback" not in done.stderr, done.stderr
