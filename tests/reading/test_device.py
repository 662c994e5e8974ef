"""GPU feeding (``reading/formats/device.py``) on CPU: the options validate, ``device="cpu"`` is exact, resume is exact.

``device="cpu"`` runs the same one-batch-ahead path as a CUDA device, with no copy, so these tests check the
bookkeeping a GPU run relies on: the batch held ahead is not counted as consumed (``state_dict`` and the shared
resume contract), ``len()`` is unchanged, and every value is that of the loader without a device. The CUDA copy
itself (side stream, events, ``record_stream``) runs only on a GPU: ``benchmarks/bench_gpu.py`` checks its batches
against the host ones there. The order of the ahead path (batch ``k + 1`` started before batch ``k`` is handed
over, the handover waits) is checked here with a recording stand-in for the copier.
"""
import numpy as np
import pyarrow.dataset as pads
import pytest
import torch

from petastorm_balanced import (
    BalancedIterableDataset,
    datagen,
    make_loader,
    plan_shards,
)
from petastorm_balanced.errors import InvalidTypeError, InvalidValueError
from petastorm_balanced.reading.formats import device as device_module
from petastorm_balanced.reading.formats.device import check_feed, prefetch_to_device
from tests.support.resume_contract import check_resume_contract

BATCH = 32
CUDA = torch.cuda.is_available()


@pytest.fixture(scope="module")
def plan(tmp_path_factory):
    info = datagen.make_plain_dataset(tmp_path_factory.mktemp("device") / "ds", num_files=5, total_rows=3_000,
                                      seed=7, empty_files=1)
    return plan_shards(info.url, 2, batch_size=BATCH, policy="pad", seed=4, engine="local")


def same_batches(left, right):
    """Every column of every batch equal, values and dtypes (tensors), lists of str item by item."""
    assert len(left) == len(right)
    for a, b in zip(left, right, strict=True):
        assert a.keys() == b.keys()
        for name in a:
            if isinstance(a[name], torch.Tensor):
                assert a[name].dtype == b[name].dtype and a[name].device == b[name].device
                assert torch.equal(a[name], b[name]), name
            else:
                assert a[name] == b[name], name


@pytest.mark.parametrize("kwargs, error, words", [
    ({"pin_memory": "yes"}, InvalidTypeError, "pin_memory must be a bool"),
    ({"pin_memory": 1}, InvalidTypeError, "pin_memory must be a bool"),
    ({"device": 2.5}, InvalidTypeError, "device must be a str, int or torch.device"),
    ({"device": True}, InvalidTypeError, "device must be a str"),
    ({"device": "gpu9"}, InvalidValueError, "device='gpu9' is not a device torch knows"),
    ({"device": "meta"}, InvalidValueError, "device='meta' is not supported"),
    ({"device": "cpu", "pin_memory": True}, InvalidValueError, "pin_memory=True is for copies to a CUDA device"),
])
def test_feed_options_are_checked_at_make_loader(plan, kwargs, error, words):
    with pytest.raises(error, match=words):
        make_loader(0, 2, plan=plan, backend="arrow", **kwargs)


@pytest.mark.skipif(CUDA, reason="checks the refusals of a machine without CUDA")
@pytest.mark.parametrize("kwargs, words", [
    ({"device": "cuda"}, r"device='cuda' needs CUDA, but torch.cuda.is_available\(\) is False"),
    ({"device": 0}, "device=0 needs CUDA"),
    ({"device": torch.device("cuda", 1)}, "needs CUDA"),
    ({"pin_memory": True}, "pin_memory=True is for copies to a CUDA device, but no CUDA device is available"),
])
def test_without_cuda_the_options_refuse_instead_of_doing_nothing(plan, kwargs, words):
    with pytest.raises(InvalidValueError, match=words):
        make_loader(0, 2, plan=plan, backend="arrow", **kwargs)
    with pytest.raises(InvalidValueError, match="needs CUDA" if "device" in kwargs else "pin_memory"):
        prefetch_to_device([], kwargs.get("device"), pin_memory=kwargs.get("pin_memory", False))


def test_no_options_is_no_feed():
    assert not check_feed(False, None).active
    assert check_feed(False, "cpu").device == torch.device("cpu")
    assert check_feed(False, torch.device("cpu")).active


@pytest.mark.parametrize("extra", [{}, {"shuffle": False}, {"balance": "rows", "shuffle_window": 64}])
def test_cpu_device_gives_exactly_the_batches_without_it(plan, extra):
    for rank in range(2):
        kwargs = dict(plan=plan, backend="arrow", padding_mask=True, **extra)
        plain = make_loader(rank, 2, **kwargs)
        fed = make_loader(rank, 2, device="cpu", **kwargs)
        assert len(fed) == len(plain)
        for _ in range(2):  # two epochs: the held-ahead batch of one epoch never leaks into the next
            same_batches(list(fed), list(plain))


def test_cpu_device_values_are_the_datasets(plan):
    """The delivered rows are the dataset's, column by column (pyarrow.dataset as the oracle)."""
    table = pads.dataset(plan.dataset_url.replace("file://", ""), format="parquet").to_table()
    by_id = {int(i): n for n, i in enumerate(table.column("id").to_numpy())}
    value = table.column("value").to_numpy()
    lang = table.column("lang").to_pylist()
    for batch in make_loader(1, 2, plan=plan, backend="arrow", device="cpu"):
        rows = [by_id[int(i)] for i in batch["id"]]
        np.testing.assert_array_equal(batch["value"].numpy(), value[rows])
        assert batch["lang"] == [lang[r] for r in rows]


