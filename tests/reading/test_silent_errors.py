"""Errors that say what happened and what to do: TransformSpec mistakes are named as the func's, with the fix,
instead of pyarrow's ArrowInvalid, a KeyError: 0, a blame on the files' statistics or a column named ''; a
declared nullable Int64 with pd.NA is served with its validity mask."""
import os

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from petastorm_balanced import TransformSpec, make_loader, plan_shards
from petastorm_balanced.errors import InvalidValueError


@pytest.fixture()
def plan(tmp_path):
    os.makedirs(tmp_path / "ds")
    pq.write_table(pa.table({"id": np.arange(8), "x": np.arange(8) * 1.0}), tmp_path / "ds" / "p.parquet")
    return plan_shards(str(tmp_path / "ds"), 1, engine="local", batch_size=4)


def batches(plan, spec):
    return list(make_loader(0, 1, plan=plan, batch_size=4, backend="arrow", workers_count=1, shuffle=False,
                            transform_spec=spec))


def as_text(frame):
    frame["id"] = "n" + frame["id"].astype(str)  # not numbers any more
    return frame


def duplicated(frame):
    return pd.concat([frame, frame[["id"]]], axis=1)


def with_a_null(frame):
    frame["x"] = frame["x"].where(frame["id"] != 2, None)
    return frame


@pytest.mark.parametrize("spec, pattern", [
    (TransformSpec(as_text), r"func changed column 'id' to \w+ values that are not its stored int64.*"
                             r"declare the new type in edit_fields"),
    (TransformSpec(duplicated), r"func returned column 'id' more than once"),
    (TransformSpec(with_a_null), r"func put a null into column 'x', which is not nullable as read.*nullable=True"),
    (TransformSpec(lambda f: f, selected_fields=["id", "id"]), r"selected_fields names 'id' more than once"),
], ids=["undeclared dtype change", "duplicate column", "null added by func", "selected twice"])
def test_transform_mistakes_are_named_with_their_fix(plan, spec, pattern):
    with pytest.raises(InvalidValueError, match=pattern):
        batches(plan, spec)


def with_pd_na(frame):
    frame["n"] = pd.array([pd.NA if i == 1 else i for i in frame["id"]], dtype="Int64")
    return frame


def test_pd_na_in_a_declared_nullable_int64_is_a_masked_null(plan):
    got = batches(plan, TransformSpec(with_pd_na, edit_fields=[("n", np.int64, (), True)]))
    assert got[0]["n__valid"].tolist() == [True, False, True, True]
    assert got[0]["n"].tolist()[2:] == [2, 3]


def test_a_read_only_cache_folder_is_named_with_the_fix_before_any_work():
    from petastorm_balanced.io.cache_dir import Cache
    if os.access("/sys/fs", os.W_OK) and not os.path.ismount("/sys"):
        pytest.skip("no read-only filesystem to point at here")
    calls = []
    with pytest.raises(InvalidValueError, match=r"cache folder file:///sys/fs/pb-cache cannot be written here.*"
                                                r"point parent_cache_dir_url"):
        Cache.at("file:///sys/fs/pb-cache").write_once("df-abc", calls.append)
    assert calls == []  # refused before the DataFrame was written


def test_a_full_disk_while_writing_is_named_with_the_fix(tmp_path):
    from petastorm_balanced.io.cache_dir import Cache

    class JavaError(Exception):  # what Spark raises: a Py4J error carrying the JVM's IOException text
        pass

    def write(url):
        os.makedirs(url[len("file://"):])
        raise JavaError("An error occurred while calling o123.parquet.\n: java.io.IOException: No space left on "
                        "device\n\tat java.base/java.io.FileOutputStream.writeBytes(Native Method)")
    cache = Cache.at(str(tmp_path / "cache"))
    with pytest.raises(InvalidValueError, match=r"ran out of space.*partial copy was removed.*free space"):
        cache.write_once("df-abc", write)
    assert os.listdir(tmp_path / "cache") == []


def test_a_lambda_with_spawned_dataloader_workers_is_refused_when_the_loader_is_made(plan):
    from petastorm_balanced import BalancedIterableDataset
    dataset = BalancedIterableDataset(plan, 0, 1, batch_size=4, transform_spec=TransformSpec(lambda f: f))
    with pytest.raises(InvalidValueError, match=r"transform_spec.func=<function .*<lambda>.* cannot be pickled.*"
                                                r"'spawn'.*define func at module level"):
        dataset.dataloader(num_workers=1, multiprocessing_context="spawn")
