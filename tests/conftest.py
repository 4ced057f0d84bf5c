"""What every part of Strom's suite shares.

- Clients a test leaves open are closed when it ends. A confluent-kafka producer or consumer
  that outlives its test keeps reconnecting to a broker that has gone, and librdkafka prints a
  FAIL line for each attempt into whatever test runs next: every Producer and Consumer made
  while a test runs is closed (queued records purged first) once the test is over. An
  AdminClient has no close(): it goes when the last reference does, and a failed admin call
  keeps it in a reference cycle (the future holds the exception, whose traceback holds the
  frame that holds the future and the client) that only the cyclic collector frees, perhaps
  long after its broker has stopped; so a collection runs after a test that leaves one alive.
- Ctrl-C reaches the commands tests start. A suite started in the background (`scripts/test &`,
  nohup, some CI runners) inherits SIGINT ignored, and so would every process it starts: a
  test's SIGINT to `strom consume` would then do nothing, and the test would hang.
- The `slow` marker (`scripts/test -m "not slow"`, the quick inner loop) is set here on the
  modules that take the longest, and a parallel run (pytest-xdist, `--dist loadfile`) starts
  them first, so that no long module is left to run alone at the end. Such a run keeps a
  module on one worker (its tests share brokers and clusters), and the modules of each group
  in TOGETHER on one worker too: those that run Spark in two groups (the ones that start Spark
  processes of their own, and those sharing one local session), so that few workers run JVMs
  at once (the README's test starts two more of its own), and the power cuts.
"""

from __future__ import annotations

import atexit
import gc
import importlib.util
import os
import shutil
import signal
import tempfile
import weakref
from collections.abc import Iterator
from pathlib import Path

import confluent_kafka
import confluent_kafka.admin
import pytest

from strom.testing import close_client, fork_brokers

# Handlers are reset to the default at exec; an ignored signal stays ignored.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

# --- broker processes ---------------------------------------------------------------------------
# The suite starts about 570 brokers; each would spend 0.2 s of CPU importing Strom. They are
# forked from a process that has imported it (strom/testing_fork.py) and run the same entry point
# as `python -m strom serve`. The README's and the CLI's tests still start `strom` as users do.
fork_brokers()


# --- the JVMs tests start (Spark, ZooKeeper) ---------------------------------------------------
# They live for a module or less, so most of their CPU is JIT compilation at full optimisation,
# a parallel collector's threads and verifying the bytecode of the jars they load; on two cores
# that CPU is taken from the brokers under test. The client compiler alone and a serial collector
# cut the Spark modules' CPU by a quarter; not verifying Spark's and ZooKeeper's own jars cuts a
# Spark session's start by another eighth. Only a test run's JVMs get this; a user's
# `spark-submit` or ZooKeeper keeps the JVM's defaults.
os.environ.setdefault("JAVA_TOOL_OPTIONS", "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC "
                      "-XX:+UnlockDiagnosticVMOptions -XX:-BytecodeVerificationRemote")


# --- PySpark's Python processes -------------------------------------------------------------------
# Spark puts $SPARK_HOME/python/lib/pyspark.zip (and py4j's zip) first on the path of every
# Python process it starts. A zip holds sources only, so each such process compiles PySpark
# afresh (a streaming query's source runner, each kind of worker daemon: ~1 s of CPU apiece),
# and each worker forked for a task re-reads the zip's 1,500-entry directory. That was a third
# of the Spark modules' CPU. A test run's Spark uses a SPARK_HOME of links to the installed one
# where those two "zips" are directories holding the same packages, which Python imports from
# their compiled caches. The same PySpark and Spark run; a worker interpreter without PySpark
# installed (tests/spark/test_install.py) still finds it there.
def _spark_home_of_directories() -> str | None:
    spec = importlib.util.find_spec("pyspark")
    if spec is None or spec.origin is None:
        return None
    real = Path(spec.origin).parent
    home = Path(tempfile.mkdtemp(prefix="strom-test-spark-home-"))
    atexit.register(shutil.rmtree, home, ignore_errors=True)  # removes the links, not their targets
    for entry in real.iterdir():
        if entry.name != "python":
            (home / entry.name).symlink_to(entry)
    lib = home / "python" / "lib"
    lib.mkdir(parents=True)
    for entry in (real / "python").iterdir():
        if entry.name != "lib":
            (home / "python" / entry.name).symlink_to(entry)
    for archive in (real / "python" / "lib").glob("*.zip"):
        package = "pyspark" if archive.name == "pyspark.zip" else archive.name.split("-", 1)[0]
        (lib / archive.name).mkdir()
        (lib / archive.name / package).symlink_to(Path(importlib.util.find_spec(package).origin).parent)
    return str(home)


if "SPARK_HOME" not in os.environ and (_home := _spark_home_of_directories()):
    os.environ["SPARK_HOME"] = _home

# --- clients left open ---------------------------------------------------------------------------
_opened: weakref.WeakSet = weakref.WeakSet()  # weak: a test may drop a client on purpose
_admins: weakref.WeakSet = weakref.WeakSet()


