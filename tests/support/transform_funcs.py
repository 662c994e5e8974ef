"""Transform functions the TransformSpec tests hand to other processes (spawned DataLoader workers, Petastorm's
process pool, which starts a fresh interpreter): a module importable as ``tests.support.transform_funcs`` from the
worktree on PYTHONPATH, so they pickle by reference. Not a test module."""


def scaled(frame):
    """Row-wise: a new float32 column, an edited one, and ``value`` changed in place with its type kept."""
    frame["score"] = frame["id"] * 0.5 + frame["label"]
    frame["label"] = frame["label"].astype("int64") * 10
    frame["value"] = frame["value"] + 1.0
    return frame
