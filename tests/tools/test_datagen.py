"""The generated datasets are the ground truth of other tests, so check that they really are skewed, that
petastorm's own readers accept them unchanged, and that a seed pins them byte for byte."""
import os

import numpy as np
import pyarrow.parquet as pq
import pytest

from petastorm_balanced.datagen import main, make_petastorm_dataset, make_plain_dataset
from tests.support.stacks import petastorm_only

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning")  # petastorm 0.12.1 uses pyarrow's legacy API


def _footer_row_groups(info):
    out = []
    for rel in info.files:
        md = pq.ParquetFile(os.path.join(info.path, rel)).metadata
        out += [(rel, i, md.row_group(i).num_rows) for i in range(md.num_row_groups)]
    return sorted(out)


def test_plain_layout_is_skewed(tmp_path):
    info = make_plain_dataset(tmp_path / "ds", num_files=8, total_rows=6000, seed=1, empty_files=1)
    assert info.kind == "plain" and info.partition_columns == ()
    assert info.files == tuple(f"part-{i:05d}.parquet" for i in range(8))
    assert (tmp_path / "ds" / "_SUCCESS").stat().st_size == 0
    assert _footer_row_groups(info) == list(info.row_groups)  # footers match the reported truth exactly
    rg_sizes = [n for _, _, n in info.row_groups]
    assert sum(rg_sizes) == info.num_rows == 6000
    assert max(rg_sizes) > 5 * min(rg_sizes)
    file_rows = [pq.ParquetFile(os.path.join(info.path, f)).metadata.num_rows for f in info.files]
    assert file_rows.count(0) == 1
    non_empty = [n for n in file_rows if n]
    assert max(non_empty) > 2 * min(non_empty)
    en_share = []
    for f, n in zip(info.files, file_rows, strict=True):
        if n:
            lang = pq.read_table(os.path.join(info.path, f), columns=["lang"]).column("lang").to_numpy()
            en_share.append(np.mean(lang == "en"))
    assert min(en_share) < 0.3 and max(en_share) > 0.7
    ids = pq.read_table(info.path).column("id").to_numpy()
    assert np.array_equal(np.sort(ids), np.arange(6000))


def _batch_reader_columns(info):
    from petastorm import make_batch_reader
    cols = {}
    with make_batch_reader(info.url, num_epochs=1, reader_pool_type="dummy") as reader:
        for batch in reader:
            for name in batch._fields:
                cols.setdefault(name, []).append(np.asarray(getattr(batch, name)))
    return {k: np.concatenate(v) for k, v in cols.items()}


@petastorm_only
@pytest.mark.parametrize("hive", [False, True])
def test_make_batch_reader_returns_every_id_once(tmp_path, hive):
    info = make_plain_dataset(tmp_path / "ds", num_files=6, total_rows=3000, seed=2, hive=hive, empty_files=1)
    cols = _batch_reader_columns(info)
    assert np.array_equal(np.sort(cols["id"]), np.arange(3000))
    if hive:
        assert info.partition_columns == ("year",)
        assert all(f.startswith("year=") for f in info.files)
        assert "year" not in pq.ParquetFile(os.path.join(info.path, info.files[0])).schema_arrow.names
        assert set(cols["year"].tolist()) == {2020, 2021, 2022}
    else:
        assert "year" not in cols


@petastorm_only
def test_make_reader_decodes_petastorm_dataset(tmp_path):
    from petastorm import make_reader
    info = make_petastorm_dataset(tmp_path / "ds", num_files=5, total_rows=1500, seed=3, empty_files=1)
    assert info.kind == "petastorm" and _footer_row_groups(info) == list(info.row_groups)
    ids = []
    with make_reader(info.url, num_epochs=1, reader_pool_type="dummy") as reader:
        for row in reader:
            ids.append(row.id)
            assert row.vec.shape == (4,) and row.vec.dtype == np.float32
            assert row.image.shape == (8, 8) and row.image.dtype == np.uint8
            assert row.lang in ("en", "de", "fr", "es", "ja")
    assert sorted(ids) == list(range(1500))


def _tree_bytes(root):
    out = {}
    for dirpath, _, names in os.walk(root):
        for name in names:
            full = os.path.join(dirpath, name)
            out[os.path.relpath(full, root)] = open(full, "rb").read()
    return out


@pytest.mark.parametrize("kind", ["plain", "hive", pytest.param("petastorm", marks=petastorm_only)])
def test_same_seed_same_bytes(tmp_path, kind):
    def gen(name, seed):
        if kind == "petastorm":
            return make_petastorm_dataset(tmp_path / name, num_files=4, total_rows=800, seed=seed)
        return make_plain_dataset(tmp_path / name, num_files=4, total_rows=800, seed=seed, hive=kind == "hive")
    a, b, c = gen("a", 7), gen("b", 7), gen("c", 8)
    assert (a.files, a.row_groups) == (b.files, b.row_groups)
    assert _tree_bytes(a.path) == _tree_bytes(b.path)
    assert _tree_bytes(a.path) != _tree_bytes(c.path)


def test_refuses_non_empty_dir_and_cli(tmp_path, capsys):
    (tmp_path / "x").mkdir()
    (tmp_path / "x" / "stale.parquet").write_bytes(b"")
    with pytest.raises(FileExistsError):
        make_plain_dataset(tmp_path / "x", total_rows=100)
    assert main([str(tmp_path / "cli"), "--kind", "hive", "--rows", "500", "--files", "3", "--seed", "4"]) == 0
    line = capsys.readouterr().out.strip()
    assert line.startswith("kind=plain partitions=year rows=500 files=3") and "\n" not in line
