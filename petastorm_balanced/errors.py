"""The error family of petastorm-balanced.

Every error a user can act on names what was wrong and how to fix it. ``PlanError`` is the base so that callers
can catch "this plan cannot be used" in one clause; bad arguments stay ``ValueError``/``TypeError`` as Python
users expect.
"""
from collections.abc import Sequence


class BadInputError(Exception):
    """Base of the errors our own checks raise for bad arguments or data: what the CLI reports as bad usage (exit 2).

    Anything else escaping the package (a ``TypeError`` from a bug, say) is a bug and is shown with its traceback.
    """


class InvalidValueError(BadInputError, ValueError):
    """A bad value: the message names the parameter, the value and the fix (still a ``ValueError``)."""


class InvalidTypeError(BadInputError, TypeError):
    """A value of the wrong type: the message names the parameter and what it takes (still a ``TypeError``)."""


class MissingDependencyError(BadInputError, ImportError):
    """A feature needs a package this environment lacks (or cannot import): the message says what to install."""


class StateKeyError(BadInputError, KeyError):
    """A loader state with a key missing, or one the state format does not declare (``reading/state.py``): the
    message names the key and where it belongs (still a ``KeyError``)."""

    def __str__(self) -> str:  # a KeyError quotes its argument; this one is a sentence
        return str(self.args[0]) if self.args else ""


class PlanError(Exception):
    """A plan cannot be used: corrupt, partial, foreign, stale or of an unknown version."""


class StalePlanError(PlanError):
    """The dataset or predicate changed since the plan was made; re-run planning."""


class PlanUpdateError(PlanError):
    """A plan cannot be updated in place of planning again: the dataset changed other than by added files (a file
    changed, removed or rewritten; a Delta remove; an Iceberg delete), or the planning parameters differ from the
    old plan's. The message names the first such file or parameter; plan from scratch instead."""


class PlanIntegrityError(PlanError):
    """A plan file is missing, truncated, or does not match its recorded checksum."""


class PlanVersionError(PlanError):
    """The plan was written in a format version this package does not read."""


class UnsafeDatasetError(PlanError):
    """A dataset's ``_common_metadata`` holds a Unischema pickle naming something outside the allow-list of schema
    classes (Petastorm's schema and codecs, numpy dtypes, Spark SQL types): loading it could run code, so it is
    refused before anything in it runs."""


class StorageUnavailableError(OSError):
    """The storage could not be reached, or kept throttling, through every attempt of the retry policy
    (``io/retry.py``): the message names the URL, the attempts and the last error. Nothing says the data is wrong:
    retry later, or raise the policy's attempts. Still an ``OSError``, as the underlying failure is."""

    def __init__(self, url: str, attempts: int, last_error: BaseException, what: str = "reading"):
        self.url, self.attempts, self.last_error = url, attempts, last_error
        detail = " ".join(f"{type(last_error).__name__}: {last_error}".split())
        super().__init__(f"{what} {url} failed {attempts} time(s) in a row: the storage is unreachable or throttling "
                         f"(last error: {detail}); the data was not found wrong. Retry later, or allow more attempts "
                         "(storage_options={'retry_attempts': N} or PETASTORM_BALANCED_RETRY, docs/remote.md)")


class InvalidWhereError(InvalidValueError):
    """``where`` is not a Spark SQL boolean expression over the dataset's columns, or it fails on its rows."""

    def __init__(self, expression: str, reason: str, columns: Sequence[str], *, on_data: bool = False):
        self.expression, self.reason, self.columns, self.on_data = expression, reason, list(columns), on_data
        super().__init__(f"where={expression!r} {self.problem}: {reason}; fix the expression")

    @property
    def problem(self) -> str:
        if self.on_data:
            return "fails on the rows of the dataset (columns " + ", ".join(self.columns) + ")"
        return "is not a valid Spark SQL boolean expression over the columns " + ", ".join(self.columns)


class ShuffleQualityWarning(UserWarning):
    """The rows are stored sorted or clustered by a column and a rank's rows need more than one shuffle window, so
    batches mix only the row groups of their window and are further from i.i.d. than a uniform permutation's."""


class PackingWarning(UserWarning):
    """A packing loader left documents of a shuffle window out of this epoch: the window held more tokens than the
    steps the plan gave it (``core/packing.py``)."""


class RowShapeError(InvalidValueError):
    """A row whose list does not fit the shape ``loader.schema`` declares for its column. ``row`` is its position
    in the rows being converted; the reader that knows their files adds the file, row group and row to the
    message (``fragments.to_columns``)."""

    def __init__(self, message: str, row: int):
        super().__init__(message)
        self.row = row

    def __reduce__(self):  # through process pools with its row
        return type(self), (str(self), self.row)
