"""Small, deliberately *skewed* Parquet / Petastorm datasets for tests, examples and benchmarks.

Balancing logic is only interesting when the input is unbalanced: real Spark outputs have files of very
different sizes, row groups of very different sizes inside a file, and column value mixes that differ per
file (so a predicate removes a different fraction of each file).  These generators reproduce exactly that,
deterministically from a seed, without starting a SparkSession (which costs seconds per test run): the
files are written with pyarrow, one ``write_table`` call per row group so that row group sizes are exactly
the planned ones rather than whatever the writer's byte-size heuristics choose.
"""
import argparse
import json
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from ..errors import InvalidValueError
from ..unischema.pickling import dumps
from ..unischema.storage import ROW_GROUPS_PER_FILE_KEY, UNISCHEMA_KEY

if TYPE_CHECKING:
    from ..unischema.schema import Unischema

__all__ = ["DatasetInfo", "make_plain_dataset", "make_petastorm_dataset", "main"]

#: Non-'en' languages; 'en' is the one whose share varies per file, so `lang == 'en'` shifts the balance.
OTHER_LANGS = np.array(["de", "fr", "es", "ja"])


@dataclass(frozen=True)
class DatasetInfo:
    """What was written, so tests can compare a reader's output against ground truth without re-reading footers.

    ``files`` and ``row_groups`` use paths relative to ``path`` (POSIX separators), sorted, because that is
    the order petastorm itself sorts pieces in.  ``row_groups`` lists ``(file, index, num_rows)``; files
    with zero rows have no entry there but are listed in ``files``.
    """
    url: str
    path: str
    num_rows: int
    files: tuple[str, ...]
    row_groups: tuple[tuple[str, int, int], ...]
    kind: str
    partition_columns: tuple[str, ...] = ()

    @property
    def num_row_groups(self) -> int:
        return len(self.row_groups)


def _apportion(total: int, weights: np.ndarray) -> np.ndarray:
    """Split ``total`` into integer parts proportional to ``weights`` that sum exactly to ``total``
    (largest remainder), because the ids must cover 0..total-1 with no gap."""
    share = weights / weights.sum() * total
    parts = np.floor(share).astype(np.int64)
    leftover = int(total - parts.sum())
    order = np.argsort(-(share - parts), kind="stable")
    parts[order[:leftover]] += 1
    return parts


def _plan(rng, num_files, total_rows, empty_files, min_rg, max_rg):
    """Draw the per-file row counts and per-file row group sizes.

    File sizes are lognormal (a few big files, many small ones).  Row group sizes are log-uniform in
    ``[min_rg, max_rg]`` so a file mixes tiny and large groups; about one file in five is written as a
    single row group regardless of its size, which is the hardest case for row-group-level balancing.
    """
    n_data = num_files - empty_files
    if num_files < 1 or empty_files < 0 or n_data < 1:
        raise InvalidValueError("need num_files >= 1 and at least one non-empty file")
    if total_rows < n_data:
        raise InvalidValueError("total_rows must be >= the number of non-empty files")
    if not 1 <= min_rg <= max_rg:
        raise InvalidValueError("need 1 <= min_row_group_rows <= max_row_group_rows")
    counts = np.zeros(num_files, dtype=np.int64)
    slots = np.sort(rng.choice(num_files, size=n_data, replace=False))
    counts[slots] = 1 + _apportion(total_rows - n_data, rng.lognormal(0.0, 1.0, size=n_data))
    plans = []
    for n in counts.tolist():
        single = rng.random() < 0.2
        sizes = []
        remaining = n
        while remaining > 0:
            s = remaining if single else int(np.exp(rng.uniform(np.log(min_rg), np.log(max_rg + 1))))
            s = max(1, min(s, remaining))
            sizes.append(s)
            remaining -= s
        plans.append(sizes)
    return counts, plans


def _relpaths(num_files: int, hive: bool):
    """Spark-like names; with ``hive`` files are spread round-robin over ``year=...`` folders so every
    partition gets files of different sizes."""
    names = [f"part-{i:05d}.parquet" for i in range(num_files)]
    if hive:
        names = [f"year={2020 + i % min(3, num_files)}/{n}" for i, n in enumerate(names)]
    return names


