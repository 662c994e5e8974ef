"""Elastic Horovod over a balanced plan: a rank leaves mid-epoch, the others go on, no row is lost or repeated.

    horovodrun -np 2 --min-np 1 --max-np 2 --gloo --network-interface lo \\
        --host-discovery-script ./discover.sh python examples/train_horovod_elastic.py --plan PLAN --batch-size 32

(On one machine ``--network-interface`` is needed: without it Horovod's elastic driver waits for a second host to
detect the interfaces hosts share, and never starts. ``discover.sh`` prints ``localhost:2``; when it prints
``localhost:1`` Horovod removes rank 1 at the next ``state.commit()``.)

The loader's position is part of Horovod's elastic state (``hvd.elastic.TorchState``, next to the model and
optimizer): every ``--commit-every`` steps the ranks ``allgather`` the ids they delivered since the last commit into
the state's log, save ``loader.state_dict()`` and commit. When the world changes Horovod raises
``HostsUpdatedInterrupt`` inside that commit (state already saved) or, when a rank dies, restores the last commit;
either way every remaining rank then builds a loader for the new world and ``load_state_dict()``s the committed
position, which was saved at the old world size. The loader continues the epoch with exactly the rows no rank had
consumed, split evenly over the new world (elastic mid-epoch resume, G10), so a rolled-back step is read again by
the new world and a committed one never is. The next epoch is a normal epoch of the new world.

After each epoch every rank checks the state's log (the same on every rank: it is synced from rank 0): equal steps
on every rank within each world, no id delivered twice in the epoch, fewer than ``world * batch_size`` matching
rows left out (world: the last one of the epoch; policy pad: none). Any failure exits 1.

``--shrink-at STEP --hosts-file FILE`` is the test's way to remove a rank at a known point: at global step STEP of
the first epoch rank 0 rewrites the discovery script's hosts file with one slot fewer, waits ``--shrink-wait``
seconds for Horovod's driver (it polls the script every second) to notify the workers, and commits.
``--crash-at STEP`` makes the last rank exit abruptly (``os._exit``) when batch STEP of epoch 0 arrives: the others
fail in that step's allreduce, roll back to the last commit and go on without it. Horovod then blacklists the
crashed rank's host, so on one machine list two names for it in the discovery script (``localhost:1`` and
``127.0.0.1:1``): with a single ``localhost:2`` the whole host is blacklisted and the job stops.
"""
from __future__ import annotations

import json
import os
import sys
import time

import numpy as np
import torch
from train_ddp import FEATURES, build_model, build_parser, check_epoch, features, log, parse_args

from petastorm_balanced import load_plan, make_loader


def open_loader(hvd, state, plan, column, args):
    """A loader for the world as it is now, at the committed position (which may come from another world size)."""
    loader = make_loader(hvd.rank(), hvd.size(), plan=plan, batch_size=args.batch_size, epoch=state.epoch,
                         workers_count=args.workers, schema_fields=["id", column, "label"], padding_mask=True,
                         backend=args.backend)
    if state.loader is not None:
        loader.load_state_dict(state.loader)  # G10: a state saved at another world size resumes mid-epoch
    return loader


def commit(hvd, state, loader, pending: list) -> None:
    """Log what every rank delivered since the last commit, save the loader's position, commit (may interrupt)."""
    ids = np.concatenate([p[0] for p in pending]) if pending else np.zeros(0, np.int64)
    pads = np.concatenate([p[1] for p in pending]) if pending else np.zeros(0, bool)
    gathered = hvd.allgather_object((hvd.rank(), len(pending), ids, pads))
    state.log = state.log + ((state.epoch, hvd.size(), tuple(gathered)),)  # new tuples: save() does not copy
    state.loader = loader.state_dict()
    state.epoch = state.loader[loader.EPOCH]
    state.commit()


def where(saved) -> str:
    if saved is None:
        return "the start"
    return f"epoch {saved['epoch']} batch {saved['batches']} of world {saved['layout']['world_size']}"


def epoch_records(log_entries, epoch: int) -> list:
    """[(world, [(rank, steps, ids, padding)...])...] of one epoch, in commit order."""
    return [(world, list(ranks)) for e, world, ranks in log_entries if e == epoch]


def check_elastic_epoch(records: list, *, matching_rows: int, batch_size: int, policy: str) -> list:
    """(name, ok, detail) for one epoch served by one or more worlds, judged by ``check_epoch``. Pure.

    Each world's stretch is checked like a plain epoch for its steps: every rank took the same number, all full
    batches. Rows are checked over the whole epoch with the bound of its last world W' (elastic resume leaves out
    fewer than W' * batch_size rows): the epoch's ids go to ``check_epoch`` as W' entries, all in the first one.
    """
    phases = []  # [world, {rank: (steps, [ids...])}] per stretch of commits at one world size
    for world, ranks in records:
        if not phases or phases[-1][0] != world:
            phases.append([world, {}])
        for rank, steps, ids, _ in ranks:
            done, chunks = phases[-1][1].get(rank, (0, []))
            phases[-1][1][rank] = (done + steps, chunks + [ids])
    checks = []
    for world, per_rank in phases:
        steps = [per_rank.get(r, (0, []))[0] for r in range(world)]
        ids = [np.concatenate(per_rank[r][1]) if r in per_rank else np.zeros(0, np.int64) for r in range(world)]
        checks += [(f"{name} at world {world}", ok, detail) for name, ok, detail in
                   check_epoch(steps, steps[0], ids, [np.zeros(len(i), bool) for i in ids], matching_rows=0,
                               batch_size=batch_size, policy=policy) if name in ("equal steps", "full batches")]
    last = phases[-1][0] if phases else 1
    entries = [entry for _, ranks in records for entry in ranks]
    ids = [np.concatenate([e[2] for e in entries] or [np.zeros(0, np.int64)])] + [np.zeros(0, np.int64)] * (last - 1)
    pads = [np.concatenate([e[3] for e in entries] or [np.zeros(0, bool)])] + [np.zeros(0, bool)] * (last - 1)
    return checks + [c for c in check_epoch([0] * last, 0, ids, pads, matching_rows=matching_rows,
                                            batch_size=batch_size, policy=policy)
                     if c[0] not in ("equal steps", "full batches")]


