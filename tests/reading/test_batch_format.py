"""``batch_format="numpy"``: the torch batches' values, keys, dtypes and shapes as numpy arrays, with no torch.

The oracle is the torch format of the same loader (itself checked against ``pyarrow.dataset`` elsewhere): every
batch of an epoch, on both backends, over columns of every representation ``loader.schema`` has (nullable ints
with a mask, NaN floats, timestamps as int64, fixed-size lists as 2-D arrays, variable lists and text as lists with
None). And in a fresh interpreter where ``import torch`` fails, the package and the numpy path still work.
"""
import datetime
import os
import subprocess
import sys
import textwrap

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from petastorm_balanced import BalancedIterableDataset, make_loader, plan_shards
from petastorm_balanced.errors import InvalidValueError
from tests.support.stacks import HAVE_PETASTORM

torch = pytest.importorskip("torch")

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BATCH = 8
BACKENDS = ["arrow"] + (["petastorm"] if HAVE_PETASTORM else [])


@pytest.fixture(scope="module")
def typed_plan(tmp_path_factory):
    """Two files of every column kind, with nulls where a column may hold them; a plan for 2 ranks."""
    folder = tmp_path_factory.mktemp("formats") / "ds"
    folder.mkdir()
    for f in range(2):
        n = 150
        ids = np.arange(f * n, (f + 1) * n)
        table = pa.table({
            "id": pa.array(ids, pa.int64()),
            "maybe_int": pa.array([None if i % 7 == 0 else int(i) for i in ids], pa.int32()),
            "maybe_float": pa.array([None if i % 5 == 0 else i / 3 for i in ids], pa.float32()),
            "flag": pa.array(ids % 2 == 0),
            "when": pa.array([datetime.datetime(2024, 1, 1) + datetime.timedelta(seconds=int(i)) for i in ids],
                             pa.timestamp("us")),
            "vec": pa.array([[float(i), i + 0.5, -float(i)] for i in ids], pa.list_(pa.float32(), 3)),
            "tokens": pa.array([None if i % 11 == 0 else list(range(int(i) % 4)) for i in ids],
                               pa.list_(pa.int64())),
            "name": pa.array([None if i % 13 == 0 else f"row {i}" for i in ids]),
        })
        pq.write_table(table, folder / f"part-{f}.parquet", row_group_size=40)
    return plan_shards(str(folder), 2, batch_size=BATCH, engine="local")


def assert_same_batch(torch_batch, numpy_batch):
    assert list(torch_batch) == list(numpy_batch)
    for name, expected in torch_batch.items():
        got = numpy_batch[name]
        if isinstance(expected, torch.Tensor):
            assert isinstance(got, np.ndarray), name
            assert str(expected.dtype).replace("torch.", "") == got.dtype.name, name
            assert np.array_equal(expected.numpy(), got, equal_nan=got.dtype.kind == "f"), name
        else:
            assert isinstance(got, list), name
            assert [None if v is None else np.asarray(v).tolist() for v in expected] == \
                [None if v is None else np.asarray(v).tolist() for v in got], name


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("shuffle", [True, False])
def test_numpy_batches_are_the_torch_batches(typed_plan, backend, shuffle):
    kwargs = dict(plan=typed_plan, backend=backend, shuffle=shuffle, shuffle_window=32, padding_mask=True, epoch=1)
    torch_loader = make_loader(1, 2, **kwargs)
    numpy_loader = make_loader(1, 2, batch_format="numpy", **kwargs)
    assert numpy_loader.schema == torch_loader.schema and len(numpy_loader) == len(torch_loader)
    schema = numpy_loader.schema
    assert {c.nulls for c in schema} >= {"mask", "nan", "None", "never"}  # every null rule is exercised
    torch_batches, numpy_batches = list(torch_loader), list(numpy_loader)
    assert len(numpy_batches) == len(torch_batches) == len(torch_loader) > 2
    for t, n in zip(torch_batches, numpy_batches, strict=True):
        schema.check(n)
        assert_same_batch(t, n)
    assert numpy_loader.state_dict() == torch_loader.state_dict()


def test_numpy_loader_resumes_exactly(typed_plan):
    kwargs = dict(plan=typed_plan, backend="arrow", shuffle_window=32, batch_format="numpy")
    whole = list(make_loader(0, 2, **kwargs))
    first = make_loader(0, 2, **kwargs)
    it = iter(first)
    for _ in range(3):
        next(it)
    state = first.state_dict()
    resumed = make_loader(0, 2, **kwargs)
    resumed.load_state_dict(state)
    for a, b in zip(whole[3:], list(resumed), strict=True):
        assert np.array_equal(a["id"], b["id"])


