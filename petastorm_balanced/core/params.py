"""The one parameter checker: every integer argument and every named choice of the package is judged here, so
the rules and the messages are the same everywhere. A value that is not an integer (``bool`` is not; numpy
integers are) raises ``TypeError``; one out of range, or a choice not accepted, raises ``ValueError``; the messages
name the parameter, the value and what is allowed.

>>> check_int("batch_size", 0, minimum=1)
Traceback (most recent call last):
...
petastorm_balanced.errors.InvalidValueError: batch_size=0 must be >= 1
"""
from __future__ import annotations

from collections.abc import Sequence
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


def check_choice(name: str, value, accepted: Sequence[str], meaning: str = "") -> str:
    """``value`` if it is one of the strings ``accepted``; else ``InvalidValueError`` naming the parameter, the
    value and every accepted value, then ``meaning`` (what each one does).

    >>> check_choice("reshuffle", "never", ("epoch", "fixed"))
    Traceback (most recent call last):
    ...
    petastorm_balanced.errors.InvalidValueError: reshuffle='never' is not one of ('epoch', 'fixed')
    """
    if not isinstance(value, str) or value not in accepted:
        raise InvalidValueError(f"{name}={value!r} is not one of {tuple(accepted)}"
                                + (f": {meaning}" if meaning else ""))
    return value
