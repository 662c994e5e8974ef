"""Content fingerprints recorded in a plan (``FileInfo.content``, ``io/content.py``): an object store's ETag for
every file, or on a local disk the sha256 of every byte where the user asked for it.

Taken before the footers are read: a file rewritten in between then carries the old fingerprint in the plan and
the new footer, and every reader refuses it (a fingerprint other than the planned one), where taking it after could
pair an old footer's rows with a new fingerprint and serve the new bytes.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable, Collection

from ..core.catalog import Catalog
from ..io import content
from ..io.dataset import dataset_root, list_data_files, relative_path


def with_contents(url: str, build: Callable[[], Catalog], *, table=None,
                  only: Collection[str] | None = None) -> Catalog:
    """``build()``'s catalog, each file with its content fingerprint taken before ``build`` ran (a file listed
    only since: after it), or ``build()`` alone where none is recorded (a local disk without
    ``PETASTORM_BALANCED_CONTENT_DIGEST``, see ``io/content.py``)."""
    if table is None and not content.wanted(dataset_root(url)[0]):
        return build()
    filesystem, root, entries = list_data_files(url, table=table)
    if not content.wanted(filesystem):
        return build()
    digest = content.digest_wanted()
    paths = [relative_path(e.path, root) for e in entries]
    chosen = [(p, e.path) for p, e in zip(paths, entries, strict=True) if only is None or p in only]
    found = dict(zip([p for p, _ in chosen], content.fingerprints(
        filesystem, [loc for _, loc in chosen], digest=digest, names=[f"{url}/{p}" for p, _ in chosen]), strict=True))
    catalog = build()
    late = [f.path for f in catalog.files if f.path not in found]
    found.update(zip(late, content.fingerprints(filesystem, [f"{root}/{p}" if root else p for p in late],
                                                digest=digest, names=[f"{url}/{p}" for p in late]), strict=True))
    return dataclasses.replace(catalog, files=tuple(dataclasses.replace(f, content=found[f.path])
                                                    for f in catalog.files))
