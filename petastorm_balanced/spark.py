"""Spark DataFrames straight to balanced loaders: Petastorm's ``make_spark_converter``, with equal steps per rank.

``make_spark_converter(df)`` writes the DataFrame once as Parquet under a cache folder, plans it (``plan_shards``
in the same Spark session, ``where`` applied by the plan) and returns a ``BalancedConverter`` whose loaders give
every rank the same number of steps, which Petastorm's converter (``cur_shard``/``shard_count``) does not.

The cache key is a sha256 of what decides the written rows: the DataFrame's canonicalized analyzed plan (classic
Spark: its JSON with expression ids normalized; Spark Connect: the plan's protobuf and its analyzed plan text),
the data files it reads (path, size, modification time and, for Parquet, the footer's sha256), the Spark SQL confs
that change what is written (a fixed list and every other explicitly set ``spark.sql.*`` conf but a few neutral
ones), and the converter's options. The same DataFrame in this process, another process or a later run reuses the
committed copy and its plans; anything else gets a new folder. A plan whose text does not describe its content (an
RDD, a Python UDF's code: classic Spark shows neither) or whose inputs have no content digest (CSV, JSON) is reused
within this process only, as Petastorm does (``sameResult``). A plan whose rows depend on the run (rand(), uuid(),
the current time, a nondeterministic UDF) is never reused: each call writes a fresh copy, since the DataFrame
would not give the old copy's rows now (``reuse=True`` reuses it as any other plan, ``reuse=False`` writes a fresh
copy of any plan). pyspark is imported when a converter is made, so ``import petastorm_balanced`` needs no Spark.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import re
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote, urlparse

from .core import balance
from .errors import InvalidTypeError, InvalidValueError, MissingDependencyError
from .io import fs as fsutil
from .io.cache_dir import Cache
from .plan.load import load_plan
from .plan.model import ShardPlan
from .planner.plan_shards import plan_shards
from .world import World

if TYPE_CHECKING:
    from os import PathLike

    from .reading.front.iterable import BalancedIterableDataset
    from .reading.front.loader import BalancedLoader

PARENT_CACHE_DIR_URL_CONF = "petastorm.spark.converter.parentCacheDirUrl"  # Petastorm's conf name, kept
DEFAULT_ROW_GROUP_SIZE_BYTES = 32 * 1024 * 1024  # Petastorm's default
DEFAULT_BATCH_SIZE = 32  # Petastorm's make_torch_dataloader default
# Parquet codecs Spark writes and pyarrow reads (Petastorm's list also names bzip2 and deflate, which Spark's
# Parquet writer rejects).
CODECS = ("uncompressed", "snappy", "gzip", "lz4", "lz4_raw", "zstd", "brotli")
DTYPES = ("float32", "float64", None)
KEY_VERSION = 2  # bump when the materialized layout changes: old copies are then never reused (2: arrays as lists)
# Session confs that change the rows or the Parquet a DataFrame writes (values, types, timestamps, names).
OUTPUT_CONFS = ("spark.sql.session.timeZone", "spark.sql.ansi.enabled", "spark.sql.caseSensitive",
                "spark.sql.storeAssignmentPolicy", "spark.sql.legacy.timeParserPolicy",
                "spark.sql.parquet.outputTimestampType", "spark.sql.parquet.writeLegacyFormat",
                "spark.sql.parquet.datetimeRebaseModeInWrite", "spark.sql.parquet.int96RebaseModeInWrite",
                "spark.sql.parquet.fieldId.write.enabled", "spark.sql.legacy.sizeOfNull")
COVERED_NULLS = ("relation", "evalMode", "evalContext")  # JSON nulls other parts of the key cover (the
# evaluation mode and context, ANSI/TRY/legacy, are in the semantic hash: Spark 4.0 shows evalMode, 4.3 evalContext)
# Explicitly set SQL confs that change neither the rows nor the Parquet written (the rest of the set spark.sql.*
# confs is in the key, so a legacy or behaviour conf such as spark.sql.legacy.castComplexTypesToString.enabled is)
NEUTRAL_CONFS = ("spark.sql.shuffle.partitions", "spark.sql.warehouse.dir", "spark.sql.artifact.",
                 "spark.sql.adaptive.", "spark.sql.execution.arrow.", "spark.sql.ui.",
                 "spark.sql.catalogImplementation", "spark.sql.codegen.", "spark.sql.autoBroadcastJoinThreshold",
                 "spark.sql.connect.")
# Expressions whose value is the time of the run: deterministic to Spark within one query, not across runs
_CURRENT_TIME = re.compile(r'expressions\.(CurrentTimestamp|CurrentDate|Now|LocalTimestamp|CurrentTime|'
                           r'CurrentBatchTimestamp|CurrentTimestampLike)"')
_CONNECT_VOLATILE = re.compile(r"\b(current_timestamp|current_date|now|localtimestamp|current_time|rand|randn|uuid|"
                               r"shuffle|random)\(", re.IGNORECASE)
_EXPR_ID = re.compile(r'"jvmId":"[0-9a-f-]+"')
_EXPLAIN_ID = re.compile(r"#\d+L?")

log = logging.getLogger(__name__)
_memo_lock = threading.Lock()
_in_process: list[tuple[Any, str]] = []  # (analyzed JVM plan, key) of plans only this process can compare


def _pyspark():
    try:
        import pyspark.sql  # noqa: F401
        from pyspark.sql import functions as F
        from pyspark.sql import types as T
    except ImportError as exc:  # pragma: no cover - exercised only without pyspark
        raise MissingDependencyError("make_spark_converter needs pyspark (pip install 'pyspark>=4.0')") from exc
    return F, T


@dataclass(frozen=True)
class ConvertOptions:
    """What decides the materialized copy (besides the DataFrame): normalized once, part of the cache key."""

    parquet_row_group_size_bytes: int = DEFAULT_ROW_GROUP_SIZE_BYTES
    compression_codec: str = "uncompressed"
    dtype: str | None = "float32"

    @classmethod
    def of(cls, parquet_row_group_size_bytes, compression_codec, dtype) -> ConvertOptions:
        from .core.params import check_int
        size = check_int("parquet_row_group_size_bytes", parquet_row_group_size_bytes, minimum=1)
        codec = "uncompressed" if compression_codec is None else compression_codec
        if not isinstance(codec, str) or codec.lower() not in CODECS:
            raise InvalidValueError(f"compression_codec={compression_codec!r} is not one of {CODECS} (or None: "
                                    "uncompressed, Petastorm's default)")
        if dtype not in DTYPES:
            raise InvalidValueError(f"dtype={dtype!r} is not one of {DTYPES} (the precision floating-point columns "
                                    "are written in; None leaves them as they are)")
        return cls(size, codec.lower(), dtype)


class BalancedConverter:
    """A materialized DataFrame and its plan: loaders that give every rank the same steps.

    ``len(converter)`` is the number of rows the plan serves (the rows matching ``where``). The copy stays in the
    cache folder for other processes and later runs until ``delete()``; unlike Petastorm's converter it is not
    removed when the process exits, since it is shared.
    """

    def __init__(self, cache: Cache, key: str, plan: ShardPlan):
        self._cache, self._key = cache, key
        self.plan = plan
        self.dataset_url = plan.dataset_url

    def __len__(self) -> int:
        return self.plan.total_rows

    def __repr__(self) -> str:
        return f"BalancedConverter({self.dataset_url!r}, rows={len(self)})"

    @contextlib.contextmanager
    def make_torch_dataloader(self, rank: int | None = None, world: int | None = None,
                              **make_loader_kwargs: Any) -> Iterator[BalancedLoader]:
        """A ``BalancedLoader`` over this rank's rows, closed on exit (``with ... as loader``), as Petastorm's.

        ``batch_size`` defaults to the converter's, else 32 (Petastorm's default); ``rank``/``world`` default to
        ``World.detect()``. Other keywords are ``make_loader``'s.
        """
        from .reading.front.loader import make_loader
        make_loader_kwargs.setdefault("batch_size", self.plan.batch_size or DEFAULT_BATCH_SIZE)
        loader = make_loader(rank, world, plan=self.plan, **make_loader_kwargs)
        try:
            yield loader
        finally:
            loader.close()

    @contextlib.contextmanager
    def make_tf_dataset(self, rank: int | None = None, world: int | None = None,
                        **make_loader_kwargs: Any) -> Iterator[Any]:
        """``petastorm_balanced.tf.make_tf_dataset`` over this rank's rows, its loader closed on exit (``with ... as
        dataset``), as Petastorm's converter; ``batch_size`` defaults as in ``make_torch_dataloader``."""
        from .tf import make_tf_dataset
        make_loader_kwargs.setdefault("batch_size", self.plan.batch_size or DEFAULT_BATCH_SIZE)
        dataset = make_tf_dataset(rank, world, plan=self.plan, **make_loader_kwargs)
        try:
            yield dataset
        finally:
            dataset.position.loader.close()

    def make_dataset(self, rank: int | None = None, world: int | None = None,
                     **kwargs: Any) -> BalancedIterableDataset:
        """A ``BalancedIterableDataset`` (for ``torch.utils.data.DataLoader(num_workers=K)``) over this rank's rows;
        ``batch_size`` defaults as in ``make_torch_dataloader``."""
        from .reading.front.iterable import BalancedIterableDataset
        kwargs.setdefault("batch_size", self.plan.batch_size or DEFAULT_BATCH_SIZE)
        return BalancedIterableDataset(self.plan, rank, world, **kwargs)

    def delete(self) -> None:
        """Remove this converter's copy (and its plans) from the cache folder; nothing else there is touched."""
        with _memo_lock:
            _in_process[:] = [(p, k) for p, k in _in_process if k != self._key]
        self._cache.delete(self._key + PLANS_SUFFIX)  # the plans first: none may outlive the copy they describe
        self._cache.delete(self._key)