def main(argv=None) -> int:
    parser = build_parser(__doc__.split("\n\n")[0])
    parser.add_argument("--commit-every", type=int, default=8, help="steps between elastic commits")
    parser.add_argument("--shrink-at", type=int, help="global step of epoch 0 at which rank 0 removes a slot")
    parser.add_argument("--hosts-file", help="the file the discovery script prints (rewritten by --shrink-at)")
    parser.add_argument("--crash-at", type=int, help="step of epoch 0 at which the last rank exits abruptly")
    parser.add_argument("--shrink-wait", type=float, default=5.0,
                        help="seconds rank 0 waits after rewriting --hosts-file, for Horovod to notice")
    args = parse_args(parser, argv)
    if (args.shrink_at is None) != (args.hosts_file is None):
        parser.error("--shrink-at and --hosts-file go together")
    try:
        import horovod.torch as hvd
    except ImportError:
        sys.exit("train_horovod_elastic.py needs Horovod with PyTorch support; see docs/distributed.md")
    hvd.init()
    plan = load_plan(args.plan)
    column, width = FEATURES[plan.catalog.kind]
    model = build_model(width, plan.seed)
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=args.lr),
                                         named_parameters=model.named_parameters())
    state = hvd.elastic.TorchState(model=model, optimizer=optimizer, epoch=0, loader=None, log=(), shrunk=False,
                                   failed=())
    state.register_reset_callbacks([lambda: log(hvd.rank(), f"reset: world={hvd.size()}")])

    @hvd.elastic.run
    def train(state) -> list:
        loader = open_loader(hvd, state, plan, column, args)
        try:
            while state.epoch < args.epochs:
                epoch = state.epoch
                loader.set_epoch(epoch)  # keeps a position loaded for this epoch
                log(hvd.rank(), f"epoch {epoch}: world={hvd.size()} steps={len(loader)} from {where(state.loader)}")
                pending = []
                for batch in loader:
                    step = loader.state_dict()[loader.BATCHES]  # batches of this epoch delivered so far
                    if args.crash_at == step and epoch == 0 and hvd.size() > 1 and hvd.rank() == hvd.size() - 1:
                        log(hvd.rank(), f"crashing at step {step} of epoch 0 (--crash-at)")
                        os._exit(3)  # no cleanup, like a lost node: the others fail in the next collective
                    x, y = features(batch, column, torch.device("cpu"))
                    loss = torch.nn.functional.cross_entropy(model(x), y)
                    optimizer.zero_grad()
                    loss.backward()
                    optimizer.step()
                    pending.append((batch["id"].numpy().astype(np.int64), batch["_padding"].numpy().astype(bool)))
                    shrink = (args.shrink_at is not None and not state.shrunk and epoch == 0
                              and step >= args.shrink_at and hvd.size() > 1)
                    if shrink:
                        state.shrunk = True
                        if hvd.rank() == 0:
                            with open(args.hosts_file, "w") as out:
                                out.write(f"localhost:{hvd.size() - 1}\n")
                            log(0, f"removing a slot at step {args.shrink_at}; waiting {args.shrink_wait} s")
                            time.sleep(args.shrink_wait)
                    if shrink or len(pending) == args.commit_every:
                        commit(hvd, state, loader, pending)
                        pending = []
                commit(hvd, state, loader, pending)  # the epoch's end: the position is the next epoch's start
                checks = check_elastic_epoch(epoch_records(state.log, epoch), matching_rows=plan.total_rows,
                                             batch_size=args.batch_size, policy=plan.policy)
                if hvd.rank() == 0:
                    for name, ok, detail in checks:
                        print(f"CHECK epoch {epoch} {name}: {'OK' if ok else 'FAILED'} ({detail})", flush=True)
                state.failed = state.failed + tuple((epoch, name) for name, ok, _ in checks if not ok)
                state.commit()  # the verdict too, so a later rollback cannot lose it
        finally:
            loader.close()
        return list(state.failed)

    failed = train(state)
    if hvd.rank() == 0 and args.ids_out:
        os.makedirs(args.ids_out, exist_ok=True)
        with open(os.path.join(args.ids_out, "elastic.json"), "w") as out:
            json.dump({"batch_size": args.batch_size, "policy": plan.policy, "matching_rows": plan.total_rows,
                       "commits": [{"epoch": e, "world": w, "ranks": [
                           {"rank": r, "steps": s, "ids": i.tolist(), "padding": p.tolist()} for r, s, i, p in ranks]}
                           for e, w, ranks in state.log]}, out)
    rank, world = hvd.rank(), hvd.size()
    hvd.join()
    hvd.shutdown()
    if rank == 0:
        print(("ALL CHECKS PASSED" if not failed else f"CHECKS FAILED: {failed}")
              + f" ({args.epochs} epochs, final world={world}, elastic)", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
