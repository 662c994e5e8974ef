"""The plain first forms ("v1") of the window permutation and of the cost arrangements ("round-lpt" v1,
"sorted-buckets" v1), written plainly: the references the bit-for-bit tests compare the fast forms with, since a
position saved by one release resumes in another only if no order moved a row (the version is not in states)."""
import numpy as np


def v1_words(key, count):
    return np.random.Generator(np.random.PCG64(list(key))).bit_generator.random_raw(count)


def v1_permutation(n, key):
    words = v1_words(key, n)
    return np.lexsort(((words >> np.uint64(32)) & np.uint64(0xFFFF), (words >> np.uint64(16)) & np.uint64(0xFFFF),
                       words & np.uint64(0xFFFF))[::-1])


def v1_ascending(costs, key):
    tie = v1_words((*key, 1), len(costs)) & np.uint64(0xFFFF)
    return np.lexsort((tie, costs.astype(np.uint64)))  # by cost, then tie word, then position


def v1_within(batches, key):
    k, rows = batches.shape
    words = (v1_words((*key, 3), k * rows) & np.uint64(0xFFFF)).reshape(k, rows)
    return np.take_along_axis(batches, np.argsort(words, axis=1, kind="stable"), axis=1)


def v1_sum(costs, batch, key):
    k = len(costs) // batch
    rounds = v1_ascending(costs, key)[::-1].reshape(batch, k)
    loads, members = np.zeros(k, dtype=np.int64), np.empty((k, batch), dtype=np.int64)
    for j in range(batch):
        lightest = np.argsort(loads, kind="stable")
        members[lightest, j] = rounds[j]
        loads[lightest] += costs[rounds[j]]
    members = members[np.argsort(-loads, kind="stable")]
    members = members[v1_permutation(k, (key[0], key[1], key[3], key[4], 4))]
    return v1_within(members, key).reshape(-1)


def v1_max(costs, batch, key):
    k = len(costs) // batch
    buckets = v1_ascending(costs, key).reshape(k, batch)[v1_permutation(k, (key[0], key[1], key[3], key[4], 4))]
    return v1_within(buckets, key).reshape(-1)
