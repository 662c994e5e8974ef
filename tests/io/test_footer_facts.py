"""What the loader's setup works out from parsed footers (``io/footer.FOOTER_FACTS``): kept with the footer object,
so a second loader over the same files reads the same answers, and a rewritten file gets its own."""
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from hypothesis import given, settings
from hypothesis import strategies as st

from petastorm_balanced.io import stats
from petastorm_balanced.io.footer import FOOTER_FACTS


def _reference_ranges(metas):
    """The ranges read plainly, row group by row group across files: a column leaves the answer at the first
    non-empty row group without a numeric min and max."""
    out, skip = {}, set()
    for meta in metas:
        for i in range(meta.num_row_groups):
            group = meta.row_group(i)
            if group.num_rows == 0:
                continue
            for j in range(meta.num_columns):
                column = group.column(j)
                name, s = column.path_in_schema, column.statistics
                if name in skip:
                    continue
                if column.physical_type not in stats.NUMERIC or s is None or not s.has_min_max:
                    skip.add(name)
                    out.pop(name, None)
                    continue
                for values, value in zip(out.setdefault(name, ([], [], [])), (s.min, s.max, group.num_rows),
                                         strict=True):
                    values.append(value)
    return out


@settings(max_examples=25, deadline=None)
@given(groups=st.lists(st.lists(st.one_of(st.none(), st.integers(-2**40, 2**40)), min_size=0, max_size=6),
                       min_size=1, max_size=5),
       files=st.integers(1, 3))
def test_value_ranges_read_from_kept_facts_equal_a_fresh_reading(tmp_path_factory, groups, files):
    """Row groups with nulls, empty ones and columns whose statistics give no range in some file: the ranges, read
    first and again from the facts kept with each footer, equal a plain reading across files."""
    root = tmp_path_factory.mktemp("ranges")
    metas = []
    for f in range(files):
        tables = [pa.table({"x": pa.array(g, pa.int64()), "s": pa.array([str(v) for v in g], pa.string())})
                  for g in groups]
        path = root / f"part-{f}.parquet"
        with pq.ParquetWriter(path, tables[0].schema) as writer:
            for table in tables[f:] + tables[:f]:  # each file its own order of row groups
                writer.write_table(table)
        metas.append(pq.read_metadata(path))
    expected = _reference_ranges(metas)
    for _ in range(2):  # worked out, then read from the facts kept with each footer
        got = stats.value_ranges(metas)
        assert list(got) == list(expected)
        for name, arrays in got.items():
            for array, values in zip(arrays, expected[name], strict=True):
                assert array.tolist() == values
    assert all("ranges" in FOOTER_FACTS.get(meta) for meta in metas)


def test_a_rewritten_file_is_judged_by_its_own_statistics(tmp_path):
    """The same path rewritten sorted after random: the second footer's ranges are its own, not the first's."""
    path = tmp_path / "part-0.parquet"
    rng = np.random.default_rng(3)
    values = rng.permutation(4000)
    pq.write_table(pa.table({"x": values}), path, row_group_size=500)
    before = stats.value_ranges([pq.read_metadata(path)])["x"]
    pq.write_table(pa.table({"x": np.sort(values)}), path, row_group_size=500)
    after = stats.value_ranges([pq.read_metadata(path)])["x"]
    assert (before[1] - before[0]).min() > 3000 and (after[1] - after[0]).max() < 500


@settings(max_examples=25, deadline=None)
@given(rows=st.lists(st.tuples(st.integers(0, 9), st.text(max_size=6), st.lists(st.integers(0, 99), max_size=4)),
                     min_size=1, max_size=60), group=st.integers(1, 20), files=st.integers(1, 3),
       wanted=st.sets(st.sampled_from(["n", "s", "l", "st"]), min_size=1))
def test_row_bytes_sums_the_variable_columns_chunks(tmp_path_factory, rows, group, files, wanted):
    """Decoded bytes per row: fixed widths plus the uncompressed Parquet bytes per row of the other columns (nested
    ones by their top-level name), read plainly chunk by chunk as the reference."""
    folder = tmp_path_factory.mktemp("rb")
    table = pa.table({"n": [r[0] for r in rows], "s": [r[1] for r in rows], "l": [r[2] for r in rows],
                      "st": [{"a": r[0], "b": r[1]} for r in rows]})
    metas = []
    for f in range(files):
        pq.write_table(table, folder / f"{f}.parquet", row_group_size=group)
        metas.append(pq.ParquetFile(folder / f"{f}.parquet").metadata)
    schema = pa.schema([table.schema.field(name) for name in sorted(wanted)])
    fixed = sum(stats.fixed_width(field.type) or 0.0 for field in schema)
    variable = {field.name for field in schema if stats.fixed_width(field.type) is None}
    size = sum(meta.row_group(i).column(j).total_uncompressed_size for meta in metas
               for i in range(meta.num_row_groups) for j in range(meta.num_columns)
               if meta.row_group(i).column(j).path_in_schema.split(".")[0] in variable)
    want = fixed + (size / (len(rows) * files) if variable else 0.0)
    assert stats.row_bytes(schema, metas) == want
