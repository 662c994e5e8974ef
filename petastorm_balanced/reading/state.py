"""The loader state's keys, declared once: the positions, the loaders, the cost identity and the CLI use these names.

A state is a plain dict (``state_dict()``), so that it pickles and prints; its keys are written here and nowhere else.
"""
# The loader state keys, declared once: Position, the loaders, the cost identity and the CLI use these names.
# STAGES and PARTITION_EPOCH may be absent (older states); the cost keys are only a cost-balancing loader's.
EPOCH, BATCHES, WORLD_SIZE, STAGES, PARTITION_EPOCH = "epoch", "batches", "world_size", "stages", "partition_epoch"
PLAN_CHECKSUM, BATCH_SIZE = "plan_checksum", "batch_size"
SHUFFLE, SHUFFLE_WINDOW, RESHUFFLE = "shuffle", "shuffle_window", "reshuffle"
BALANCE, COST_REDUCE, MAX_BATCH_COST = "balance", "cost_reduce", "max_batch_cost"
NUM_WORKERS = "num_workers"  # slots per rank of a BalancedIterableDataset's state
