"""The ``_cost`` column of cost-balanced batches: each row's cost, whether the cost is a delivered int64 column
(which travels once and is named ``_cost`` too), a column read only for the cost, or a function of a column;
checked against the values ``pyarrow.dataset`` reads for the delivered ids."""
import numpy as np
import pyarrow.dataset as ds
import pytest

from petastorm_balanced import make_loader, plan_shards
from petastorm_balanced.core.cost.options import CostOptions
from petastorm_balanced.errors import InvalidValueError
from petastorm_balanced.plan.model import Fragment
from petastorm_balanced.reading.source import stream
from tests.core.test_cost import cost_plan, lengths  # noqa: F401  (module fixtures)


def _truth(path, column):
    table = ds.dataset(path, format="parquet").to_table(columns=["id", column])
    return dict(zip(table["id"].to_pylist(), table[column].to_pylist(), strict=True))


@pytest.mark.parametrize("batch_format", ["torch", "numpy"])
@pytest.mark.parametrize("shuffle", [True, False])
@pytest.mark.parametrize("fields", [None, ["id"]])
def test_cost_column_is_each_rows_cost(lengths, cost_plan, batch_format, shuffle, fields):  # noqa: F811
    """``cost="length"``: delivered (``fields=None``: one array under both names) or read only for the cost."""
    truth = _truth(lengths, "length")
    seen = 0
    for rank in range(3):
        loader = make_loader(rank, 3, plan=cost_plan, batch_size=8, epoch=1, backend="arrow", shuffle=shuffle,
                             schema_fields=fields, batch_format=batch_format)
        for batch in loader:
            ids = batch["id"].tolist()
            assert batch["_cost"].tolist() == [truth[i] for i in ids]
            assert str(batch["_cost"].dtype).endswith("int64")
            if fields is None:
                assert batch["length"].tolist() == batch["_cost"].tolist()
            else:
                assert "length" not in batch
            seen += len(ids)
    assert seen == cost_plan.total_rows // 24 * 24


def test_cost_of_a_text_column_is_its_length(lengths):  # noqa: F811
    plan = plan_shards(lengths, 2, batch_size=8, engine="local", cost="length(text)")
    truth = _truth(lengths, "text")
    for batch in make_loader(0, 2, plan=plan, batch_size=8, epoch=1, backend="arrow", schema_fields=["id", "length"]):
        assert batch["_cost"].tolist() == [len(truth[i]) for i in batch["id"].tolist()]


def test_a_cost_column_whose_type_changes_is_refused_naming_it():
    """The cost column travels once only while it is int64 as read: a reader that gives it another type part way
    through a slot is refused, naming the column, rather than delivering batches with a missing ``_cost``."""
    fragments = [Fragment("a.parquet", 0, False, 0, 0, 8, 8), Fragment("b.parquet", 0, False, 0, 0, 8, 8)]

    def chunks(todo):
        for fragment, dtype in zip(todo, (np.int32, np.int64), strict=True):
            yield [fragment], {"id": np.arange(8), "n": np.arange(1, 9, dtype=dtype)}
    cost = CostOptions("n", "n", None, "sum")
    with pytest.raises(InvalidValueError, match="'n'.*another type"):
        list(stream.slot_runs(fragments, chunks, batch_size=4, shuffle=True, shuffle_window=16, key=(0, 0, 0, 0),
                              cost=cost))