def make_spark_converter(df: Any, *, world_size: int | None = None, batch_size: int | None = None,
                         parent_cache_dir_url: str | PathLike[str] | None = None, where: str | None = None,
                         cost: str | None = None,
                         policy: str = "drop", seed: int = 0,
                         parquet_row_group_size_bytes: int = DEFAULT_ROW_GROUP_SIZE_BYTES,
                         compression_codec: str | None = None, dtype: str | None = "float32",
                         reuse: bool | None = None) -> BalancedConverter:
    """Materialize ``df`` once as Parquet under the cache folder and plan it; see the module docstring for reuse.

    ``parent_cache_dir_url`` defaults to the Spark conf ``petastorm.spark.converter.parentCacheDirUrl``, as
    Petastorm's. ``world_size`` defaults to the detected world (``World.detect()``) and else to 1: a converter is
    usually made on the driver, and a plan serves any world size (G9), so loaders may run on W ranks whatever was
    planned. ``where``, ``cost``, ``policy``, ``seed`` and ``batch_size`` are ``plan_shards``'s. Spark ML vectors
    become arrays of ``dtype``. Array columns are delivered by the loaders' ``list_format``: ``(batch, k)`` tensors
    where every array of a column has one length (the default), padded tensors with lengths, or lists.

    ``reuse``: None (the default) reuses a copy of the same plan unless its rows depend on the run (rand(), uuid(),
    current_timestamp(), a nondeterministic UDF: a fresh copy each call, the rows the DataFrame gives now); True
    reuses such a copy too (the rows of the first call, as Petastorm's converter does); False writes a fresh copy
    whatever the plan.
    """
    return _convert(df, world_size=world_size, batch_size=batch_size, parent_cache_dir_url=parent_cache_dir_url,
                    where=where, cost=cost, policy=policy, seed=seed,
                    options=(parquet_row_group_size_bytes, compression_codec, dtype), reuse=reuse)


