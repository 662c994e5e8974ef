"""The error family of petastorm-balanced.

Every error a user can act on names what was wrong and how to fix it. ``PlanError`` is the base so that callers
can catch "this plan cannot be used" in one clause; bad arguments stay ``ValueError``/``TypeError`` as Python
users expect.
"""


class PlanError(Exception):
    """A plan cannot be used: corrupt, partial, foreign, stale or of an unknown version."""


class StalePlanError(PlanError):
    """The dataset or predicate changed since the plan was made; re-run planning."""


class PlanIntegrityError(PlanError):
    """A plan file is missing, truncated, or does not match its recorded checksum."""


class PlanVersionError(PlanError):
    """The plan was written in a format version this package does not read."""
