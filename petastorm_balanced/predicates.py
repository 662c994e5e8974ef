"""Petastorm's row predicates on any stack: Petastorm's own classes where Petastorm imports, else the same classes
written here (same names, arguments, attributes and semantics).

Why: ``plan_shards(predicate=...)`` takes a Petastorm ``PredicateBase`` (an object with ``get_fields()`` and
``do_include(values)``), but Petastorm cannot be imported on pyarrow >= 16. A predicate's fingerprint is built from
its class name and attributes (``core/predicate_info.py``), so ``in_set({'en'}, 'lang')`` has the same fingerprint on
both stacks, and a plan made with one is recognised with the other (G7, G12).

>>> p = in_set({"en"}, "lang")
>>> sorted(p.get_fields()), p.do_include({"lang": "en"}), in_negate(p).do_include({"lang": "en"})
(['lang'], True, False)
"""
try:
    from petastorm.predicates import PredicateBase, in_intersection, in_lambda, in_negate, in_reduce, in_set
except ImportError:  # no Petastorm on this stack (pyarrow >= 16): the same classes, here
    import abc

    import numpy as np

    class PredicateBase(abc.ABC):  # type: ignore[no-redef]  # fallback for Petastorm's class of this name
        """Base class for row predicates: the fields read, and whether a row (a dict of those fields) matches."""

        @abc.abstractmethod
        def get_fields(self):
            """The column names ``do_include`` reads."""

        @abc.abstractmethod
        def do_include(self, values):
            """Whether the row ``values`` (a mapping of field name to value) is kept."""

    class in_set(PredicateBase):  # type: ignore[no-redef]  # fallback for Petastorm's class of this name
        """The field's value is one of ``inclusion_values``."""

        def __init__(self, inclusion_values, predicate_field):
            self._inclusion_values = set(inclusion_values)
            self._predicate_field = predicate_field

        def get_fields(self):
            return {self._predicate_field}

        def do_include(self, values):
            return values[self._predicate_field] in self._inclusion_values

    class in_intersection(PredicateBase):  # type: ignore[no-redef]  # fallback for Petastorm's class of this name
        """The field (a list) holds at least one of ``inclusion_values``."""

        def __init__(self, inclusion_values, _predicate_field):
            self._inclusion_values = list(inclusion_values)
            self._predicate_field = _predicate_field

        def get_fields(self):
            return {self._predicate_field}

        def do_include(self, values):
            return bool(np.isin(values[self._predicate_field], self._inclusion_values).any())

    class in_lambda(PredicateBase):  # type: ignore[no-redef]  # fallback for Petastorm's class of this name
        """``predicate_func(*fields[, state_arg])``: a function of the listed fields (and a state, if not None)."""

        def __init__(self, predicate_fields, predicate_func, state_arg=None):
            if not isinstance(predicate_fields, list):
                raise ValueError("Predicate fields should be a list")
            self._predicate_fields = predicate_fields
            self._predicate_func = predicate_func
            self._state_arg = state_arg

        def get_fields(self):
            return set(self._predicate_fields)

        def do_include(self, values):
            args = [values[field] for field in self._predicate_fields]
            if self._state_arg is not None:
                args.append(self._state_arg)
            return self._predicate_func(*args)

    class in_negate(PredicateBase):  # type: ignore[no-redef]  # fallback for Petastorm's class of this name
        """Rows the wrapped predicate does not keep."""

        def __init__(self, predicate):
            if not isinstance(predicate, PredicateBase):
                raise ValueError("Predicate is nor derived from PredicateBase")
            self._predicate = predicate

        def get_fields(self):
            return self._predicate.get_fields()

        def do_include(self, values):
            return not self._predicate.do_include(values)

    class in_reduce(PredicateBase):  # type: ignore[no-redef]  # fallback for Petastorm's class of this name
        """``reduce_func`` (e.g. ``all``, ``any``) over the results of several predicates."""

        def __init__(self, predicate_list, reduce_func):
            if not all(isinstance(p, PredicateBase) for p in predicate_list):
                raise ValueError("Predicate is nor derived from PredicateBase")
            self._predicate_list = predicate_list
            self._reduce_func = reduce_func

        def get_fields(self):
            fields = set()
            for p in self._predicate_list:
                fields |= p.get_fields()
            return fields

        def do_include(self, values):
            return self._reduce_func([p.do_include(values) for p in self._predicate_list])

__all__ = ["PredicateBase", "in_intersection", "in_lambda", "in_negate", "in_reduce", "in_set"]
