"""TransformSpec on make_loader, BalancedIterableDataset and make_reader, on both backends.

Every delivered value is compared with the same function applied to ``pyarrow.dataset``'s rows (decoded with the
Unischema's codecs for a Petastorm dataset), looked up by ``id``; the transform must not move a row (same ids in
the same order as without it), and a function that changes the row count or order is refused at that batch with
the rule. On the petastorm stack Petastorm's own ``make_batch_reader`` with the same ``TransformSpec`` is the oracle.
"""
import multiprocessing

import numpy as np
import pyarrow.dataset as pads
import pytest
import torch

from petastorm_balanced import BalancedIterableDataset, TransformSpec, datagen, make_loader, make_reader, plan_shards
from tests.support.stacks import HAVE_PETASTORM, petastorm_only
from tests.support.transform_funcs import scaled

BACKENDS = ["arrow", pytest.param("petastorm", marks=petastorm_only)]
BATCH = 16


SCALED = dict(edit_fields=[("score", np.float32, (), False), ("label", np.int64, (), False)],
              removed_fields=["text"])


def expected_scaled(path):
    frame = pads.dataset(str(path), format="parquet").to_table().to_pandas()
    return scaled(frame).set_index("id")


def image_features(frame):
    """On a Unischema dataset: decoded cells (numpy arrays) in, other arrays out."""
    frame["image"] = [(im.astype(np.float32) / 255.0).reshape(64) for im in frame["image"]]
    frame["vec_sum"] = [float(v.sum()) for v in frame["vec"]]
    return frame


IMAGE = dict(edit_fields=[("image", np.float32, (64,), False), ("vec_sum", np.float64, (), False)],
             selected_fields=["vec_sum", "id", "image"])


def expected_images(path):
    schema = datagen.make_unischema()
    frame = pads.dataset(str(path), format="parquet").to_table().to_pandas()
    for name in ("image", "vec"):
        frame[name] = [schema.fields[name].codec.decode(schema.fields[name], cell) for cell in frame[name]]
    return image_features(frame).set_index("id")


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    return datagen.make_plain_dataset(tmp_path_factory.mktemp("plain") / "ds", num_files=3, total_rows=1500, seed=4,
                                      max_row_group_rows=300)


@pytest.fixture(scope="module")
def unischema_dataset(tmp_path_factory):
    return datagen.make_petastorm_dataset(tmp_path_factory.mktemp("uni") / "ds", num_files=2, total_rows=400, seed=5)


def ids_of(batches):
    return np.concatenate([b["id"].numpy() for b in batches])


@pytest.mark.stack
@pytest.mark.parametrize("backend", BACKENDS)
def test_loader_values_are_func_applied_to_the_rows_and_rows_do_not_move(small, backend):
    plan = plan_shards(small.url, 2, batch_size=BATCH, engine="local")
    loader = make_loader(1, 2, plan=plan, backend=backend, workers_count=2, transform_spec=TransformSpec(scaled,
                                                                                                         **SCALED))
    schema = loader.schema
    assert schema.names == ("id", "lang", "value", "score", "label")
    assert (schema["score"].dtype, schema["label"].dtype) == ("float32", "int64")
    batches = list(loader)
    assert len(batches) == len(make_loader(1, 2, plan=plan, backend=backend)) == plan.steps_per_epoch(2)
    plain = list(make_loader(1, 2, plan=plan, backend=backend))
    assert np.array_equal(ids_of(batches), ids_of(plain))  # same rows, same order, same shuffle
    expected = expected_scaled(small.path)
    for batch in batches:
        schema.check(batch)
        rows = expected.loc[batch["id"].numpy()]
        assert np.array_equal(batch["score"].numpy(), rows["score"].to_numpy(np.float32))
        assert np.array_equal(batch["label"].numpy(), rows["label"].to_numpy())
        assert np.array_equal(batch["value"].numpy(), rows["value"].to_numpy())
        assert batch["lang"] == rows["lang"].tolist()


