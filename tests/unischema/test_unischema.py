"""Petastorm datasets without Petastorm: our codecs give Petastorm 0.12.1's values, a stored Unischema
loads only through the allow-list (a hostile pickle is refused on every load path and runs nothing), and
``make_reader`` on the Arrow backend yields Petastorm's rows. Real Petastorm is the oracle where it imports."""
import io
import os
import pickle
import subprocess
import sys
from decimal import Decimal

import numpy as np
import pyarrow.parquet as pq
import pytest

from petastorm_balanced import UnsafeDatasetError, datagen, load_plan, make_loader, plan_shards
from petastorm_balanced.predicates import in_lambda
from petastorm_balanced.reading.front.reader import make_reader
from petastorm_balanced.unischema import (
    CompressedImageCodec,
    CompressedNdarrayCodec,
    NdarrayCodec,
    ScalarCodec,
    Unischema,
    UnischemaField,
    codecs,
    pickling,
)
from petastorm_balanced.unischema.spark_types import spark_type
from petastorm_balanced.unischema.storage import UNISCHEMA_KEY
from tests.support.stacks import HAVE_PETASTORM, petastorm_only

RNG = np.random.default_rng(7)
ARRAYS = [RNG.standard_normal((3, 4)).astype(np.float32), RNG.integers(0, 2 ** 16, (5,), dtype=np.uint16),
          RNG.integers(-9, 9, (2, 3, 4), dtype=np.int64), np.array(3.5), np.arange(6, dtype=">i4").reshape(2, 3),
          np.zeros((0, 3), dtype=np.float64), np.array([True, False])]


def smooth(shape):
    """A gradient with a little noise: what JPEG is for (pure noise is not a picture JPEG keeps)."""
    y, x = np.mgrid[0:shape[0], 0:shape[1]]
    base = x * 255 / shape[1] + y * 128 / shape[0]
    image = np.stack([(base + 40 * k) % 256 for k in range(shape[2])], -1) if len(shape) == 3 else base
    return (image + RNG.integers(0, 8, image.shape)).clip(0, 255).astype(np.uint8)


IMAGES = [RNG.integers(0, 256, (16, 12, 3), dtype=np.uint8), RNG.integers(0, 256, (9, 7), dtype=np.uint8),
          smooth((32, 24, 3)), smooth((20, 30))]
# JPEG decoded by Pillow instead of OpenCV (both bundle libjpeg-turbo with the default IDCT): the largest
# per-pixel difference measured, on noise and gradients at quality 50-100, with OpenCV 4.11 and 5.0 and Pillow 13,
# is 0. docs/stacks.md states it; OpenCV (the [images] extra) is Petastorm's own decoder in any case.
PILLOW_JPEG_TOLERANCE = 0


def field(name, value, codec):
    return UnischemaField(name, value.dtype.type, value.shape, codec, False)


def same(a, b):
    return type(a) is type(b) and np.asarray(a).dtype == np.asarray(b).dtype and np.shape(a) == np.shape(b) \
        and np.array_equal(a, b)


@pytest.mark.parametrize("codec", [NdarrayCodec(), CompressedNdarrayCodec()], ids=str)
@pytest.mark.parametrize("value", ARRAYS, ids=lambda a: f"{a.dtype}{a.shape}")
def test_array_codecs_round_trip_and_decode_what_numpy_wrote(codec, value):
    f = field("x", value, codec)
    cell = codec.encode(f, value)
    assert same(codec.decode(f, cell), value)
    memfile = io.BytesIO()  # bytes numpy writes itself (as Petastorm's encode does) decode the same
    (np.save(memfile, value) if isinstance(codec, NdarrayCodec) else np.savez_compressed(memfile, arr=value))
    assert same(codec.decode(f, memfile.getvalue()), value)


@pytest.mark.parametrize("value", IMAGES, ids=lambda a: str(a.shape))
def test_png_is_lossless_with_either_image_library(value):
    pil = pytest.importorskip("PIL.Image")
    codec = CompressedImageCodec("png")
    f = field("img", value, codec)
    cell = codec.encode(f, value)
    assert same(codec.decode(f, cell), value)
    assert same(codecs._Pillow(pil).decode(cell), value)  # Pillow reads what OpenCV (or Pillow) wrote
    assert same(codec.decode(f, codecs._Pillow(pil).encode(value, ".png", 80)), value)


