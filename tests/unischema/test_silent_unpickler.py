"""The stored Unischema's unpickler cannot change anything: no state on classes, no allocation a pickle did not
bring along, and no loaded value the reader would choke on (names, types, shapes checked before use); a
differential fuzz over pickle opcodes against Python's C unpickler with the same allow-list."""
import io
import pickle
import pickletools
import tracemalloc

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from petastorm_balanced import UnsafeDatasetError
from petastorm_balanced.errors import InvalidValueError
from petastorm_balanced.unischema import (
    CompressedImageCodec,
    NdarrayCodec,
    ScalarCodec,
    Unischema,
    UnischemaField,
    codecs,
    pickling,
)
from petastorm_balanced.unischema.spark_types import SparkType, spark_type

REFUSED = (UnsafeDatasetError, InvalidValueError)


def schema():
    return Unischema("S", [UnischemaField("id", np.int64, (), ScalarCodec(spark_type("LongType")), False),
                           UnischemaField("vec", np.float32, (None, 3), NdarrayCodec(), False),
                           UnischemaField("img", np.uint8, (4, 4), CompressedImageCodec("png"), False)])


def unframed(payload: bytes) -> bytes:
    """A protocol-4 pickle without its FRAME opcode (frames are optional), so opcodes can be edited in place."""
    assert payload[:2] == b"\x80\x04" and payload[2] == pickle.FRAME[0]
    return payload[:2] + payload[11:]


def class_state():
    """What a pickle must never change: the attributes of the classes a Unischema pickle names."""
    return {cls: dict(vars(cls)) for cls in (UnischemaField, Unischema, *codecs.CODECS, SparkType)}


def test_build_on_the_field_class_is_refused_and_changes_nothing():
    """BUILD with (None, {'numpy_dtype': int8}) on the class UnischemaField itself, then a clean schema: the class
    must keep its field, so a clean dataset opened later still delivers int64."""
    attack = (b"\x80\x02cpetastorm.unischema\nUnischemaField\nN}Vnumpy_dtype\ncnumpy\nint8\ns\x86b0")
    before = class_state()
    try:
        with pytest.raises(UnsafeDatasetError, match="sets state on UnischemaField.*a class"):
            pickling.loads(attack + pickling.dumps(schema()))
        assert class_state() == before
        clean = pickling.loads(pickling.dumps(schema()))
        assert clean.fields["id"].numpy_dtype is np.int64
        assert UnischemaField("id", np.int64, ()).numpy_dtype is np.int64
    finally:  # on an unguarded unpickler, undo the damage for the tests that follow
        for cls, attributes in before.items():
            for name in set(vars(cls)) - set(attributes):
                delattr(cls, name)
            for name, value in attributes.items():
                if vars(cls).get(name) is not value and name not in ("__dict__", "__weakref__", "__doc__"):
                    setattr(cls, name, value)


def test_a_huge_memo_index_is_refused_before_allocating():
    """A 9-byte pickle (LONG_BINPUT 2**27) made the C unpickler allocate its memo for 2**27 entries (2 GiB)."""
    attack = b"\x80\x02Nr" + (2 ** 27).to_bytes(4, "little") + b"."
    assert len(attack) == 9
    tracemalloc.start()
    try:
        with pytest.raises(UnsafeDatasetError, match="memo index 134217728"):
            pickling.loads(attack)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 16 << 20


@pytest.mark.parametrize("call", [b"cbuiltins\nbytearray\nJ\x00\x00\x00\x40\x85R.",  # bytearray(2**30)
                                  b"cnumpy\nvoid\nJ\x00\x00\x00\x40\x85R.",  # numpy.void(2**30)
                                  b"cnumpy.core.multiarray\n_reconstruct\ncnumpy\nndarray\nJ\x00\x00\x00\x40\x85"
                                  b"C\x01b\x87R."])  # an empty ndarray of 2**30 bytes
def test_calls_that_ask_for_a_size_are_refused_before_allocating(call):
    tracemalloc.start()
    try:
        with pytest.raises(UnsafeDatasetError, match="size|shape"):
            pickling.loads(b"\x80\x02" + call)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 16 << 20


def test_a_deep_tuple_as_a_shape_is_refused_at_load():
    """A 10**6-deep tuple as a field's shape passed the checks and crashed the process at the first batch."""
    payload = unframed(pickling.dumps(Unischema("S", [UnischemaField("x", np.int64, (7777777,), None, False)])))
    marker = b"J" + (7777777).to_bytes(4, "little") + pickle.TUPLE1
    assert payload.count(marker) == 1
    deep = payload.replace(marker, b"N" + pickle.TUPLE1 * 10 ** 6)
    with pytest.raises(UnsafeDatasetError, match="'x' has a shape that is a tuple of 1, not a tuple of at most 32"):
        pickling.loads(deep)


