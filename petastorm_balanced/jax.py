"""JAX: a process's balanced batches as ``jax.Array``s, assembled into global batches over a multi-process mesh.

Importing this module imports nothing of JAX; ``make_jax_iterator`` imports it when called.

Every process takes the same steps (G1), so a jitted step with a cross-process reduction (``jnp.mean`` over a
global batch, ``jax.lax.pmean``) never waits for a process that ran out. With ``sharding`` (a
``jax.sharding.NamedSharding`` over a mesh of every process's devices), each step's arrays are global: process
``p`` contributes its own rows (``jax.make_array_from_process_local_data``), so the global batch is ``batch_size x
process_count`` rows, every row read once by the process that holds it (G3). ``get_state()``/``set_state()`` work
as Grain's iterators: the state is the loader's ``state_dict()`` at the next batch, the same on every process, and
conversion reads nothing ahead, so a restored iterator continues with exactly that batch (G6).
"""
from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np

from .errors import InvalidValueError, MissingDependencyError
from .plan.model import ShardPlan
from .reading.fields.schema import TENSOR
from .reading.front.loader import BalancedLoader, numpy_loader


def _jax() -> Any:
    try:
        import jax
    except ImportError:
        raise MissingDependencyError("petastorm_balanced.jax needs JAX: pip install 'petastorm-balanced[jax]' "
                                     "(docs/frameworks.md)") from None
    return jax


def make_jax_iterator(rank: int | None = None, world: int | None = None, *, plan: ShardPlan | str,
                      sharding: Any = None, batch_size: int | None = None, **make_loader_kwargs: Any
                      ) -> JaxBatches:
    """``make_loader(rank, world, plan=plan, batch_size=batch_size, batch_format="numpy", ...)`` as ``jax.Array``s.

    ``rank``/``world`` default to ``jax.process_index()``/``jax.process_count()`` once ``jax.distributed`` is
    initialized (``World.detect()``). Without ``sharding`` each array is put on JAX's default device; with one, it
    is a global array of ``(batch_size x world, ...)`` rows laid out by ``sharding`` (which must span the
    processes of this world). Columns that ``loader.schema`` gives as lists (text) stay this process's lists.
    64-bit columns (int64, float64, timestamps) need ``jax_enable_x64``: without it JAX would narrow their values
    to 32 bits, so they are refused with the fix.
    """
    jax = _jax()
    loader = numpy_loader("JAX", rank, world, plan, batch_size, make_loader_kwargs,
                          "JAX places arrays itself (sharding=)", "make_jax_iterator takes one plan")
    wide = [c.name for c in loader.schema if c.kind == TENSOR and np.dtype(c.dtype).itemsize == 8]
    if wide and not jax.config.jax_enable_x64:
        raise InvalidValueError(f"columns {wide} are 64-bit, which JAX would silently narrow to 32 bits "
                                "(jax_enable_x64 is off); call jax.config.update('jax_enable_x64', True) first, or "
                                "leave them out (schema_fields=[...])")
    if sharding is not None:
        if not isinstance(sharding, jax.sharding.Sharding):
            raise InvalidValueError(f"sharding={sharding!r} must be a jax.sharding.Sharding (e.g. NamedSharding(mesh, "
                                    "PartitionSpec('data'))) or None")
        processes = {d.process_index for d in sharding.device_set}
        if len(processes) != loader.world_size:
            raise InvalidValueError(f"sharding spans the devices of {len(processes)} process(es) but the loader's "
                                    f"world is {loader.world_size}: a global batch is assembled from every rank's "
                                    "rows, so the mesh must cover exactly the processes of the world (jax.devices())")
        if loader.batch_size is None:
            raise InvalidValueError("sharding= needs batches of one size (batch_size=), not a token budget "
                                    "(max_batch_cost)")
    return JaxBatches(loader, sharding)


class JaxBatches:
    """Iterable: ``for batch in it`` is one epoch (the next ``iter()`` serves the next one, as the loader);
    ``len(it)`` its steps; ``get_state()``/``set_state()`` the position; ``it.loader`` the ``BalancedLoader``."""

    def __init__(self, loader: BalancedLoader, sharding: Any = None):
        self.loader, self.sharding = loader, sharding

    def __iter__(self) -> Iterator[dict[str, Any]]:
        jax = _jax()
        for batch in self.loader:
            yield {name: self._array(jax, value) for name, value in batch.items()}

    def _array(self, jax, value):
        if isinstance(value, list):
            return value
        if self.sharding is None:
            return jax.device_put(value)
        rows = value.shape[0] * self.loader.world_size
        return jax.make_array_from_process_local_data(self.sharding, np.ascontiguousarray(value),
                                                      (rows, *value.shape[1:]))

    def __len__(self) -> int:
        return len(self.loader)

    def set_epoch(self, epoch: int) -> None:
        self.loader.set_epoch(epoch)

    def get_state(self) -> dict:
        """The loader's ``state_dict()``: the epoch and batch the next step gets (JSON-serializable)."""
        return self.loader.state_dict()

    def set_state(self, state: dict) -> None:
        """Continue exactly at ``state`` (also one saved at another world size: G10)."""
        self.loader.load_state_dict(state)

    def stats(self) -> dict:
        """The loader's ``stats()`` (docs/stats.md); ``jax.device_put`` runs outside it, in the loop's time."""
        return self.loader.stats()
