"""Hive partition folders: the ``key=value`` rule every listing, planner and reader shares (``io.dataset`` re-exports
it; ``io.tables`` checks a table's recorded partition values against it)."""
from __future__ import annotations

from typing import Dict


def partition_values(relative_path: str) -> Dict[str, str]:
    """Hive partition values from the ``key=value`` folders of a relative path."""
    return dict(part.split("=", 1) for part in relative_path.split("/")[:-1] if "=" in part)