def _convert(df: Any, *, world_size, batch_size, parent_cache_dir_url, where, cost, policy, seed, options,
             reuse: bool | None = None, types=None) -> BalancedConverter:
    """``make_spark_converter``; ``types`` (an Arrow schema): the copy's files are given these types exactly
    (``io/exact_copy.py``) before the copy is committed."""
    _pyspark()
    if reuse is not None and not isinstance(reuse, bool):
        raise InvalidTypeError(f"reuse={reuse!r} must be None (reuse unless the rows depend on the run), True or "
                               "False")
    if not hasattr(df, "sparkSession") or not hasattr(df, "write"):
        raise InvalidTypeError(f"df={df!r} is not a pyspark.sql.DataFrame")
    spark = df.sparkSession
    options = ConvertOptions.of(*options)
    cache = Cache.at(_parent_url(spark, parent_cache_dir_url))
    world_size = _default_world_size() if world_size is None else world_size
    balance.check_params(world_size=world_size, seed=seed, **({} if batch_size is None else
                                                                {"batch_size": batch_size}))
    balance.check_policy(policy)  # planning parameters are checked before anything is written
    prepared = _prepare(df, options.dtype)
    key = _cache_key(spark, prepared, options, reuse, types)
    dataset_url = cache.write_once(key, lambda url: _materialize(prepared, url, options, types))
    plan = _plan(dataset_url, spark, world_size=world_size, batch_size=batch_size, where=where, cost=cost,
                 policy=policy, seed=seed)
    return BalancedConverter(cache, key, plan)


