"""The window batcher (``reading/batches/batching.py``), pure and on synthetic fragments whose rows are numbered 0..n-1:
whole batches only, every row once, a start at batch k gives the suffix (the pure core of G1 and G6), and text stays
Arrow in a window, whole, whatever its offsets' width."""
from unittest import mock

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from petastorm_balanced.reading.batches import batching
from petastorm_balanced.reading.batches.batching import WindowBatcher, split_batches, start_point


def batches_from(rows, batch, window, shuffle, done):
    """The pure batching core over synthetic fragments whose rows are numbered 0..total-1."""
    ends = np.cumsum(rows)
    start = start_point(rows, batch_size=batch, window_rows=window, batches_done=done, shuffle=shuffle)
    batcher = WindowBatcher(total_rows=int(ends[-1]), batch_size=batch, window_rows=window, start=start,
                            key=(7, 1, 0, 0) if shuffle else None)
    out = []
    for i in range(start.fragment, len(rows)):
        begin = (ends[i - 1] if i else 0) + (start.offset if i == start.fragment else 0)
        ids = np.arange(begin, ends[i])
        for run in batcher.push({"id": ids, "text": pa.array(ids.astype(str))}):  # strings stay Arrow arrays
            for b in split_batches(run, batch):
                assert b["text"].to_pylist() == b["id"].astype(str).tolist()
                out.append(b["id"].tolist())
    batcher.finish()
    return out


@pytest.mark.slow
def test_a_window_of_over_2_gib_of_text_is_delivered_whole():
    """Text stays Arrow in the window: two chunks whose bytes overflow 32-bit offsets together become one array
    with 64-bit offsets, not an error, and the permutation moves every value whole; so do a bundle's fragments
    (``convert.one_array``). About 4.5 GB of memory."""
    import pyarrow.compute as pc

    from petastorm_balanced.reading.rows.convert import one_array
    big = 1100 << 20  # two of them: more than 2**31 bytes
    parts = [pa.array([fill * big, fill], pa.binary()) for fill in (b"a", b"b")]
    bundle = one_array(pa.chunked_array(parts))
    assert pa.types.is_large_binary(bundle.type)
    assert pc.binary_length(bundle).to_pylist() == [big, 1, big, 1]
    del bundle
    batcher = WindowBatcher(total_rows=4, batch_size=2, window_rows=4, start=start_point(
        np.array([2, 2]), batch_size=2, window_rows=4, batches_done=0, shuffle=True), key=(3, 0, 0, 0))
    runs = []
    for first, text in zip((0, 2), parts, strict=True):
        runs += list(batcher.push({"id": np.arange(first, first + 2), "text": text}))
    del parts, text
    batcher.finish()
    (run,) = runs
    assert pa.types.is_large_binary(run["text"].type)
    lengths = dict(zip(run["id"].tolist(), pc.binary_length(run["text"]).to_pylist(), strict=True))
    assert lengths == {0: big, 1: 1, 2: big, 3: 1}
    firsts = dict(zip(run["id"].tolist(), (run["text"][i].as_buffer()[:1].to_pybytes() for i in range(4)),
                      strict=True))
    assert firsts == {0: b"a", 1: b"a", 2: b"b", 3: b"b"}


def test_a_window_of_text_parts_of_both_offset_widths_is_one_array():
    """A bundle that needed 64-bit offsets and the next one, which did not, meet in one window: both become 64-bit
    and every value is delivered, in its place."""
    batcher = WindowBatcher(total_rows=4, batch_size=2, window_rows=4, start=start_point(
        np.array([2, 2]), batch_size=2, window_rows=4, batches_done=0, shuffle=False), key=None)
    runs = list(batcher.push({"id": np.arange(2), "text": pa.array(["é", None], pa.large_string())}))
    runs += list(batcher.push({"id": np.arange(2, 4), "text": pa.array(["c", "dd"])}))
    batcher.finish()
    (run,) = runs
    assert run["text"].to_pylist() == ["é", None, "c", "dd"] and run["id"].tolist() == [0, 1, 2, 3]


@settings(max_examples=30, deadline=None)
@given(rows=st.lists(st.integers(1, 40), min_size=1, max_size=12), batch=st.integers(1, 9),
       windows=st.integers(1, 5), shuffle=st.booleans(), data=st.data())
def test_batching_resumes_at_any_batch(rows, batch, windows, shuffle, data):
    """Pure core of G1/G6: whole batches only, every row once, and starting at batch k gives the suffix."""
    total = sum(rows) // batch * batch
    while sum(rows) > total:  # trim the synthetic slot to whole batches, as the balancer does
        rows[-1] -= min(sum(rows) - total, rows[-1])
        rows = rows if rows[-1] else rows[:-1]
    if not rows:
        return
    rows = np.array(rows)
    full = batches_from(rows, batch, windows * batch, shuffle, 0)
    assert all(len(b) == batch for b in full) and sorted(sum(full, [])) == list(range(total))
    done = data.draw(st.integers(0, len(full)))
    assert batches_from(rows, batch, windows * batch, shuffle, done) == full[done:]


