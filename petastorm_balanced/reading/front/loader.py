"""``make_loader`` / ``BalancedLoader``: equal steps on every rank, as batches of torch tensors (or numpy arrays).

Every rank yields exactly ``len(loader) == plan.steps_per_epoch(world, batch_size)`` batches of exactly
``batch_size`` rows (G1). The rows are the plan's assignment for the epoch (a fresh one per epoch, G5), read in
plan order, then shuffled in fixed windows seeded by ``[seed, epoch, rank, slot, window]`` (G4: same plan, epoch,
world, rank give the same batches for any pool and worker count). Resuming
(G6) needs only the epoch and the number of batches delivered: fragments before the current shuffle window are
skipped arithmetically, and only the window in progress is read again. The row groups are read by the Arrow
backend (``backends/arrow.py``) or Petastorm's reader (``backends/petastorm.py``); the batches are the same.
"""
from __future__ import annotations

import itertools
import weakref
from collections.abc import Generator, Iterator, Sequence
from fractions import Fraction
from typing import Any, Self

from ...errors import InvalidValueError
from ...plan.model import ShardPlan
from ..backends.reader_arguments import check_petastorm_kwargs, petastorm_only, reader_options
from ..formats.device import NO_FEED, Feed, check_feed, close_iterator, delivered
from ..formats.tensors import TORCH, format_batches, format_groups
from ..mixing.mixture import MixturePosition, MixtureSettings
from ..options import SHUFFLE_BUDGET, SPILL_BUDGET, LoaderOptions
from ..planned_view import PlannedView
from ..source import stream
from ..source.position import Position
from ..source.settings import Settings
from .pipeline import pipeline
from .request import LoaderRequest, resolve_request

# What the loader owns on top of the reader's owned arguments, and what to do instead.
LOADER_REFUSED = {
    "seed": "rows are shuffled from the plan's seed (plan_shards(seed=...)), the epoch and the rank",
    "shuffle_rows": "use shuffle= and shuffle_window= of make_loader",
}


