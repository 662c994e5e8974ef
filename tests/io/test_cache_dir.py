"""The write-once cache folder (io/cache_dir.py) with real processes: concurrent writers of one key end with one
complete copy, a writer killed mid-write leaves nothing a reader would serve, delete removes only its own copy."""
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from petastorm_balanced.errors import InvalidValueError
from petastorm_balanced.io.cache_dir import Cache
from tests.support.jobs import ROOT, job_env

# A writer: FILES files with its pid in each, a pause between them (a wide window for the others to interleave).
WRITER = textwrap.dedent("""
    import os, sys, time
    from petastorm_balanced.io.cache_dir import Cache

    def write(url):
        path = url[len("file://"):]
        os.makedirs(path)
        for i in range(FILES):
            with open(os.path.join(path, f"part-{i}"), "w") as out:
                out.write(str(os.getpid()))
            if i == 0:
                print("writing", flush=True)
            time.sleep(PAUSE)

    time.sleep(max(0.0, float(sys.argv[2]) - time.time()))  # all writers look up the key at the same moment
    print("served", Cache.at(sys.argv[1]).write_once("k", write), flush=True)
""")


def _start(parent, files=5, pause=0.2, start_at=0.0):
    code = WRITER.replace("FILES", str(files)).replace("PAUSE", str(pause))
    return subprocess.Popen([sys.executable, "-c", code, str(parent), str(start_at)], cwd=ROOT, env=job_env(),
                            text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def _complete(folder: Path) -> bool:
    parts = sorted(folder.iterdir())
    return len(parts) == 5 and len({p.read_text() for p in parts}) == 1  # all of one writer's files


def test_concurrent_writers_end_with_one_complete_copy(tmp_path):
    start_at = time.time() + 8  # after every interpreter has started, even on a loaded machine
    writers = [_start(tmp_path, start_at=start_at) for _ in range(4)]
    outputs = [w.communicate(timeout=60) for w in writers]
    assert all(w.returncode == 0 for w in writers), outputs
    served = {line.split(" ", 1)[1] for out, _ in outputs for line in out.splitlines() if line.startswith("served")}
    assert served == {Cache.at(tmp_path).child("k")}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["k"], "a temporary folder or a second copy was left"
    racing = sum("writing" in out for out, _ in outputs)  # a writer that started late finds the copy: fine
    assert racing >= 2, "fewer than two writers overlapped: the race was not tested"
    assert _complete(tmp_path / "k")


def test_a_writer_killed_mid_write_is_never_served(tmp_path):
    writer = _start(tmp_path, pause=30)
    assert writer.stdout.readline().startswith("writing")
    os.kill(writer.pid, signal.SIGKILL)  # the process this test started
    writer.wait()
    cache = Cache.at(tmp_path)
    assert cache.lookup("k") is None
    half = [p for p in tmp_path.iterdir()]
    assert len(half) == 1 and half[0].name.startswith("k.") and len(list(half[0].iterdir())) == 1
    fresh = _start(tmp_path, pause=0)
    _, err = fresh.communicate(timeout=60)
    assert fresh.returncode == 0, err
    assert _complete(tmp_path / "k") and (tmp_path / "k" / "part-0").read_text() == str(fresh.pid)
    assert cache.sweep(older_than=3600) == 0  # the dead writer's folder is recent: kept
    os.utime(half[0], (time.time() - 7200, time.time() - 7200))
    assert cache.sweep(older_than=3600) == 1 and sorted(p.name for p in tmp_path.iterdir()) == ["k"]


def test_a_failed_write_leaves_nothing(tmp_path):
    cache = Cache.at(tmp_path)

    def fail(url):
        os.makedirs(url[len("file://"):])
        raise RuntimeError("disk full")

    with pytest.raises(RuntimeError, match="disk full"):
        cache.write_once("k", fail)
    assert list(tmp_path.iterdir()) == []


def test_delete_removes_only_its_own_copy(tmp_path):
    cache = Cache.at(tmp_path / "cache")
    for key in ("a", "b"):
        cache.write_once(key, lambda url: os.makedirs(url[len("file://"):]))
    (tmp_path / "cache" / "unrelated.txt").write_text("keep")
    assert cache.delete("a") and not cache.delete("a")
    assert sorted(p.name for p in (tmp_path / "cache").iterdir()) == ["b", "unrelated.txt"]


@pytest.mark.parametrize("url", ["s3://bucket/cache", "gs://bucket/cache"])
def test_object_stores_are_refused(url):
    with pytest.raises(InvalidValueError, match="atomic folder rename"):
        Cache.at(url)
