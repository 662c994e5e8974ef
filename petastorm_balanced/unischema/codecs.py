"""Petastorm 0.12.1's four codecs, reimplemented: the same bytes in the cells, the same values out.

The classes keep Petastorm's attribute names (``_spark_type``, ``_image_codec``, ``_quality``) because a
Unischema is stored as a pickle of those attributes: ``pickling.py`` writes our objects under Petastorm's class
paths, and Petastorm reads them back as its own.

- ``NdarrayCodec``: ``numpy.save`` bytes (``.npy``); decoded with ``numpy.load`` (no pickles: object arrays are
  refused, as Petastorm's ``np.load`` does).
- ``CompressedNdarrayCodec``: ``numpy.savez_compressed(arr=...)`` bytes; decoded from the ``arr`` entry.
- ``CompressedImageCodec('png'|'jpeg', quality=80)``: an image file, RGB or grayscale. Petastorm encodes and decodes
  with OpenCV (BGR in the file's channel order fixed up to RGB); we use OpenCV where it imports (the ``[images]``
  extra: opencv-python-headless), so JPEG decodes to Petastorm's very pixels, and Pillow otherwise (PNG bit-exact;
  JPEG within the tolerance measured in tests/unischema/test_unischema.py, since two JPEG decoders may round
  differently).
- ``ScalarCodec(spark_type)``: the value as Spark stores it; decoded as ``numpy_dtype(value)``.
"""
from __future__ import annotations

import io
import re
import threading
import zipfile
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from ..core.narrowing import checked_scalar
from ..errors import InvalidTypeError, InvalidValueError, MissingDependencyError
from . import spark_types


class DataframeColumnCodec:
    """What every codec does: ``encode`` a value to what the Parquet cell stores, ``decode`` it back."""

    def encode(self, unischema_field: Any, value: Any) -> Any:  # pragma: no cover - abstract
        raise NotImplementedError

    def decode(self, unischema_field: Any, value: Any) -> Any:  # pragma: no cover - abstract
        raise NotImplementedError

    def spark_dtype(self) -> Any:
        """The Spark SQL type of the stored column (needs pyspark)."""
        import pyspark.sql.types as sql_types
        return sql_types.BinaryType()

    def __eq__(self, other: object) -> bool:
        return type(other).__name__ == type(self).__name__ and vars(other) == vars(self)

    def __hash__(self) -> int:
        return hash(type(self).__name__)

    def __str__(self) -> str:
        return f"{type(self).__name__}()"

    __repr__ = __str__


def _check_array(unischema_field, value, *, exact_type: bool) -> None:
    """Petastorm's checks before encoding an array: its numpy type and a shape compatible with the field's."""
    if not isinstance(value, np.ndarray):
        raise InvalidValueError(f"field {unischema_field.name!r} expects an ndarray of {unischema_field.numpy_dtype}, "
                                f"got {type(value).__name__}")
    expected = unischema_field.numpy_dtype
    same = value.dtype.type == expected if exact_type else value.dtype == expected
    if not same:
        raise InvalidValueError(f"field {unischema_field.name!r} expects dtype {expected}, got {value.dtype}")
    if not compliant_shape(value.shape, unischema_field.shape):
        raise InvalidValueError(f"field {unischema_field.name!r} expects shape {unischema_field.shape} (None: any "
                                f"size), got {value.shape}")


def compliant_shape(actual: Sequence[int | None], expected: Sequence[int | None]) -> bool:
    """Whether ``actual`` fits ``expected`` (same rank; ``None`` or 0 in either matches any size).

    >>> compliant_shape((2, 3), (None, 3)), compliant_shape((2, 3), (2, 4)), compliant_shape((2,), (2, 1))
    (True, False, False)
    """
    return len(actual) == len(expected) and all(not a or not b or a == b for a, b in zip(actual, expected, strict=True))


class NdarrayCodec(DataframeColumnCodec):
    """An ndarray as ``.npy`` bytes."""

    def encode(self, unischema_field: Any, value: Any) -> bytearray:
        _check_array(unischema_field, value, exact_type=True)
        memfile = io.BytesIO()
        np.save(memfile, value)
        return bytearray(memfile.getvalue())

    def decode(self, unischema_field: Any, value: Any) -> np.ndarray:
        return load_npy(value)


class CompressedNdarrayCodec(DataframeColumnCodec):
    """An ndarray as ``.npz`` bytes (zlib), under the name ``arr``."""

    def encode(self, unischema_field: Any, value: Any) -> bytearray:
        _check_array(unischema_field, value, exact_type=True)
        memfile = io.BytesIO()
        np.savez_compressed(memfile, arr=value)
        return bytearray(memfile.getvalue())

    def decode(self, unischema_field: Any, value: Any) -> np.ndarray:
        with zipfile.ZipFile(io.BytesIO(value)) as archive:
            names = archive.namelist()
            if "arr.npy" in names:  # what savez_compressed(arr=...) writes: read it as np.load would
                return load_npy(archive.read("arr.npy"))
        with np.load(io.BytesIO(value)) as npz:
            return npz["arr"]  # KeyError naming the missing entry, as Petastorm's decode raises