@pytest.mark.parametrize("value", IMAGES, ids=lambda a: str(a.shape))
def test_jpeg_decodes_with_opencv_exactly_and_pillow_within_tolerance(value):
    cv2 = pytest.importorskip("cv2")
    pil = pytest.importorskip("PIL.Image")
    cell = codecs._OpenCV(cv2).encode(value, ".jpeg", 90)
    by_cv2, by_pillow = codecs._OpenCV(cv2).decode(cell), codecs._Pillow(pil).decode(cell)
    assert by_cv2.shape == by_pillow.shape == value.shape and by_cv2.dtype == by_pillow.dtype == np.uint8
    assert np.abs(by_cv2.astype(int) - by_pillow.astype(int)).max() <= PILLOW_JPEG_TOLERANCE
    if value.shape[0] >= 20:  # a picture, not noise: lossy, but the same picture
        assert np.abs(by_cv2.astype(int) - value.astype(int)).mean() < 20


def test_codec_checks_refuse_wrong_dtype_shape_and_image_layout():
    codec = NdarrayCodec()
    with pytest.raises(ValueError, match="dtype"):
        codec.encode(UnischemaField("x", np.float64, (3,), codec), np.zeros(3, np.float32))
    with pytest.raises(ValueError, match="shape"):
        codec.encode(UnischemaField("x", np.float32, (4,), codec), np.zeros(3, np.float32))
    image = CompressedImageCodec("png")
    with pytest.raises(ValueError, match=r"\(H, W\) or \(H, W, 3\)"):
        image.encode(UnischemaField("x", np.uint8, (2, 2, 4), image), np.zeros((2, 2, 4), np.uint8))
    with pytest.raises(ValueError, match="image_codec"):
        CompressedImageCodec("gif")


@petastorm_only
@pytest.mark.parametrize("kind", ["ndarray", "compressed", "png", "jpeg"])
def test_cells_written_by_petastorm_decode_to_petastorms_values_and_back(kind):
    from petastorm import codecs as theirs
    from petastorm.unischema import UnischemaField as TheirField
    pairs = {"ndarray": (theirs.NdarrayCodec(), NdarrayCodec()),
             "compressed": (theirs.CompressedNdarrayCodec(), CompressedNdarrayCodec()),
             "png": (theirs.CompressedImageCodec("png"), CompressedImageCodec("png")),
             "jpeg": (theirs.CompressedImageCodec("jpeg", 85), CompressedImageCodec("jpeg", 85))}
    their_codec, our_codec = pairs[kind]
    for value in (IMAGES if kind in ("png", "jpeg") else ARRAYS):
        tf = TheirField("x", value.dtype.type, value.shape, their_codec, False)
        of = field("x", value, our_codec)
        cell = their_codec.encode(tf, value)
        assert same(our_codec.decode(of, cell), their_codec.decode(tf, cell))
        ours = our_codec.encode(of, value)
        assert same(their_codec.decode(tf, ours), our_codec.decode(of, ours))
        if kind != "png":  # PNG: same pixels, the compressor may differ; the rest are the same bytes
            assert bytes(ours) == bytes(cell)


