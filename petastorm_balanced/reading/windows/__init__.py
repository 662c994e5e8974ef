"""Shuffle windows: sized from the memory budget, or larger than memory on local disk."""