@pytest.mark.stack
@pytest.mark.parametrize("backend", BACKENDS)
def test_unischema_cells_reach_func_decoded_and_edit_fields_shape_the_tensors(unischema_dataset, backend):
    plan = plan_shards(unischema_dataset.url, 2, batch_size=BATCH, engine="local")
    loader = make_loader(0, 2, plan=plan, backend=backend, transform_spec=TransformSpec(image_features, **IMAGE))
    assert loader.schema.names == ("vec_sum", "id", "image")
    assert (loader.schema["image"].dtype, loader.schema["image"].shape) == ("float32", (64,))
    expected = expected_images(unischema_dataset.path)
    batches = list(loader)
    assert len(batches) == plan.steps_per_epoch(2)
    for batch in batches:
        assert tuple(batch) == ("vec_sum", "id", "image") and batch["image"].shape == (BATCH, 64)
        rows = expected.loc[batch["id"].numpy()]
        assert np.array_equal(batch["image"].numpy(), np.stack(rows["image"].to_list()))
        assert np.array_equal(batch["vec_sum"].numpy(), rows["vec_sum"].to_numpy())


def shrink(frame):
    return frame.iloc[: len(frame) // 2]


def reverse(frame):
    return frame.iloc[::-1]


@pytest.mark.stack
@pytest.mark.parametrize("backend", BACKENDS)
def test_a_func_that_changes_the_row_count_or_order_is_refused_at_the_batch(small, backend):
    plan = plan_shards(small.url, 2, batch_size=BATCH, engine="local")
    with pytest.raises(ValueError, match=r"returned \d+ rows for \d+: transform_spec.func must return the same "
                                         r"rows, in the same order"):
        next(iter(make_loader(0, 2, plan=plan, backend=backend, transform_spec=TransformSpec(shrink))))
    with pytest.raises(ValueError, match=r"in another order .*transform_spec.func must return the same rows"):
        next(iter(make_loader(0, 2, plan=plan, backend=backend, transform_spec=TransformSpec(reverse))))


@pytest.mark.stack
def test_removed_fields_and_declared_schema_are_checked(small):
    plan = plan_shards(small.url, 2, batch_size=BATCH, engine="local")
    loader = make_loader(0, 2, plan=plan, backend="arrow", transform_spec=TransformSpec(removed_fields=["lang",
                                                                                                        "text"]))
    batch = next(iter(loader))
    assert tuple(batch) == loader.schema.names == ("id", "value", "label")
    with pytest.raises(ValueError, match="removed_fields names 'nope'"):
        make_loader(0, 2, plan=plan, backend="arrow", transform_spec=TransformSpec(removed_fields=["nope"]))
    with pytest.raises(ValueError, match="returned no column 'extra'"):
        next(iter(make_loader(0, 2, plan=plan, backend="arrow", transform_spec=TransformSpec(
            edit_fields=[("extra", np.float32, (), False)]))))
    with pytest.raises(TypeError, match=r"transform_spec=1 must be a petastorm_balanced.TransformSpec"):
        make_loader(0, 2, plan=plan, transform_spec=1)
    with pytest.raises(ValueError, match="removed_fields or selected_fields, not both"):
        TransformSpec(removed_fields=["id"], selected_fields=["id"])
    wrong_shape = TransformSpec(scaled, edit_fields=[("score", np.float32, (2,), False)])
    with pytest.raises(ValueError, match=r"column 'score' row 0 is \(\), not the declared shape \(2,\)"):
        next(iter(make_loader(0, 2, plan=plan, backend="arrow", transform_spec=wrong_shape)))


def test_a_cost_balanced_loader_refuses_a_transform_rows_balanced_takes_it(small):
    plan = plan_shards(small.url, 2, batch_size=BATCH, engine="local", cost="label")
    spec = TransformSpec(scaled, **SCALED)
    with pytest.raises(ValueError, match="transform_spec with a cost plan balanced by cost.*balance='rows'"):
        make_loader(0, 2, plan=plan, backend="arrow", transform_spec=spec)
    assert len(list(make_loader(0, 2, plan=plan, backend="arrow", balance="rows", transform_spec=spec))) == \
        plan.steps_per_epoch(2)


def test_resume_state_is_unaffected(small):
    plan = plan_shards(small.url, 2, batch_size=BATCH, engine="local")
    spec = TransformSpec(scaled, **SCALED)
    whole = list(make_loader(0, 2, plan=plan, backend="arrow", shuffle_window=64, transform_spec=spec))
    loader = make_loader(0, 2, plan=plan, backend="arrow", shuffle_window=64, transform_spec=spec)
    head = [b for _, b in zip(range(5), loader, strict=False)]
    state = loader.state_dict()
    assert state == make_loader(0, 2, plan=plan, backend="arrow", shuffle_window=64).state_dict() | {"batches": 5}
    resumed = make_loader(0, 2, plan=plan, backend="arrow", shuffle_window=64, transform_spec=spec)
    resumed.load_state_dict(state)
    rest = list(resumed)
    assert len(head) + len(rest) == len(whole)
    for got, want in zip(head + rest, whole, strict=True):
        assert all(torch.equal(got[k], want[k]) if isinstance(want[k], torch.Tensor) else got[k] == want[k]
                   for k in want)


@pytest.mark.stack
@pytest.mark.parametrize("backend", BACKENDS)
def test_iterable_dataset_in_process_gives_the_loaders_transformed_batches(small, backend):
    plan = plan_shards(small.url, 2, batch_size=BATCH, engine="local")
    spec = TransformSpec(scaled, **SCALED)
    dataset = BalancedIterableDataset(plan, 1, 2, backend=backend, shuffle_window=64, transform_spec=spec)
    assert dataset.schema == make_loader(1, 2, plan=plan, backend=backend, transform_spec=spec).schema
    batches = list(dataset)
    loader = list(make_loader(1, 2, plan=plan, backend=backend, shuffle_window=64, transform_spec=spec))
    assert len(batches) == len(loader) == plan.steps_per_epoch(2)
    for got, want in zip(batches, loader, strict=True):
        assert all(torch.equal(got[k], want[k]) if isinstance(want[k], torch.Tensor) else got[k] == want[k]
                   for k in want)


@pytest.mark.slow  # spawned workers import torch (about 20 s on 2 cores)
@pytest.mark.stack
def test_spawned_dataloader_workers_run_the_pickled_func(small):
    plan = plan_shards(small.url, 2, batch_size=BATCH, engine="local")
    spec = TransformSpec(scaled, **SCALED)
    dataset = BalancedIterableDataset(plan, 0, 2, backend="arrow", shuffle_window=64, transform_spec=spec)
    loader = dataset.dataloader(num_workers=2, multiprocessing_context=multiprocessing.get_context("spawn"))
    batches = list(loader)
    assert len(batches) == plan.steps_per_epoch(2)
    expected = expected_scaled(small.path)
    for batch in batches:
        rows = expected.loc[batch["id"].numpy()]
        assert np.array_equal(batch["score"].numpy(), rows["score"].to_numpy(np.float32))
        assert "text" not in batch
    plain = BalancedIterableDataset(plan, 0, 2, backend="arrow", shuffle_window=64).dataloader(num_workers=2)
    assert np.array_equal(ids_of(batches), ids_of(plain))  # the same slots, rows and order


@pytest.mark.slow  # Petastorm's worker processes start fresh interpreters (about 10 s)
@petastorm_only
def test_petastorms_process_pool_runs_the_func_in_its_workers(small):
    plan = plan_shards(small.url, 2, batch_size=BATCH, engine="local")
    spec = TransformSpec(scaled, **SCALED)
    batches = list(make_loader(0, 2, plan=plan, backend="petastorm", reader_pool_type="process", workers_count=2,
                               transform_spec=spec))
    threads = list(make_loader(0, 2, plan=plan, backend="petastorm", transform_spec=spec))
    assert len(batches) == len(threads) == plan.steps_per_epoch(2)
    for got, want in zip(batches, threads, strict=True):
        assert all(torch.equal(got[k], want[k]) if isinstance(want[k], torch.Tensor) else got[k] == want[k]
                   for k in want)
    with pytest.raises(ValueError, match=r"cannot be pickled .*reader_pool_type='process'"):
        next(iter(make_loader(0, 2, plan=plan, backend="petastorm", reader_pool_type="process",
                              transform_spec=TransformSpec(lambda frame: frame))))


@pytest.mark.stack
@pytest.mark.parametrize("backend", BACKENDS)
def test_make_reader_follows_petastorms_readers(small, unischema_dataset, backend):
    """Plain Parquet: ``func`` on each fragment's DataFrame (make_batch_reader); a Unischema dataset: on each
    decoded row's dict (make_reader). Same rows as without the transform; count changes refused."""
    plan = plan_shards(small.url, 2, batch_size=BATCH, engine="local")
    spec = TransformSpec(scaled, **SCALED)
    with make_reader(0, 2, plan=plan, backend=backend, transform_spec=spec) as reader:
        assert sorted(reader.schema.fields) == ["id", "label", "lang", "score", "value"]
        batches = list(reader)
    expected = expected_scaled(small.path)
    ids = np.concatenate([b.id for b in batches])
    with make_reader(0, 2, plan=plan, backend=backend) as reader:
        assert np.array_equal(ids, np.concatenate([b.id for b in reader]))
    for batch in batches:
        assert np.array_equal(batch.score, expected.loc[batch.id, "score"].to_numpy())
        assert np.array_equal(batch.label, expected.loc[batch.id, "label"].to_numpy())
    with pytest.raises(ValueError, match="transform_spec.func must return the same rows"):
        with make_reader(0, 2, plan=plan, backend=backend, transform_spec=TransformSpec(shrink)) as reader:
            list(reader)

    uni = plan_shards(unischema_dataset.url, 2, batch_size=BATCH, engine="local")

    def per_row(row):
        row["image"] = row["image"].astype(np.float32).reshape(64)
        return row
    row_spec = TransformSpec(per_row, edit_fields=[("image", np.float32, (64,), False)], removed_fields=["vec"])
    # one worker: Petastorm's NdarrayCodec decodes with np.load, whose ast parsing fails now and then in concurrent
    # threads on CPython <= 3.11.7 ("AST constructor recursion depth mismatch", cpython gh-106905)
    with make_reader(0, 2, plan=uni, backend=backend, workers_count=1, transform_spec=row_spec) as reader:
        rows = list(reader)
    with make_reader(0, 2, plan=uni, backend=backend, workers_count=1) as reader:
        raw = list(reader)
    assert [r.id for r in rows] == [r.id for r in raw]
    assert all(np.array_equal(r.image, w.image.astype(np.float32).reshape(64)) for r, w in zip(rows, raw,
                                                                                                strict=True))
    assert "vec" not in rows[0]._fields


@pytest.mark.skipif(not HAVE_PETASTORM, reason="Petastorm's make_batch_reader is the oracle (petastorm stack)")
def test_petastorms_make_batch_reader_with_the_same_spec_gives_the_same_values(small):
    from petastorm import make_batch_reader
    from petastorm.transform import TransformSpec as PetastormSpec
    spec = PetastormSpec(scaled, edit_fields=SCALED["edit_fields"], removed_fields=SCALED["removed_fields"])
    oracle = {}
    with make_batch_reader(small.url, transform_spec=spec, shuffle_row_groups=False, num_epochs=1) as reader:
        for batch in reader:
            for i, row_id in enumerate(batch.id):
                oracle[int(row_id)] = (batch.score[i], batch.label[i], batch.value[i])
    plan = plan_shards(small.url, 1, batch_size=BATCH, engine="local")
    seen = 0
    for backend in ("arrow", "petastorm"):
        for batch in make_loader(0, 1, plan=plan, backend=backend, transform_spec=spec):  # Petastorm's class
            for i, row_id in enumerate(batch["id"].tolist()):
                score, label, value = oracle[row_id]
                assert (batch["score"][i].item(), batch["label"][i].item(), batch["value"][i].item()) == \
                    (np.float32(score), label, value)
                seen += 1
    assert seen == 2 * plan.steps_per_epoch(1) * BATCH
