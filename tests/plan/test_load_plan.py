"""load_plan refuses a plan for another dataset or another filter than the caller names (G7)."""
import pytest

from petastorm_balanced import StalePlanError, load_plan, plan_shards
from petastorm_balanced.predicates import in_lambda, in_set


@pytest.fixture(scope="module")
def saved(plain_dataset, tmp_path_factory):
    url = str(tmp_path_factory.mktemp("plans") / "en")
    plan_shards(plain_dataset.url, 2, batch_size=8, engine="local", predicate=in_set({"en"}, "lang"), output_url=url)
    return url


def test_same_dataset_and_predicate_load(saved, plain_dataset):
    plan = load_plan(saved, dataset_url=plain_dataset.path, predicate=in_set({"en"}, "lang"))
    assert plan.predicate.kind == "petastorm"


@pytest.mark.parametrize("other", [in_set({"fr"}, "lang"), in_lambda(["lang"], lambda lang: lang == "en")])
def test_other_predicate_is_stale(saved, other):
    with pytest.raises(StalePlanError, match="predicate changed"):
        load_plan(saved, predicate=other)


def test_sql_where_against_petastorm_plan_is_stale(saved):
    with pytest.raises(StalePlanError, match="kind 'petastorm' -> 'sql'"):
        load_plan(saved, where="lang = 'en'")


def test_other_dataset_is_stale(saved, hive_dataset):
    with pytest.raises(StalePlanError, match="not dataset_url="):
        load_plan(saved, dataset_url=hive_dataset.url)
