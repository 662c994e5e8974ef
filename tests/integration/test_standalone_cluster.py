"""The spark-submit planning job on a real Spark standalone cluster: a master and two workers on 127.0.0.1.

Each daemon is its own JVM (``spark-class ...deploy.master.Master`` / ``...deploy.worker.Worker``, from pyspark's
bin/), and the job's executors run in JVMs the workers launch, so the driver, the tasks and the package zip the
engine ships really cross processes, as on a cluster. Checked (G8): the plan the job writes there is the plan of
the in-process engine without a filter (same checksum), and with ``--where`` the plan of a ``local[2]`` session
(same checksum) whose catalog is the local engine's with the same filter as a Petastorm predicate, and whose rows
are Spark's ``count(where)``. The cluster is always stopped (the fixture kills every daemon's process group).
"""
import pytest

pytest.importorskip("pyspark")

from petastorm_balanced import load_plan, plan_shards  # noqa: E402
from petastorm_balanced.predicates import in_lambda  # noqa: E402
from tests.support.jobs import ROOT  # noqa: E402
from tests.support.standalone_cluster import StandaloneCluster, group_alive, submit  # noqa: E402

# A spark-submit job with executors started by the workers takes about a minute on an idle 2-core machine and
# several under load: more than the suite's 300 s per test.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(900),
              pytest.mark.filterwarnings("ignore::FutureWarning", "ignore::DeprecationWarning")]

JOB = ROOT / "spark_jobs" / "plan_shards.py"
WORLD, BATCH = 3, 16
WHERE = "lang = 'en' AND value > 4"


def english_above_4(lang, value):
    return (lang == "en") & (value > 4)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with StandaloneCluster(tmp_path_factory.mktemp("standalone"), workers=2, cores=1, memory="1g") as running:
        groups = running.process_groups()
        assert len(groups) == 3  # a master and two workers, each its own JVM and process group
        yield running
    alive = [group for group in groups if group_alive(group)]
    assert not alive, f"daemon process groups still alive after stop(): {alive}"


def run_job(cluster, dataset_url, output, *args):
    done = submit(cluster, JOB, dataset_url, "--world-size", WORLD, "--batch-size", BATCH, "--seed", 5,
                  "--output", output, *args, timeout=600)
    assert any(line.startswith("plan_shards: wrote ") for line in done.stdout.splitlines()), done.stdout[-3000:]
    return load_plan(str(output))


def executors_of(cluster):
    """Executor folders per application: each app got executors on both workers (not the driver's JVM)."""
    apps = {}
    for folder in cluster.executor_dirs():
        worker, app = folder.parts[-3], folder.parts[-2]
        apps.setdefault(app, set()).add(worker)
    return apps


def test_job_on_a_standalone_cluster_writes_the_local_engines_plan(cluster, plain_dataset, tmp_path):
    plan = run_job(cluster, plain_dataset.url, tmp_path / "plan")
    local = plan_shards(plain_dataset.url, WORLD, batch_size=BATCH, seed=5, engine="local")
    assert plan.catalog == local.catalog
    assert plan.checksum == local.checksum


def test_job_with_where_on_a_standalone_cluster_equals_local_session_and_count(cluster, spark, plain_dataset,
                                                                               tmp_path):
    plan = run_job(cluster, plain_dataset.url, tmp_path / "plan", "--where", WHERE)
    on_local_session = plan_shards(plain_dataset.url, WORLD, batch_size=BATCH, seed=5, where=WHERE, engine="spark",
                                   spark=spark)
    assert plan.checksum == on_local_session.checksum
    local = plan_shards(plain_dataset.url, WORLD, batch_size=BATCH, seed=5, engine="local",
                        predicate=in_lambda(["lang", "value"], english_above_4))
    assert plan.catalog == local.catalog  # the same rows, row group by row group, as the in-process engine's
    assert 0 < plan.total_rows == spark.read.parquet(plain_dataset.url).where(WHERE).count() < plain_dataset.num_rows
    apps = executors_of(cluster)
    assert apps and all(workers == {"worker-0", "worker-1"} for workers in apps.values()), apps
