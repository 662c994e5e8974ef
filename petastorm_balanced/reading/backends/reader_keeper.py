"""``ReaderKeeper``: one rank's Petastorm reader, kept from epoch to epoch by the loader that owns it."""
from __future__ import annotations


class ReaderKeeper:
    """Keeps one rank's ``BalancedReader`` between epochs, so the next epoch re-arms it instead of paying for a
    new one (listing, footers, pool start). A reader left mid-epoch is stopped and replaced."""

    def __init__(self):
        self.reader = None

    def close(self) -> None:
        reader, self.reader = self.reader, None
        if reader is not None:
            reader.stop()
            reader.join()
