"""A dataset's location (filesystem and root) is resolved once per plan: the loader's schema pass, its list scan and
every epoch's readers share ``plan.location``, and a plan loaded from a URL takes it from its staleness listing."""
import pickle
import sys

import pyarrow.fs as pafs

from petastorm_balanced import load_plan, make_loader, plan_shards
from petastorm_balanced.io import dataset as io_dataset
from petastorm_balanced.io.location import DatasetLocation


def _count_dataset_root(monkeypatch) -> list:
    """Every ``dataset_root`` call from any module of the package (each imports it by name)."""
    calls: list = []
    real = io_dataset.dataset_root

    def counted(url):
        calls.append(url)
        return real(url)
    for name, module in list(sys.modules.items()):
        if name.startswith("petastorm_balanced") and getattr(module, "dataset_root", None) is real:
            monkeypatch.setattr(module, "dataset_root", counted)
    return calls


def test_a_loader_of_a_plan_url_never_resolves_the_root_again(plain_dataset, tmp_path, monkeypatch):
    url = str(tmp_path / "plan")
    plan_shards(plain_dataset.url, 2, batch_size=32, engine="local", output_url=url)
    calls = _count_dataset_root(monkeypatch)
    for backend in ("arrow", "auto"):
        with make_loader(0, 2, plan=url, backend=backend, workers_count=1) as loader:
            epochs = [sum(1 for _ in loader) for _ in range(2)]
        assert epochs[0] == epochs[1] == len(loader) > 0
    assert calls == []  # the listing that checked the plan against its dataset (G7) resolved it


def test_a_plan_in_memory_resolves_its_location_once(plain_dataset, monkeypatch):
    plan = pickle.loads(pickle.dumps(plan_shards(plain_dataset.url, 2, batch_size=32, engine="local")))
    assert "location" not in plan.__dict__  # as a spawned DataLoader worker receives it
    calls = _count_dataset_root(monkeypatch)
    with make_loader(0, 2, plan=plan, backend="arrow", workers_count=1) as loader:
        for _ in range(2):
            sum(1 for _ in loader)
    assert calls == [plan.dataset_url]
    assert plan.location.root == io_dataset.dataset_root(plan.dataset_url)[1]


def test_the_location_is_not_pickled_and_a_forked_process_resolves_its_own_filesystem(plain_dataset, tmp_path):
    url = str(tmp_path / "plan")
    plan_shards(plain_dataset.url, 2, batch_size=32, engine="local", output_url=url)
    plan = load_plan(url)
    assert "location" in plan.__dict__  # primed by the staleness listing
    copy = pickle.loads(pickle.dumps(plan))
    assert "location" not in copy.__dict__ and copy == plan
    assert copy.location == plan.location
    other = DatasetLocation(plan.location.url, plan.location.root, plan.location.filesystem, _pid=-1)  # "forked"
    assert isinstance(other.filesystem, pafs.LocalFileSystem) and other.root == plan.location.root
