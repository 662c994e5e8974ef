"""One worker of a MultiWorkerMirroredStrategy job (tests/test_tf.py): Keras (tf-keras) fit on balanced batches.

    python tf_job.py RANK PORT0 PLAN_URL OUT_DIR BACKUP_DIR EPOCHS INTERRUPT_STEP

Each worker records the ids its model trained on, step by step (a py_function inside train_step), so the test sees
exactly what training consumed. INTERRUPT_STEP >= 0 raises after that global step (BackupAndRestore saved it).
"""
import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ["TF_USE_LEGACY_KERAS"] = "1"
rank, port0, plan_url, out_dir, backup_dir = int(sys.argv[1]), int(sys.argv[2]), *sys.argv[3:6]
epochs, interrupt = int(sys.argv[6]), int(sys.argv[7])
os.environ["TF_CONFIG"] = json.dumps({"cluster": {"worker": [f"127.0.0.1:{port0}", f"127.0.0.1:{port0 + 1}"]},
                                      "task": {"type": "worker", "index": rank}})

import tensorflow as tf  # noqa: E402
import tf_keras as keras  # noqa: E402

from petastorm_balanced import World  # noqa: E402
from petastorm_balanced.tf import distribute_tf_dataset  # noqa: E402

strategy = tf.distribute.MultiWorkerMirroredStrategy()
assert World.detect() == World(rank, 2), World.detect()  # from TF_CONFIG
ds = distribute_tf_dataset(strategy, plan=plan_url, shuffle_window=64, schema_fields=["id", "value"])
seen = []


def record(ids):
    seen.append(ids.numpy().tolist())
    return 0


class Model(keras.Model):
    def __init__(self):
        super().__init__()
        self.dense = keras.layers.Dense(1)

    def call(self, x):
        return self.dense(x)

    def train_step(self, batch):
        tf.py_function(record, [batch["id"]], tf.int64)
        x = tf.cast(tf.reshape(batch["value"], (-1, 1)), tf.float32)
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean((self(x) - x) ** 2)
        grads = tape.gradient(loss, self.trainable_variables)
        self.optimizer.apply_gradients(zip(grads, self.trainable_variables, strict=True))
        return {"loss": loss}


class Interrupt(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.epoch, self.steps = 0, 0

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch

    def on_train_batch_end(self, batch, logs=None):
        if self.epoch * len(ds.position) + batch == interrupt:
            raise KeyboardInterrupt(f"interrupted after epoch {self.epoch} step {batch}")


with strategy.scope():
    model = Model()
    model.compile(optimizer=keras.optimizers.SGD(0.01))
model.data_position = ds.position  # saved and restored with the model by BackupAndRestore
callbacks = [ds.position.keras_callback(), keras.callbacks.BackupAndRestore(backup_dir, save_freq=1), Interrupt()]
status = "done"
try:
    model.fit(ds, epochs=epochs, steps_per_epoch=len(ds.position), callbacks=callbacks, verbose=0)
except KeyboardInterrupt:
    status = "interrupted"
with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
    json.dump({"status": status, "steps_per_epoch": len(ds.position), "ids": seen}, f)
print("worker", rank, status, len(seen), flush=True)
sys.stderr.flush()
os._exit(0)  # MultiWorkerMirroredStrategy's chief can wait for its peers at interpreter exit; everything is written
