"""TensorFlow and Keras: a rank's balanced batches as a ``tf.data.Dataset``, with its position in checkpoints.

Importing this module imports nothing of TensorFlow; the functions import it when called.

Why the pieces look as they do:

- **Batches** come from ``make_loader(..., batch_format="numpy")`` (no torch), so every rank takes the same steps
  (G1) and ``element_spec`` is ``loader.schema`` as TensorFlow types, known before the first batch.
- **Epochs.** ``make_tf_dataset`` is finite: one pass is one loader epoch, and every new pass (Keras starts one per
  epoch) serves the next epoch, freshly shuffled (G5); ``cardinality()`` is the steps per epoch.
  ``distribute_tf_dataset`` (``MultiWorkerMirroredStrategy``) is endless, epoch after epoch, since Keras keeps one
  iterator over a distributed dataset: ``fit(..., steps_per_epoch=len(position))``.
- **Strategies re-batch.** Handed to ``fit`` under a strategy with several replicas, a ``tf.data.Dataset``'s batch is
  taken as the *global* batch and split between the replicas (each worker then trains on part of each of its own
  batches: rows lost). ``distribute_tf_dataset`` builds each worker's dataset with
  ``strategy.distribute_datasets_from_function`` instead, which re-batches nothing. ``position.keras_callback()``
  raises if the model consumed more batches than the dataset delivered, which only a re-batching does.
- **Resume.** TensorFlow reads ahead (prefetching), so the batches handed to TensorFlow are not the batches the
  model trained on. ``position.keras_callback()`` counts the batches training consumed; the position
  (``DatasetPosition``, a ``tf.train.experimental.PythonState``) saves exactly that in any ``tf.train.Checkpoint``
  it belongs to, and restoring it makes the next pass continue with the next batch (G6). Attached to the model
  (``model.data_position = position``), Keras' ``BackupAndRestore`` saves and restores it with the model.
"""
from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from typing import Any

import numpy as np

from .errors import InvalidValueError, MissingDependencyError
from .plan.model import ShardPlan
from .reading.fields.schema import TENSOR, BatchSchema
from .reading.front.loader import BalancedLoader, numpy_loader


def _tf() -> Any:
    try:
        import tensorflow as tf
    except ImportError:
        raise MissingDependencyError("petastorm_balanced.tf needs TensorFlow: pip install 'petastorm-balanced[tf]' "
                                     "(docs/frameworks.md)") from None
    return tf


def make_tf_dataset(rank: int | None = None, world: int | None = None, *, plan: ShardPlan | str,
                    batch_size: int | None = None, **make_loader_kwargs: Any) -> Any:
    """A ``tf.data.Dataset`` of rank ``rank``'s batches: ``make_loader(rank, world, plan=plan,
    batch_size=batch_size, batch_format="numpy", **make_loader_kwargs)`` as dicts of tensors.

    Each pass is the loader's next epoch; ``cardinality()`` is its steps. ``ds.position`` is the
    ``DatasetPosition`` to checkpoint (and ``ds.position.loader`` the loader, for ``set_epoch``). Text columns are
    ``tf.string``; columns ``loader.schema`` gives as lists of other values, and text that may hold nulls, are
    refused (leave them out with ``schema_fields=``). Rank and world default to ``World.detect()``, which reads
    ``TF_CONFIG``. Under a multi-replica strategy use ``distribute_tf_dataset`` instead (module docstring).
    """
    tf = _tf()
    _refuse_strategy(tf)
    loader = _loader(rank, world, plan, batch_size, make_loader_kwargs)
    position = DatasetPosition.of(loader)
    dataset = tf.data.Dataset.from_generator(position.epoch_batches, output_signature=element_spec(loader.schema,
                                                                                                  loader.batch_size))
    dataset = dataset.apply(tf.data.experimental.assert_cardinality(len(loader))).with_options(_options(tf))
    dataset.position = position
    return dataset


def distribute_tf_dataset(strategy: Any, *, plan: ShardPlan | str, batch_size: int | None = None,
                          **make_loader_kwargs: Any) -> Any:
    """Each worker's balanced batches for ``strategy`` (``MultiWorkerMirroredStrategy``, one replica per worker),
    through ``strategy.distribute_datasets_from_function``: rank and world are the input pipeline's id and count,
    ``batch_size`` is each worker's batch (the global batch is ``batch_size x workers``).

    Endless (Keras keeps one iterator over it): ``model.fit(ds, epochs=E, steps_per_epoch=len(ds.position),
    callbacks=[ds.position.keras_callback(), ...])``. ``ds.position`` is the ``DatasetPosition``.
    """
    tf = _tf()
    made: list[DatasetPosition] = []

    def dataset_fn(context):
        if context.num_replicas_in_sync != context.num_input_pipelines:
            raise InvalidValueError(f"the strategy has {context.num_replicas_in_sync} replicas on "
                                    f"{context.num_input_pipelines} workers: distribute_tf_dataset serves one replica "
                                    "per worker (each worker's batches are one replica's); run one worker per device")
        loader = _loader(context.input_pipeline_id, context.num_input_pipelines, plan, batch_size,
                         make_loader_kwargs)
        position = DatasetPosition.of(loader)
        made.append(position)
        return tf.data.Dataset.from_generator(position.all_batches, output_signature=element_spec(
            loader.schema, loader.batch_size)).with_options(_options(tf))

    distributed = strategy.distribute_datasets_from_function(dataset_fn)
    if len(made) != 1:
        raise InvalidValueError(f"the strategy built {len(made)} input pipelines in this process; "
                                "distribute_tf_dataset serves one per worker")
    distributed.position = made[0]
    return distributed


