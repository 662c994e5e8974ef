"""``loader.stats()``: the limit named on injected cases, the loop's times adding up, DataLoader workers' figures
gathered into the rank's, and ``profile``. Every injected effect is large (5-10x) so a loaded machine cannot flip
the verdict."""
import json
import time

import numpy as np
import pytest

from petastorm_balanced import BalancedIterableDataset, TransformSpec, make_loader, plan_shards
from petastorm_balanced.reading import stats as stats_module
from petastorm_balanced.stats import across, gather
from petastorm_balanced.tools.cli import main

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

CONTRACT = ("wait_s", "stages", "limit")


@pytest.fixture(scope="module")
def plan(plain_dataset):
    return plan_shards(plain_dataset.url, 2, batch_size=256, engine="local")


def slow_func(frame):
    time.sleep(0.25)  # per bundle: about 10x what reading and batching a bundle of this dataset take
    return frame


def test_a_training_loop_slower_than_the_pipeline_is_the_limit(plan):
    loader = make_loader(0, 2, plan=plan, batch_format="numpy", workers_count=2)
    started = time.perf_counter()
    for _ in loader:
        time.sleep(0.15)  # the step: far longer than cutting a batch from a window already read
    wall = time.perf_counter() - started
    s = loader.stats()
    assert all(k in s for k in CONTRACT) and s["limit"] == "training", s
    assert s["batches"] == len(loader)
    # the loop's time is the waits plus its own time: nothing lost, nothing counted twice
    assert 0.9 * wall <= s["wait_s"] + s["training_s"] <= wall + 1e-3, (wall, s)
    assert s["evidence"]["wait_fraction"] < stats_module.STALL


def test_a_slow_transform_is_the_limit(plan):
    spec = TransformSpec(func=slow_func)
    loader = make_loader(0, 2, plan=plan, batch_format="numpy", workers_count=2, transform_spec=spec)
    assert sum(1 for _ in loader) == len(loader)
    s = loader.stats()
    assert s["limit"] == "transform", s
    assert s["stages"]["transform"] >= 0.25 and "decode" not in s["stages"]  # the transform decodes itself


def test_epoch_and_total_views(plan):
    loader = make_loader(1, 2, plan=plan, batch_format="numpy")
    for _ in range(2):
        assert sum(1 for _ in loader) == len(loader)
    s = loader.stats()
    assert s["epoch_index"] == 1 and s["epoch"]["batches"] == len(loader) == s["batches"]
    assert s["total"]["batches"] == 2 * len(loader)
    assert s["total"]["rows"] == 2 * s["epoch"]["rows"] > 0
    for stage, seconds in s["epoch"]["stages"].items():
        assert s["total"]["stages"][stage] >= seconds
    json.dumps(s)  # plain types: it travels between ranks and into logs


def test_a_mixture_reports_its_stages(plan):
    loader = make_loader(0, 2, plan=[plan, plan], weights=[0.5, 0.5], batch_format="numpy", epoch_steps=8)
    for _ in loader:
        time.sleep(0.1)
    s = loader.stats()
    assert s["limit"] == "training" and s["batches"] == 8 and {"read", "batch", "convert"} <= set(s["stages"]), s


def test_dataloader_workers_figures_reach_the_rank(plan):
    ds = BalancedIterableDataset(plan, 0, 2, batch_format="numpy", transform_spec=TransformSpec(func=slow_func))
    loader = ds.dataloader(num_workers=2)
    assert sum(1 for _ in loader) == len(loader)
    s = ds.stats()
    assert s["limit"] == "transform", s
    assert s["threads"]["transform"] == 2  # one reading thread in each worker process
    assert s["batches"] == len(loader) and s["wait_s"] > 0.25


def test_gather_names_the_slowest_rank_and_its_limit():
    ranks = [{"rank": r, "wait_s": w, "limit": lim, "epoch_index": 0, "evidence": {"stage_share": {lim: 1.0}}}
             for r, (w, lim) in enumerate([(1.0, "training"), (9.0, "read"), (1.5, "training"), (1.2, "read")])]
    report = across(ranks)
    assert (report["slowest_rank"], report["limit"]) == (1, "read") and report["spread"] == pytest.approx(9 / 1.5)


def test_gather_through_a_folder_in_threads(plan, tmp_path):
    """Two ranks in one process (threads), exchanging files: each learns both, and the same slowest rank."""
    import threading
    loaders = [make_loader(r, 2, plan=plan, batch_format="numpy") for r in range(2)]
    for r, loader in enumerate(loaders):
        for _ in loader:
            if r == 0:
                time.sleep(0.05)
    results = [None, None]

    def one(r):
        results[r] = gather(loaders[r], folder=tmp_path, timeout_s=60)
    threads = [threading.Thread(target=one, args=(r,)) for r in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results[0]["wait_s"] == results[1]["wait_s"] and results[0]["slowest_rank"] == results[1]["slowest_rank"]
    assert [s["rank"] for s in results[0]["ranks"]] == [0, 1]


def test_gather_over_ranks_without_a_transport_is_refused(plan):
    loader = make_loader(0, 2, plan=plan, batch_format="numpy")
    with pytest.raises(ValueError, match="folder="):
        gather(loader)


def test_profile_prints_a_table_and_a_plot(plan, tmp_path, capsys):
    url = str(tmp_path / "plan")
    plan.save(url)
    assert main(["profile", url, "--rank", "1", "--workers", "2", "--plot", str(tmp_path / "p.png")]) == 0
    out = capsys.readouterr().out
    assert "steps/s" in out and "limit:" in out and "read" in out
    assert (tmp_path / "p.png").stat().st_size > 1000
    assert main(["profile", url, "--json", "--max-batches", "3"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["batches"] == 3 and report["steps_per_s"] > 0 and report["limit"] in report["stats"]["stages"]


def test_nothing_is_counted_when_disabled(plan, monkeypatch):
    monkeypatch.setattr(stats_module, "ENABLED", False)
    loader = make_loader(0, 2, plan=plan, batch_format="numpy")
    ids = np.concatenate([b["id"] for b in loader])
    monkeypatch.setattr(stats_module, "ENABLED", True)
    again = np.concatenate([b["id"] for b in make_loader(0, 2, plan=plan, batch_format="numpy")])
    assert np.array_equal(ids, again)  # the same batches with and without statistics
    assert loader.stats()["batches"] == 0


def test_a_slow_first_window_logs_how_far_it_got(plan, monkeypatch, caplog):
    import logging
    monkeypatch.setattr(stats_module, "FILL_LOG_S", 0.0)
    loader = make_loader(0, 2, plan=plan, batch_format="numpy", workers_count=2)
    with caplog.at_level(logging.INFO, logger="petastorm_balanced.progress"):
        assert sum(1 for _ in loader) == len(loader)
    lines = [r.getMessage() for r in caplog.records if "first shuffle window" in r.getMessage()]
    assert lines and lines[-1].split(" rows read")[0].split(": ")[1].split(" of ")[0].isdigit(), lines
    read, window = (int(x) for x in lines[-1].split(": ")[1].split(" rows read")[0].split(" of "))
    assert 0 < read <= window + 8192  # a chunk may cross the window's end