class BalancedLoader(PlannedView[Settings | MixtureSettings, Position | MixturePosition]):
    """Batches of one rank: ``for batch in loader`` is one epoch; the next ``iter()`` serves the next one.

    Only delivered batches and ``set_epoch`` move the position (``position.Position``): an ``iter()`` abandoned
    before its first batch consumes nothing, and one abandoned mid-epoch is continued by the next ``iter()``.

    Batches are dicts of column name to tensor (strings as lists of str), plus a boolean ``_padding`` tensor with
    ``padding_mask=True``; with ``batch_format="numpy"`` numpy arrays instead of tensors (same keys, dtypes,
    shapes and lists: ``loader.schema``), and torch is never imported. ``state_dict()`` is the same on every rank
    (all ranks take the same steps), so a checkpoint written by rank 0 resumes every rank. Made by ``make_loader``
    from one ``LoaderRequest`` (``request.py``): one plan, or a mixture of plans (``loader.plan`` is then their
    tuple; its readers are ``mixture.MixtureReads``, a reader per source).
    """

    # state_dict keys
    EPOCH, BATCHES, IDENTITY_KEYS = Position.EPOCH, Position.BATCHES, Position.IDENTITY_KEYS
    _iterator: Any = None  # the iteration in progress (a generator, or a chain of lists: Recorder.grouped)

    def __init__(self, request: LoaderRequest, epoch: int = 0, feeding: Feed = NO_FEED):
        self._cut = format_batches(request.options.batch_format)  # refuses "torch" without torch, before any reading
        self._groups = format_groups(request.options.batch_format)
        stages = pipeline(request, epoch)
        self._settings, self._position = stages.settings, stages.position
        self.backend = request.backend
        self._feed = feeding  # pinned / copied ahead to a device (device.py); counted when delivered
        self._reads = stages.reads  # they live from epoch to epoch; stopped when the loader goes
        self._finalizer = weakref.finalize(self, self._reads.close)

    def __iter__(self) -> Iterator[dict[str, Any]]:
        if self._iterator is not None:
            self._iterator.close()  # one pool at a time
        # starts (and takes the position) at its first next(): a probe consumes nothing
        iterator: Iterator[dict[str, Any]]
        if self._feed.active:  # one batch held ahead: counted as handed on, the loop timed per batch
            iterator = self._iterator = self.recorder.measured(self._run())  # loader.stats(): the loop's waits
        else:  # lists of batches handed out in C, timed and counted per list (reading/stats.py)
            iterator = self._iterator = self.recorder.grouped(self._run(grouped=True))
        return iterator

    def _run(self, grouped: bool = False) -> Generator[Any, None, None]:
        settings, position = self._settings, self._position
        run, runs = self._reads.begin()  # takes the position
        self.recorder.begin(run.epoch)
        if grouped:
            try:
                for batch_run in runs:
                    for group in self._groups(batch_run, settings.batch_size or len(batch_run[stream.PADDING]),
                                              settings.padding_mask):
                        batches = iter(group)
                        position.handing(run, batches, len(group))  # counted as they leave `batches`
                        yield batches
            finally:
                close_iterator(runs)
            return
        # a token budget's batches come one per run (packed: the sequences); the runs' batches chained in C (no
        # generator frame of ours per batch)
        tensors = itertools.chain.from_iterable(self._cut(batch_run, settings.batch_size or len(
            batch_run[stream.PADDING]), settings.padding_mask) for batch_run in runs)
        yield from delivered(tensors, self._feed, run, runs)  # a batch held ahead counts once handed on

    @property
    def weights(self) -> tuple[Fraction, ...]:
        """The weights as read: fractions summing to 1 (one plan: ``(1,)``)."""
        return self._settings.weights

    def steps_of(self, epoch: int, stages=()) -> int:
        """Steps of ``epoch`` on this loader's world (after ``stages``: an elastic resume's earlier worlds), which an
        adapter that counts consumed batches across epochs (``petastorm_balanced.tf``) needs; one plan's only."""
        if not isinstance(self._settings, Settings):
            raise InvalidValueError("steps_of(epoch) counts one plan's epochs; a mixture's epoch is len(loader) "
                                    "(set by epoch_steps= or its scarcest source)")
        return int(self._settings.steps_of(epoch, stages))

    def set_epoch(self, epoch: int) -> None:
        """Serve ``epoch`` next (like ``DistributedSampler.set_epoch``); a position loaded for that same epoch by
        ``load_state_dict`` is kept, so calling ``set_epoch`` at the top of every epoch is safe after resuming."""
        self._position.set_epoch(epoch)

    def state_dict(self) -> dict:
        """The epoch and batch the next iteration serves (a mixture's: each source's ``[pass, row]`` and the
        schedule's phase, ``state["mixture"]``), and the settings they are valid for; the end of an epoch is saved
        as the start of the next one."""
        return self._position.state_dict()

    def load_state_dict(self, state: dict) -> None:
        """The next ``iter()`` continues exactly where ``state`` was saved; a state saved at another world size
        continues that epoch with the rows no rank had consumed, split evenly over this world (G10); a mixture's
        saved with other weights continues every source where it stood."""
        self._position.load_state_dict(state)

    def close(self) -> None:
        """Stop the readers' workers now (otherwise they wait for the next epoch, until the loader is collected)."""
        if self._iterator is not None:
            self._iterator.close()
            self._iterator = None
        self._reads.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def numpy_loader(framework: str, rank, world, plan, batch_size, kwargs: dict, places: str,
                 one_plan: str) -> BalancedLoader:
    """One plan's numpy batches for a framework adapter (``petastorm_balanced.tf``, ``.jax``), which decides the
    batch format and where arrays go (``places``): those arguments, and a mixture, are refused naming it."""
    owned = {"batch_format": f"{framework} takes numpy batches (batch_format='numpy' is set here)",
             "pin_memory": places, "device": places}
    for name, why in owned.items():
        if name in kwargs:
            raise InvalidValueError(f"{name}={kwargs[name]!r} is not accepted here: {why}")
    if isinstance(plan, (list, tuple)):
        raise InvalidValueError(f"plan=[...] (a mixture) is served to torch and numpy loops (make_loader); {one_plan}")
    return make_loader(rank, world, plan=plan, batch_size=batch_size, batch_format="numpy", **kwargs)