@petastorm_only
def test_scalar_codec_decodes_as_petastorm_does():
    from petastorm.codecs import ScalarCodec as TheirScalar
    from petastorm.unischema import UnischemaField as TheirField
    from pyspark.sql import types as T
    cases = [(np.int8, T.ByteType(), 5), (np.int32, T.IntegerType(), -7), (np.int64, T.LongType(), 2 ** 40),
             (np.float32, T.FloatType(), 0.1), (np.float64, T.DoubleType(), float("nan")),
             (np.bool_, T.BooleanType(), 1), (np.str_, T.StringType(), "héllo"), (np.bytes_, T.BinaryType(), b"a\x00b"),
             (Decimal, T.DecimalType(10, 2), Decimal("3.14")),
             (np.datetime64, T.DateType(), np.datetime64("2024-02-29"))]
    for dtype, spark, value in cases:
        theirs, ours = TheirScalar(spark), ScalarCodec(spark)
        tf, of = TheirField("s", dtype, (), theirs, False), UnischemaField("s", dtype, (), ours, False)
        try:
            encoded = theirs.encode(tf, value)
        except TypeError:  # Petastorm refuses it (bytes have a len): so do we, and the cell is the raw value
            with pytest.raises(TypeError):
                ours.encode(of, value)
            encoded = value
        else:
            assert ours.encode(of, value) == encoded or (encoded != encoded)  # NaN != NaN
        a, b = ours.decode(of, encoded), theirs.decode(tf, encoded)
        assert type(a) is type(b) and (a == b or (a != a and b != b)), (dtype, a, b)


# ---- the stored schema: Petastorm's pickle paths, read and written ----

def full_schema():
    return Unischema("Full", [
        UnischemaField("id", np.int64, (), ScalarCodec(spark_type("LongType")), False),
        UnischemaField("name", np.str_, (), ScalarCodec(spark_type("StringType")), True),
        UnischemaField("price", Decimal, (), ScalarCodec(spark_type("DecimalType", precision=10, scale=2,
                                                                     hasPrecisionInfo=True)), True),
        UnischemaField("vec", np.float32, (None, 3), NdarrayCodec(), False),
        UnischemaField("mat", np.float64, (2, 2), CompressedNdarrayCodec(), False),
        UnischemaField("png", np.uint8, (8, 8, 3), CompressedImageCodec("png"), False),
        UnischemaField("jpg", np.uint8, (8, 8), CompressedImageCodec("jpeg", 90), False),
        UnischemaField("raw", np.bytes_, (), None, False),
    ])


def globals_named(payload):
    """The (module, name) pairs a pickle looks up (recorded by an unpickler that hands out the allowed objects)."""
    found = set()

    class Recording(pickle.Unpickler):
        def find_class(self, module, name):
            found.add((module, name))
            return pickling.ALLOWED[(module, name)]

    Recording(io.BytesIO(payload)).load()
    return found


def test_schema_pickles_under_petastorms_class_paths_and_loads_back():
    schema = full_schema()
    payload = pickling.dumps(schema)
    named = globals_named(payload)
    assert {m for m, _ in named} == {"petastorm.unischema", "petastorm.codecs", "pyspark.sql.types", "numpy",
                                     "collections", "decimal"}
    assert named <= set(pickling.ALLOWED)
    assert ("numpy", "bool") not in globals_named(pickling.dumps(Unischema("B", [UnischemaField("b", np.bool_, ())])))
    loaded = pickling.loads(payload)
    assert str(loaded) == str(schema) and list(loaded.fields.values()) == list(schema.fields.values())
    assert loaded.price.codec._spark_type.scale == 2 and loaded.jpg.codec._quality == 90


@petastorm_only
def test_petastorm_reads_our_pickle_as_its_own_and_we_read_its():
    from petastorm.etl.legacy import depickle_legacy_package_name_compatible
    from petastorm.unischema import Unischema as TheirUnischema
    theirs = depickle_legacy_package_name_compatible(pickling.dumps(full_schema()))
    assert type(theirs) is TheirUnischema and str(theirs) == str(full_schema())
    assert type(theirs.jpg.codec).__module__ == "petastorm.codecs" and theirs.jpg.codec.image_codec == "jpeg"
    back = pickling.loads(pickle.dumps(theirs))  # Petastorm's own bytes
    assert type(back) is Unischema and str(back) == str(full_schema())


# ---- hostile pickles: refused on every load path, nothing runs ----

class Call:
    """Pickles as a call of ``function(*args)``: what a hostile pickle does."""

    def __init__(self, function, *args):
        self.function, self.args = function, args

    def __reduce__(self):
        return self.function, self.args