def make_shuffled_copy(dataset_url: str | PathLike[str], *, spark: Any = None, seed: int = 0,
                       parent_cache_dir_url: str | PathLike[str] | None = None, world_size: int | None = None,
                       batch_size: int | None = None, where: str | None = None, cost: str | None = None,
                       policy: str = "drop") -> BalancedConverter:
    """A copy of ``dataset_url`` with its rows in a seeded random order, written once by Spark and planned (G16).

    For data stored sorted or clustered (by time, label, user) whose ranks' rows are larger than a loader's shuffle
    budget: loaders shuffle within windows, and a window of sorted rows holds a few labels; in the copy every row
    group is a random sample of the dataset, so any window gives i.i.d. batches. Rows are spread over as many files
    as the input has by a 64-bit hash of all their values and ``seed`` and ordered by it inside each file: one
    Spark shuffle, no sort of the whole dataset, and the same copy from the same content. The copy is the
    converter's (``make_spark_converter``): written atomically under the cache folder, reused by every later call
    on the same files and ``seed``. Every column keeps the Arrow type and value ``pyarrow.dataset`` reads from the
    source (timestamps with their unit and zone, unsigned integers, dictionaries, durations, nested lists, structs
    and maps: ``io/exact_copy.py``); a column Spark cannot give back exactly (nanosecond timestamps, times of day)
    is refused, naming it and the fix, before Spark runs. ``where``, ``cost``, ``policy``, ``batch_size`` and
    ``world_size`` plan the copy as ``plan_shards`` would plan the original.
    """
    F, _ = _pyspark()
    from .io import exact_copy
    from .planner.engines.spark import get_session, spark_url
    from .unischema.storage import has_unischema
    url = fsutil.normalize_url(dataset_url)
    if has_unischema(url):
        raise InvalidValueError(f"dataset_url={url!r} is a Petastorm (Unischema) dataset: a Spark copy would keep its "
                                "codec cells as raw bytes without the Unischema; raise the loader's shuffle_budget "
                                "instead, or rewrite it shuffled with petastorm_balanced.unischema.materialize_dataset")
    types, partitions = exact_copy.source_schema(url)
    exact_copy.check_copyable(types)  # before Spark reads a byte
    df = get_session(spark).read.parquet(spark_url(url))
    exact_copy.spark_types_ok(types, df.schema, partitions)
    key = "__petastorm_balanced_shuffle__"
    while key in df.columns:
        key += "_"
    # Spark hashes no map (DATATYPE_MISMATCH.HASH_MAP_TYPE): a column holding one is hashed as its JSON text
    hashed_columns = [F.to_json(F.col(_quoted(f.name))) if "map<" in f.dataType.simpleString()
                      else F.col(_quoted(f.name)) for f in df.schema.fields]
    hashed = df.withColumn(key, F.xxhash64(*hashed_columns, F.lit(int(seed))))
    shuffled = (hashed.repartition(max(1, len(df.inputFiles())), F.col(key)).sortWithinPartitions(key)
                .drop(key).select(*[F.col(_quoted(n)) for n in types.names]))
    return _convert(shuffled, world_size=world_size, batch_size=batch_size,
                    parent_cache_dir_url=parent_cache_dir_url, where=where, cost=cost, policy=policy, seed=seed,
                    options=(DEFAULT_ROW_GROUP_SIZE_BYTES, None, None), types=types)


