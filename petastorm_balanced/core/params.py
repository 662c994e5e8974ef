"""The one parameter checker: every integer argument of the package is judged here, so the rules are the same
everywhere. A value that is not an integer (``bool`` is not; numpy integers are) raises ``TypeError``; one out of
range raises ``ValueError``; both messages name the parameter, the value and what is allowed.

>>> check_int("batch_size", 0, minimum=1)
Traceback (most recent call last):
...
petastorm_balanced.errors.InvalidValueError: batch_size=0 must be >= 1
"""
from __future__ import annotations

from numbers import Integral

from ..errors import InvalidTypeError, InvalidValueError


def check_int(name: str, value, *, minimum: int | None = None, maximum: int | None = None,
              hint: str = "") -> int:
    """``value`` as a Python int, after checking it is an integer in ``[minimum, maximum]`` (inclusive)."""
    if isinstance(value, bool) or not isinstance(value, Integral):
        raise InvalidTypeError(f"{name} must be an int, got {value!r} ({type(value).__name__})")
    value = int(value)
    if minimum is not None and value < minimum:
        raise InvalidValueError(f"{name}={value} must be >= {minimum}{hint}")
    if maximum is not None and value > maximum:
        raise InvalidValueError(f"{name}={value} must be <= {maximum}{hint}")
    return value
