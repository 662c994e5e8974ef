"""One side of the cross-stack tests: run by either stack's python (``python tests/support/stack_side.py COMMAND
...``), it prints one JSON document on its last line. Used by tests/integration/test_stacks.py; not a test module."""
import hashlib
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))  # the checkout

import pyarrow as pa  # noqa: E402


def batches_digest(plan_url, world, epoch, backend):
    """sha256 of every rank's batches (all columns, as Python values, in order), and the step counts."""
    from petastorm_balanced import make_loader
    digest, steps = hashlib.sha256(), []
    for rank in range(world):
        loader = make_loader(rank, world, plan=plan_url, epoch=epoch, backend=backend, padding_mask=True)
        count = 0
        for batch in loader:
            values = {k: (v.tolist() if hasattr(v, "tolist") else list(v)) for k, v in sorted(batch.items())}
            digest.update(json.dumps(values, sort_keys=True, default=str).encode())
            count += 1
        steps.append(count)
    return {"digest": digest.hexdigest(), "steps": steps}


def main(argv):
    command, args = argv[0], argv[1:]
    out = {"pyarrow": pa.__version__}
    if command == "data":  # a plain dataset (this stack's writer)
        from petastorm_balanced import datagen
        datagen.make_plain_dataset(args[0], num_files=6, total_rows=6000, seed=11, hive=False)
    elif command == "unischema":
        from petastorm_balanced import datagen
        datagen.make_petastorm_dataset(args[0], num_files=3, total_rows=600, seed=3)
    elif command == "view-types":  # Parquet with Utf8View/BinaryView columns (pyarrow >= 16 writes them)
        import numpy as np
        import pyarrow.parquet as pq
        os.makedirs(args[0])
        for i in range(3):
            ids = np.arange(i * 500, (i + 1) * 500)
            table = pa.table({"id": ids, "text": pa.array([f"row {n}" for n in ids], type=pa.string_view()),
                              "blob": pa.array([str(n).encode() for n in ids], type=pa.binary_view())})
            pq.write_table(table, os.path.join(args[0], f"part-{i}.parquet"), row_group_size=200)
        out["schema"] = str(pq.read_schema(os.path.join(args[0], "part-0.parquet")))
    elif command == "plan":  # DATASET PLAN_URL WORLD: plan with a predicate, saved
        from petastorm_balanced import plan_shards
        from petastorm_balanced.predicates import in_set
        plan = plan_shards(args[0], int(args[2]), batch_size=16, policy="pad", seed=5, engine="local",
                           predicate=in_set({"en", "de"}, "lang"), output_url=args[1])
        out["checksum"] = plan.checksum
    elif command == "plan-any":  # DATASET: plan without a predicate; the error text if planning refuses
        from petastorm_balanced import plan_shards
        try:
            out["checksum"] = plan_shards(args[0], 2, batch_size=16, engine="local").checksum
        except (ValueError, ImportError) as exc:
            out["error"] = f"{type(exc).__name__}: {exc}"
    elif command == "load":  # PLAN_URL
        from petastorm_balanced import load_plan
        out["checksum"] = load_plan(args[0]).checksum
    elif command == "batches":  # PLAN_URL WORLD EPOCH BACKEND
        out.update(batches_digest(args[0], int(args[1]), int(args[2]), args[3]))
    elif command == "loader":  # PLAN_URL: build a loader; the error text if it is refused
        from petastorm_balanced import make_loader
        try:
            out["steps"] = len(make_loader(0, 2, plan=args[0], batch_size=16, backend="auto"))
        except (ValueError, ImportError) as exc:  # named by the builtin it is (our typed errors subclass them)
            out["error"] = f"{'ImportError' if isinstance(exc, ImportError) else 'ValueError'}: {exc}"
    elif command == "unischema-write":  # DIR WRITER: all codecs through materialize_dataset ('petastorm' or 'ours')
        from pyspark.sql import SparkSession

        from tests.support import unischema_data
        os.environ["PYSPARK_PYTHON"] = os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable  # this stack's workers
        spark = (SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false")
                 .config("spark.driver.host", "127.0.0.1").config("spark.sql.session.timeZone", "UTC").getOrCreate())
        spark.sparkContext.setLogLevel("ERROR")
        unischema_data.write(spark, args[0], args[1])
        spark.stop()
    elif command == "unischema-read":  # DIR READER: decoded rows by id ('petastorm': its make_reader; 'ours')
        from tests.support import unischema_data
        url = "file://" + args[0]
        if args[1] == "petastorm":
            from petastorm import make_reader
            with make_reader(url, reader_pool_type="dummy", num_epochs=1) as reader:
                out["rows"] = unischema_data.row_digests(reader)
        else:
            from petastorm_balanced import make_reader, plan_shards
            plan = plan_shards(url, 1, batch_size=1, engine="local")
            with make_reader(0, 1, plan=plan, backend="arrow") as reader:
                out["rows"] = unischema_data.row_digests(reader)
    else:
        raise SystemExit(f"unknown command {command!r}")
    print(json.dumps(out))


if __name__ == "__main__":
    main(sys.argv[1:])