def _objects(items):
    out = np.empty(len(items), dtype=object)
    out[:] = items
    return out


def _whole_window_batches(columns, *, batch, window, key, skip):
    """The rule written plainly (one gather of each whole window, ``core/shuffle``): batch ``j`` of window ``w`` is
    rows ``perm[j*B:(j+1)*B]`` of it, ``perm`` the Fisher-Yates rule written out in Python
    (``fisher_yates.reference``); ``skip`` batches dropped."""
    from petastorm_balanced.core.fisher_yates import reference
    total = len(columns["id"])
    out = []
    for w, begin in enumerate(range(0, total, window)):
        size = min(window, total - begin)
        order = begin + reference(size, (*key, w))
        for b in range(0, size, batch):
            out.append({name: values.take(order[b:b + batch]) if isinstance(values, pa.Array)
                        else values[order[b:b + batch]] for name, values in columns.items()})
    return out[skip:]


@settings(max_examples=40, deadline=None)
@given(cuts=st.lists(st.integers(1, 700), min_size=1, max_size=8), batch=st.integers(1, 40),
       windows=st.integers(1, 60), data=st.data())
def test_shuffled_batches_are_the_rule_whatever_the_columns_and_chunks(cuts, batch, windows, data):
    """The batcher gathers a window a run of batches at a time, with the 1-D fixed-width columns interleaved row-major
    (``batching.Window``): the rows, their order, every column's values and dtype are those of one gather of each
    whole window, for columns of every item size (grouped or alone), datetimes, shaped arrays, text and objects,
    chunks cut anywhere, and a start at any batch, row-major or column by column; numeric batches are writable."""
    total = sum(cuts) // batch * batch
    if not total:
        return
    ids = np.arange(total)
    rng = np.random.default_rng(total)
    columns = {"id": ids, "f32": rng.random(total).astype(np.float32), "i32": ids.astype(np.int32) * 3,
               "flag": ids % 3 == 0, "u8": (ids % 251).astype(np.uint8), "i16": (ids % 999).astype(np.int16),
               "when": ids.astype("datetime64[ns]"), "vec": np.stack([ids, -ids], axis=1).astype(np.float64),
               "text": pa.array([f"t{i}" for i in ids]), "obj": _objects([f"o{i}" for i in ids])}
    columns = {k: v for k, v in columns.items() if k == "id" or data.draw(st.booleans(), label=k)}
    window = windows * batch
    done = data.draw(st.integers(0, total // batch))
    ends = np.cumsum([c for c in cuts if c]).clip(max=total)
    fragment_rows = np.diff(np.concatenate([[0], np.unique(ends)]))
    start = start_point(fragment_rows, batch_size=batch, window_rows=window, batches_done=done, shuffle=True)
    row_major = data.draw(st.booleans(), label="row_major")
    run_rows = data.draw(st.integers(1, 300), label="run_rows")
    with mock.patch.multiple(batching, ROW_MAJOR_BYTES=0 if row_major else 2**62, RUN_ROWS=run_rows):
        batcher = WindowBatcher(total_rows=total, batch_size=batch, window_rows=window, start=start,
                                key=(5, 2, 1, 0))
        got = []
        begin = start.row
        for end in np.cumsum(fragment_rows)[start.fragment:]:
            chunk = {name: values[begin:end] for name, values in columns.items()}
            got += [b for run in batcher.push(chunk) for b in split_batches(run, batch)]
            begin = end
        batcher.finish()
    want = _whole_window_batches(columns, batch=batch, window=window, key=(5, 2, 1, 0), skip=done)
    assert len(got) == len(want) == total // batch - done
    for g, w in zip(got, want, strict=True):
        assert list(g) == list(w)
        for name in w:
            if isinstance(w[name], pa.Array):
                assert g[name].equals(w[name])
            else:
                assert g[name].dtype == w[name].dtype and g[name].shape == w[name].shape
                assert g[name].tolist() == w[name].tolist()
                assert g[name].flags.writeable


def test_a_column_whose_type_changes_within_a_row_major_window_is_refused():
    """Chunks of one window are interleaved as raw words of the first chunk's types: a later chunk of another type
    of the same width would be read back as garbage, so it is refused instead."""
    start = start_point(np.array([2, 2]), batch_size=2, window_rows=4, batches_done=0, shuffle=True)
    with mock.patch.object(batching, "ROW_MAJOR_BYTES", 0):
        batcher = WindowBatcher(total_rows=4, batch_size=2, window_rows=4, start=start, key=(1, 0, 0, 0))
        assert list(batcher.push({"a": np.arange(2, dtype=np.int32), "b": np.zeros(2, np.float32)})) == []
        with pytest.raises(RuntimeError, match="'b' came as float64 of shape \\(2,\\) after float32"):
            list(batcher.push({"a": np.arange(2, dtype=np.int32), "b": np.zeros(2, np.float64)}))
