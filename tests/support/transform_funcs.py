"""Transform functions the TransformSpec tests hand to other processes (spawned DataLoader workers, Petastorm's
process pool, which starts a fresh interpreter): a module importable as ``tests.support.transform_funcs`` from the
worktree on PYTHONPATH, so they pickle by reference. Not a test module."""


def scaled(frame):
    """Row-wise: a new float32 column, an edited one, and ``value`` changed in place with its type kept."""
    frame["score"] = frame["id"] * 0.5 + frame["label"]
    frame["label"] = frame["label"].astype("int64") * 10
    frame["value"] = frame["value"] + 1.0
    return frame


def mixed(frame):
    """For a mixture's sources: a new float32 column, ``value`` changed (its dtype declared float32), ``text``
    upper-cased in place with its type kept; the other columns pass through."""
    frame["score"] = (frame["id"] * 0.25).astype("float32")
    frame["value"] = (frame["value"] * 2.0).astype("float32")
    frame["text"] = frame["text"].str.upper()
    return frame


def cut_as_float(frame):
    """``cut`` (int32 in one source, int64 in another) as float64, which every source then delivers."""
    frame["cut"] = frame["cut"].astype("float64")
    return frame
