"""One process of a two-process JAX job on CPU (tests/test_jax.py): a jitted step over global batches.

    python jax_job.py RANK PORT PLAN_URL OUT_DIR STOP_AFTER [STATE_IN]

Runs epochs 0 and 1; with STOP_AFTER >= 0 it stops after that many steps and saves get_state(); with STATE_IN it
starts from that state. Records, per step, this process's ids and the global mean the jitted step computed.
"""
import json
import os
import sys

os.environ.setdefault("JAX_PLATFORMS", "cpu")
rank, port, plan_url, out_dir, stop_after = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4], \
    int(sys.argv[5])
state_in = sys.argv[6] if len(sys.argv) > 6 else None

import jax  # noqa: E402

jax.config.update("jax_enable_x64", True)  # ids are int64: JAX would narrow them otherwise
import jax.numpy as jnp  # noqa: E402
from jax.sharding import Mesh, NamedSharding, PartitionSpec  # noqa: E402

jax.distributed.initialize(coordinator_address=f"127.0.0.1:{port}", num_processes=2, process_id=rank)

from petastorm_balanced import World  # noqa: E402
from petastorm_balanced.jax import make_jax_iterator  # noqa: E402

assert World.detect() == World(rank, 2), World.detect()  # from jax.distributed
mesh = Mesh(jax.devices(), ("data",))
batches = make_jax_iterator(plan=plan_url, sharding=NamedSharding(mesh, PartitionSpec("data")), shuffle_window=64,
                            schema_fields=["id", "value"])
if state_in:
    batches.set_state(json.load(open(state_in)))


@jax.jit
def step(w, batch):
    x = batch["value"].astype(jnp.float32)
    loss = jnp.mean((w * x - x) ** 2)  # a mean over the global batch: every process's rows
    return w - 0.01 * jax.grad(lambda v: jnp.mean((v * x - x) ** 2))(w), loss, jnp.mean(batch["id"])


w = jnp.float32(0.5)
record, done = [], 0
epoch = batches.get_state()["epoch"]
while epoch < 2 and (stop_after < 0 or done < stop_after):
    for batch in batches:
        local = [int(i) for shard in batch["id"].addressable_shards for i in shard.data]
        w, loss, mean = step(w, batch)
        record.append({"ids": local, "global_mean": float(mean), "rows": int(batch["id"].shape[0])})
        done += 1
        if done == stop_after:
            break
    epoch = batches.get_state()["epoch"]
state = batches.get_state()
with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
    json.dump({"steps": record, "state": state, "len": len(batches)}, f)
print("process", rank, "done", len(record), flush=True)