def _refuse_strategy(tf) -> None:
    """``InvalidValueError`` when a strategy would re-batch this dataset (module docstring): a multi-replica strategy
    in scope, or a ``MultiWorkerMirroredStrategy`` made in this process (it must be made before any other TensorFlow
    work, so it exists when the dataset is made, in scope or not). Keras would otherwise fail deep in ``fit`` with
    "Input dataset was expected to contain N elements but contained only M", or lose rows."""
    strategy = tf.distribute.get_strategy() if tf.distribute.has_strategy() else None
    replicas = strategy.num_replicas_in_sync if strategy is not None else 1
    try:
        from tensorflow.python.eager import context
        collective = getattr(context.context(), "_collective_ops_server_def", None) is not None
    except ImportError:  # pragma: no cover - a TensorFlow without that module: the scope check alone
        collective = False
    if replicas > 1 or collective:
        what = (f"{type(strategy).__name__} ({replicas} replicas) is in scope" if replicas > 1 else
                "a MultiWorkerMirroredStrategy runs in this process")
        raise InvalidValueError(f"make_tf_dataset(...) while {what}: Keras would split each batch between the "
                                "replicas and shard the batches between workers (rows lost, or TensorFlow's 'Input "
                                "dataset was expected to contain N elements'); use distribute_tf_dataset(strategy, "
                                "plan=..., batch_size=...) instead (docs/frameworks.md)")


def _options(tf) -> Any:
    """No prefetch injected by tf.data's optimizer: a plain loop then reads exactly the batches it takes, so the
    position counted from what was handed over is what the loop consumed."""
    options = tf.data.Options()
    options.experimental_optimization.inject_prefetch = False
    return options


def _loader(rank, world, plan, batch_size, kwargs: dict) -> BalancedLoader:
    loader = numpy_loader("TensorFlow", rank, world, plan, batch_size, kwargs, "TensorFlow places tensors itself",
                          "TensorFlow datasets take one plan")
    element_spec(loader.schema, loader.batch_size)  # refuse what TensorFlow cannot hold before training starts
    return loader


def element_spec(schema: BatchSchema, batch_size: int | None) -> dict:
    """``loader.schema`` as ``tf.TensorSpec``s: tensors with their dtype and ``(batch, *shape)``, text and bytes
    as ``tf.string``; a token budget's batches (``batch_size=None``) have an unknown first dimension."""
    tf = _tf()
    spec = {}
    for column in schema:
        if column.kind == TENSOR:
            spec[column.name] = tf.TensorSpec((batch_size, *column.shape), tf.as_dtype(np.dtype(column.dtype)))
        elif column.item in ("str", "bytes") and column.nulls == "never":
            spec[column.name] = tf.TensorSpec((batch_size,), tf.string)
        else:
            what = "may hold nulls, which a tf.string tensor cannot show" if column.item in ("str", "bytes") else \
                f"is delivered as a list of {column.item} values ({column.arrow_type}), which has no tensor type"
            raise InvalidValueError(f"column {column.name!r} {what}; leave it out with schema_fields=[...] (the other "
                                    "columns), or fill it when writing the dataset")
    return spec