def test_a_dtype_that_is_not_a_type_is_refused_at_load():
    payload = unframed(pickling.dumps(Unischema("S", [UnischemaField("id", np.int64, (), None, False)])))
    # numpy.int64 replaced by an (allowed) OrderedDict instance
    text = payload.replace(b"\x8c\x05numpy\x94\x8c\x05int64\x94\x93\x94",
                           b"\x8c\x0bcollections\x94\x8c\x0bOrderedDict\x94\x93\x94)R\x94")
    assert text != payload
    with pytest.raises(UnsafeDatasetError, match="'id' has numpy_dtype OrderedDict"):
        pickling.loads(text)


def test_an_oversized_payload_is_refused_unread():
    with pytest.raises(UnsafeDatasetError, match="over the"):
        pickling.loads(b"\x80\x02N" + b"0N" * (pickling.MAX_PICKLE_BYTES // 2) + b".")


# ---- differential fuzz over pickle opcodes ----

SEED = unframed(pickling.dumps(schema()))
OPCODES = [b"0", b"N", b"b", b"R", b"\x81", b"\x85", b"\x86", b"\x87", b"(", b")", b"}", b"]", b"s", b"u", b"a",
           b"e", b"\x94", b"t", b"1", b"2", b"\x93", b"cbuiltins\nbytearray\n", b"cbuiltins\nobject\n",
           b"cnumpy\nint8\n", b"cpetastorm.unischema\nUnischemaField\n", b"cpetastorm.unischema\nUnischema\n",
           b"cpetastorm.codecs\nNdarrayCodec\n", b"ccollections\nOrderedDict\n", b"Vnumpy_dtype\n", b"V_name\n",
           b"K\x07", b"J\x00\x00\x00\x40", b"q\x03", b"h\x01", b"r\x00\x00\x00\x08", b"j\x02\x00\x00\x00"]


class Reference(pickle.Unpickler):
    """Python's C unpickler with the same allow-list: what the bytes mean when nothing is checked."""

    def find_class(self, module, name):
        if (module, name) not in pickling.ALLOWED:
            raise pickle.UnpicklingError(f"{module}.{name}")
        return pickling.ALLOWED[(module, name)]


# stack-neutral gadgets: inserted between two opcodes of a valid pickle, the pickle stays valid
GADGETS = [b"cpetastorm.unischema\nUnischemaField\nN}Vnumpy_dtype\ncnumpy\nint8\ns\x86b0",  # BUILD on a class
           b"cpetastorm.codecs\nNdarrayCodec\n}V_x\nK\x01sb0",  # BUILD (dict) on a class
           b"cpetastorm.unischema\nUnischema\nN}Vfields\nNs\x86b0",
           b"Nr\x00\x00\x00\x010",  # LONG_BINPUT 2**24
           b"cbuiltins\nbytearray\nJ\x00\x00\x00\x04\x85R0"]  # bytearray(2**26)
BOUNDARIES = [pos for _, _, pos in pickletools.genops(SEED)][1:]


@st.composite
def edited(draw):
    data = bytearray(SEED)
    if draw(st.booleans()):
        at = draw(st.sampled_from(BOUNDARIES))
        data[at:at] = draw(st.sampled_from(GADGETS))
    for _ in range(draw(st.integers(0, 3))):
        at = draw(st.integers(2, len(data) - 1))
        kind = draw(st.sampled_from(["insert", "replace", "delete"]))
        op = draw(st.sampled_from(OPCODES))
        if kind == "insert":
            data[at:at] = op
        elif kind == "replace":
            data[at:at + len(op)] = op
        else:
            del data[at:at + draw(st.integers(1, 8))]
    return bytes(data)


@given(edited())
def test_opcode_fuzz_changes_nothing_and_agrees_with_the_reference(payload):
    before = class_state()
    try:
        ours = pickling.loads(payload)
    except REFUSED:
        ours = None
    assert class_state() == before  # refused or not, no class was touched
    if ours is None:
        return
    # what ours accepted is a clean Unischema; the reference reads the same bytes to the same fields
    reference = Reference(io.BytesIO(payload)).load()
    assert isinstance(reference, Unischema) and reference._name == ours._name
    assert list(reference.fields.items()) == list(ours.fields.items())
    for field in ours.fields.values():
        assert type(field.shape) is tuple and len(field.shape) <= 32
        assert isinstance(field.numpy_dtype, (type, np.dtype))