# The .npy header numpy writes for a plain dtype: {'descr': '<f4', 'fortran_order': False, 'shape': (3, 4), }
_NPY_HEADER = re.compile(r"\{'descr': '([<>|=][a-zA-Z]\d*)', 'fortran_order': (True|False), "
                         r"'shape': \(((?:\d+, )*\d*|\d+,)\), \}\s*")
_NPY_FALLBACK = threading.Lock()


def load_npy(value: Any) -> np.ndarray:
    """``numpy.load`` of ``.npy`` bytes, the same array (dtype with byte order, shape, Fortran order, a fresh
    writable copy), with the header parsed by a regular expression instead of numpy's ``ast.literal_eval``.

    Why: CPython 3.11 up to 3.11.7 can fail ``ast`` parsing done by several threads at once ("SystemError: AST
    constructor recursion depth mismatch", cpython gh-106905), and the loaders decode cells in threads; a regular
    expression is also far cheaper per cell. Any header this does not recognise (structured or object dtypes,
    other versions) goes to ``numpy.load`` itself, one thread at a time, so it raises exactly what numpy raises."""
    view = memoryview(value).cast("B")
    if view[:6] == b"\x93NUMPY" and len(view) >= 10:
        major = view[6]
        size_bytes = 2 if major == 1 else 4
        start = 8 + size_bytes
        length = int.from_bytes(view[8:start], "little")
        match = _NPY_HEADER.fullmatch(bytes(view[start:start + length]).decode("latin1"))
        if match is not None and major in (1, 2, 3):
            descr, fortran, shape_text = match.groups()
            dtype = np.dtype(descr)
            shape = tuple(int(d) for d in shape_text.replace(",", " ").split())
            count = int(np.prod(shape, dtype=np.int64))
            if not dtype.hasobject and len(view) - start - length >= count * dtype.itemsize:
                flat = np.frombuffer(view, dtype=dtype, count=count, offset=start + length)
                return flat.reshape(shape, order="F" if fortran == "True" else "C").copy(order="K")
    with _NPY_FALLBACK:
        return np.load(io.BytesIO(bytes(view)))


class CompressedImageCodec(DataframeColumnCodec):
    """An (H, W) grayscale or (H, W, 3) RGB image as PNG or JPEG bytes (``quality`` applies to JPEG)."""

    def __init__(self, image_codec: str = "png", quality: int = 80):
        if image_codec not in ("png", "jpeg", "jpg"):
            raise InvalidValueError(f"image_codec={image_codec!r} is not 'png' or 'jpeg'")
        self._image_codec = "." + image_codec
        self._quality = quality

    @property
    def image_codec(self) -> str:
        return self._image_codec[1:]

    def encode(self, unischema_field: Any, value: Any) -> bytearray:
        _check_array(unischema_field, value, exact_type=False)
        _check_image_shape(value.shape)
        return bytearray(_images().encode(value, self._image_codec, self._quality))

    def decode(self, unischema_field: Any, value: Any) -> np.ndarray:
        image = _images().decode(value)
        _check_image_shape(image.shape)
        return image

    def decode_into(self, cells: Iterable[Any], out: np.ndarray) -> tuple[int, tuple] | None:
        """Decode ``cells`` (buffers: bytes or uint8 arrays) straight into ``out[i]``, the loader's batch array
        (rows on axis 0): the pixels ``decode`` gives, without a per-cell array to stack afterwards. Returns None,
        or ``(row, shape)`` of the first cell whose image does not have ``out``'s row shape (nothing is guessed)."""
        _check_image_shape(out.shape[1:])
        return _images().decode_into(cells, out)

    def __str__(self) -> str:
        return f"{type(self).__name__}('{self.image_codec}', {self._quality})"

    __repr__ = __str__


def _check_image_shape(shape) -> None:
    if not (len(shape) == 2 or (len(shape) == 3 and shape[2] == 3)):
        raise InvalidValueError(f"an image must be (H, W) or (H, W, 3) (as Petastorm's CompressedImageCodec), "
                                f"got shape {shape}")


class ScalarCodec(DataframeColumnCodec):
    """A scalar stored as the Spark SQL type ``spark_type``; decoded as ``numpy_dtype(value)``."""

    def __init__(self, spark_type: Any):
        self._spark_type = spark_type

    def encode(self, unischema_field: Any, value: Any) -> Any:
        unsized = isinstance(value, np.ndarray) and value.shape == ()
        if not unsized and hasattr(value, "__len__") and not isinstance(value, str):
            raise InvalidTypeError(f"field {unischema_field.name!r} expects a scalar, got {type(value).__name__}")
        if unischema_field.shape:
            raise InvalidValueError(f"field {unischema_field.name!r} has a ScalarCodec, so its shape must be (), "
                                    f"not {unischema_field.shape}")
        name = spark_types.type_name(self._spark_type)
        if name in spark_types.INTEGRAL:
            return int(value)
        if name in spark_types.FRACTIONAL:
            return float(value)
        if name == "BooleanType":
            return bool(value)
        if name == "StringType":
            if not isinstance(value, str):
                raise InvalidTypeError(f"field {unischema_field.name!r} expects a str, got {type(value).__name__}")
            return str(value)
        return value

    def decode(self, unischema_field: Any, value: Any) -> Any:
        return checked_scalar(unischema_field.numpy_dtype, value, unischema_field.name, "the Unischema declares")

    def spark_dtype(self) -> Any:
        return spark_types.to_pyspark(self._spark_type)

    def __str__(self) -> str:
        return f"{type(self).__name__}({spark_types.type_name(self._spark_type)}())"

    __repr__ = __str__


