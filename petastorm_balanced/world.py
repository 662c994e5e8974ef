"""Who we are in the job: rank and world size as a value, with environment detection kept apart.

Detection never guesses: a partially set or malformed environment is an error, because a silent rank 0 makes
every rank read the same data.
"""
from __future__ import annotations

import json
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass

from .core.params import check_int
from .errors import InvalidValueError

# (rank variable, size variable, launcher), in the order they are trusted: the most specific launcher first. A
# torchrun, horovodrun or mpirun started inside a SLURM job (by srun or in an sbatch script) inherits SLURM's
# variables, which then describe SLURM's tasks rather than these processes, so SLURM comes last.
_ENV_PAIRS = (
    ("RANK", "WORLD_SIZE", "torchrun"),
    ("HOROVOD_RANK", "HOROVOD_SIZE", "Horovod"),
    ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "Open MPI"),
    ("PMI_RANK", "PMI_SIZE", "MPICH"),
    ("SLURM_PROCID", "SLURM_NTASKS", "SLURM (srun)"),
)
# Read and checked with SLURM's pair (a malformed value is an error like the others), though World keeps no local rank.
_SLURM_LOCAL = "SLURM_LOCALID"


# Frameworks start the process group late, or launch with no distributed environment at all.
FRAMEWORK_HINT = ("With a framework, build the loader where the processes already exist: in Lightning's "
                  "train_dataloader() (or petastorm_balanced.lightning.BalancedDataModule), after "
                  "Accelerator() with accelerate; and launch with torchrun --nproc_per_node=N (accelerate launch "
                  "--cpu may start a single process without RANK/WORLD_SIZE). See docs/integrations.md")


@dataclass(frozen=True)
class World:
    """A rank inside a world of ``size`` ranks."""

    rank: int
    size: int

    def __post_init__(self) -> None:
        check_rank_world(self.rank, self.size)

    @classmethod
    def detect(cls, environ: Mapping[str, str] | None = None) -> World:
        """Rank and world size from the job's launcher, trusted in this order (the first one present decides):

        1. an initialized ``torch.distributed`` process group, else an initialized ``jax.distributed``
           (``jax.process_index()``/``jax.process_count()``) (only when ``environ`` is not given);
        2. torchrun: ``RANK``/``WORLD_SIZE`` (also when torchrun itself was started by srun);
        3. Horovod: ``HOROVOD_RANK``/``HOROVOD_SIZE``;
        4. Open MPI: ``OMPI_COMM_WORLD_RANK``/``OMPI_COMM_WORLD_SIZE``;
        5. MPICH/PMI: ``PMI_RANK``/``PMI_SIZE``;
        6. SLURM: ``SLURM_PROCID``/``SLURM_NTASKS`` (``srun python train.py``; ``SLURM_LOCALID`` is checked too);
        7. TensorFlow: ``TF_CONFIG`` (``MultiWorkerMirroredStrategy``): the chief is rank 0, then the workers in
           order; a task that does not train (``evaluator``, ``ps``) is an error.

        A launcher with one of its pair missing, or a value that is not an integer or out of range, is an error, never
        a silent rank 0. Raises ``RuntimeError`` when nothing names the world: pass ``rank``/``world`` explicitly.
        """
        if environ is None:
            environ = os.environ
            dist = _initialized_torch_distributed()
            if dist is not None:
                return cls(dist.get_rank(), dist.get_world_size())
            jax = _initialized_jax_distributed()
            if jax is not None:
                return cls(jax.process_index(), jax.process_count())
        for rank_var, size_var, launcher in _ENV_PAIRS:
            if rank_var in environ or size_var in environ:
                if rank_var not in environ or size_var not in environ:
                    missing = size_var if rank_var in environ else rank_var
                    raise RuntimeError(f"{launcher} environment is incomplete: {missing} is not set "
                                       f"(set both {rank_var} and {size_var}, or pass rank= and world=)")
                if rank_var == "SLURM_PROCID" and _SLURM_LOCAL in environ:
                    _parse_env_int(environ, _SLURM_LOCAL)
                return cls(_parse_env_int(environ, rank_var), _parse_env_int(environ, size_var))
        if _TF_CONFIG in environ:
            return cls(*_tf_config_world(environ[_TF_CONFIG]))
        raise RuntimeError("cannot detect rank and world size: neither torch.distributed nor jax.distributed is "
                           "initialized and none of " + ", ".join(f"{r}/{s}" for r, s, _ in _ENV_PAIRS)
                           + f", {_TF_CONFIG} is set; pass rank= and world= explicitly. " + FRAMEWORK_HINT)


def resolve_world(rank: int | None, world: int | None) -> World:
    """Explicit ``rank``/``world`` win; both missing means detect; one missing is an error."""
    if rank is None and world is None:
        return World.detect()
    if rank is None or world is None:
        missing = "rank" if rank is None else "world"
        raise InvalidValueError(f"{missing}=None while the other is given; pass both rank and world, or neither to "
                                "detect them from the environment")
    return World(rank, world)


def check_rank_world(rank: int, size: int) -> None:
    check_int("rank", rank)
    size = check_int("world_size", size, minimum=1)
    check_int("rank", rank, minimum=0, maximum=size - 1, hint=f" (world_size={size}; ranks count from 0)")


def _parse_env_int(environ, name) -> int:
    text = environ[name]
    try:
        return int(text.strip())
    except ValueError:
        raise RuntimeError(f"environment variable {name}={text!r} is not an integer") from None


_TF_CONFIG = "TF_CONFIG"
_TF_TRAINING_TASKS = ("chief", "worker")  # MultiWorkerMirroredStrategy's collective: the chief first


def _tf_config_world(text: str) -> tuple[int, int]:
    """(rank, world size) of this task in a ``TF_CONFIG`` of ``MultiWorkerMirroredStrategy``."""
    try:
        config = json.loads(text)
        cluster, task = config["cluster"], config["task"]
        kind, index = task["type"], task["index"]
        sizes = {name: len(cluster.get(name) or ()) for name in _TF_TRAINING_TASKS}
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise RuntimeError(f"{_TF_CONFIG}={text!r} is not a TensorFlow cluster spec with 'cluster' and 'task' "
                           f"{{'type', 'index'}} ({exc!r}); fix it, or pass rank= and world=") from None
    if kind not in _TF_TRAINING_TASKS:
        raise RuntimeError(f"{_TF_CONFIG} names task type {kind!r}, which reads no training data here (the ranks are "
                           f"the {' and '.join(_TF_TRAINING_TASKS)} tasks of MultiWorkerMirroredStrategy); pass "
                           "rank= and world= for another role")
    if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < sizes[kind]:
        raise RuntimeError(f"{_TF_CONFIG} task index {index!r} is not one of the {sizes[kind]} {kind!r} tasks of its "
                           "cluster")
    rank = index if kind == "chief" else sizes["chief"] + index
    return rank, sizes["chief"] + sizes["worker"]


def _initialized_jax_distributed():
    if "jax" not in sys.modules:  # never import jax just to ask
        return None
    import jax
    is_initialized = getattr(jax.distributed, "is_initialized", None)
    if is_initialized is not None and is_initialized():
        return jax
    return None


def _initialized_torch_distributed():
    if "torch" not in sys.modules:  # never import torch just to ask
        return None
    import torch.distributed as dist
    if dist.is_available() and dist.is_initialized():
        return dist
    return None
