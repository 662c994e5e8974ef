"""core/deletes.py: a table's position deletes leave the catalog's selections, checked against a brute-force
model over random files, row groups, predicate selections and deletes."""
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from petastorm_balanced.core.catalog import Catalog, FileInfo, match_from_mask
from petastorm_balanced.core.deletes import without_rows


@st.composite
def catalogs_with_deletes(draw):
    files, masks, deleted = [], {}, {}
    for i in range(draw(st.integers(1, 4))):
        sizes = tuple(draw(st.lists(st.integers(0, 40), min_size=1, max_size=4)))
        path = f"p=x/f{i}.parquet"
        files.append(FileInfo(path, 100 + i, sizes))
        total = sum(sizes)
        masks[path] = np.array(draw(st.lists(st.booleans(), min_size=total, max_size=total)), dtype=bool)
        if total and draw(st.booleans()):
            deleted[path] = np.array(draw(st.lists(st.integers(0, total - 1), max_size=total)), dtype=np.int64)
    return files, masks, deleted


@settings(max_examples=100)
@given(catalogs_with_deletes())
def test_without_rows_keeps_exactly_the_undeleted_matching_rows(case):
    files, masks, deleted = case
    matches = []
    for f in files:
        start = 0
        for i, n in enumerate(f.row_group_rows):
            if n:
                match = match_from_mask(f.path, i, masks[f.path][start:start + n])
                if match is not None:
                    matches.append(match)
            start += n
    catalog = without_rows(Catalog(tuple(files), tuple(matches)), deleted)
    got = {(m.path, m.row_group): m.positions().tolist() for m in catalog.row_groups}
    want = {}
    for f in files:
        keep = masks[f.path].copy()
        keep[deleted.get(f.path, np.array([], np.int64))] = False
        starts = np.concatenate(([0], np.cumsum(f.row_group_rows)))
        for i in range(len(f.row_group_rows)):
            positions = np.flatnonzero(keep[starts[i]:starts[i + 1]])
            if len(positions):
                want[(f.path, i)] = positions.tolist()
    assert got == want
    assert catalog.total_rows == sum(len(v) for v in want.values())
    assert catalog.files == tuple(files)
