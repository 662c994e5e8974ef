"""``World.detect()`` from ``TF_CONFIG`` (MultiWorkerMirroredStrategy), after every launcher it trusted before."""
import json

import pytest

from petastorm_balanced import World


def tf_config(kind, index, chief=1, workers=3, **extra):
    cluster = {"worker": [f"host{i}:2222" for i in range(workers)], **extra}
    if chief:
        cluster["chief"] = ["chief:2222"]
    return json.dumps({"cluster": cluster, "task": {"type": kind, "index": index}})


@pytest.mark.parametrize("kind, index, chief, expected", [
    ("chief", 0, 1, World(0, 4)), ("worker", 0, 1, World(1, 4)), ("worker", 2, 1, World(3, 4)),
    ("worker", 0, 0, World(0, 3)), ("worker", 2, 0, World(2, 3))])
def test_the_chief_is_rank_0_then_the_workers(kind, index, chief, expected):
    assert World.detect({"TF_CONFIG": tf_config(kind, index, chief)}) == expected


def test_launchers_before_it_win():
    assert World.detect({"TF_CONFIG": tf_config("worker", 1), "RANK": "3", "WORLD_SIZE": "8"}) == World(3, 8)
    assert World.detect({"TF_CONFIG": tf_config("worker", 1), "SLURM_PROCID": "1", "SLURM_NTASKS": "2"}) == World(1, 2)


@pytest.mark.parametrize("text, message", [
    (tf_config("evaluator", 0, evaluator=["ev:1"]), "task type 'evaluator', which reads no training data"),
    (tf_config("ps", 0, ps=["ps:1"]), "task type 'ps'"),
    (tf_config("worker", 3), "task index 3 is not one of the 3 'worker' tasks"),
    (tf_config("worker", True), "task index True"),
    ("{not json", "is not a TensorFlow cluster spec"),
    (json.dumps({"cluster": {"worker": ["a:1"]}}), "is not a TensorFlow cluster spec"),
])
def test_a_task_that_is_not_a_training_rank_or_a_malformed_config_is_an_error(text, message):
    with pytest.raises(RuntimeError, match=message):
        World.detect({"TF_CONFIG": text})