# ---------------------------------------------------------------------------------------------- inputs

def _parent_url(spark, given) -> str:
    if given is not None:
        return given
    conf = spark.conf.get(PARENT_CACHE_DIR_URL_CONF, None)
    if not conf:
        raise InvalidValueError(f"parent_cache_dir_url=None and the Spark conf {PARENT_CACHE_DIR_URL_CONF} is not "
                                "set: pass parent_cache_dir_url= (a folder every rank can read, e.g. "
                                "file:///dbfs/tmp/cache) or set the conf, as for Petastorm's converter")
    return conf


def _default_world_size() -> int:
    try:
        return World.detect().size
    except RuntimeError:
        return 1  # on the driver: the plan serves any world size (elastic assignment from the same catalog)


def _prepare(df, dtype: str | None):
    """Vectors to arrays and floating-point columns to ``dtype``, as Petastorm's converter writes them."""
    F, T = _pyspark()
    vectors = [f.name for f in df.schema.fields if type(f.dataType).__name__ == "VectorUDT"]
    if vectors:
        from pyspark.ml.functions import vector_to_array
        df = df.withColumns({n: vector_to_array(F.col(_quoted(n)), dtype or "float64") for n in vectors})
    if dtype is None:
        return df
    source, target = (T.DoubleType, T.FloatType()) if dtype == "float32" else (T.FloatType, T.DoubleType())
    casts = {}
    for field in df.schema.fields:
        if isinstance(field.dataType, source):
            casts[field.name] = F.col(_quoted(field.name)).cast(target)
        elif isinstance(field.dataType, T.ArrayType) and isinstance(field.dataType.elementType, source):
            casts[field.name] = F.col(_quoted(field.name)).cast(T.ArrayType(target, field.dataType.containsNull))
    return df.withColumns(casts) if casts else df


