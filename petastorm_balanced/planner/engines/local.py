"""In-process planning: footers and Petastorm predicates evaluated in threads of this process.

The engine for datasets that fit one machine's patience, and the reference the Spark engine must agree with (G8).
"""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

from ...core.catalog import Catalog, RowGroups, full_catalog, match_from_mask
from ...io import fs as fsutil
from ...io.dataset import dataset_root
from ...io.tables import partition_types
from ...unischema.storage import load_unischema
from ..filters import check_fields, row_group_mask
from ..scan import scan


def build_catalog(url: str, *, predicate=None, threads: int = 8, progress=None, table=None,
                  only=None) -> Catalog:
    """The catalog of ``url``; with ``only`` (relative paths, a plan update's added files) of those files alone,
    evaluated as in a catalog of the whole dataset (partition columns and types from every listed file)."""
    listing = scan(url, progress=progress, table=table, only=only)
    if predicate is None:
        return full_catalog(listing.files, listing.kind, listing.partition_columns)
    stored = [] if listing.schema is None else list(listing.schema.names)  # None: no file to read a schema from
    fields = check_fields(predicate, stored + list(listing.partition_columns), url)
    unischema = load_unischema(url) if listing.kind == "petastorm" else None
    filesystem, root = dataset_root(url)
    types = partition_types(table, listing.paths)  # one type per hive column for the whole dataset

    def evaluate(file):
        with filesystem.open_input_file(fsutil.join(root, file.path)) as handle:
            return [match_from_mask(file.path, i, row_group_mask(handle, file.path, i, predicate, fields,
                                                                 unischema=unischema, partition_types=types))
                    for i, n in enumerate(file.row_group_rows) if n > 0]

    with ThreadPoolExecutor(max(1, threads)) as pool:
        matches = [m for per_file in pool.map(evaluate, listing.files) for m in per_file if m is not None]
    return Catalog(listing.files, RowGroups.from_matches(matches), listing.kind, listing.partition_columns)
