"""The window batcher (``reading/batching.py``), pure and on synthetic fragments whose rows are numbered 0..n-1: whole
batches only, every row once, a start at batch k gives the suffix (the pure core of G1 and G6), and text stays
Arrow in a window, whole, whatever its offsets' width."""
import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from petastorm_balanced.reading.batching import WindowBatcher, split_batches, start_point


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

    from petastorm_balanced.reading.convert import one_array
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
