"""The error family of petastorm-balanced.

Every error a user can act on names what was wrong and how to fix it. ``PlanError`` is the base so that callers
can catch "this plan cannot be used" in one clause; bad arguments stay ``ValueError``/``TypeError`` as Python
users expect.
"""
from typing import Sequence


class PlanError(Exception):
    """A plan cannot be used: corrupt, partial, foreign, stale or of an unknown version."""


class StalePlanError(PlanError):
    """The dataset or predicate changed since the plan was made; re-run planning."""


class PlanIntegrityError(PlanError):
    """A plan file is missing, truncated, or does not match its recorded checksum."""


class PlanVersionError(PlanError):
    """The plan was written in a format version this package does not read."""


class InvalidWhereError(ValueError):
    """``where`` is not a Spark SQL boolean expression over the dataset's columns, or it fails on its rows."""

    def __init__(self, expression: str, reason: str, columns: Sequence[str], *, on_data: bool = False):
        self.expression, self.reason, self.columns, self.on_data = expression, reason, list(columns), on_data
        super().__init__(f"where={expression!r} {self.problem}: {reason}; fix the expression")

    @property
    def problem(self) -> str:
        if self.on_data:
            return "fails on the rows of the dataset (columns " + ", ".join(self.columns) + ")"
        return "is not a valid Spark SQL boolean expression over the columns " + ", ".join(self.columns)
