"""World detection: every launcher's variables, and no silent rank 0 when the environment is partial or malformed."""
import pytest

from petastorm_balanced import World
from petastorm_balanced.world import resolve_world

LAUNCHERS = [("RANK", "WORLD_SIZE"), ("HOROVOD_RANK", "HOROVOD_SIZE"),
             ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"), ("PMI_RANK", "PMI_SIZE"),
             ("SLURM_PROCID", "SLURM_NTASKS")]
ALL_VARS = [v for pair in LAUNCHERS for v in pair]


@pytest.fixture
def clean_env(monkeypatch):
    """os.environ without any launcher variable (the test runner may itself run under one)."""
    for name in ALL_VARS + ["LOCAL_RANK", "LOCAL_WORLD_SIZE"]:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.delenv("SLURM_LOCALID", raising=False)
    return monkeypatch


@pytest.mark.parametrize("rank_var, size_var", LAUNCHERS)
@pytest.mark.parametrize("rank, size", [(0, 1), (3, 4), (7, 64)])
def test_each_launcher(rank_var, size_var, rank, size):
    assert World.detect({rank_var: str(rank), size_var: str(size)}) == World(rank, size)


def test_torchrun_wins_over_mpi_variables():
    """horovodrun/mpirun set their own variables too; the first launcher in trust order decides."""
    env = {"RANK": "2", "WORLD_SIZE": "4", "OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "1",
           "LOCAL_RANK": "0"}
    assert World.detect(env) == World(2, 4)
    assert World.detect({"HOROVOD_RANK": "1", "HOROVOD_SIZE": "2", "PMI_RANK": "0", "PMI_SIZE": "2"}) == World(1, 2)


def test_reads_os_environ(clean_env):
    clean_env.setenv("OMPI_COMM_WORLD_RANK", "5")
    clean_env.setenv("OMPI_COMM_WORLD_SIZE", "6")
    assert World.detect() == World(5, 6)


def test_nothing_set_is_an_error_not_rank_zero(clean_env):
    with pytest.raises(RuntimeError, match="pass rank= and world="):
        World.detect()
    with pytest.raises(RuntimeError, match="cannot detect") as error:
        World.detect({})
    for hint in ("train_dataloader()", "torchrun", "Accelerator()", "docs/integrations.md"):  # frameworks' fix
        assert hint in str(error.value)
    with pytest.raises(RuntimeError):
        resolve_world(None, None)


@pytest.mark.parametrize("rank_var, size_var", LAUNCHERS)
def test_incomplete_environment_names_the_missing_variable(rank_var, size_var):
    with pytest.raises(RuntimeError, match=size_var):
        World.detect({rank_var: "1"})
    with pytest.raises(RuntimeError, match=rank_var):
        World.detect({size_var: "4"})


@pytest.mark.parametrize("rank_text, size_text, error, pattern", [
    ("one", "4", RuntimeError, "RANK='one'"), ("1", "", RuntimeError, "WORLD_SIZE=''"),
    ("1.0", "4", RuntimeError, "RANK"), ("4", "4", ValueError, "rank=4"), ("-1", "4", ValueError, "rank=-1"),
    ("0", "0", ValueError, "world_size=0"),
])
def test_malformed_environment_is_an_error(rank_text, size_text, error, pattern):
    with pytest.raises(error, match=pattern):
        World.detect({"RANK": rank_text, "WORLD_SIZE": size_text})


def test_whitespace_around_numbers_is_accepted():
    assert World.detect({"RANK": " 1\n", "WORLD_SIZE": "2 "}) == World(1, 2)


@pytest.mark.parametrize("rank, size, error, pattern", [
    (0, 0, ValueError, "world_size=0"), (2, 2, ValueError, "rank=2"), (-1, 2, ValueError, "rank=-1"),
    (True, 2, TypeError, "rank"), (0, 2.0, TypeError, "world_size"), ("0", 2, TypeError, "rank"),
])
def test_explicit_values_are_validated(rank, size, error, pattern):
    with pytest.raises(error, match=pattern):
        World(rank, size)


def test_resolve_world_explicit_wins_and_half_given_is_an_error(clean_env):
    clean_env.setenv("RANK", "0")
    clean_env.setenv("WORLD_SIZE", "2")
    assert resolve_world(1, 2) == World(1, 2)
    assert resolve_world(None, None) == World(0, 2)
    with pytest.raises(ValueError, match="world=None"):
        resolve_world(1, None)
    with pytest.raises(ValueError, match="rank=None"):
        resolve_world(None, 2)


def test_initialized_torch_distributed_wins_over_environment(clean_env):
    """A real single-process gloo group; torch is imported by the loader tests anyway, so this costs ~nothing."""
    dist = pytest.importorskip("torch.distributed")
    if dist.is_initialized():
        pytest.skip("another test left torch.distributed initialized")
    clean_env.setenv("RANK", "3")  # a stale environment that must lose to the initialized group
    clean_env.setenv("WORLD_SIZE", "8")
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        assert World.detect() == World(0, 1)
        assert World.detect({"RANK": "3", "WORLD_SIZE": "8"}) == World(3, 8)  # an explicit mapping is read as is
    finally:
        dist.destroy_process_group()
    assert World.detect() == World(3, 8)


def test_slurm_after_every_other_launcher():
    """srun python train.py sets SLURM's variables only; a torchrun (or horovodrun, mpirun) that srun started
    inherits them, and its own per-process variables win."""
    slurm = {"SLURM_PROCID": "3", "SLURM_NTASKS": "8", "SLURM_LOCALID": "1"}
    assert World.detect(slurm) == World(3, 8)
    assert World.detect({**slurm, "RANK": "5", "WORLD_SIZE": "16"}) == World(5, 16)
    assert World.detect({**slurm, "HOROVOD_RANK": "0", "HOROVOD_SIZE": "2"}) == World(0, 2)
    assert World.detect({**slurm, "OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "2"}) == World(1, 2)
    assert World.detect({**slurm, "PMI_RANK": "6", "PMI_SIZE": "8"}) == World(6, 8)


def test_slurm_from_os_environ(clean_env):
    clean_env.setenv("SLURM_PROCID", "1")
    clean_env.setenv("SLURM_NTASKS", "2")
    assert World.detect() == World(1, 2)


@pytest.mark.parametrize("env, error, pattern", [
    ({"SLURM_PROCID": "x", "SLURM_NTASKS": "4"}, RuntimeError, "SLURM_PROCID='x'"),
    ({"SLURM_PROCID": "0", "SLURM_NTASKS": "4(x2)"}, RuntimeError, "SLURM_NTASKS='4\\(x2\\)'"),
    ({"SLURM_PROCID": "0", "SLURM_NTASKS": "4", "SLURM_LOCALID": ""}, RuntimeError, "SLURM_LOCALID=''"),
    ({"SLURM_PROCID": "4", "SLURM_NTASKS": "4"}, ValueError, "rank=4"),
    ({"SLURM_PROCID": "0"}, RuntimeError, "SLURM_NTASKS is not set"),
    ({"SLURM_NTASKS": "4", "SLURM_LOCALID": "0"}, RuntimeError, "SLURM_PROCID is not set"),
])
def test_malformed_slurm_environment_is_an_error(env, error, pattern):
    with pytest.raises(error, match=pattern):
        World.detect(env)