CODECS = (NdarrayCodec, CompressedNdarrayCodec, CompressedImageCodec, ScalarCodec)


class _OpenCV:
    """Petastorm's own image calls: BGR in OpenCV, RGB outside."""

    def __init__(self, cv2):
        self.cv2 = cv2

    def encode(self, value: np.ndarray, extension: str, quality: int) -> bytes:
        bgr = value if value.ndim == 2 else value[:, :, (2, 1, 0)]
        ok, contents = self.cv2.imencode(extension, bgr, [int(self.cv2.IMWRITE_JPEG_QUALITY), quality])
        if not ok:
            raise InvalidValueError(f"OpenCV could not encode a {value.shape} {value.dtype} image as {extension}")
        return contents.tobytes()

    def decode(self, value) -> np.ndarray:
        image = self.cv2.imdecode(np.frombuffer(value, dtype=np.uint8), self.cv2.IMREAD_UNCHANGED)
        if image is None:
            raise InvalidValueError("a CompressedImageCodec cell holds bytes OpenCV cannot decode as an image")
        if image.ndim == 2 or image.shape[2] != 3:
            return image
        # The channel swap Petastorm does with image[:, :, (2, 1, 0)], as one SIMD pass without the GIL (a fifth of
        # the decode time for small images); a permutation, so the pixels are the same.
        return self.cv2.cvtColor(image, self.cv2.COLOR_BGR2RGB)

    def decode_into(self, cells: Iterable[Any], out: np.ndarray) -> tuple[int, tuple] | None:
        """``decode`` per cell, the channel swap writing into ``out[i]`` itself (OpenCV fills a ``dst`` of the
        right size and type in place), so each pixel is copied once; other images are assigned (numpy casts)."""
        cv2 = self.cv2
        imdecode, unchanged, cvt, swap = cv2.imdecode, cv2.IMREAD_UNCHANGED, cv2.cvtColor, cv2.COLOR_BGR2RGB
        row_shape = out.shape[1:]
        in_place = out.dtype == np.uint8 and len(row_shape) == 3 and row_shape[2] == 3
        for i, cell in enumerate(cells):
            image = imdecode(cell if isinstance(cell, np.ndarray) else np.frombuffer(cell, dtype=np.uint8), unchanged)
            if image is None:
                raise InvalidValueError("a CompressedImageCodec cell holds bytes OpenCV cannot decode as an image")
            if image.shape != row_shape:
                return i, image.shape
            if in_place and image.dtype == np.uint8:
                cvt(image, swap, dst=out[i])
            elif image.ndim == 3 and image.shape[2] == 3:
                out[i] = cvt(image, swap)
            else:
                out[i] = image
        return None


class _Pillow:
    """Pillow, where OpenCV is not installed: RGB and grayscale, 8 or 16 bits."""

    def __init__(self, image_module):
        self.Image = image_module

    def encode(self, value: np.ndarray, extension: str, quality: int) -> bytes:
        memfile = io.BytesIO()
        fmt = "PNG" if extension == ".png" else "JPEG"
        self.Image.fromarray(value).save(memfile, format=fmt, **({"quality": quality} if fmt == "JPEG" else {}))
        return memfile.getvalue()

    def decode(self, value) -> np.ndarray:
        with self.Image.open(io.BytesIO(bytes(value))) as image:
            if image.mode == "P":
                image = image.convert("RGBA" if "transparency" in image.info else "RGB")
            out = np.asarray(image)
        return out.astype(out.dtype.newbyteorder("=")) if not out.dtype.isnative else out

    def decode_into(self, cells: Iterable[Any], out: np.ndarray) -> tuple[int, tuple] | None:
        for i, cell in enumerate(cells):
            image = self.decode(cell)
            if image.shape != out.shape[1:]:
                return i, image.shape
            out[i] = image
        return None


_BACKEND: _OpenCV | _Pillow | None = None


def _images():
    """OpenCV (Petastorm's library) if it imports, else Pillow; one of them is needed for image fields."""
    global _BACKEND
    if _BACKEND is None:
        try:
            import cv2
            _BACKEND = _OpenCV(cv2)
        except ImportError:
            try:
                from PIL import Image
            except ImportError:
                raise MissingDependencyError("CompressedImageCodec needs OpenCV or Pillow: pip install "
                                             "'petastorm-balanced[images]'") from None
            _BACKEND = _Pillow(Image)
    return _BACKEND


def image_library() -> str:
    """``'opencv'`` or ``'pillow'``: which library decodes images here (JPEG pixels are OpenCV's only with it)."""
    return "opencv" if isinstance(_images(), _OpenCV) else "pillow"
