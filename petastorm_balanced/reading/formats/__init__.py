"""Batches in the user's format: torch tensors or numpy arrays, pinned or copied to a device."""
