"""No silent narrowing: a declared numeric type that cannot hold a stored or computed value is refused naming the
column, the value and the declared type (a Unischema's int8 over an int64 column, ``edit_fields`` int8/float16);
values that fit are delivered exactly in the declared type."""
import importlib.util
import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from petastorm_balanced import TransformSpec, make_loader, make_reader, plan_shards
from petastorm_balanced.errors import InvalidValueError
from petastorm_balanced.unischema import ScalarCodec, Unischema, UnischemaField, pickling
from petastorm_balanced.unischema.spark_types import spark_type
from petastorm_balanced.unischema.write import write_metadata

BACKENDS = ["arrow"] + (["petastorm"] if importlib.util.find_spec("petastorm") else [])


def int8_over_int64(folder, ids):
    """A Petastorm dataset whose Unischema declares int8 for a column stored as int64."""
    os.makedirs(folder)
    pq.write_table(pa.table({"id": np.asarray(ids, dtype=np.int64)}), os.path.join(folder, "part-0.parquet"))
    schema = Unischema("S", [UnischemaField("id", np.int8, (), ScalarCodec(spark_type("LongType")), False)])
    write_metadata(str(folder), pickling.dumps(schema))
    return plan_shards(str(folder), 1, engine="local", batch_size=4)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_unischema_int8_over_a_stored_399_is_refused_by_the_loader(tmp_path, backend):
    plan = int8_over_int64(tmp_path / "ds", [1, 399, -3, 5])
    with pytest.raises(InvalidValueError, match=r"column 'id' holds 399 \(int64\).*declares as int8"):
        [b["id"] for b in make_loader(0, 1, plan=plan, batch_size=4, backend=backend, shuffle=False)]


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_unischema_int8_over_a_stored_399_is_refused_by_make_reader(tmp_path, backend):
    plan = int8_over_int64(tmp_path / "ds", [1, 399, -3, 5])
    with pytest.raises(InvalidValueError, match=r"column 'id' holds 399 \(int64\).*declares as int8"):
        with make_reader(0, 1, plan=plan, backend=backend) as reader:
            [row.id for row in reader]


@pytest.mark.parametrize("backend", BACKENDS)
def test_values_that_fit_the_declared_int8_are_exact(tmp_path, backend):
    plan = int8_over_int64(tmp_path / "ds", [1, 127, -128, 5])
    got = [int(i) for b in make_loader(0, 1, plan=plan, batch_size=4, backend=backend, shuffle=False)
           for i in b["id"].tolist()]
    assert sorted(got) == [-128, 1, 5, 127]


def out_of_range(frame):
    frame["big"] = frame["id"] * 0 + 300  # int8 wraps it to 44
    frame["huge"] = frame["id"] * 0 + 70000.0  # float16 overflows it to inf
    return frame


def plain(folder):
    os.makedirs(folder)
    ids = np.arange(8, dtype=np.int64)
    pq.write_table(pa.table({"id": ids}), os.path.join(folder, "part-0.parquet"))
    return plan_shards(str(folder), 1, engine="local", batch_size=4)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("field, dtype, pattern", [
    ("big", np.int8, r"column 'big' holds 300 \(int64\).*edit_fields declares as int8.*would give 44"),
    ("huge", np.float16, r"column 'huge' holds 70000.0 \(float64\).*edit_fields declares as float16.*inf"),
])
def test_edit_fields_narrowing_that_wraps_or_overflows_is_refused(tmp_path, backend, field, dtype, pattern):
    plan = plain(tmp_path / "ds")
    spec = TransformSpec(out_of_range, edit_fields=[(field, dtype, (), False)])
    with pytest.raises(InvalidValueError, match=pattern):
        [b[field] for b in make_loader(0, 1, plan=plan, batch_size=4, backend=backend, shuffle=False,
                                       transform_spec=spec)]


def test_edit_fields_narrowing_that_fits_is_exact(tmp_path):
    plan = plain(tmp_path / "ds")
    spec = TransformSpec(lambda f: f.assign(small=f["id"] * 10), edit_fields=[("small", np.int8, (), False)])
    got = sorted(int(v) for b in make_loader(0, 1, plan=plan, batch_size=4, backend="arrow", transform_spec=spec)
                 for v in b["small"].tolist())
    assert got == [i * 10 for i in range(8)]
