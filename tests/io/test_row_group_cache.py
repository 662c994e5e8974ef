"""The local-disk row group cache on its own: exact round trips, entries that cannot be read are misses, the folder
stays within its byte limit (least recently used out first), and several processes writing and reading one folder
at once never see part of an entry."""
import multiprocessing
import os
import time

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from petastorm_balanced.io.row_group_cache import LocalDiskCache, entry_key


def table(seed: int, rows: int = 2000) -> pa.Table:
    rng = np.random.default_rng(seed)
    ints = rng.integers(-2**62, 2**62, rows)
    return pa.table({
        "id": pa.array(ints),
        "maybe": pa.array([None if i % 7 == 0 else float(i) for i in range(rows)]),
        "text": pa.array([None if i % 5 == 0 else f"{seed}-{i}-é" for i in range(rows)]),
        "vec": pa.array([list(range(i % 4)) for i in range(rows)], pa.list_(pa.int16())),
        "day": pa.array(ints.astype("datetime64[us]")),
        "dict": pa.array(["a", "b"] * (rows // 2)).dictionary_encode(),
    })


def test_an_entry_reads_back_exactly(tmp_path):
    cache = LocalDiskCache(str(tmp_path), 1 << 30)
    original = table(1)
    cache.put("k" * 64, original)
    back = cache.get("k" * 64)
    assert back.schema.equals(original.schema)
    assert back.equals(original)
    assert cache.get("0" * 64) is None


def test_read_loads_once_then_hits(tmp_path):
    cache = LocalDiskCache(str(tmp_path), 1 << 30)
    loads = []

    def load():
        loads.append(1)
        return table(2)
    assert cache.read("a" * 64, load).equals(table(2))
    assert cache.read("a" * 64, load).equals(table(2))
    assert len(loads) == 1 and (cache.hits, cache.misses) == (1, 1)


def test_the_key_changes_with_every_part_of_the_fingerprint():
    base = ("s3://b/ds/part-0.parquet", "ab" * 32, 1000, 1_700_000_000_000_000_000, 3, ["id", "text"])
    key = entry_key(*base)
    for i, other in enumerate(["s3://b/ds/part-1.parquet", "cd" * 32, 1001, 1_700_000_000_000_000_001, 4,
                               ["text", "id"]]):
        changed = list(base)
        changed[i] = other
        assert entry_key(*changed) != key, i
    assert entry_key(*base[:3], None, *base[4:]) != key  # no modification time is not any modification time


@pytest.mark.parametrize("damage", ["cut", "garbage", "empty"])
def test_an_entry_that_cannot_be_read_is_a_miss_and_removed(tmp_path, damage):
    cache = LocalDiskCache(str(tmp_path), 1 << 30)
    cache.put("c" * 64, table(3))
    path = cache.path("c" * 64)
    data = open(path, "rb").read()
    with open(path, "wb") as f:
        f.write({"cut": data[:len(data) // 2], "garbage": b"\x00" * len(data), "empty": b""}[damage])
    assert cache.get("c" * 64) is None
    assert not os.path.exists(path)
    assert cache.read("c" * 64, lambda: table(3)).equals(table(3))  # read again, stored again
    assert cache.get("c" * 64).equals(table(3))


def _size(folder) -> int:
    return sum(e.stat().st_size for e in os.scandir(folder) if e.name.endswith(".arrow"))


def test_the_folder_stays_within_the_limit_least_recently_used_out_first(tmp_path):
    probe = LocalDiskCache(str(tmp_path / "probe"), 1 << 30)
    probe.put("p" * 64, table(0))
    entry = os.path.getsize(probe.path("p" * 64))
    limit = 10 * entry + entry // 2
    folder = tmp_path / "cache"
    cache = LocalDiskCache(str(folder), limit)
    (folder / "someone-elses.txt").write_text("not ours")
    keys = [f"{i:064x}" for i in range(40)]
    for i, key in enumerate(keys):
        cache.put(key, table(0))
        if i >= 1:
            time.sleep(0.01)
            assert cache.get(keys[0]) is not None  # used all along: never the least recently used
        assert _size(folder) <= limit
    assert cache.get(keys[0]) is not None
    assert cache.get(keys[1]) is None  # the oldest unused entries went first
    assert cache.get(keys[-1]) is not None
    assert (folder / "someone-elses.txt").read_text() == "not ours"


def test_an_entry_larger_than_the_limit_is_not_kept(tmp_path):
    cache = LocalDiskCache(str(tmp_path), 1000)
    assert cache.read("d" * 64, lambda: table(4)).equals(table(4))
    assert cache.get("d" * 64) is None
    assert not [n for n in os.listdir(tmp_path) if n.startswith("rg-")]  # no temporary file left either


def _hammer(folder: str, worker: int, rounds: int, queue) -> None:
    cache = LocalDiskCache(folder, 1 << 30)
    tables = [table(k) for k in range(4)]
    wrong = 0
    for r in range(rounds):
        for k in range(4):  # every process writes and reads the same four entries
            key = f"{k:064x}"
            got = cache.get(key)
            if got is not None and not got.equals(tables[k]):
                wrong += 1
            if (r + worker + k) % 2 == 0:
                cache.put(key, tables[k])
    queue.put(wrong)


@pytest.mark.slow  # four fresh interpreters
def test_processes_writing_and_reading_one_folder_see_whole_entries(tmp_path):
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    processes = [context.Process(target=_hammer, args=(str(tmp_path), w, 30, queue)) for w in range(4)]
    for p in processes:
        p.start()
    results = [queue.get(timeout=120) for _ in processes]
    for p in processes:
        p.join(60)
    assert results == [0, 0, 0, 0]
    cache = LocalDiskCache(str(tmp_path), 1 << 30)
    for k in range(4):
        assert cache.get(f"{k:064x}").equals(table(k))
    assert not [n for n in os.listdir(tmp_path) if n.endswith(".tmp")]  # every temporary name was renamed


def test_a_temporary_file_of_a_killed_writer_is_never_read_and_cleaned_up(tmp_path):
    cache = LocalDiskCache(str(tmp_path), 1 << 30)
    key = "e" * 64
    temp = cache.path(key) + ".deadbeef.tmp"
    with open(temp, "wb") as f:
        f.write(b"half an entry")
    assert cache.get(key) is None
    old = time.time() - 2 * 3600
    os.utime(temp, (old, old))
    cache.evict()
    assert not os.path.exists(temp)


@settings(max_examples=60, deadline=None)
@example(operations=[("put", 0, 1000), ("put", 0, 2703), ("get", 0, 1000)], entries_in_limit=1)  # too large a put
@given(st.lists(st.tuples(st.sampled_from(["put", "get"]), st.integers(0, 11), st.integers(1000, 3000)),
                min_size=1, max_size=40),
       st.integers(1, 4))
def test_any_sequence_of_puts_and_gets_stays_bounded_and_exact(tmp_path_factory, operations, entries_in_limit):
    """Whatever is stored and looked up, in any order: the folder never holds more than the limit after a put,
    and a get gives None or exactly what was stored under that key."""
    folder = tmp_path_factory.mktemp("cache")
    probe = LocalDiskCache(str(folder / "probe"), 1 << 30)
    probe.put("p" * 64, _sized(0, 3000))
    limit = entries_in_limit * os.path.getsize(probe.path("p" * 64))
    cache = LocalDiskCache(str(folder / "cache"), limit)
    stored = {}
    for op, key_number, rows in operations:
        key = f"{key_number:064x}"
        if op == "put":
            stored[key] = _sized(key_number, rows)
            cache.put(key, stored[key])
            assert _size(folder / "cache") <= limit
        else:
            got = cache.get(key)
            assert got is None or got.equals(stored[key])


def _sized(seed: int, rows: int) -> pa.Table:
    return pa.table({"id": np.arange(rows, dtype=np.int64) + seed, "text": [f"{seed}:{i}" for i in range(rows)]})