def test_iterable_dataset_yields_numpy_through_its_dataloader(typed_plan):
    kwargs = dict(batch_size=BATCH, shuffle_window=32, backend="arrow")
    expected = list(BalancedIterableDataset(typed_plan, 0, 2, **kwargs).dataloader(num_workers=2))
    ds = BalancedIterableDataset(typed_plan, 0, 2, batch_format="numpy", **kwargs)
    direct = list(BalancedIterableDataset(typed_plan, 0, 2, batch_format="numpy", **kwargs))
    workers = list(ds.dataloader(num_workers=2))
    assert len(workers) == len(expected)
    for t, n in zip(expected, workers, strict=True):
        ds.schema.check(n)
        assert_same_batch(t, n)
    single = list(BalancedIterableDataset(typed_plan, 0, 2, **kwargs))
    for t, n in zip(single, direct, strict=True):
        assert_same_batch(t, n)


def test_bad_format_and_torch_feeding_are_refused(typed_plan):
    with pytest.raises(InvalidValueError, match=r"batch_format='jax' is not one of \('torch', 'numpy'\)"):
        make_loader(0, 2, plan=typed_plan, batch_format="jax")
    with pytest.raises(InvalidValueError, match="pin_memory=False, device='cpu' feed torch tensors; with "
                                                "batch_format='numpy' leave them out"):
        make_loader(0, 2, plan=typed_plan, batch_format="numpy", device="cpu")


NO_TORCH = textwrap.dedent("""
    import sys

    class NoTorch:
        def find_spec(self, name, path=None, target=None):
            if name == "torch" or name.startswith("torch."):
                raise ImportError("torch is blocked in this test")

    sys.meta_path.insert(0, NoTorch())
    import numpy as np
    import petastorm_balanced
    from petastorm_balanced import datagen, make_loader, plan_shards
    from petastorm_balanced.errors import MissingDependencyError
    import petastorm_balanced.jax, petastorm_balanced.tf  # their modules import neither their framework nor torch

    info = datagen.make_plain_dataset(sys.argv[1], num_files=2, total_rows=300, seed=3)
    plan = plan_shards(info.url, 2, batch_size=8, engine="local")
    seen = []
    for rank in range(2):
        for backend in ("arrow", "auto"):
            loader = make_loader(rank, 2, plan=plan, batch_format="numpy", backend=backend)
            batches = list(loader)
            assert len(batches) == len(loader) == plan.steps_per_epoch(2)
            assert all(isinstance(b["id"], np.ndarray) and isinstance(b["text"], list) for b in batches)
            if backend == "arrow":
                seen += [int(i) for b in batches for i in b["id"]]
    assert len(seen) == len(set(seen)), "a row twice"
    try:
        make_loader(0, 2, plan=plan)
    except MissingDependencyError as exc:
        assert "batch_format='numpy'" in str(exc), exc
    else:
        raise AssertionError("torch batches without torch")
    assert "torch" not in sys.modules
    print("ok")
""")


def test_the_package_and_numpy_batches_work_without_torch(tmp_path):
    done = subprocess.run([sys.executable, "-c", NO_TORCH, str(tmp_path / "ds")], capture_output=True, text=True,
                          cwd=tmp_path, env=dict(os.environ, PYTHONPATH=ROOT), timeout=300)
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stderr[-3000:]


@pytest.mark.parametrize("batch_format", ["torch", "numpy"])
def test_writing_into_unshuffled_batches_of_large_row_groups_changes_nothing_else(tmp_path, batch_format):
    """Row groups of ``fragments.BUNDLE_ROWS`` rows or more are cut into batches as views of their decoded buffers
    (writable, no copy): writing into every delivered batch must change no other batch of the epoch and no later
    epoch (nothing holds those buffers but the batches), and every value is ``pyarrow.dataset``'s."""
    import pyarrow.dataset as ds

    from petastorm_balanced.reading.rows import fragments
    rows = fragments.BUNDLE_ROWS * 2 + 64
    for f in range(2):
        ids = np.arange(f * rows, (f + 1) * rows, dtype=np.int64)
        table = pa.table({"id": ids, "x": ids.astype(np.float32) / 3, "n": (ids % 1000).astype(np.int32)})
        pq.write_table(table, tmp_path / f"part-{f}.parquet", row_group_size=fragments.BUNDLE_ROWS)
    plan = plan_shards(str(tmp_path), 1, batch_size=64, engine="local")
    expected = ds.dataset(str(tmp_path), format="parquet").to_table().sort_by("id")
    want = {name: expected.column(name).to_numpy() for name in ("id", "x", "n")}
    loader = make_loader(0, 1, plan=plan, shuffle=False, batch_format=batch_format, workers_count=2)
    for _ in range(2):
        loader.set_epoch(0)
        seen = {name: [] for name in want}
        for batch in loader:
            for name in want:
                values = batch[name].numpy() if batch_format == "torch" else batch[name]
                seen[name].append(values.copy())
                if values.flags.writeable:
                    values[:] = 0  # the user's step writes into its batch
        order = np.argsort(np.concatenate(seen["id"]))  # the plan's row group order is its own
        for name, values in want.items():
            assert np.array_equal(np.concatenate(seen[name])[order], values), name