def _quoted(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


# ---------------------------------------------------------------------------------------------- cache key

def _cache_key(spark, df, options: ConvertOptions, reuse: bool | None = None, types=None) -> str:
    """The folder name of ``df``'s copy: a digest of its plan, its input files, output confs and options; a name
    of its own (a fresh copy) for a plan whose rows depend on the run, unless ``reuse=True`` (then reused within
    this process only, as Petastorm does), and for any plan with ``reuse=False``."""
    text, shareable, repeatable, jplan = _plan_text(spark, df)
    digest = hashlib.sha256()
    files, by_content = _input_files(df)
    shareable = shareable and by_content and repeatable  # reuse=True: such a plan within this process only
    parts = {"version": KEY_VERSION, "options": options.__dict__, "files": files, "confs": _result_confs(spark),
             **({} if types is None else {"types": types.to_string(show_schema_metadata=False)})}
    digest.update(json.dumps(parts, sort_keys=True, default=str).encode())
    digest.update(b"\0" + text.encode())
    key = "df-" + digest.hexdigest()[:40]
    if reuse is False or (not repeatable and reuse is None):
        log.info("writing a fresh copy of the DataFrame (%s)", "reuse=False" if reuse is False else
                 "its rows depend on the run; reuse=True would reuse an earlier copy")
        return f"{key}-{uuid.uuid4().hex[:12]}"
    if shareable:
        return key
    with _memo_lock:  # as Petastorm: reuse within this process when Spark says the plans give the same result
        for other, other_key in _in_process:
            if jplan is not None and other_key.startswith(key) and other.sameResult(jplan):
                return other_key
        key = f"{key}-{uuid.uuid4().hex[:12]}"
        _in_process.append((jplan, key))
    return key


def _plan_text(spark, df) -> tuple[str, bool, bool, Any]:
    """Text describing ``df``'s content, whether it describes all of it, whether its rows are the same at every
    run (no rand(), uuid(), current time or nondeterministic UDF), and the JVM plan (classic Spark).

    Classic: the canonicalized analyzed plan as JSON (expression ids normalized by Spark, the JVM id removed);
    fields it cannot show come out ``null``. A file relation's null is covered by the input files in the key, an
    ANSI/TRY/legacy evaluation mode's (or context's) by the plan's semantic hash (``a + b`` and ``try_add(a, b)``
    differ only there); any other null (an RDD, a Python UDF's function) makes the plan this process's only.
    Spark Connect: the protobuf of the plan (literal rows, UDF pickles, paths), and the analyzed plan text for what
    the server resolves (views).
    """
    from .planner.engines.spark import is_connect
    if is_connect(spark):
        plan = df._plan.to_proto(spark.client)
        _canonical_proto(plan, {})
        proto = plan.SerializeToString(deterministic=True)
        analyzed = df._explain_string(mode="extended")
        analyzed = analyzed.split("== Analyzed Logical Plan ==")[-1].split("== Optimized Logical Plan ==")[0]
        volatile = _CONNECT_VOLATILE.search(analyzed) is not None  # rand(), uuid(), current_timestamp() ...
        return hashlib.sha256(proto).hexdigest() + _EXPLAIN_ID.sub("#", analyzed), True, not volatile, None
    jplan = df._jdf.queryExecution().analyzed()
    text = _EXPR_ID.sub("", jplan.canonicalized().toJSON())
    unknown = text
    for covered in COVERED_NULLS:
        unknown = unknown.replace(f'"{covered}":null', "")
    # rand(), uuid(), a nondeterministic UDF, or the time of the run: another run computes other rows
    repeatable = bool(jplan.deterministic()) and _CURRENT_TIME.search(text) is None
    return f"{text}\n{jplan.semanticHash()}", '":null' not in unknown, repeatable, jplan


def _result_confs(spark) -> dict:
    """The SQL confs that decide the copy: ``OUTPUT_CONFS`` and every other explicitly set ``spark.sql.*`` conf
    but the few known to change neither rows nor Parquet (``NEUTRAL_CONFS``)."""
    confs = {k: spark.conf.get(k, None) for k in OUTPUT_CONFS}
    try:
        rows = spark.sql("SET").collect()
    except Exception:  # noqa: BLE001 - a session that cannot list its confs: the fixed list only
        rows = []
    for row in rows:
        key, value = row[0], row[1]
        if key.startswith("spark.sql.") and not key.startswith(NEUTRAL_CONFS):
            confs[key] = value
    return confs


def _canonical_proto(message, seen: dict) -> None:
    """Make equal Connect plans serialize equally: the client's plan ids (a process-wide counter: the same
    DataFrame built twice gets other ids) become their order of first appearance, so references between nodes
    still hold, and call-site origins (the file and line that built a column) are dropped."""
    for field, value in message.ListFields():
        if field.name == "origin":
            message.ClearField(field.name)
        elif field.name == "plan_id" and field.type == field.TYPE_INT64:
            setattr(message, field.name, seen.setdefault(value, len(seen)))
        elif field.type == field.TYPE_MESSAGE:
            repeated = field.is_repeated if hasattr(field, "is_repeated") else field.label == field.LABEL_REPEATED
            if not repeated:
                _canonical_proto(value, seen)
                continue
            for item in (value.values() if hasattr(value, "values") else value):  # a map or a list
                if hasattr(item, "ListFields"):
                    _canonical_proto(item, seen)


def _input_files(df) -> tuple[list[list], bool]:
    """The data files ``df`` reads with their size, modification time, for Parquet the sha256 of the footer, and
    the store's content fingerprint (an ETag, or every byte's digest where ``PETASTORM_BALANCED_CONTENT_DIGEST``
    asks for it: ``io/content.py``), and whether that identifies their content: a copy that keeps size and
    modification time (``cp -p``, rsync) mostly changes a Parquet footer (statistics, offsets), and a fingerprint
    tells the rest; a file with neither is reused within this process only."""
    from .io import content
    from .io.footer import read_footer
    names = sorted(df.inputFiles())
    if not names:
        return [], True
    try:
        filesystem, _ = fsutil.resolve(_as_url(names[0]))
        paths = [fsutil.resolve(_as_url(n))[1] for n in names]
        infos = filesystem.get_file_info(paths)
        out, by_content = [], True
        digest = content.digest_wanted()
        for name, path, info in zip(names, paths, infos, strict=True):
            entry = [name, info.size, info.mtime_ns]
            tag = content.fingerprint(filesystem, path, digest=digest) if content.wanted(filesystem) else ""
            if name.endswith(".parquet"):
                with filesystem.open_input_file(path) as handle:
                    entry.append(read_footer(handle).digest)
            elif not tag:
                by_content = False
            out.append(entry + ([tag] if tag else []))
        return out, by_content
    except (OSError, ValueError):  # a filesystem pyarrow cannot open here: names only, this process only
        return [[n] for n in names], False


def _as_url(spark_path: str) -> str:
    """Spark names local files ``file:/path`` or ``file:///path`` (URL-quoted); pyarrow wants a plain path."""
    return "file://" + unquote(urlparse(spark_path).path) if spark_path.startswith("file:") else spark_path


# ---------------------------------------------------------------------------------------------- writing

def _materialize(df, url: str, options: ConvertOptions, types=None) -> None:
    """Write ``df`` under ``url`` (which does not exist yet). Array columns stay Parquet lists as Spark writes them:
    the loaders deliver them as tensors (``(batch, k)`` where every array of a column has one length, a padded form
    on request) or lists, by their ``list_format`` (``reading/fields/list_shapes.py``)."""
    from .planner.engines.spark import spark_url
    (df.write.option("compression", "none" if options.compression_codec == "uncompressed"
                     else options.compression_codec)
     .option("parquet.block.size", str(options.parquet_row_group_size_bytes))
     .parquet(spark_url(url)))
    if types is not None:  # before the copy is committed: never served with Spark's types
        from .io.exact_copy import restore_types
        codec = {"uncompressed": "none", "lz4_raw": "lz4"}.get(options.compression_codec, options.compression_codec)
        log.info("gave %d files of the copy the source's types", restore_types(url, types, codec))
    log.info("materialized the DataFrame at %s", url)


# ---------------------------------------------------------------------------------------------- planning

PLANS_SUFFIX = "-plans"


def plans_url(dataset_url: str) -> str:
    """The folder of a copy's plans: a sibling of the copy (a plan is never written into its dataset)."""
    return dataset_url.rstrip("/") + PLANS_SUFFIX


def _plan(dataset_url: str, spark, *, world_size, batch_size, where, cost, policy, seed) -> ShardPlan:
    """The plan for these parameters, saved beside the copy (``<copy>-plans/<digest>``: never inside the dataset it
    describes, G14) and reused when it is there."""
    params = {"world_size": world_size, "batch_size": batch_size, "where": where, "cost": cost, "policy": policy,
              "seed": seed}
    digest = hashlib.sha256(json.dumps(params, sort_keys=True, default=repr).encode()).hexdigest()[:24]
    plans = Cache(plans_url(dataset_url))
    found = plans.lookup(digest)
    if found is not None:
        return load_plan(found)
    plan = plan_shards(dataset_url, world_size, batch_size=batch_size, where=where, cost=cost, policy=policy,
                       seed=seed, engine="spark", spark=spark)
    plans.write_once(digest, plan.save)  # a plan another process saved first is this one (G4, G8)
    return plan
