"""``LoaderOptions`` is the one definition of a loader's options: both public signatures hold to it.

``make_loader`` and ``BalancedIterableDataset`` keep their keyword signatures (the public contract) and build their
options with ``LoaderOptions.of(locals())``; an option added to ``LoaderOptions`` but not to a signature (or given
another default there) would silently never reach that loader, so these tests name the difference.
"""
import dataclasses
import inspect

import pytest

from petastorm_balanced.errors import InvalidValueError
from petastorm_balanced.reading.front.loader import make_loader
from petastorm_balanced.reading.options import LoaderOptions

# Options a signature leaves out on purpose, and why.
NOT_IN = {
    # token budgets and packing: DataLoader workers would need equal steps per worker from windows of documents
    "BalancedIterableDataset": {"max_batch_cost", "pack", "seq_len", "long_documents"},
}


def _iterable_init():
    pytest.importorskip("torch")
    from petastorm_balanced.reading.front.iterable import BalancedIterableDataset
    return BalancedIterableDataset.__init__


@pytest.mark.parametrize("name, signature", [("make_loader", lambda: make_loader),
                                             ("BalancedIterableDataset", _iterable_init)])
def test_every_option_is_a_keyword_with_the_options_default(name, signature):
    parameters = inspect.signature(signature()).parameters
    for field in dataclasses.fields(LoaderOptions):
        if field.name in NOT_IN.get(name, ()):
            assert field.name not in parameters
            continue
        assert field.name in parameters, f"{name} has no keyword {field.name!r} (an option of LoaderOptions)"
        parameter = parameters[field.name]
        assert parameter.kind == inspect.Parameter.KEYWORD_ONLY, f"{name}({field.name}=...) is not keyword-only"
        assert parameter.default == field.default, \
            f"{name}({field.name}={parameter.default!r}) but LoaderOptions has {field.default!r}"


def test_of_takes_the_options_among_the_arguments_and_checks_them():
    arguments = {"self": object(), "plan": "p", "batch_size": 8, "shuffle": False, "shuffle_budget": "1KiB"}
    options = LoaderOptions.of(arguments)
    assert (options.batch_size, options.shuffle, options.shuffle_budget) == (8, False, 1024)
    assert options.reshuffle == "epoch"  # not given: the default
    with pytest.raises(InvalidValueError, match="reshuffle='never'"):
        LoaderOptions.of({"reshuffle": "never"})


@pytest.mark.parametrize("budget", ["9" * 400 + "TiB", "1" + "0" * 400, 10**400, 2**63])
def test_a_byte_count_past_int64_is_refused_naming_it(budget):
    """A budget of hundreds of digits is a ValueError naming shuffle_budget, not float overflow (infinity)."""
    with pytest.raises(InvalidValueError, match=r"shuffle_budget=.* is more than 9223372036854775807 bytes"):
        LoaderOptions.of({"shuffle_budget": budget})


def test_byte_counts_are_read_exactly():
    from petastorm_balanced.reading.options import MAX_BYTES, parse_bytes
    assert parse_bytes("shuffle_budget", "1.5KiB") == 1536
    assert parse_bytes("shuffle_budget", str(MAX_BYTES)) == MAX_BYTES  # a float would round it up past int64
    assert parse_bytes("shuffle_budget", "0.00013GB") == 130000  # a float gives 129999


def test_the_spill_budget_is_read_by_the_same_rule():
    with pytest.raises(InvalidValueError, match=r"shuffle_spill_budget=.* is more than"):
        LoaderOptions.of({"shuffle_spill_budget": "9" * 400 + "TiB"})