def make_loader(rank: int | None = None, world: int | None = None, *, plan: ShardPlan | str | Sequence[Any],
                batch_size: int | None = None, epoch: int = 0, shuffle: bool = True, reshuffle: str = "epoch",
                workers_count: int = 4, reader_pool_type: str = "thread", schema_fields: Sequence[Any] | None = None,
                padding_mask: bool = False, shuffle_window: int | None = None,
                shuffle_budget: int | str = SHUFFLE_BUDGET, shuffle_spill_dir: Any = None,
                shuffle_spill_budget: int | str = SPILL_BUDGET, backend: str = "auto", partition_epoch: int = 1,
                balance: str = "auto", cost_reduce: str = "sum", max_batch_cost: int | None = None,
                pin_memory: bool = False, device: Any = None, transform_spec: Any = None,
                weights: Sequence[float] | None = None, epoch_steps: int | None = None,
                list_format: Any = "auto", list_shapes: Any = None, batch_format: str = TORCH,
                pack: str | None = None, seq_len: int | None = None, long_documents: str = "split",
                **petastorm_kwargs: Any) -> BalancedLoader:
    """A ``BalancedLoader`` for rank ``rank`` of ``world`` (both default to ``World.detect()``).

    ``plan`` is a ShardPlan or a plan URL (loaded and checked against its dataset). A plan made for W ranks
    serves any ``world`` (G9). ``batch_size`` defaults to the plan's.

    Shuffling (G16): the rank's rows are permuted in windows of as many rows as ``shuffle_budget`` bytes hold
    (default 512 MiB of decoded rows of the columns read, ``loader.shuffle_window`` says how many rows that is).
    A rank whose rows fit in one window gets batches cut from one uniform permutation of all its rows, whatever
    order they are stored in; beyond that a batch mixes the row groups of its window (``petastorm-balanced inspect
    --shuffle-quality`` tells how close to i.i.d. that is). ``shuffle_window=N`` sets the rows instead. Memory per
    rank is about the budget plus ``workers_count + 4`` bundles (the Arrow backend's prefetch; a bundle is
    consecutive fragments of about 4 MiB of the decoded bytes per row measured on this rank's reads so far, so a
    row group larger than that is one bundle); the first batch comes when the first window is read, and a resume
    reads at most one window again. The window's rows come from the footers' estimate, and a window that holds more
    bytes than that sends the rest to local disk, so memory stays within the budget (docs/shuffle.md, "The bound").

    ``shuffle_spill_dir=DIR`` (a local folder, such as NVMe scratch): windows hold a rank's whole share (up to
    ``shuffle_spill_budget`` bytes of decoded rows, 64 GiB by default), what memory cannot hold written once to
    DIR and read back memory-mapped, so batches are as random as a uniform permutation's at any scale, each row
    read from storage once per epoch; the files are gone at the end of the epoch, at ``close()``, and (left by a
    crash) at the next start. The first batch then waits for the slot's whole share to be read.

    ``backend`` picks who reads the row groups: ``"arrow"`` (pyarrow threads, any stack), ``"petastorm"``
    (Petastorm's reader and pools; pyarrow < 15) or ``"auto"``: Arrow, which reads for less CPU per row, unless a
    reader argument only Petastorm honours is given (``reader_pool_type="process"``, ``hdfs_driver``,
    ``filesystem``, ...) and Petastorm imports. Both give identical batches (G12). With Petastorm, its other reader
    arguments pass through; the Arrow backend takes ``results_queue_size``, the retry policy's ``storage_options``
    and the local-disk cache (``cache_type``, ``cache_location``, ``cache_size_limit``). The arguments the plan
    owns are refused with what to do instead, and so are Petastorm-only ones with ``backend="arrow"``.

    ``partition_epoch=P`` splits each pass over the data into P sub-epochs: loader epoch ``e`` serves part ``e % P``
    of pass ``e // P`` (every rank the same steps in a part, parts differing by at most one step, no row twice in
    a pass). ``load_state_dict`` also takes a state saved at another world size (elastic resume, G10).

    Cost plans (``plan_shards(cost=...)``): ``balance="cost"`` (the default for them) arranges every shuffle window
    so that each step's batches cost about the same on every rank, with no communication (docs/how-it-works.md);
    ``cost_reduce="sum"`` for packed batches, ``"max"`` for padded ones (batch_size x longest row). Batches then
    carry each row's cost as ``_cost``. ``max_batch_cost=C`` with ``batch_size=None``: batches of as many rows as
    fit under C, the same number of steps on every rank.

    GPU feeding (``reading/formats/device.py``): ``pin_memory=True`` puts each batch's tensors in page-locked memory;
    ``device="cuda"`` (or ``"cuda:N"``, a ``torch.device``) also copies the next batch to that device on a side
    CUDA stream while the current step runs, so batches arrive on the device and a step never waits for a copy.
    Without CUDA both are refused with a typed error, never silently ignored. The batches, ``len()`` and
    ``state_dict()`` are those without them (the batch held ahead is not consumed); ``device="cpu"`` is exact and
    copies nothing.

    ``batch_format="numpy"``: dicts of numpy arrays instead of tensors (text and other list columns as lists, nulls
    as ``loader.schema`` says, as with torch), so nothing imports torch: the batches TensorFlow (``petastorm_balanced
    .tf``), JAX (``petastorm_balanced.jax``) or plain numpy code take. The arrays may be read-only views of the
    reading buffers (copy before writing into them); ``pin_memory`` and ``device`` are for torch batches only.

    ``transform_spec`` (a ``TransformSpec``, ours or Petastorm's; ``reading/rows/transform.py``): ``func`` gets each
    bundle's rows as a pandas DataFrame (Unischema cells decoded) in the reading threads or Petastorm's workers, and
    must return the same rows in the same order (checked: a typed error at that batch); ``edit_fields``,
    ``removed_fields`` and ``selected_fields`` shape ``loader.schema`` and the batches (a mixture's: every source's
    rows transformed alike). Not with ``balance="cost"``.

    A mixture (``reading/mixing/mixture.py``, G17): ``plan=[plan_a, plan_b, ...]`` with ``weights=[w_a, w_b, ...]``;
    every batch holds each source's share of ``batch_size`` rows and a ``_source`` tensor; ``epoch_steps`` sets the
    epoch length (default: until the scarcest source completes a pass).

    List columns of numbers (``reading/fields/list_shapes.py``): ``list_format="auto"`` delivers one whose rows all have
    one length as a ``(batch, k, ...)`` tensor (lengths read from the planned row groups when the loader is made),
    others as lists of Python lists; ``"tensor"`` refuses other lengths; ``"padded"`` gives ``(batch, longest,
    ...)`` values padded with 0 and a ``<name>__lengths`` tensor; ``"python"`` lists of lists. A dict sets it per
    column. ``list_shapes={"vec": (4,)}`` declares a shape instead of reading the lengths (checked on every batch:
    a row of another length is an error naming its file and row).

    Packed sequences for language models (``reading/batches/packing.py``, docs/packing.md): ``pack="tokens"``,
    ``seq_len=L`` and ``batch_size=S`` make every step ``S`` sequences of exactly ``L`` tokens of the list column
    ``tokens``: ``batch["tokens"]`` ``(S, L)``, ``tokens__segments`` (0 padding, k > 0 the k-th piece of the row),
    ``tokens__positions`` and ``tokens__cu_seqlens`` for flash-attention's varlen kernels. The plan needs each
    document's length as its cost (``cost="size(tokens)"`` or a column of counts); every rank takes the same steps
    and about the same attention cost per step. ``long_documents="split"`` (default) cuts a document longer than
    ``L`` into consecutive pieces, ``"drop"`` leaves it out.
    """
    options = LoaderOptions.of(locals())  # the options among the arguments, checked once (options.py)
    if batch_format != TORCH and (pin_memory or device is not None):
        raise InvalidValueError(f"pin_memory={pin_memory!r}, device={device!r} feed torch tensors; with "
                                f"batch_format={batch_format!r} leave them out and move the arrays yourself "
                                "(jax.device_put, tf.data), or use batch_format='torch'")
    fed = check_feed(pin_memory, device)
    check_petastorm_kwargs(petastorm_kwargs, LOADER_REFUSED)
    request = resolve_request(plan, rank, world, options, weights=weights, epoch_steps=epoch_steps,
                              backend=backend, petastorm_arguments=petastorm_only(petastorm_kwargs, reader_pool_type),
                              reader_options=lambda chosen: reader_options(chosen, workers_count, reader_pool_type,
                                                                           petastorm_kwargs))
    return BalancedLoader(request, epoch, fed)
