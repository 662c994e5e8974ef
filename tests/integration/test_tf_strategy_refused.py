"""``make_tf_dataset`` refuses a strategy that would re-batch it, naming ``distribute_tf_dataset``: a
``MultiWorkerMirroredStrategy`` made in the process (in scope or not, as Keras ``fit`` uses it), or a multi-replica
strategy in scope. Each case runs in its own interpreter: a strategy configures TensorFlow's runtime for the
process."""
import json
import os
import subprocess
import sys
import textwrap

import pytest

from petastorm_balanced import datagen, plan_shards
from tests.support.jobs import ROOT, free_port

pytestmark = [pytest.mark.slow, pytest.mark.stack]
pytest.importorskip("tensorflow")

SCRIPT = textwrap.dedent("""
    import sys
    import tensorflow as tf
    from petastorm_balanced.errors import InvalidValueError
    from petastorm_balanced.tf import make_tf_dataset
    case, plan = sys.argv[1], sys.argv[2]
    if case == "mwms":
        strategy = tf.distribute.MultiWorkerMirroredStrategy()
        scope = None
    else:
        cpu = tf.config.list_physical_devices("CPU")[0]
        tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
        strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
        scope = strategy.scope()
    try:
        if scope is None:
            make_tf_dataset(0, 1, plan=plan, batch_size=8)
        else:
            with scope:
                make_tf_dataset(0, 1, plan=plan, batch_size=8)
    except InvalidValueError as exc:
        print("REFUSED", exc)
    else:
        print("ACCEPTED")
""")


@pytest.mark.parametrize("case", ["mwms", "mirrored_in_scope"])
def test_make_tf_dataset_under_a_rebatching_strategy_says_use_distribute_tf_dataset(tmp_path, case):
    info = datagen.make_plain_dataset(tmp_path / "ds", num_files=2, total_rows=64, seed=1)
    plan = str(tmp_path / "plan")
    plan_shards(info.url, 1, batch_size=8, engine="local", output_url=plan)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TF_CPP_MIN_LOG_LEVEL": "2"}
    if case == "mwms":
        env["TF_CONFIG"] = json.dumps({"cluster": {"worker": [f"127.0.0.1:{free_port()}"]},
                                       "task": {"type": "worker", "index": 0}})
    done = subprocess.run([sys.executable, "-c", SCRIPT, case, plan], env=env, capture_output=True, text=True,
                          timeout=300, cwd=str(ROOT))
    assert "REFUSED" in done.stdout, done.stdout + done.stderr[-3000:]
    assert "distribute_tf_dataset" in done.stdout and "make_tf_dataset" in done.stdout
