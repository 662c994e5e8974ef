"""Rows into batches: a window's batch views, cost budgets and packed sequences."""