def hostile_payloads(marker):
    touch = f"open({str(marker)!r}, 'w').close()"
    hidden = Unischema("Genuine", [UnischemaField("id", np.int64, (), ScalarCodec(spark_type("LongType")), False),
                                   UnischemaField("img", np.uint8, (4, 4), Call(os.system, f"touch {marker}"), False)])
    return {
        "os.system": pickle.dumps(Call(os.system, f"touch {marker}")),
        "builtins.exec": pickle.dumps(Call(exec, touch)),  # Petastorm 0.12.1's own unpickler lets this through
        "builtins.eval": pickle.dumps(Call(eval, touch)),
        "subprocess": pickle.dumps(Call(subprocess.call, ["touch", str(marker)])),
        "numpy.load": pickle.dumps(Call(np.load, str(marker))),  # numpy, but not a dtype
        "hidden-in-unischema": pickling.dumps(hidden),
        "builtins.getattr": pickle.dumps(Call(getattr, int, "mro")),  # a step towards any attribute
    }


def poison(dataset_path, payload):
    path = os.path.join(dataset_path, "_common_metadata")
    schema = pq.read_schema(path)
    pq.write_metadata(schema.with_metadata({**schema.metadata, UNISCHEMA_KEY: payload}), path)


@pytest.fixture(scope="module")
def small_petastorm(tmp_path_factory):
    return datagen.make_petastorm_dataset(tmp_path_factory.mktemp("small") / "ds", num_files=2, total_rows=120,
                                          seed=4, min_row_group_rows=20, max_row_group_rows=40)


@pytest.mark.parametrize("name", sorted(hostile_payloads("x")))
def test_hostile_pickle_is_refused_by_every_load_path_and_runs_nothing(name, small_petastorm, tmp_path):
    marker = tmp_path / "ran"
    data = tmp_path / "ds"
    import shutil
    shutil.copytree(small_petastorm.path, data)
    plan = plan_shards(str(data), 2, batch_size=8, engine="local", output_url=str(tmp_path / "plan"))  # clean
    poison(data, hostile_payloads(marker)[name])
    with pytest.raises(UnsafeDatasetError, match="allow-list|not a Unischema|refused"):
        pickling.loads(hostile_payloads(marker)[name])
    attempts = {
        "plan": lambda: plan_shards(str(data), 2, batch_size=8, engine="local"),
        "plan+predicate": lambda: plan_shards(str(data), 2, batch_size=8, engine="local",
                                              predicate=in_lambda(["label"], lambda v: v > 2)),
        "load_plan": lambda: load_plan(str(tmp_path / "plan")),
        "loader-arrow": lambda: next(iter(make_loader(0, 2, plan=plan, backend="arrow"))),
        "reader-arrow": lambda: next(iter(make_reader(0, 2, plan=plan, backend="arrow"))),
        "iterable": lambda: next(iter(_iterable(plan))),
    }
    if HAVE_PETASTORM:
        attempts["loader-petastorm"] = lambda: next(iter(make_loader(0, 2, plan=plan, backend="petastorm")))
        attempts["reader-petastorm"] = lambda: next(iter(make_reader(0, 2, plan=plan, backend="petastorm")))
    for what, attempt in attempts.items():
        with pytest.raises(UnsafeDatasetError):
            attempt()
        assert not marker.exists(), f"{what}: the pickle ran"


def _iterable(plan):
    from petastorm_balanced import BalancedIterableDataset
    return BalancedIterableDataset(plan, 0, 2)


@petastorm_only
def test_petastorms_own_unpickler_runs_exec_and_ours_hardens_it(tmp_path):
    """Why we check before Petastorm: its RestrictedUnpickler admits builtins. Run in fresh interpreters."""
    marker = tmp_path / "ran"
    blob = tmp_path / "blob"
    blob.write_bytes(hostile_payloads(marker)["builtins.exec"])
    load = ("import sys; from petastorm.etl.legacy import restricted_loads; "
            "restricted_loads(open(sys.argv[1], 'rb').read())")
    subprocess.run([sys.executable, "-c", load, str(blob)], check=True, timeout=120, capture_output=True)
    assert marker.exists()  # Petastorm alone ran it
    marker.unlink()
    hardened = "import petastorm_balanced.reading.backends.petastorm; " + load
    done = subprocess.run([sys.executable, "-c", hardened, str(blob)], timeout=120, capture_output=True, text=True)
    assert done.returncode != 0 and "UnsafeDatasetError" in done.stderr and not marker.exists()


