"""One resume contract (G6) for every stateful loader.

``make()`` builds a fresh loader; ``next_epoch(loader)`` starts its next iteration (``iter(loader)``, or
``iter(dataloader)`` for a DataLoader wrapper). The loader has ``state_dict``/``load_state_dict``/``set_epoch``.
``cuts`` are the batch counts to save at; ``c <= 0`` counts from the end (0: the whole epoch, -1: all but one).
A batch is compared by its ids and padding flags, so "the same batch" means the same rows in the same order.

Checked, against an uninterrupted run of ``epochs`` epochs:
- saving after ``c`` batches of an epoch (several midpoints, the last batch, the whole epoch) and loading into a
  fresh loader gives exactly the batches that would have come next, then the following epochs;
- the same across an epoch boundary (saved inside the second epoch);
- ``set_epoch(e)`` right after loading a position in epoch ``e`` keeps the position (the usual training loop);
- ``state_dict()`` right after ``load_state_dict`` gives the loaded position back;
- loading is strict: a missing key raises ``KeyError``, a state from other settings ``ValueError``.
"""
from itertools import islice

from petastorm_balanced.reading.state import flat, nest


def fingerprint(batch) -> tuple:
    ids = tuple(int(i) for i in batch["id"])
    padding = tuple(bool(p) for p in batch["_padding"]) if "_padding" in batch else ()
    return ids + padding


def take(iterator, count=None) -> list:
    try:
        return [fingerprint(b) for b in (iterator if count is None else islice(iterator, count))]
    finally:  # a DataLoader's worker processes are stopped here, not by whichever later test's collection finds them
        shutdown = getattr(iterator, "_shutdown_workers", None)
        if shutdown is not None:
            shutdown()


def check_resume_contract(make, next_epoch, *, epochs: int = 3, cuts=None) -> None:
    reference_loader = make()
    reference = [take(next_epoch(reference_loader)) for _ in range(epochs)]
    steps = len(reference[0])
    assert steps >= 4, "use a plan with at least 4 steps per epoch"
    assert all(len(epoch) == steps for epoch in reference), "every epoch has the same number of batches"
    assert reference[0] != reference[1], "consecutive epochs must differ (G5)"

    # cuts <= 0 count from the end of the epoch: 0 is the whole epoch, -1 its last batch
    cuts = sorted({c if c > 0 else steps + c for c in (cuts or [1, steps // 3, steps // 2, -1, 0])})
    for epoch in range(min(2, epochs - 1)):  # inside the first epoch, and across into the next one
        for cut in cuts:
            loader = make()
            for _ in range(epoch):
                take(next_epoch(loader))
            head = take(next_epoch(loader), cut)
            assert head == reference[epoch][:cut]
            state = loader.state_dict()

            resumed = make()
            resumed.load_state_dict(state)
            assert resumed.state_dict() == state, "a loaded state must read back unchanged"
            resumed.set_epoch(state["epoch"])  # the training loop's set_epoch keeps the loaded position
            rest = take(next_epoch(resumed))
            if cut < steps:
                assert rest == reference[epoch][cut:], f"resume at batch {cut} of epoch {epoch}"
                following = epoch + 1
            else:
                assert state["epoch"] == epoch + 1 and state["batches"] == 0, "an ended epoch saves the next one"
                assert rest == reference[epoch + 1], f"resume after the whole epoch {epoch}"
                following = epoch + 2
            if following < epochs:
                assert take(next_epoch(resumed)) == reference[following], "the epoch after a resumed one"

    loader = make()
    state = loader.state_dict()
    for key in ("epoch", "batches"):
        broken = dict(state)
        del broken[key]
        try:
            make().load_state_dict(broken)
        except KeyError as exc:
            assert key in str(exc)
        else:
            raise AssertionError(f"load_state_dict accepted a state without {key!r}")
    values = flat(state)  # every key at the top (reading/state.py), to change one and nest it again
    name = "batch_size" if values["batch_size"] is not None else "max_batch_cost"  # token budgets: no batch size
    foreign = nest({**values, name: values[name] + 1})
    try:
        make().load_state_dict(foreign)
    except ValueError as exc:
        assert name in str(exc)
    else:
        raise AssertionError(f"load_state_dict accepted a state saved with another {name}")
