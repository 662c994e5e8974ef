"""A real Spark standalone cluster on 127.0.0.1: one master and N workers, each its own JVM, from pyspark's bin/.

Executors then run in the workers' JVMs (``CoarseGrainedExecutorBackend`` processes), so the planning job's
driver, its tasks and its Python workers really are separate processes, as on a cluster. Ports are chosen free, each
daemon writes its log under the work folder, and ``stop()`` always kills what ``start()`` started (by process
group, the JVM's children included), whatever failed in between.

    with StandaloneCluster(workdir, workers=2, cores=1, memory="1g") as cluster:
        spark-submit --master cluster.url ...

Used by ``tests/integration/test_standalone_cluster.py`` and ``benchmarks/bench_cluster.py``.
"""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.support.jobs import free_port

START_TIMEOUT_S = 120


def spark_bin(name: str) -> str:
    """pyspark's own launcher (``spark-class``, ``spark-submit``), next to the installed pyspark package."""
    import pyspark
    path = Path(pyspark.__file__).parent / "bin" / name
    if not path.exists():
        raise FileNotFoundError(f"{path} not found: pyspark's bin/ is missing from this installation")
    return str(path)


def cluster_env(extra: dict | None = None) -> dict:
    """The daemons' and jobs' environment: this Python for the executors' workers, 127.0.0.1 for every address,
    and the repository on PYTHONPATH (the planning job ships the package itself; this only helps imports)."""
    env = dict(os.environ)
    env.update({"SPARK_LOCAL_IP": "127.0.0.1", "SPARK_MASTER_HOST": "127.0.0.1", "PYSPARK_PYTHON": sys.executable,
                "PYSPARK_DRIVER_PYTHON": sys.executable})
    env.pop("SPARK_HOME", None)  # let pyspark's bin/ find its own home
    env.update(extra or {})
    return env


class StandaloneCluster:
    """``spark-class ...deploy.master.Master`` plus ``workers`` x ``...deploy.worker.Worker``, on free ports."""

    def __init__(self, workdir, *, workers: int = 2, cores: int = 1, memory: str = "1g"):
        self.workdir = Path(workdir)
        self.workers, self.cores, self.memory = workers, cores, memory
        self.port = free_port()
        self.url = f"spark://127.0.0.1:{self.port}"
        self._procs: list[subprocess.Popen] = []
        self._logs: list[Path] = []

    def start(self) -> StandaloneCluster:
        self.workdir.mkdir(parents=True, exist_ok=True)
        try:
            self._daemon("master", ["org.apache.spark.deploy.master.Master", "--host", "127.0.0.1", "--port",
                                    str(self.port), "--webui-port", str(free_port())])
            self._wait_for(self._logs[0], r"I have been elected leader|Starting Spark master")
            for i in range(self.workers):
                work = self.workdir / f"worker-{i}"
                self._daemon(f"worker-{i}", ["org.apache.spark.deploy.worker.Worker", self.url, "--host",
                                             "127.0.0.1", "--port", str(free_port()), "--webui-port",
                                             str(free_port()), "--cores", str(self.cores), "--memory", self.memory,
                                             "--work-dir", str(work)])
            for log in self._logs[1:]:
                self._wait_for(log, r"Successfully registered with master")
        except BaseException:
            self.stop()
            raise
        return self

    def _daemon(self, name: str, args: list[str]) -> None:
        log = self.workdir / f"{name}.log"
        env = cluster_env({"SPARK_LOG_DIR": str(self.workdir), "SPARK_WORKER_DIR": str(self.workdir)})
        with open(log, "w") as handle:  # the daemon keeps its own copy of the descriptor
            proc = subprocess.Popen([spark_bin("spark-class"), *args], stdout=handle, stderr=subprocess.STDOUT,
                                    env=env, cwd=self.workdir, start_new_session=True)
        self._procs.append(proc)
        self._logs.append(log)

    def _wait_for(self, log: Path, pattern: str, timeout: float = START_TIMEOUT_S) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            text = log.read_text(errors="replace") if log.exists() else ""
            if re.search(pattern, text):
                return
            for proc in self._procs:
                if proc.poll() is not None:
                    raise RuntimeError(f"a Spark daemon exited with {proc.returncode} while starting; "
                                       f"{log}:\n{text[-3000:]}")
            time.sleep(0.25)
        raise TimeoutError(f"no {pattern!r} in {log} after {timeout:.0f} s:\n"
                           f"{log.read_text(errors='replace')[-3000:] if log.exists() else ''}")

    def executor_dirs(self) -> list[Path]:
        """One folder per executor the workers launched (``worker-i/app-.../<executor id>``, holding its stdout
        and stderr): proof that tasks ran in the workers' JVMs, not in the driver."""
        return sorted(p for p in self.workdir.glob("worker-*/app-*/*") if p.is_dir())

    def process_groups(self) -> list[int]:
        """The daemons' process groups (one per daemon, its JVM and the executors it started)."""
        return [proc.pid for proc in self._procs]

    def logs(self) -> str:
        return "\n".join(f"--- {log}\n{log.read_text(errors='replace')[-2000:]}" for log in self._logs
                         if log.exists())

    def stop(self) -> None:
        """Kill every daemon's process group (workers first, so they start no more executors) and wait until each
        group is empty: the executors and their Python workers share their worker's group."""
        groups = [proc.pid for proc in reversed(self._procs)]
        for group in groups:
            _signal_group(group, signal.SIGTERM)
        deadline = time.monotonic() + 20
        for proc in reversed(self._procs):
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        while any(group_alive(g) for g in groups) and time.monotonic() < deadline:
            time.sleep(0.2)
        for group in groups:
            _signal_group(group, signal.SIGKILL)  # whatever did not stop in time
        for proc in self._procs:
            proc.wait(timeout=10)
        deadline = time.monotonic() + 10
        while any(group_alive(g) for g in groups) and time.monotonic() < deadline:
            time.sleep(0.1)
        self._procs.clear()

    def __enter__(self) -> StandaloneCluster:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def _signal_group(group: int, sig: int) -> None:
    try:
        os.killpg(group, sig)
    except ProcessLookupError:
        pass


def group_alive(group: int) -> bool:
    """Whether any process of process group ``group`` still exists."""
    try:
        os.killpg(group, 0)
    except ProcessLookupError:
        return False
    return True



def submit(cluster: StandaloneCluster, script, *args, executor_memory: str = "768m", timeout: float = 600,
           conf: dict | None = None) -> subprocess.CompletedProcess:
    """``spark-submit --master cluster.url script args``, client mode: the driver is this machine's JVM, the
    executors the workers'; raises with the output when it fails."""
    settings = {"spark.ui.enabled": "false", "spark.driver.host": "127.0.0.1", "spark.driver.bindAddress":
                "127.0.0.1", "spark.executor.memory": executor_memory, "spark.executor.cores": str(cluster.cores),
                **(conf or {})}
    cmd = [spark_bin("spark-submit"), "--master", cluster.url, "--driver-memory", "1g"]
    for key, value in settings.items():
        cmd += ["--conf", f"{key}={value}"]
    cmd += [str(script), *map(str, args)]
    done = subprocess.run(cmd, capture_output=True, text=True, env=cluster_env(), timeout=timeout,
                          cwd=cluster.workdir, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited {done.returncode}:\n{done.stdout[-3000:]}\n"
                           f"{done.stderr[-5000:]}\n{cluster.logs()}")
    return done