# ---- make_reader on the Arrow backend gives Petastorm's rows ----

def rows_equal(ours, theirs):
    assert len(ours) == len(theirs) and len(ours) > 0
    for a, b in zip(ours, theirs, strict=True):
        assert a._fields == b._fields
        for name in a._fields:
            assert same(getattr(a, name), getattr(b, name)), (name, getattr(a, name), getattr(b, name))


@pytest.mark.parametrize("shuffle_rows", [False, True])
def test_arrow_make_reader_rows_are_the_plans_and_decoded(small_petastorm, shuffle_rows):
    plan = plan_shards(small_petastorm.url, 2, batch_size=8, engine="local", policy="pad")
    table = pq.read_table(small_petastorm.path, columns=["id", "vec"])
    vec_by_id = {i: np.load(io.BytesIO(v)) for i, v in zip(table.column("id").to_pylist(),
                                                           table.column("vec").to_pylist(), strict=True)}
    seen = []
    for rank in range(2):
        with make_reader(rank, 2, plan=plan, backend="arrow", shuffle_rows=shuffle_rows, workers_count=2) as reader:
            rows = list(reader)
        assert type(rows[0]).__name__ == "SkewedSchema_view" and not reader.batched_output
        assert len(rows) == plan.steps_per_rank * 8 if hasattr(plan, "steps_per_rank") else True
        for row in rows:
            assert type(row.id) is np.int64 and type(row.lang) is np.str_ and row.vec.dtype == np.float32
            assert np.array_equal(row.vec, vec_by_id[int(row.id)])
        seen.append([int(r.id) for r in rows])
    assert len(seen[0]) == len(seen[1])
    assert set(seen[0]) | set(seen[1]) == set(vec_by_id)  # every row served (padding may repeat some)


def test_arrow_make_reader_stop_join_and_refusals(small_petastorm):
    plan = plan_shards(small_petastorm.url, 1, batch_size=4, engine="local")
    reader = make_reader(0, 1, plan=plan, backend="arrow", workers_count=1)
    first = next(reader)
    reader.stop()
    assert list(reader) == [] and first.id is not None
    reader.join()
    with pytest.raises(ValueError, match="cache_type"):
        make_reader(0, 1, plan=plan, backend="arrow", cache_type="local-disk")
    with pytest.raises(ValueError, match="cur_shard"):
        make_reader(0, 1, plan=plan, backend="arrow", cur_shard=0)


@petastorm_only
@pytest.mark.parametrize("kind", ["petastorm", "plain"])
def test_arrow_make_reader_equals_petastorms_reader(small_petastorm, tmp_path, kind):
    info = small_petastorm if kind == "petastorm" else \
        datagen.make_plain_dataset(tmp_path / "plain", num_files=3, total_rows=300, seed=2)
    plan = plan_shards(info.url, 2, batch_size=8, engine="local", policy="pad")
    for rank in range(2):
        for kwargs in ({}, {"shuffle_rows": True, "seed": 3}, {"schema_fields": ["id", "vec" if kind == "petastorm"
                                                                                 else "value"]}):
            with make_reader(rank, 2, plan=plan, backend="arrow", **kwargs) as reader:
                ours = list(reader)
            with make_reader(rank, 2, plan=plan, backend="petastorm", reader_pool_type="dummy", **kwargs) as reader:
                theirs = list(reader)
            if "schema_fields" in kwargs:  # Petastorm orders a view's fields by a set; compare by name
                ours = [r._asdict() for r in ours]
                theirs = [r._asdict() for r in theirs]
                assert len(ours) == len(theirs)
                for a, b in zip(ours, theirs, strict=True):
                    assert a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
            else:
                rows_equal(ours, theirs)


