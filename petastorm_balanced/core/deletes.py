"""Row-level deletes of a table snapshot applied to a catalog: deleted rows leave the plan's selections.

Iceberg position deletes (merge-on-read) name rows by their position in a data file; those rows are still in the
Parquet file, so the catalog's selection (the rows the plan delivers) must leave them out. Applying them to the
catalog after either engine built it, rather than inside each engine, keeps one rule and one checksum for both
(G8). Pure: positions in, catalog out.

>>> from petastorm_balanced.core.catalog import FileInfo, full_catalog
>>> catalog = full_catalog([FileInfo("a.parquet", 10, (3, 4))])
>>> kept = without_rows(catalog, {"a.parquet": np.array([0, 4])})
>>> [(m.row_group, m.positions().tolist()) for m in kept.row_groups]
[(0, [1, 2]), (1, [0, 2, 3])]
"""
from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from ..errors import InvalidValueError
from . import selection
from .catalog import Catalog, RowGroupMatch, RowGroups


def without_rows(catalog: Catalog, deleted: Mapping[str, np.ndarray]) -> Catalog:
    """``catalog`` without the rows ``deleted`` names (file path -> row positions in the file, any order).

    A row group left without a matching row leaves the catalog; files stay listed (their footers were read).
    Applied before costs are added (a cost sum over deleted rows would be wrong).
    """
    if not deleted:
        return catalog
    if catalog.cost is not None:
        raise InvalidValueError("deletes must be applied to a catalog before its costs are computed")
    starts = {f.path: np.concatenate(([0], np.cumsum(f.row_group_rows, dtype=np.int64)))
              for f in catalog.files if f.path in deleted}
    matches = []
    for match in catalog.row_groups:
        gone = deleted.get(match.path)
        if gone is None:
            matches.append(match)
            continue
        first = int(starts[match.path][match.row_group])
        positions = match.positions()
        keep = positions[~np.isin(positions + first, np.asarray(gone, dtype=np.int64))]
        if len(keep) == len(positions):
            matches.append(match)
        elif len(keep):
            matches.append(RowGroupMatch(match.path, match.row_group, match.total_rows, len(keep),
                                         selection.encode(keep, match.total_rows), match.cost_sum, match.cost_max))
    return Catalog(catalog.files, RowGroups.from_matches(matches), catalog.kind, catalog.partition_columns,
                   catalog.cost)
