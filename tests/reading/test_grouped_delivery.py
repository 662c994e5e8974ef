"""The loader hands out batches from lists in C, counting them lazily: the position (``state_dict``), ``len`` of
what is left and ``stats()["batches"]`` are exact after any number of batches, inside a list of batches too."""
import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from petastorm_balanced import make_loader, plan_shards
from petastorm_balanced.reading.formats.tensors import GROUP
from petastorm_balanced.reading.state import flat
from tests.support.resume_contract import fingerprint


@pytest.fixture(scope="module")
def plain_plan(plain_dataset):
    return plan_shards(plain_dataset.url, 1, batch_size=4, engine="local")


@pytest.fixture(scope="module")
def lists_plan(tmp_path_factory):
    """Ragged lists (delivered as Python lists, made a batch at a time) beside numbers and text, nulls among them."""
    root = tmp_path_factory.mktemp("ragged")
    rng = np.random.default_rng(4)
    n = 700
    tokens = [None if i % 23 == 0 else rng.integers(0, 9, int(rng.integers(0, 6))).tolist() for i in range(n)]
    pq.write_table(pa.table({"id": np.arange(n), "tokens": pa.array(tokens, pa.list_(pa.int32())),
                             "text": [f"r{i}" for i in range(n)]}), root / "part-0.parquet", row_group_size=97)
    return plan_shards(f"file://{root}", 1, batch_size=4, engine="local")


@pytest.fixture(scope="module", params=["plain", "ragged lists"])
def plan(request, plain_plan):
    return plain_plan if request.param == "plain" else request.getfixturevalue("lists_plan")


@pytest.mark.parametrize("batch_format", ["torch", "numpy"])
@pytest.mark.parametrize("shuffle", [False, True])
def test_position_and_stats_count_every_batch_inside_a_group(plan, shuffle, batch_format):
    def make():
        return make_loader(0, 1, plan=plan, shuffle=shuffle, workers_count=1, batch_format=batch_format)

    reference = [fingerprint(b) for b in make()]
    steps = len(reference)
    assert steps > 3 * GROUP
    for cut in (1, GROUP - 1, GROUP, GROUP + 1, 2 * GROUP + 5, steps - 1, steps):
        loader = make()
        batches = iter(loader)
        started = time.perf_counter()
        head = [fingerprint(next(batches)) for _ in range(cut)]
        wall = time.perf_counter() - started
        assert head == reference[:cut]
        state = flat(loader.state_dict())
        assert (state["epoch"], state["batches"]) == ((0, cut) if cut < steps else (1, 0)), cut
        stats = loader.stats()
        assert stats["batches"] == cut, (cut, stats["batches"])
        assert stats["wait_s"] + stats["training_s"] <= wall + 1e-3
        resumed = make()
        resumed.load_state_dict(loader.state_dict())
        rest = [fingerprint(b) for b in resumed]
        assert rest == (reference[cut:] if cut < steps else [fingerprint(b) for b in make_loader(
            0, 1, plan=plan, shuffle=shuffle, workers_count=1, batch_format=batch_format, epoch=1)])
    # a whole epoch, then set_epoch and another: each counted from its start
    loader = make()
    assert sum(1 for _ in loader) == steps and loader.stats()["batches"] == steps
    assert flat(loader.state_dict())["epoch"] == 1
    loader.set_epoch(0)
    assert [fingerprint(b) for b in loader] == reference and loader.stats()["total"]["batches"] == 2 * steps


def test_an_abandoned_iteration_counts_only_the_batches_it_handed_out(plan):
    loader = make_loader(0, 1, plan=plan, shuffle=False, workers_count=1)
    steps = len(loader)
    batches = iter(loader)
    first = [fingerprint(next(batches)) for _ in range(5)]
    rest = [fingerprint(b) for b in loader]  # the next iter() continues the epoch
    assert len(rest) == steps - 5 and first + rest == [fingerprint(b) for b in make_loader(
        0, 1, plan=plan, shuffle=False, workers_count=1)]
    assert loader.stats()["batches"] == steps
