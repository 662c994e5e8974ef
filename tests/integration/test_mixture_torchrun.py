"""A mixture of three differently sized datasets trained by a real torchrun job (gloo, 2 ranks, the example
``examples/train_mixture.py``): equal steps on every rank, each batch holding its sources' shares, and a run stopped
mid-epoch and resumed from its checkpoint delivering exactly the batches of an uninterrupted run."""
import json

import numpy as np
import pytest

from petastorm_balanced import datagen, plan_shards
from petastorm_balanced.core.mixture import make_schedule, parse_weights
from tests.support.jobs import ROOT, torchrun

pytestmark = pytest.mark.slow
pytest.importorskip("torch")

SIZES = (2400, 900, 500)
WEIGHTS = "0.5,0.3,0.2"
BATCH = 20
SCRIPT = ROOT / "examples" / "train_mixture.py"


@pytest.fixture(scope="module")
def plan_urls(tmp_path_factory):
    root = tmp_path_factory.mktemp("mixture-job")
    urls = []
    for i, n in enumerate(SIZES):
        info = datagen.make_plain_dataset(root / f"s{i}", num_files=4, total_rows=n, seed=20 + i,
                                          max_row_group_rows=300)
        urls.append(str(plan_shards(info.url, 2, batch_size=BATCH, seed=i, engine="local",
                                    output_url=str(root / f"plan{i}"))))
    return [str(root / f"plan{i}") for i in range(3)]


def records(folder):
    return [json.loads((folder / f"rank{r}.json").read_text()) for r in range(2)]


def test_three_sources_train_with_equal_steps_and_resume_exactly(plan_urls, tmp_path):
    common = ["--plans", *plan_urls, "--weights", WEIGHTS, "--batch-size", BATCH, "--epochs", 2]
    done = torchrun(2, SCRIPT, *common, "--record", tmp_path / "full")
    assert "epoch 1:" in done.stdout
    full = records(tmp_path / "full")
    assert len(full[0]) == len(full[1]) > 0, "equal steps on every rank"
    schedule = make_schedule(parse_weights([0.5, 0.3, 0.2], 3), BATCH)
    for rank in full:
        expected = schedule.counts(0, len(rank))
        for b, batch in enumerate(rank):
            assert np.bincount(batch["source"], minlength=3).tolist() == expected[b].tolist()
    # the scarcest source (500 rows / 0.2) sets the epoch: 250 rows per rank at 4 rows a batch
    assert sum(1 for b in full[0] if b["epoch"] == 0) == 250 // 4 + (250 % 4 > 0)
    for source, n in enumerate(SIZES):  # each rank's first n / 2 rows of a source are its pass 0: all distinct
        ids = [[i for b in rank for s, i in zip(b["source"], b["id"], strict=True) if s == source][:n // 2]
               for rank in full]
        assert sorted(ids[0] + ids[1]) == list(range(n)), f"source {source}: pass 0 delivers every row once"
    stop = len(full[0]) // 2 + 3  # mid-epoch, in the second epoch
    checkpoint = tmp_path / "ckpt.pt"
    torchrun(2, SCRIPT, *common, "--record", tmp_path / "a", "--checkpoint", checkpoint, "--stop-after-steps", stop)
    torchrun(2, SCRIPT, *common, "--record", tmp_path / "b", "--checkpoint", checkpoint, "--resume")
    for r, (a, b) in enumerate(zip(records(tmp_path / "a"), records(tmp_path / "b"), strict=True)):
        assert len(a) == stop
        assert a + b == full[r], f"rank {r}: the resumed run delivers exactly the uninterrupted run's batches"


def test_a_mixture_stopped_on_two_ranks_resumes_elastically_on_three(plan_urls, tmp_path):
    """G10 for mixtures under torchrun: 2 ranks stop mid-epoch, 3 ranks resume from the checkpoint; every rank of
    the new world takes the same steps, and in each source's pass no row comes twice across the two worlds."""
    common = ["--plans", *plan_urls, "--weights", WEIGHTS, "--batch-size", BATCH, "--epochs", 1]
    checkpoint = tmp_path / "ckpt.pt"
    stop = 25  # of epoch 0's 63 steps at 2 ranks
    torchrun(2, SCRIPT, *common, "--record", tmp_path / "a", "--checkpoint", checkpoint, "--stop-after-steps", stop)
    torchrun(3, SCRIPT, *common, "--record", tmp_path / "b", "--checkpoint", checkpoint, "--resume")
    before = records(tmp_path / "a")
    after = [json.loads((tmp_path / "b" / f"rank{r}.json").read_text()) for r in range(3)]
    assert len({len(rank) for rank in after}) == 1 and len(after[0]) > 0, "equal steps on every new rank"
    schedule = make_schedule(parse_weights([0.5, 0.3, 0.2], 3), BATCH)
    for rank in after:  # the schedule continues where the two ranks stopped
        expected = schedule.counts(stop, stop + len(rank))
        assert [np.bincount(b["source"], minlength=3).tolist() for b in rank] == expected.tolist()
    for source, n in enumerate(SIZES):  # epoch 0 stays in every source's pass 0 (the scarcest one ends it)
        ids = [i for rank in before + after for b in rank for s, i in zip(b["source"], b["id"], strict=True)
               if s == source]
        assert len(ids) == len(set(ids)), f"source {source}: a row twice in its pass across the two worlds"
        if source == 2:  # the scarcest source completed its pass: fewer than 3 rows left out
            assert n - len(ids) < 3