def _base_columns(rng, i, num_files, start, n):
    """Columns shared by both kinds.  Ids are a contiguous range per file, shuffled inside the file, so a
    reader that duplicates or drops a row group is caught by a simple set comparison."""
    p_en = 0.05 + 0.9 * (i / (num_files - 1) if num_files > 1 else 0.5)
    ids = start + rng.permutation(n).astype(np.int64)
    lang = np.where(rng.random(n) < p_en, "en", OTHER_LANGS[rng.integers(0, len(OTHER_LANGS), n)])
    return ids, lang


def _write(path, kind, num_files, total_rows, seed, hive, empty_files, min_rg, max_rg, compression, make_table,
           schema):
    """Shared skeleton: plan layout, write every file row group by row group, return the ground truth."""
    path = os.path.abspath(os.fspath(path))
    if os.path.isdir(path) and os.listdir(path):
        # Leftover files from another layout would silently become part of the dataset.
        raise FileExistsError(f"output directory is not empty: {path}")
    os.makedirs(path, exist_ok=True)
    rng = np.random.default_rng(seed)
    counts, plans = _plan(rng, num_files, total_rows, empty_files, min_rg, max_rg)
    relpaths = _relpaths(num_files, hive)
    row_groups, start = [], 0
    for i, (rel, n, sizes) in enumerate(zip(relpaths, counts.tolist(), plans, strict=True)):
        table = make_table(rng, i, start, n)
        full = os.path.join(path, *rel.split("/"))
        os.makedirs(os.path.dirname(full), exist_ok=True)
        with pq.ParquetWriter(full, schema, compression=compression) as writer:
            offset = 0
            for rg, size in enumerate(sizes):
                writer.write_table(table.slice(offset, size), row_group_size=size)
                row_groups.append((rel, rg, size))
                offset += size
        start += n
    open(os.path.join(path, "_SUCCESS"), "wb").close()
    return DatasetInfo(url="file://" + path, path=path, num_rows=int(total_rows), files=tuple(sorted(relpaths)),
                       row_groups=tuple(sorted(row_groups)), kind=kind,
                       partition_columns=("year",) if hive else ())


PLAIN_SCHEMA = pa.schema([("id", pa.int64()), ("lang", pa.string()), ("value", pa.float64()),
                          ("label", pa.int32()), ("text", pa.string())])


def make_plain_dataset(path: str | os.PathLike[str], *, num_files: int = 8, total_rows: int = 20_000, seed: int = 0,
                       hive: bool = False, min_row_group_rows: int = 32, max_row_group_rows: int = 4096,
                       compression: str = "snappy", empty_files: int = 0) -> DatasetInfo:
    """Write a plain (non-Petastorm) Parquet store, the input of ``make_batch_reader``.

    ``value`` is shifted per file so per-file statistics differ too; ``empty_files`` of the ``num_files``
    files hold zero rows (a schema-only footer), which Spark produces for empty partitions and which
    readers must skip without error.  With ``hive=True`` the ``year`` column exists only in folder names.
    """
    def make_table(rng, i, start, n):
        ids, lang = _base_columns(rng, i, num_files, start, n)
        value = rng.normal(loc=float(i), scale=1.0, size=n)
        label = rng.integers(0, 10, size=n, dtype=np.int32)
        text = np.char.add(np.char.add(lang, ":"), ids.astype("U20"))
        return pa.Table.from_arrays([pa.array(ids), pa.array(lang), pa.array(value), pa.array(label),
                                     pa.array(text)], schema=PLAIN_SCHEMA)

    return _write(path, "plain", num_files, total_rows, seed, hive, empty_files, min_row_group_rows,
                  max_row_group_rows, compression, make_table, PLAIN_SCHEMA)


def make_unischema() -> "Unischema":
    """The Unischema of ``make_petastorm_dataset``.  Built lazily so plain datasets need no petastorm/pyspark
    import.  ``image`` uses the plain ``NdarrayCodec`` because ``make_reader`` decodes every cell in Python and
    tests read every row; ``CompressedNdarrayCodec`` would add zip/zlib cost for no coverage gain."""
    from ..unischema import NdarrayCodec, ScalarCodec, Unischema, UnischemaField
    from ..unischema.spark_types import spark_type
    return Unischema("SkewedSchema", [
        UnischemaField("id", np.int64, (), ScalarCodec(spark_type("LongType")), False),
        UnischemaField("lang", np.str_, (), ScalarCodec(spark_type("StringType")), False),
        UnischemaField("label", np.int32, (), ScalarCodec(spark_type("IntegerType")), False),
        UnischemaField("vec", np.float32, (4,), NdarrayCodec(), False),
        UnischemaField("image", np.uint8, (8, 8), NdarrayCodec(), False),
    ])


