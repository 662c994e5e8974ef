"""Row costs, one concern per module, all pure (numpy and Arrow arrays, no I/O):

- ``spec.py``: what a cost is (a column or a Spark SQL expression), how its values are checked, and the one
  ``balance="auto"`` rule;
- ``order.py``: the row group order of a cost plan, and the per-rank cost a plan implies;
- ``arrangement.py``: fixed-size batches inside one shuffle window (``cost_reduce="sum"`` and ``"max"``), by
  version; ``one_sort.py``: their second version (one sort, one random stream per window);
- ``budget.py``: batches of varying rows under a token budget (``max_batch_cost``);
- ``options.py``: ``CostOptions``, how a loader arranges its windows, built once from its checked arguments.

The statistics a plan records are read by the planner (``planner/cost_stats.py``, ``planner/engines/spark_cost.py``)
and the loader's arguments are checked at the boundary (``reading/source/resolve.resolve_cost``).
"""