class DatasetPosition:
    """Where training is in the loader, for checkpoints: a ``tf.train.experimental.PythonState`` (made by
    ``DatasetPosition.of``, which binds TensorFlow's class), so ``tf.train.Checkpoint(..., data=position)`` saves
    it and ``restore`` loads it into the loader.

    Saved: the loader's ``state_dict()`` at the batch training consumes next. With ``keras_callback()`` that is
    counted from the batches Keras trained on; without it, from the batches handed to TensorFlow (exact for a plain
    ``for batch in ds`` loop, which reads nothing ahead).
    """

    loader: BalancedLoader

    @staticmethod
    def of(loader: BalancedLoader) -> DatasetPosition:
        tf = _tf()
        cls = _bound_class(tf)
        position = cls()
        position._setup(loader)
        return position

    def _setup(self, loader: BalancedLoader) -> None:
        self.loader = loader
        self._run = 0  # generator runs started (a pass, or the endless run)
        self._start: tuple[int, int] | None = None  # (epoch, batch) the current run started at
        self._delivered = 0  # batches the current run handed to TensorFlow
        self._counted_run = -1  # the run the consumed count belongs to
        self._consumed: int | None = None  # batches training consumed of the current run (the Keras callback)

    def __len__(self) -> int:
        """Steps per epoch (``steps_per_epoch`` for ``fit`` on ``distribute_tf_dataset``)."""
        return len(self.loader)

    def steps_left(self) -> int:
        """Batches the next pass of ``make_tf_dataset`` holds: after restoring a mid-epoch position, the rest of that
        epoch (iterate ``ds.take(position.steps_left())``: ``cardinality()`` stays the whole epoch's steps)."""
        state = self.state_dict()
        return self.loader.steps_of(state["epoch"]) - state["batches"]

    # -- the generators TensorFlow runs
    def epoch_batches(self) -> Iterator[dict]:
        """One pass: the loader's next epoch (or the rest of a resumed one)."""
        yield from self._batches(endless=False)

    def all_batches(self) -> Iterator[dict]:
        """Epoch after epoch, without end."""
        yield from self._batches(endless=True)

    def _batches(self, endless: bool) -> Iterator[dict]:
        state = self.loader.state_dict()
        self._start, self._delivered = (state["epoch"], state["batches"]), 0
        self._run += 1
        while True:
            for batch in self.loader:
                self._delivered += 1
                yield {k: np.asarray(v, dtype=object) if isinstance(v, list) else v for k, v in batch.items()}
            if not endless:
                return

    # -- counting what training consumed
    def consumed(self, batches: int) -> None:
        """Training consumed ``batches`` more batches of the current run (the Keras callback calls this)."""
        if self._counted_run != self._run:
            self._counted_run, self._consumed = self._run, 0
        self._consumed = (self._consumed or 0) + int(batches)  # Keras' step numbers may be numpy ints
        if self._consumed > self._delivered:
            raise InvalidValueError(f"training consumed {self._consumed} batches but the dataset delivered only "
                                    f"{self._delivered}: a distribution strategy re-batched it (each replica got part "
                                    "of each batch, so rows were lost); build it with distribute_tf_dataset(strategy, "
                                    "...) instead of handing make_tf_dataset's dataset to fit")

    def state_dict(self) -> dict:
        """The loader's state at the batch training consumes next."""
        state = self.loader.state_dict()
        if self._start is None or self._counted_run != self._run or self._consumed is None:
            return state  # nothing counted: what was handed to TensorFlow
        epoch, batch = self._start
        left = self._consumed
        def steps(epoch: int, stages: tuple) -> int:
            return self.loader.steps_of(epoch, stages)
        if state["elastic"]["stages"] and (epoch, batch + left) != (state["epoch"], state["batches"]):
            raise InvalidValueError("a position inside an elastic resume (a state saved at another world size) can "
                                    "only be saved where the loader is; checkpoint after the resumed epoch ends")
        while batch + left >= steps(epoch, ()):
            left -= steps(epoch, ()) - batch
            epoch, batch = epoch + 1, 0
        return {**state, "epoch": int(epoch), "batches": int(batch + left)}

    def load_state_dict(self, state: dict) -> None:
        self.loader.load_state_dict(state)
        self._start, self._consumed, self._counted_run = None, None, -1

    # -- tf.train.experimental.PythonState
    def serialize(self) -> str:
        return json.dumps(self.state_dict())

    def deserialize(self, string_value) -> None:
        text = string_value.numpy() if hasattr(string_value, "numpy") else string_value
        self.load_state_dict(json.loads(text.decode() if isinstance(text, bytes) else text))

    def keras_callback(self, keras: Any = None) -> Any:
        """A Keras callback that counts the batches ``fit`` trains on into this position; put it before any
        callback that saves checkpoints (``BackupAndRestore``, ``ModelCheckpoint``). ``keras``: the Keras module
        the model uses (default: ``tf_keras`` when imported, else ``tf.keras``)."""
        return _callback_class(keras or _keras())(self)


def _keras() -> Any:
    if "tf_keras" in sys.modules:
        return sys.modules["tf_keras"]
    return _tf().keras


_BOUND: dict[str, type] = {}


def _bound_class(tf) -> type:
    if "position" not in _BOUND:
        _BOUND["position"] = type("DatasetPosition", (DatasetPosition, tf.train.experimental.PythonState),
                                  {"__module__": __name__})
    return _BOUND["position"]


def _callback_class(keras) -> type:
    key = f"callback:{keras.__name__}"
    if key not in _BOUND:
        class PositionCallback(keras.callbacks.Callback):
            """Counts the batches ``fit`` trained on (``on_train_batch_begin``/``end`` give the first and last
            step of each execution) into a ``DatasetPosition``."""

            def __init__(self, position: DatasetPosition):
                super().__init__()
                self.position, self._first = position, 0

            def on_train_batch_begin(self, batch, logs=None):
                self._first = batch

            def on_train_batch_end(self, batch, logs=None):
                self.position.consumed(batch - self._first + 1)

        _BOUND[key] = PositionCallback
    return _BOUND[key]
