"""The plans the reading tests share: one per dataset case, made once per run by the in-process engine."""
import pyarrow.dataset as pads
import pytest

from petastorm_balanced import plan_shards
from petastorm_balanced.predicates import in_lambda, in_set
from tests.support.predicate_funcs import english

BATCH = 32


@pytest.fixture(scope="session")
def plans(request, plain_dataset, hive_dataset):
    """(plan, matching ids) per dataset case; plans from the in-process engine (no Spark needed here). The
    Petastorm (Unischema) case runs on every stack (our codecs decode it without Petastorm). ``plain-en`` filters
    by a Python function (``in_lambda``), ``plain-in-set`` by a value set (``in_set``), over three ranks."""
    def ids_of(info, where=None):
        table = pads.dataset(info.path, format="parquet", partitioning="hive").to_table(columns=["id", "lang"])
        ids = table.column("id").to_numpy()
        return set(ids[table.column("lang").to_numpy(zero_copy_only=False) == "en"] if where else ids)

    en = in_lambda(["lang"], english)
    cases = {
        "plain-drop": (plan_shards(plain_dataset.url, 2, batch_size=BATCH, engine="local"), ids_of(plain_dataset)),
        "plain-pad": (plan_shards(plain_dataset.url, 2, batch_size=BATCH, policy="pad", seed=5, engine="local"),
                      ids_of(plain_dataset)),
        "plain-en": (plan_shards(plain_dataset.url, 3, batch_size=BATCH, predicate=en, policy="pad", engine="local"),
                     ids_of(plain_dataset, "en")),
        "plain-in-set": (plan_shards(plain_dataset.url, 3, batch_size=BATCH, policy="pad",
                                     predicate=in_set({"en"}, "lang"), engine="local"), ids_of(plain_dataset, "en")),
        "hive": (plan_shards(hive_dataset.url, 2, batch_size=BATCH, seed=3, engine="local"), ids_of(hive_dataset)),
    }
    petastorm_dataset = request.getfixturevalue("petastorm_dataset")
    cases["petastorm"] = (plan_shards(petastorm_dataset.url, 2, batch_size=16, predicate=en, policy="pad",
                                      engine="local"), ids_of(petastorm_dataset, "en"))
    return cases
