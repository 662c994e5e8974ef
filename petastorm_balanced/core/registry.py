"""Named algorithms: every choice that is an algorithm (how rows are balanced, how a plan orders its row groups,
how a window's rows are arranged by cost, which backend reads) is an entry of a small registry, looked up by the
name a user passes, instead of a branch of an if-chain.

Why each entry has a name and a version: a plan stamps the algorithms that decided its rows (``plan.json``:
``parameters.algorithm``, ``cost.order``), and a reader refuses a plan whose (name, version) it does not hold,
since another version would deliver other rows. A new algorithm is a new entry, and the stamp follows it.

>>> doubling = Registry("demo", "mode", {"twice": Algorithm("doubling", 1, lambda x: 2 * x)})
>>> doubling["twice"].run(3)
6
>>> doubling.holds("doubling", 2)
False
"""
from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from ..errors import InvalidValueError


@dataclass(frozen=True)
class Algorithm:
    """One algorithm: the name and version a plan records, and the function that runs it."""

    name: str
    version: int
    run: Callable[..., Any]


class Registry:
    """The algorithms of one choice, by the value the user passes (``balance="cost"``, ``cost_reduce="sum"``)."""

    def __init__(self, kind: str, parameter: str, choices: Mapping[str, Algorithm]):
        self.kind, self.parameter = kind, parameter
        self._choices = dict(choices)

    @property
    def names(self) -> tuple[str, ...]:
        """The values the parameter accepts, in registration order."""
        return tuple(self._choices)

    def __getitem__(self, choice: str) -> Algorithm:
        try:
            return self._choices[choice]
        except (KeyError, TypeError):
            raise InvalidValueError(f"{self.parameter}={choice!r} is not one of {self.names} (the {self.kind}s this "
                                    "package holds)") from None

    def holds(self, name: str, version: int) -> bool:
        """Whether an algorithm of that name and version is registered (what a plan's stamp is checked against)."""
        return any((a.name, a.version) == (name, version) for a in self._choices.values())
