"""Delta tables compared row by row: deltalake's own read of a table against what the loader delivers."""
import numpy as np
import pyarrow as pa

from petastorm_balanced import make_loader


def delta_rows(path, columns, version=None):
    """deltalake's own read, ``{id: {column: value}}`` (DataFusion where pyarrow is too old for
    ``to_pyarrow_table``; its string views cast to dictionaries, which pyarrow 14 imports, then decoded)."""
    import deltalake
    table = deltalake.DeltaTable(str(path), version=version)
    try:
        read = table.to_pyarrow_table()
    except TypeError:  # pyarrow < 16
        kinds = {f.name: str(getattr(f.type, "type", f.type)) for f in table.schema().fields}
        select = ", ".join(f"arrow_cast({c}, 'Dictionary(Int32, Utf8)') as {c}" if kinds[c] == "string" else c
                           for c in kinds)
        reader = deltalake.QueryBuilder().register("t", table).execute(f"select {select} from t")
        read = pa.RecordBatchReader._import_from_c_capsule(reader.__arrow_c_stream__()).read_all()
        read = read.cast(pa.schema([f.with_type(f.type.value_type) if pa.types.is_dictionary(f.type) else f
                                    for f in read.schema]))
    return {r["id"]: {c: r[c] for c in columns} for r in read.to_pylist()}, read.schema


def delivered_rows(plan, columns, schema, world=2):
    """What the loader delivers, ``{id: {column: value}}``, each column's values brought to the Arrow type
    deltalake reads it as (a timestamp tensor holds microseconds, a date tensor days), nulls from the masks."""
    out = {}
    for rank in range(world):
        for batch in make_loader(rank, world, plan=plan, batch_size=3, workers_count=1, shuffle=False,
                                 batch_format="numpy", padding_mask=True):
            keep = ~np.asarray(batch["_padding"], dtype=bool)
            ids = np.asarray(batch["id"])[keep].tolist()
            values = {}
            for c in columns:
                raw = batch[c]
                valid = batch.get(c + "__valid")
                wanted = schema.field(c).type
                if isinstance(raw, list):
                    array = pa.array([v for v, k in zip(raw, keep, strict=True) if k], type=wanted)
                else:
                    mask = None if valid is None else ~np.asarray(valid, dtype=bool)[keep]
                    if mask is None and pa.types.is_floating(wanted):
                        mask = np.isnan(np.asarray(raw)[keep])  # a float column's nulls are NaN (no NaN in ROWS)
                    array = pa.array(np.asarray(raw)[keep], mask=mask)
                    if pa.types.is_date32(wanted):
                        array = array.cast(pa.int32())  # days
                    array = array.cast(wanted)
                values[c] = array.to_pylist()
            for n, i in enumerate(ids):
                assert i not in out, f"id {i} delivered twice"
                out[i] = {c: values[c][n] for c in columns}
    return out


def same(a, b):
    return a == b or (isinstance(a, float) and isinstance(b, float) and a != a and b != b)
