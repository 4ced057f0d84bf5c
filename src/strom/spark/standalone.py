"""A Spark standalone cluster on this machine, started from the installed PySpark: one master
and N workers (each its own JVM, launching executors in JVMs of their own, which start their
own Python workers), on 127.0.0.1 with ephemeral ports and a temporary directory. For tests
and benchmarks of the connector on Spark as a distributed engine, and for trying a pipeline
on a real cluster without installing Spark:

    with StandaloneCluster(workers=2) as cluster:
        spark = cluster.session("my-app")
        ...
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

MASTER_CLASS = "org.apache.spark.deploy.master.Master"
WORKER_CLASS = "org.apache.spark.deploy.worker.Worker"
_MASTER_URL = re.compile(r"Starting Spark master at (spark://\S+)")
_REGISTERED = "Successfully registered with master"


def spark_home() -> Path:
    """$SPARK_HOME when set, else the installed PySpark's: where PySpark's own launcher looks."""
    if home := os.environ.get("SPARK_HOME"):
        return Path(home)
    import pyspark

    return Path(pyspark.__file__).parent


class _Daemon:
    """A master or worker JVM, its output kept in memory (and on disk) to wait on."""

    def __init__(self, name: str, args: list[str], env: dict[str, str], log: Path) -> None:
        self.name, self.lines = name, []
        self._log = log.open("a")
        # spark-class ends in `exec java ...`: the process is the JVM itself.
        self.proc = subprocess.Popen([str(spark_home() / "bin" / "spark-class"), *args], env=env,
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        threading.Thread(target=self._drain, daemon=True).start()

    def _drain(self) -> None:
        for line in self.proc.stdout:
            self.lines.append(line.rstrip())
            self._log.write(line)
            self._log.flush()

    def wait_for(self, pattern: re.Pattern | str, timeout: float) -> re.Match | str:
        deadline = time.monotonic() + timeout
        seen = 0
        while time.monotonic() < deadline:
            for line in self.lines[seen:]:
                found = pattern.search(line) if isinstance(pattern, re.Pattern) else (pattern in line and line)
                if found:
                    return found
            seen = len(self.lines)
            if self.proc.poll() is not None:
                break
            time.sleep(0.05)
        raise RuntimeError(f"Spark {self.name} did not start in {timeout:.0f} s:\n" + "\n".join(self.lines[-30:]))

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()

    def stop(self, timeout: float = 30.0) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.kill()
        self._log.close()


class StandaloneCluster:
    """`workers` workers of `cores` cores and `memory` each, for executors of `executor_memory`."""

    def __init__(self, workers: int = 2, cores: int = 1, memory: str = "1g", executor_memory: str = "512m",
                 daemon_memory: str = "256m") -> None:
        self.n_workers, self.cores, self.memory = workers, cores, memory
        self.executor_memory = executor_memory
        self._tmp = tempfile.TemporaryDirectory(prefix="strom-spark-standalone-")
        self.dir = Path(self._tmp.name)
        self.env = {**os.environ, "SPARK_HOME": str(spark_home()), "SPARK_LOCAL_IP": "127.0.0.1",
                    "SPARK_DAEMON_MEMORY": daemon_memory, "SPARK_LOG_DIR": str(self.dir / "logs"),
                    "SPARK_CONF_DIR": str(self.dir / "conf")}
        self.master: _Daemon | None = None
        self.workers: list[_Daemon] = []
        self.url = ""

    def start(self, timeout: float = 120.0) -> StandaloneCluster:
        (self.dir / "conf").mkdir(parents=True, exist_ok=True)
        (self.dir / "logs").mkdir(exist_ok=True)
        self.master = _Daemon("master", [MASTER_CLASS, "--host", "127.0.0.1", "--port", "0", "--webui-port", "0"],
                              self.env, self.dir / "logs" / "master.log")
        self.url = self.master.wait_for(_MASTER_URL, timeout)[1]
        for i in range(self.n_workers):
            self.workers.append(self._worker(i))
        for worker in self.workers:
            worker.wait_for(_REGISTERED, timeout)
        return self

    def _worker(self, i: int) -> _Daemon:
        work = self.dir / f"worker-{i}"
        work.mkdir(exist_ok=True)
        return _Daemon(f"worker {i}", [WORKER_CLASS, "--host", "127.0.0.1", "--port", "0", "--webui-port", "0",
                                       "--cores", str(self.cores), "--memory", self.memory, "--work-dir", str(work),
                                       self.url], self.env, self.dir / "logs" / f"worker-{i}.log")

    def replace_worker(self, i: int, timeout: float = 120.0) -> None:
        """Start worker `i` again (after it was killed), as a new worker."""
        self.workers[i].stop()
        self.workers[i] = self._worker(i)
        self.workers[i].wait_for(_REGISTERED, timeout)

    def session(self, app: str = "strom", **conf: Any) -> SparkSession:
        """A SparkSession on this cluster: one executor per worker, Python workers running
        this interpreter (so that they import the Strom installed here)."""
        from pyspark.sql import SparkSession

        # The driver's own Python processes (data source lookup and planning) run what the
        # environment names when the driver's JVM starts.
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        builder = SparkSession.builder.master(self.url).appName(app)
        settings = {
            "spark.executor.memory": self.executor_memory, "spark.executor.cores": str(self.cores),
            "spark.cores.max": str(self.cores * self.n_workers), "spark.pyspark.python": sys.executable,
            "spark.driver.host": "127.0.0.1", "spark.driver.bindAddress": "127.0.0.1",
            "spark.ui.enabled": "false", "spark.ui.showConsoleProgress": "false",
            "spark.sql.shuffle.partitions": "2", **conf}
        for key, value in settings.items():
            builder = builder.config(key, value)
        spark = builder.getOrCreate()
        wanted = self.n_workers
        deadline = time.monotonic() + 120
        while len(executors(spark)) < wanted:  # tasks spread over every worker from the start
            if time.monotonic() > deadline:
                raise RuntimeError(f"{len(executors(spark))} of {wanted} executors registered in 120 s")
            time.sleep(0.1)
        return spark

    def close(self) -> None:
        for worker in self.workers:
            worker.stop()
        if self.master is not None:
            self.master.stop()
        self._tmp.cleanup()

    def __enter__(self) -> StandaloneCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()


def executors(spark: SparkSession) -> list[str]:
    """The ids of the session's live executors (the driver left out)."""
    ids = spark.sparkContext._jsc.sc().getExecutorIds()
    return [ids.apply(i) for i in range(ids.size())]
