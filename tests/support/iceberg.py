"""A real Iceberg catalog (pyiceberg's SQL catalog on sqlite) in a test's folder, or a skip saying why not."""
import pyarrow as pa
import pytest


def iceberg_catalog(tmp_path):
    """A catalog with namespace ``db``; skips where pyiceberg is missing or cannot write with this pyarrow."""
    pytest.importorskip("pyiceberg", reason="Iceberg tests need pyiceberg (pip install "
                        "'petastorm-balanced[iceberg]')")
    if tuple(int(v) for v in pa.__version__.split(".")[:2]) < (17, 0):
        pytest.skip(f"pyiceberg writes Parquet with options pyarrow {pa.__version__} lacks (needs pyarrow >= 17; the "
                    "modern stack runs these tests)")
    from pyiceberg.catalog.sql import SqlCatalog
    warehouse = tmp_path / "warehouse"
    warehouse.mkdir()
    catalog = SqlCatalog("test", uri=f"sqlite:///{warehouse}/catalog.db", warehouse=f"file://{warehouse}")
    catalog.create_namespace("db")
    return catalog