class _ClosedAfterTheTest:
    """Mixed into confluent-kafka's Producer and Consumer: remembers each instance made."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        _opened.add(self)


class Producer(_ClosedAfterTheTest, confluent_kafka.Producer):
    pass


class Consumer(_ClosedAfterTheTest, confluent_kafka.Consumer):
    pass


# Before any test module imports them (this conftest is loaded first).
confluent_kafka.Producer, confluent_kafka.Consumer = Producer, Consumer
# AdminClient is patched in place, not subclassed: its methods name their class through the
# module (super(AdminClient, self)), which a subclass put there would send round in circles.
_make_admin = confluent_kafka.admin.AdminClient.__init__


def _remembered_admin(self, *args, **kwargs) -> None:
    _make_admin(self, *args, **kwargs)
    _admins.add(self)


confluent_kafka.admin.AdminClient.__init__ = _remembered_admin


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    _opened.clear()  # made by fixtures: theirs to close
    _admins.clear()
    try:
        return (yield)
    finally:
        for client in list(_opened):
            close_client(client)
        _opened.clear()
        if _admins:  # one the test made is still referenced: by a cycle, unless it is kept
            gc.collect()
        _admins.clear()


# --- slow modules, and the order a parallel run starts them in ----------------------------------
# Longest first, as measured: the junit times of two whole runs, per module or TOGETHER group
# (5 workers on 2 cores, the second run's in brackets). `-m "not slow"` leaves these out.
SLOW: tuple[str, ...] = (
    "tests/spark/",                                  # 376 (466) the shared session's group, 425 (337) the other
    "tests/test_readme.py",                          # 174 (171), its PySpark section 40-57
    "tests/integration/test_secure_walkthrough.py",  # 51 (62), with the group that starts Spark processes
    "tests/cluster/test_failover.py",                # 106 (117)
    "tests/cluster/test_replication.py",             # 103 (112), both modes
    "tests/cluster/test_nemesis.py",                 # 98 (110)
    "tests/cluster/test_cluster.py",                 # 79 (90)
    "tests/server/test_hardening2.py",               # 83 (87)
    "tests/raft/test_simulation.py",                 # 62 (85)
    "tests/integration/test_tls_failures.py",        # 73 (82)
    "tests/cluster/test_partition_scale_cluster.py", # 76 (82)
    "tests/cli/test_cluster_cli.py",                 # 73 (81)
    "tests/powerloss/",                              # 74 (104), one group
    "tests/server/test_fuzz.py",                     # 48 (63): a broker, then a controller listener
    "tests/cluster/test_transactions_cluster.py",    # 50 (61)
    "tests/cli/test_produce_consume_cli.py",         # 36 (59)
    "tests/cli/test_offsets_cli.py",                 # 70 (49)
    "tests/cli/test_topics_cli.py",                  # 63 (37)
    "tests/integration/test_partition_scale.py",     # 36 (47)
    "tests/cli/test_admin_tools_cli.py",             # 40 (50)
    "tests/test_mutation_check.py",                  # 43 (37), a pytest run per mutant
    "tests/cli/test_reassign_cli.py",                # 25 (41)
    "tests/server/test_hardening.py",                # 24 (31)
    "tests/cluster/",                                # 20-52 each, the other modules
    "tests/tables/test_iceberg_cluster.py",          # 20 (a KRaft cluster)
    "tests/kraft/",                                  # 5-23 each
)


def _slow_rank(item: pytest.Item) -> int:
    path = item.nodeid.split("::", 1)[0]
    for rank, prefix in enumerate(SLOW):
        if path.startswith(prefix):
            return rank
    return len(SLOW)


# test_readme.py runs alone: in that group it made a chain of 425-507 s on one worker, longer than
# the rest of the suite takes on the others; it starts two Spark processes in one of its tests.
TOGETHER = {
    "spark-processes": ("tests/spark/test_standalone.py", "tests/spark/test_dropin.py",
                        "tests/integration/test_secure_walkthrough.py"),
    "spark": ("tests/spark/",),
    "powerloss": ("tests/powerloss/",),
}


@pytest.hookimpl(optionalhook=True)  # a hook of pytest-xdist: none without it (-p no:xdist)
def pytest_xdist_make_scheduler(config: pytest.Config, log):
    """--dist loadfile, with each group of TOGETHER one unit of work."""
    if config.getoption("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class Scheduler(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            path = nodeid.split("::", 1)[0]
            return next((group for group, prefixes in TOGETHER.items() if path.startswith(prefixes)), path)

    return Scheduler(config, log)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if _slow_rank(item) < len(SLOW):
            item.add_marker(pytest.mark.slow)
    items.sort(key=_slow_rank)  # stable: within a rank, modules and tests keep their order


# --- where the suite's CPU goes ------------------------------------------------------------------
# On two cores the suite is bound by CPU, not by waiting: STROM_TEST_CPU_LOG=FILE appends, per
# module, the CPU its tests took in the worker and in the processes it started and reaped
# (brokers, ZooKeeper, CLI runs), one "seconds path" line each, to find what to make cheaper.
_cpu_by_module: dict[str, float] = {}


def _cpu_now() -> float:
    import resource

    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime + _fork_server_cpu()


def _fork_server_cpu() -> float:
    """CPU of the brokers forked for this worker (strom/testing_fork.py): they are the fork
    server's children, not ours, so only the server's account of those it reaped has them."""
    from multiprocessing import forkserver

    pid = getattr(forkserver._forkserver, "_forkserver_pid", None)
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split() if pid else []
    except OSError:  # not started yet, or gone
        return 0.0
    # utime, stime, cutime, cstime: fields 14-17 of proc(5), counted from the state (field 3).
    return sum(int(f) for f in fields[11:15]) / os.sysconf("SC_CLK_TCK") if fields else 0.0


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    if not os.environ.get("STROM_TEST_CPU_LOG"):
        return (yield)
    start = _cpu_now()
    try:
        return (yield)
    finally:
        module = item.nodeid.split("::", 1)[0]
        _cpu_by_module[module] = _cpu_by_module.get(module, 0.0) + _cpu_now() - start


def pytest_sessionfinish(session: pytest.Session) -> None:
    path = os.environ.get("STROM_TEST_CPU_LOG")
    if path and _cpu_by_module:
        with open(path, "a") as out:
            out.writelines(f"{cpu:8.1f} {module}\n" for module, cpu in _cpu_by_module.items())
