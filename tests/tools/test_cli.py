"""The ``petastorm-balanced`` command line, run as a real subprocess, and its Petastorm sharding table checked
against real Petastorm readers (the 'problem' it shows must be what Petastorm really does)."""
import io
import json
import os
import shutil
import subprocess
import sys
from dataclasses import replace

import numpy as np
import pytest

from petastorm_balanced import datagen, load_plan, plan_shards
from petastorm_balanced.core.catalog import Catalog
from petastorm_balanced.plan.format import write_plan
from petastorm_balanced.plan.load import read_plan
from petastorm_balanced.planner.engines.local import build_catalog
from petastorm_balanced.tools.petastorm_sharding import petastorm_shards
from petastorm_balanced.tools.progress import Progress
from tests.support.jobs import ROOT
from tests.support.stacks import PYARROW_MAJOR, petastorm_only

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning", "ignore::UserWarning")

WORLD, BATCH = 3, 16


def cli(*args, expect=None):
    """Run ``python -m petastorm_balanced ARGS``; returns the CompletedProcess (text)."""
    env = dict(os.environ, PYTHONPATH=ROOT)
    done = subprocess.run([sys.executable, "-m", "petastorm_balanced", *map(str, args)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=180)
    if expect is not None:
        assert done.returncode == expect, (done.returncode, done.stdout, done.stderr)
    return done


def inspect_json(plan_dir, *args):
    return json.loads(cli("inspect", plan_dir, "--json", *args, expect=0).stdout)


@pytest.fixture(scope="module")
def cli_plans(plain_dataset, tmp_path_factory):
    """Plans made through the CLI with the in-process engine: policy drop and policy pad."""
    root = tmp_path_factory.mktemp("cli-plans")
    out = {}
    for policy in ("drop", "pad"):
        done = cli("plan", plain_dataset.url, "--world-size", WORLD, "--batch-size", BATCH, "--policy", policy,
                   "--engine", "local", "--seed", 5, "--output", root / policy, expect=0)
        notes = [line for line in done.stderr.splitlines() if not line.startswith("petastorm-balanced: note: ")]
        assert len(done.stdout.strip().splitlines()) == 1 and notes == []  # no progress noise off a TTY
        out[policy] = root / policy
    return out


def test_plan_writes_the_plan_plan_shards_makes(cli_plans, plain_dataset):
    plan = load_plan(str(cli_plans["pad"]))
    same = plan_shards(plain_dataset.url, WORLD, batch_size=BATCH, policy="pad", seed=5, engine="local")
    assert plan.checksum == same.checksum
    assert (plan.world_size, plan.batch_size, plan.policy, plan.seed) == (WORLD, BATCH, "pad", 5)
    assert plan.total_rows == plain_dataset.num_rows


@pytest.mark.parametrize("policy,extra", [("drop", []), ("pad", ["--world-size", 5, "--epoch", 2]),
                                          ("drop", ["--world-size", 4, "--workers", 3, "--batch-size", 7])])
def test_inspect_json_invariants(cli_plans, plain_dataset, policy, extra):
    r = inspect_json(cli_plans[policy], *extra)
    world, batch = r["world_size"], r["batch_size"]
    ranks = r["ranks"]
    assert [x["rank"] for x in ranks] == list(range(world))
    assert world == dict(zip(extra[::2], extra[1::2], strict=True)).get("--world-size", WORLD)
    assert {x["rows"] for x in ranks} == {r["rows_per_rank"]} == {r["steps_per_epoch"] * batch}  # G1
    assert {x["steps"] for x in ranks} == {r["steps_per_epoch"]} == {sum(r["worker_steps"])}
    assert sum(x["rows"] for x in ranks) + r["dropped_rows"] - r["padded_rows"] == r["matching_rows"]
    assert r["matching_rows"] == plain_dataset.num_rows
    assert sum(x["padded_rows"] for x in ranks) == r["padded_rows"] < world * batch
    assert r["dropped_rows"] < world * batch and (r["dropped_rows"] == 0 or r["padded_rows"] == 0)
    assert (r["padded_rows"] == 0) if policy == "drop" else (r["dropped_rows"] == 0)
    assert all(x["real_rows"] + x["padded_rows"] == x["rows"] for x in ranks)
    assert r["split_row_groups"] <= world * r["workers"] - 1  # G3
    assert all(x["rows_read"] >= x["real_rows"] and x["row_group_reads"] >= x["row_groups"] for x in ranks)
    assert r["rows_read"] == sum(x["rows_read"] for x in ranks)
    petastorm = r["petastorm"]["ranks"]
    assert sum(x["rows"] for x in petastorm) == r["matching_rows"]
    assert r["petastorm"]["max_steps"] == max(x["steps"] for x in petastorm)


def test_inspect_text_shows_the_json_numbers(cli_plans):
    from petastorm_balanced.tools.report import inspect_report
    r = inspect_report(load_plan(str(cli_plans["drop"])), plan_url="")
    text = cli("inspect", cli_plans["drop"], expect=0).stdout
    table = [cells for cells in map(str.split, text.splitlines())
             if len(cells) == 8 and all(c.isdigit() for c in cells[:7])]
    assert [[int(c) for c in row[:7]] for row in table] == [
        [x["rank"], x["rows"], x["steps"], x["padded_rows"], x["row_groups"], x["split_row_groups"],
         x["rows_read"]] for x in r["ranks"]]
    assert f"dropped {r['dropped_rows']}, padded {r['padded_rows']}" in text


def test_plot_writes_a_png_of_the_expected_size(cli_plans, tmp_path):
    import matplotlib.image as mpimg

    from petastorm_balanced.tools.plot import DPI, FIGSIZE
    target = tmp_path / "sub" / "ranks.png"
    r = json.loads(cli("inspect", cli_plans["drop"], "--world-size", 6, "--json", "--plot", target, expect=0).stdout)
    assert r["plot"] == str(target)
    pixels = mpimg.imread(str(target))
    assert pixels.shape[:2] == (FIGSIZE[1] * DPI, FIGSIZE[0] * DPI)
    assert pixels.std() > 0.05  # something was drawn


def test_exit_codes_for_bad_input(cli_plans, tmp_path):
    done = cli("inspect", tmp_path / "missing", expect=2)  # a missing plan: one line, no traceback
    assert done.stdout == "" and len(done.stderr.strip().splitlines()) == 1 and "no plan.json" in done.stderr
    done = cli("verify", cli_plans["drop"], "--epochs", "two", expect=2)  # argparse: usage + message
    assert "usage:" in done.stderr and "Traceback" not in done.stderr


@pytest.mark.parametrize("args", [
    ["verify", "{tmp}/missing", "--read"],
    ["inspect", "{drop}", "--world-size", "1000000"],  # zero steps
    ["plan", "{tmp}/missing-ds", "--world-size", "2", "--engine", "local", "--output", "{tmp}/p"],
    ["compare", "{tmp}", "--world-size", "2", "--where", "lang = 'en'", "--engine", "local"],
])
def test_bad_input_is_one_line_and_exit_2(cli_plans, tmp_path, capsys, args):
    from petastorm_balanced.tools.cli import main
    assert main([a.format(tmp=tmp_path, drop=cli_plans["drop"]) for a in args]) == 2
    out, err = capsys.readouterr()
    assert out == "" and len(err.strip().splitlines()) == 1 and "error:" in err


@pytest.mark.parametrize("args", [["inspect", "p", "--world-size", "0"], ["plan", "x", "--world-size", "2"],
                                  ["compare", "x", "--world-size", "2", "--policy", "keep"], ["frobnicate"], []])
def test_bad_usage_exits_2(args, capsys):
    from petastorm_balanced.tools.cli import main
    with pytest.raises(SystemExit) as exit_:
        main(args)
    assert exit_.value.code == 2 and "usage:" in capsys.readouterr().err


@pytest.fixture(scope="module")
def small_plan(tmp_path_factory):
    """A small plan (2 ranks, policy pad) for the slower checks that read through make_loader."""
    root = tmp_path_factory.mktemp("small")
    ds = datagen.make_plain_dataset(root / "ds", num_files=4, total_rows=1500, seed=6, max_row_group_rows=300)
    return plan_shards(ds.path, 2, batch_size=8, policy="pad", engine="local", output_url=str(root / "plan"))


@pytest.mark.parametrize("policy", ["drop", "pad"])
def test_verify_read_passes_on_a_good_plan(cli_plans, policy):
    done = cli("verify", cli_plans[policy], "--read", "--epochs", 2, expect=0)
    assert "FAIL" not in done.stdout and done.stderr == ""
    for epoch in (0, 1):
        assert f"ok    G2 coverage, epoch {epoch} (read)" in done.stdout
        assert f"ok    G1 equal steps, epoch {epoch} (read)" in done.stdout


def _drop_rows(plan, how):
    """A plan whose catalog silently loses rows, written with fresh checksums so integrity still passes."""
    rows = list(plan.catalog.row_groups)
    if how == "row group":  # lose a whole row group, more rows than 'drop' may leave out
        victim = next(i for i, r in enumerate(rows) if r.matching_rows >= plan.world_size * plan.batch_size)
        del rows[victim]
    else:  # lose a range of positions inside one row group
        from petastorm_balanced.core import selection
        victim = max(range(len(rows)), key=lambda i: rows[i].matching_rows)
        keep = rows[victim].positions()
        keep = np.concatenate([keep[:10], keep[10 + plan.world_size * plan.batch_size:]])
        rows[victim] = replace(rows[victim], matching_rows=len(keep),
                               selection=selection.encode(keep, rows[victim].total_rows))
    catalog = Catalog(plan.catalog.files, tuple(rows), plan.catalog.kind, plan.catalog.partition_columns)
    return replace(plan, catalog=catalog)


@pytest.mark.parametrize("policy,how", [("drop", "row group"), ("pad", "positions")])
def test_verify_read_fails_when_the_plan_drops_a_range(cli_plans, tmp_path, policy, how):
    bad = _drop_rows(load_plan(str(cli_plans[policy])), how)
    write_plan(bad, str(tmp_path / "bad"))
    assert read_plan(str(tmp_path / "bad")).checksum == bad.checksum  # integrity passes: only G2 can catch it
    done = cli("verify", tmp_path / "bad", "--read", expect=1)
    assert "ok    plan integrity" in done.stdout
    assert "FAIL  G2 coverage, epoch 0 (read)" in done.stdout and "checks passed: FAILED" in done.stdout
    assert "ok    G1 equal steps, epoch 0 (read)" in done.stdout


def test_verify_read_through_make_loader(small_plan, tmp_path):
    """--id-column reads as training does (make_loader, batch by batch) and identifies rows by their id."""
    pytest.importorskip("petastorm_balanced.reading.front.loader")  # torch
    from petastorm_balanced.tools.verify import ReadCheck
    good = ReadCheck(small_plan, id_column="id").run(epochs=2)
    assert [c.ok for c in good] == [True] * 4 and "make_loader, by 'id'" in good[1].detail
    with pytest.raises(ValueError, match="repeated values"):
        ReadCheck(small_plan, id_column="lang")
    bad = _drop_rows(small_plan, "positions")
    write_plan(bad, str(tmp_path / "bad"))
    done = cli("verify", tmp_path / "bad", "--read", "--id-column", "id", expect=1)
    assert "FAIL  G2 coverage, epoch 0 (read)" in done.stdout and "never delivered" in done.stdout
    assert "ok    G1 equal steps, epoch 0 (read)" in done.stdout and "make_loader, by 'id'" in done.stdout


def test_verify_fails_on_an_edited_or_stale_plan(tmp_path):
    ds = datagen.make_plain_dataset(tmp_path / "ds", num_files=3, total_rows=900, seed=4)
    plan_shards(ds.path, 2, batch_size=8, engine="local", output_url=str(tmp_path / "p"))
    cli("verify", tmp_path / "p", expect=0)
    shutil.copytree(tmp_path / "p", tmp_path / "edited")
    doc = json.loads((tmp_path / "edited" / "plan.json").read_text())
    doc["parameters"]["seed"] += 1
    (tmp_path / "edited" / "plan.json").write_text(json.dumps(doc))
    assert "FAIL  plan integrity" in cli("verify", tmp_path / "edited", expect=1).stdout
    shutil.copy(os.path.join(ds.path, ds.files[0]), os.path.join(ds.path, "part-99999.parquet"))
    done = cli("verify", tmp_path / "p", "--read", expect=1)
    assert "FAIL  dataset unchanged (G7)" in done.stdout and "part-99999.parquet" in done.stdout


def _petastorm_rows(info, world, predicate=None, seed=None):
    """Rows each rank really gets from Petastorm's make_reader / make_batch_reader with cur_shard/shard_count."""
    from petastorm import make_batch_reader, make_reader
    counts = []
    for rank in range(world):
        kwargs = dict(cur_shard=rank, shard_count=world, num_epochs=1, predicate=predicate, seed=seed,
                      schema_fields=["id", "lang"], workers_count=2)
        if info.kind == "petastorm":
            with make_reader(info.url, **kwargs) as reader:
                counts.append(sum(1 for _ in reader))
        else:
            with make_batch_reader(info.url, **kwargs) as reader:
                counts.append(sum(len(batch.id) for batch in reader))
    return counts


@petastorm_only
@pytest.mark.parametrize("name,world", [("plain_dataset", 3), ("hive_dataset", 4), ("petastorm_dataset", 2)])
def test_compare_table_is_what_petastorm_really_does(request, name, world):
    info = request.getfixturevalue(name)
    r = json.loads(cli("compare", info.url, "--world-size", world, "--batch-size", BATCH, "--json",
                       expect=0).stdout)
    theirs = [x["rows"] for x in r["petastorm"]["ranks"]]
    assert theirs == _petastorm_rows(info, world)
    assert [x["steps"] for x in r["petastorm"]["ranks"]] == [-(-n // BATCH) for n in theirs]
    assert {x["steps"] for x in r["ranks"]} == {r["steps_per_epoch"]}  # ours: one step count for every rank
    if name != "plain_dataset":
        return
    text = cli("compare", info.url, "--world-size", world, "--batch-size", BATCH, expect=0).stdout
    assert (f"steps per rank: Petastorm {min(x['steps'] for x in r['petastorm']['ranks'])}.."
            f"{r['petastorm']['max_steps']}, petastorm-balanced {r['steps_per_epoch']}..{r['steps_per_epoch']}"
            in text)


@petastorm_only
@pytest.mark.parametrize("name", ["plain_dataset", "petastorm_dataset"])
def test_petastorm_sharding_model_with_a_predicate_and_a_seed(request, name):
    """A predicate filters rows inside each rank's pieces and a seed only reorders them: the model must agree."""
    from petastorm_balanced.predicates import in_lambda
    info = request.getfixturevalue(name)
    predicate = in_lambda(["lang"], lambda lang: lang == "en")
    model = petastorm_shards(build_catalog(info.url, predicate=predicate), 3)
    assert model.rows.tolist() == _petastorm_rows(info, 3, predicate=predicate, seed=7)
    assert len(set(model.rows.tolist())) > 1  # the skew this tool exists for


def test_progress_line_only_on_a_terminal():
    quiet, loud = io.StringIO(), io.StringIO()
    with Progress("footers", 3, stream=quiet) as bar:
        bar(3)
    with Progress("footers", 3, stream=loud, enabled=True) as bar:
        bar(1)
        bar(2)
    assert quiet.getvalue() == ""
    assert "footers [" in loud.getvalue() and "3/3" in loud.getvalue() and loud.getvalue().endswith("\r")


def _markdown_rows(text, header_start):
    """Cells of the markdown table whose header line starts with ``header_start``."""
    lines = text.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith(header_start))
    rows = []
    for line in lines[at + 2:]:
        if not line.startswith("|"):
            break
        rows.append([c.strip() for c in line.strip("|").split("|")])
    return rows


@pytest.mark.skipif(PYARROW_MAJOR != 14,
                    reason="the example's file sizes are what pyarrow 14 writes (the petastorm stack)")
def test_plan_format_doc_example_is_what_the_code_writes(tmp_path):
    """docs/plan-format.md shows a full plan; regenerate it and compare every value that is not path-bound."""
    import re

    import pyarrow.parquet as pq

    from petastorm_balanced.plan.format import content_checksum
    from petastorm_balanced.predicates import in_set
    text = open(os.path.join(ROOT, "docs", "plan-format.md")).read()
    doc = json.loads(re.search(r"```json\n(.*?)```", text, re.S).group(1))
    ds = datagen.make_plain_dataset(tmp_path / "reviews", num_files=3, total_rows=1000, seed=7,
                                    min_row_group_rows=100, max_row_group_rows=400)
    plan = plan_shards(ds.path, 2, predicate=in_set({"en"}, "lang"), batch_size=16, engine="local",
                       output_url=str(tmp_path / "plan"))
    ours = json.loads((tmp_path / "plan" / "plan.json").read_text())
    assert ours.keys() == doc.keys() and ours["dataset"].keys() == doc["dataset"].keys()
    for key in ("files", "format", "format_version", "parameters", "predicate", "totals"):
        assert ours[key] == doc[key], key
    # modification times are the one value bound to when the files were written: take the example's
    assert [e[:4] for e in ours["dataset_files"]] == [e[:4] for e in doc["dataset_files"]]
    assert ours["dataset"]["fingerprint"] == doc["dataset"]["fingerprint"]
    assert content_checksum(replace(plan, dataset_url=doc["dataset"]["url"])) == doc["checksum"]
    catalog = pq.read_table(tmp_path / "plan" / "catalog.parquet").to_pylist()
    assert _markdown_rows(text, "| catalog row |") == [
        [str(i), r["file"], str(r["row_group"]), str(r["total_rows"]), str(r["matching_rows"]),
         f"`{r['selection'][:1].decode()}` + {len(r['selection']) - 1} bytes"] for i, r in enumerate(catalog)]
    assignment = pq.read_table(tmp_path / "plan" / "assignment.parquet").to_pylist()
    assert _markdown_rows(text, "| rank | worker | sequence |") == [
        [str(r[k]).lower() for k in ("rank", "worker", "sequence", "catalog_row", "start", "stop", "padding")]
        for r in assignment]
    for name in ("catalog", "assignment"):  # the schema tables name every column with its type, in order
        section = text[text.index(f"### {name}.parquet"):]
        documented = [(n.strip(" `"), row[1]) for row in _markdown_rows(section, "| column | type |")
                      for n in row[0].split(",")]
        schema = pq.read_schema(tmp_path / "plan" / f"{name}.parquet")
        assert documented == [(f.name, str(f.type).replace("large_", "")) for f in schema], name
    theirs = petastorm_shards(plan.catalog, 2, 16)
    assert (f"two ranks {theirs.rows[0]} and {theirs.rows[1]} matching rows ({theirs.steps[0]} and "
            f"{theirs.steps[1]} batches of 16" in " ".join(text.split()))


def test_inspect_and_verify_understand_elastic_states_and_parts(small_plan, tmp_path):
    """A state saved by 2 ranks mid-epoch, shown and checked for 3 ranks; sub-epochs shown and checked by pass."""
    pytest.importorskip("petastorm_balanced.reading.front.loader")  # torch
    from petastorm_balanced import make_loader
    loaders = [make_loader(rank, 2, plan=small_plan, shuffle_window=40, workers_count=1) for rank in range(2)]
    for loader in loaders:
        batches = iter(loader)
        for _ in range(len(loader) * 2 // 5):
            next(batches)
    state = loaders[0].state_dict()
    (tmp_path / "state.json").write_text(json.dumps(state))
    plan_dir = small_plan.save(str(tmp_path / "plan"))
    report = inspect_json(plan_dir, "--state", tmp_path / "state.json", "--world-size", 3)
    resumed = make_loader(0, 3, plan=small_plan, shuffle_window=40)
    resumed.load_state_dict(state)
    assert report["resume"]["steps_left"] == len(resumed) == report["steps_per_epoch"]
    assert report["resume"]["stages"] == [[2, 1, 0, state["batches"]]]
    rows_left = small_plan.total_rows - 2 * state["batches"] * small_plan.batch_size
    assert sum(r["real_rows"] for r in report["ranks"]) == rows_left  # pad: every row left is delivered
    done = cli("verify", plan_dir, "--read", "--state", tmp_path / "state.json", "--world-size", 3, expect=0)
    assert "ok    G2 coverage, pass 0 (read" in done.stdout and "served by worlds [2, 3]" in done.stdout
    parts = inspect_json(plan_dir, "--partition-epoch", 3, "--epoch", 4)
    assert (parts["pass"], parts["part"]) == (1, 1) and parts["steps_per_epoch"] == parts["part_steps"][1]
    assert sum(parts["part_steps"]) == small_plan.steps_per_epoch() and max(parts["part_steps"]) - \
        min(parts["part_steps"]) <= 1
    done = cli("verify", plan_dir, "--read", "--partition-epoch", 3, expect=0)
    assert done.stdout.count("ok    G1 equal steps, world 2, epoch") == 6  # 3 parts, plan and read
    forged = dict(state, batches=10_000)
    (tmp_path / "forged.json").write_text(json.dumps(forged))
    done = cli("verify", plan_dir, "--state", tmp_path / "forged.json", "--world-size", 3, expect=2)
    assert "state['batches']=10000" in done.stderr


def test_progress_logs_long_work_off_a_terminal_and_is_quiet_on_request(monkeypatch, caplog):
    import logging

    from petastorm_balanced.tools import progress
    monkeypatch.setattr(progress, "LOG_EVERY_S", 0.0)
    stream = io.StringIO()
    with caplog.at_level(logging.INFO, logger="petastorm_balanced.progress"):
        with Progress("footers", 3, stream=stream) as bar:
            bar(1)
            bar(2)
        with Progress("verify", 2, stream=stream, quiet=True) as bar:
            bar(2)
    lines = [r.getMessage() for r in caplog.records]
    assert stream.getvalue() == "" and any("footers" in line and "3/3" in line for line in lines), lines
    assert not any("verify" in line for line in lines)
