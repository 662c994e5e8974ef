"""Predicate functions the tests plan with: a module importable as ``tests.support.predicate_funcs``, so a plan's
``in_lambda`` predicate pickles by reference into reader processes. Not a test module."""


def english(lang):
    return lang == "en"