@pytest.mark.parametrize("library", ["opencv", "pillow"])
@pytest.mark.parametrize("value", IMAGES, ids=lambda a: str(a.shape))
def test_images_decoded_into_the_batch_array_equal_decode_per_cell(value, library, monkeypatch):
    """The loader's path (``decode_into`` from views of the Arrow buffer, chunked and sliced) gives ``decode``'s
    pixels, row for row; an image of another shape than the Unischema's is refused naming the row."""
    import pyarrow as pa

    from petastorm_balanced.reading.fields.schema import unischema_column
    from petastorm_balanced.reading.rows.fragments import _decode_cells
    if library == "pillow":
        pytest.importorskip("PIL")
        monkeypatch.setattr(codecs, "_BACKEND", codecs._Pillow(__import__("PIL.Image").Image))
    for kind in ("png", "jpeg"):
        codec = CompressedImageCodec(kind, 90)
        the_field = field("image", value, codec)
        images = [(value.astype(np.int64) + i * 7) % 256 for i in range(9)]
        cells = [bytes(codec.encode(the_field, image.astype(np.uint8))) for image in images]
        column = pa.chunked_array([pa.array(cells[:4], pa.binary()).slice(1), pa.array(cells[4:], pa.binary())])
        spec = unischema_column(the_field, pa.binary(), False, False)
        got = _decode_cells(column, the_field, spec)
        want = np.stack([codec.decode(the_field, c) for c in column.to_pylist()])
        assert got.shape == (8, *value.shape) and got.dtype == want.dtype and np.array_equal(got, want)
        wrong = np.zeros((value.shape[0] + 1, *value.shape[1:]), dtype=np.uint8)
        odd = pa.chunked_array([pa.array(cells[:2] + [bytes(codec.encode(field("image", wrong, codec), wrong))])])
        with pytest.raises(ValueError, match=rf"column 'image' row 2 decodes to shape \({value.shape[0] + 1}, "):
            _decode_cells(odd, the_field, spec)


NPY_ARRAYS = ARRAYS + [np.asfortranarray(RNG.standard_normal((4, 5))), np.array(["ab", "c"]), np.array([b"x", b"yz"]),
                       np.zeros((2,), dtype=[("a", "<i4"), ("b", ">f8")]), np.arange(10)[::2], np.array(7, np.int8),
                       np.zeros((1, 1, 1, 2), np.complex64), np.array(np.datetime64("2020-01-01"))]


@pytest.mark.parametrize("value", NPY_ARRAYS, ids=lambda a: f"{a.dtype}{a.shape}")
def test_npy_cells_load_as_numpy_loads_them_and_threads_never_parse_headers_with_ast(value, monkeypatch):
    """``load_npy`` (NdarrayCodec, CompressedNdarrayCodec) gives ``np.load``'s array: dtype and byte order, shape,
    memory order, a writable copy; headers numpy's ``ast.literal_eval`` would parse (racy in threads on CPython
    <= 3.11.7) are parsed without it, the rest go to ``np.load`` itself."""
    import ast
    from concurrent.futures import ThreadPoolExecutor
    memfile = io.BytesIO()
    np.save(memfile, value)
    cell = memfile.getvalue()
    expected = np.load(io.BytesIO(cell))
    plain = value.dtype.fields is None and value.dtype.kind != "M"
    if plain:  # a plain dtype's header never reaches ast
        monkeypatch.setattr(ast, "literal_eval", lambda *a: pytest.fail("header parsed by ast.literal_eval"))
    for got in (codecs.load_npy(cell), codecs.load_npy(bytearray(cell)),
                codecs.load_npy(np.frombuffer(cell, np.uint8))):
        assert got.dtype == expected.dtype and got.shape == expected.shape and np.array_equal(got, expected)
        assert got.flags.writeable and got.flags.f_contiguous == expected.flags.f_contiguous
    compressed = CompressedNdarrayCodec()
    got = compressed.decode(None, compressed.encode(field("a", value, compressed), value)) if plain else expected
    assert got.dtype == expected.dtype and np.array_equal(got, expected)
    with ThreadPoolExecutor(4) as pool:
        assert all(np.array_equal(a, expected) for a in pool.map(codecs.load_npy, [cell] * 400))
