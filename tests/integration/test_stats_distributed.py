"""A real torchrun job (gloo, two ranks) where one rank's share holds 3x the bytes: ``gather`` at the second
epoch's end (the first also pays each process's one-time start-up) names that rank as the slowest on every rank,
with a reading stage as its limit (the fast rank waits for it inside the all-reduce, which its loader counts as
training)."""
import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from petastorm_balanced import plan_shards
from tests.support.jobs import ROOT, torchrun

pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore::UserWarning")]
FILES, ROWS, LIGHT = 8, 3000, 4096  # files of one row group each; rows per file; bytes per light row


def write(path, heavy: set[str], light: int = LIGHT) -> None:
    """``FILES`` files of equal rows (one row group each) of ``light`` bytes a row; the rows of the files in
    ``heavy`` hold 3x the bytes (uncompressed: reading them costs in proportion to their bytes)."""
    path.mkdir(parents=True)
    rng = np.random.default_rng(0)
    for i in range(FILES):
        name = f"part-{i}.parquet"
        width = 3 * light if name in heavy else light
        raw = rng.integers(0, 4, size=ROWS * width, dtype=np.uint8).tobytes()
        blob = pa.array([raw[j * width:(j + 1) * width] for j in range(ROWS)], type=pa.binary())
        table = pa.table({"id": np.arange(i * ROWS, (i + 1) * ROWS), "blob": blob})
        pq.write_table(table, path / name, compression="NONE", use_dictionary=False)


def share_files(plan, rank: int) -> set[str]:
    return {f.path for f in plan.assignment(rank)}


def share_bytes(plan, rank: int, heavy: set[str]) -> int:
    return sum(f.num_rows * (3 * LIGHT if f.path in heavy else LIGHT) for f in plan.assignment(rank))


def test_the_rank_with_three_times_the_bytes_is_named_slowest(tmp_path):
    write(tmp_path / "light", set(), light=8)  # the shape alone: which files each rank reads
    light = plan_shards((tmp_path / "light").as_uri(), 2, batch_size=100, engine="local")
    heavy_rank = 1
    heavy_files = share_files(light, heavy_rank) - share_files(light, 1 - heavy_rank)  # row groups split: neither
    write(tmp_path / "heavy", heavy_files)
    url = (tmp_path / "plan").as_uri()
    plan = plan_shards((tmp_path / "heavy").as_uri(), 2, batch_size=100, engine="local", output_url=url)
    assert share_files(plan, heavy_rank) == share_files(light, heavy_rank)  # same shape, same shares
    ratio = share_bytes(plan, heavy_rank, heavy_files) / share_bytes(plan, 1 - heavy_rank, heavy_files)
    assert ratio >= 2.5, ratio  # about 3x the bytes (a row group split between the ranks stays light)
    torchrun(2, ROOT / "tests" / "support" / "stats_job.py", url, tmp_path / "report.json", timeout=300)
    report = json.loads((tmp_path / "report.json").read_text())
    waits = report["wait_s"]
    assert report["slowest_rank"] == heavy_rank, report
    assert waits[heavy_rank] > 1.3 * waits[1 - heavy_rank], waits
    assert report["limit"] in ("read", "decode", "list", "batch", "convert"), report  # a stage, not "training"
    fast, slow = report["ranks"][1 - heavy_rank], report["ranks"][heavy_rank]
    assert fast["training_s"] > slow["training_s"], report  # the fast rank waited for it inside the all-reduce