PETASTORM_SCHEMA = pa.schema([("id", pa.int64()), ("lang", pa.string()), ("label", pa.int32()),
                              ("vec", pa.binary()), ("image", pa.binary())])


def make_petastorm_dataset(path: str | os.PathLike[str], *, num_files: int = 8, total_rows: int = 20_000, seed: int = 0,
                           min_row_group_rows: int = 32, max_row_group_rows: int = 4096,
                           compression: str = "snappy", empty_files: int = 0) -> DatasetInfo:
    """Write a Petastorm dataset (``make_reader`` input) with the same skew as the plain one, no Spark.

    Values go through the Unischema codecs exactly as ``dict_to_spark_row`` would, then ``_common_metadata``
    gets the two keys ``materialize_dataset`` writes: the pickled Unischema and the JSON map
    ``{relative file path: number of row groups}``.  We know the row group counts already, so we write the
    metadata file directly instead of going through petastorm's helpers, which need a legacy
    ``pq.ParquetDataset`` (deprecated in pyarrow >= 11) and, for the row group map, a SparkContext.
    """
    schema = make_unischema()
    fields = [schema.fields[name] for name in PETASTORM_SCHEMA.names]
    encoders = []  # (field, its codec): every field of make_unischema has one
    for f in fields:
        if f.codec is None:
            raise AssertionError(f"make_unischema's field {f.name!r} has no codec")
        encoders.append((f, f.codec))

    def make_table(rng, i, start, n):
        ids, lang = _base_columns(rng, i, num_files, start, n)
        label = rng.integers(0, 10, size=n, dtype=np.int32)
        vec = rng.standard_normal((n, 4)).astype(np.float32)
        image = rng.integers(0, 256, size=(n, 8, 8), dtype=np.uint8)
        raw = [ids, lang, label, vec, image]
        cols = [[codec.encode(f, v) for v in values] for (f, codec), values in zip(encoders, raw, strict=True)]
        return pa.Table.from_arrays([pa.array(c, type=t) for c, t in zip(cols, PETASTORM_SCHEMA.types, strict=True)],
                                    schema=PETASTORM_SCHEMA)

    info = _write(path, "petastorm", num_files, total_rows, seed, False, empty_files, min_row_group_rows,
                  max_row_group_rows, compression, make_table, PETASTORM_SCHEMA)
    per_file = {f: 0 for f in info.files}
    for rel, _, _ in info.row_groups:
        per_file[rel] += 1
    metadata = {UNISCHEMA_KEY: dumps(schema),  # Petastorm's class paths: Petastorm reads it as its own
                ROW_GROUPS_PER_FILE_KEY: json.dumps(per_file, sort_keys=True).encode()}
    pq.write_metadata(PETASTORM_SCHEMA.with_metadata(metadata), os.path.join(info.path, "_common_metadata"))
    return info


def _summary(info: DatasetInfo) -> str:
    sizes = np.array([n for _, _, n in info.row_groups]) if info.row_groups else np.zeros(1, dtype=int)
    partitions = ",".join(info.partition_columns) or "-"
    return (f"kind={info.kind} partitions={partitions} rows={info.num_rows} files={len(info.files)} "
            f"row_groups={info.num_row_groups} "
            f"rg_rows(min/median/max)={int(sizes.min())}/{int(np.median(sizes))}/{int(sizes.max())} url={info.url}")


def main(argv: list | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m petastorm_balanced.datagen", description=__doc__.split("\n")[0])
    parser.add_argument("out_dir")
    parser.add_argument("--kind", choices=["plain", "petastorm", "hive"], default="plain")
    parser.add_argument("--rows", type=int, default=20_000)
    parser.add_argument("--files", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--empty-files", type=int, default=0)
    args = parser.parse_args(argv)
    common = dict(num_files=args.files, total_rows=args.rows, seed=args.seed, empty_files=args.empty_files)
    if args.kind == "petastorm":
        info = make_petastorm_dataset(args.out_dir, **common)
    else:
        info = make_plain_dataset(args.out_dir, hive=args.kind == "hive", **common)
    print(_summary(info))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