def test_held_ahead_batch_is_not_consumed(plan):
    loader = make_loader(0, 2, plan=plan, backend="arrow", device="cpu")
    batches = iter(loader)
    for taken in range(1, 4):
        next(batches)
        assert loader.state_dict()["batches"] == taken  # the feed has read one more; it is not delivered
    loader.close()


def test_resume_contract_with_cpu_device(plan):
    check_resume_contract(lambda: make_loader(1, 2, plan=plan, backend="arrow", shuffle_window=96,
                                              padding_mask=True, device="cpu"), iter, cuts=[1, 5, -1, 0])


def test_resume_contract_dataloader_with_cpu_device(plan):
    check_resume_contract(lambda: BalancedIterableDataset(plan, 0, 2, shuffle_window=96, padding_mask=True,
                                                          backend="arrow").dataloader(num_workers=2, device="cpu"),
                          iter, cuts=[3, -1, 0])


def test_dataloader_device_cpu_is_exact_and_refuses_no_workers(plan):
    dataset = BalancedIterableDataset(plan, 1, 2, padding_mask=True, backend="arrow")
    plain = list(BalancedIterableDataset(plan, 1, 2, padding_mask=True, backend="arrow").dataloader(num_workers=2))
    same_batches(list(dataset.dataloader(num_workers=2, device="cpu")), plain)
    with pytest.raises(InvalidValueError, match="device='cpu' needs num_workers >= 1"):
        dataset.dataloader(num_workers=0, device="cpu")
    with pytest.raises(InvalidValueError, match="device='gpu9'"):
        dataset.dataloader(num_workers=2, device="gpu9")


def test_prefetch_to_device_over_a_plain_dataloader(plan):
    def loader():  # a fresh dataset each: iterated in this process, a dataset moves on to its next epoch
        return torch.utils.data.DataLoader(BalancedIterableDataset(plan, 0, 2, backend="arrow"), batch_size=None,
                                           num_workers=2)
    same_batches(list(prefetch_to_device(loader(), "cpu")), list(loader()))


def test_ahead_starts_the_next_copy_before_handing_over_and_waits_at_handover():
    """The order a CUDA copy relies on, with a recording copier: start(k+1) before batch k is handed over, and
    batch k's wait (finish) only at its handover; closing stops the source."""
    events = []

    def start(batch):
        events.append(("start", batch["i"]))

        def finish():
            events.append(("finish", batch["i"]))
            return batch
        return batch, finish

    closed = []

    def source():
        try:
            for i in range(4):
                yield {"i": i}
        finally:
            closed.append(True)

    fed = device_module._ahead(source(), start)
    got = []
    for batch in fed:
        events.append(("delivered", batch["i"]))
        got.append(batch["i"])
        if batch["i"] == 2:
            break
    fed.close()
    assert got == [0, 1, 2]
    assert events == [("start", 0), ("start", 1), ("finish", 0), ("delivered", 0), ("start", 2), ("finish", 1),
                      ("delivered", 1), ("start", 3), ("finish", 2), ("delivered", 2)]
    assert closed == [True]


def test_closing_a_fed_loader_mid_epoch_stops_it(plan):
    loader = make_loader(0, 2, plan=plan, backend="arrow", device="cpu")
    batches = iter(loader)
    next(batches)
    loader.close()
    assert loader.state_dict()["batches"] == 1
    assert len(list(loader)) == len(loader) - 1  # the next iter() continues after the delivered batch


@pytest.mark.skipif(not CUDA, reason="needs a CUDA device")
def test_cuda_device_batches_equal_the_host_ones(plan):  # pragma: no cover - runs only on a GPU machine
    host = list(make_loader(0, 2, plan=plan, backend="arrow"))
    fed = list(make_loader(0, 2, plan=plan, backend="arrow", pin_memory=True, device="cuda"))
    assert all(t.is_cuda for b in fed for t in b.values() if isinstance(t, torch.Tensor))
    same_batches([{k: v.cpu() if isinstance(v, torch.Tensor) else v for k, v in b.items()} for b in fed], host)


@pytest.mark.slow  # imports Lightning (seconds)
def test_lightning_datamodule_device_trainer_is_the_trainers_root_device(plan, tmp_path):
    pytest.importorskip("pytorch_lightning", reason="PyTorch Lightning is not installed")
    from petastorm_balanced.lightning import BalancedDataModule, pl
    data = BalancedDataModule(plan, batch_size=BATCH, backend="arrow", device="trainer")
    with pytest.raises(InvalidValueError, match="device='trainer' needs the DataModule attached to a Trainer"):
        data.train_dataloader()
    data.trainer = pl.Trainer(accelerator="cpu", devices=1, logger=False, enable_progress_bar=False,
                              enable_model_summary=False, enable_checkpointing=False, default_root_dir=tmp_path)
    loader = data.train_dataloader()
    assert loader._feed.device == data.trainer.strategy.root_device == torch.device("cpu")
    same_batches(list(loader), list(make_loader(0, 1, plan=plan, batch_size=BATCH, backend="arrow")))
