"""The README's code runs as printed: "Run a cluster" (started, grown by a fourth broker,
stopped with Ctrl-C), the install line and the client examples of "Connect your client", and
every block of "PySpark" (the scripts as the files the text names, then the shell lines that
run them), against real brokers. Only addresses and ports, the interpreter's path, data and
/tmp checkpoint paths are substituted; a shell line's trailing `# comment` is output it must
print."""

from __future__ import annotations

import importlib.metadata
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from strom.client import Connection
from strom.testing import BrokerProcess, unique_name, wait_for

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
BLOCK = re.compile(r"```(\w+)\n(.*?)```", re.S)


def section(title: str) -> str:
    text = README.read_text().split(f"\n## {title}\n", 1)[1]
    return text.split("\n## ", 1)[0]


def blocks(text: str) -> list[tuple[str, str, str]]:
    """(language, code, the file name the text before it gives: "as `name.py`")."""
    out = []
    for match in BLOCK.finditer(text):
        named = re.search(r"as `([\w.]+\.py)`:\s*$", text[:match.start()])
        out.append((match[1], match[2], named[1] if named else ""))
    return out


@pytest.fixture(scope="module")
def broker():
    with BrokerProcess() as proc:
        yield proc


def localize(code: str, broker: BrokerProcess, work: Path) -> str:
    # /tmp paths first: the interpreter's own path may lie under /tmp (a CI checkout).
    code = re.sub(r"/tmp/([\w-]+)", lambda m: str(work / m[1]), code)
    return code.replace("127.0.0.1:9092", broker.bootstrap).replace(".venv/bin/python", sys.executable)


def run_python(code: str, work: Path, name: str = "example.py") -> str:
    (work / name).write_text(code)
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable}
    done = subprocess.run([sys.executable, name], cwd=work, capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, f"{name}:\n{code}\n{done.stdout[-2000:]}{done.stderr[-3000:]}"
    return done.stdout


def run_shell_line(line: str, work: Path) -> None:
    command, _, expected = line.partition("#")
    done = subprocess.run(["bash", "-c", command], cwd=work, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"{command}\n{done.stdout[-2000:]}{done.stderr[-3000:]}"
    assert expected.strip() in done.stdout, f"{command}: expected {expected.strip()!r}, got {done.stdout!r}"


def test_client_install_line():
    """The one command that adds the clients, run as printed; after it `.venv`'s Python has
    them and kcat is on the PATH."""
    shell = [code for lang, code, _ in blocks(section("Connect your client")) if lang == "sh"]
    assert shell == ["scripts/bootstrap clients\n"]
    done = subprocess.run(["bash", "-c", shell[0]], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    has = subprocess.run([str(ROOT / ".venv/bin/python"), "-c", "import confluent_kafka, aiokafka, kafka"],
                         capture_output=True, text=True, timeout=60)
    assert has.returncode == 0, has.stderr
    assert shutil.which("kcat")
    # On a venv made for `scripts/serve` alone the line installs Strom's `clients` extra: it
    # names both.
    wanted = [r for r in importlib.metadata.requires("strom") or () if 'extra == "clients"' in r]
    assert {re.match(r"[\w-]+", r)[0] for r in wanted} == {"confluent-kafka", "aiokafka"}


def test_connect_your_client(broker, tmp_path):
    python = [code for lang, code, _ in blocks(section("Connect your client")) if lang == "python"]
    assert len(python) == 3  # confluent-kafka, kafka-python, aiokafka
    for code in python:
        assert "hello" in run_python(localize(code, broker, tmp_path), tmp_path)


def test_pyspark(broker, tmp_path):
    ran = []
    for lang, code, name in blocks(section("PySpark")):
        code = localize(code, broker, tmp_path)
        if lang == "python":
            assert name, f"a PySpark block with no file name before it:\n{code}"
            (tmp_path / name).write_text(code)  # run by the shell block that follows
        else:
            assert lang == "sh"
            for line in code.splitlines():
                run_shell_line(line, tmp_path)
                ran.append(line)
    assert any("clicks.py" in line for line in ran) and any("click_counts.py" in line for line in ran)


def free_ports(count: int) -> int:
    """The first of `count` consecutive ports that are free now."""
    for _ in range(50):
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            first = probe.getsockname()[1]
        if first + count > 65535:
            continue
        try:
            for port in range(first, first + count):
                with socket.socket() as s:
                    s.bind(("127.0.0.1", port))
        except OSError:
            continue
        return first
    raise AssertionError(f"no {count} consecutive free ports")


def read_until(proc: subprocess.Popen, marker: str, timeout: float = 180) -> str:
    """stdout lines of `proc` up to the one holding `marker` (which is returned)."""
    seen: list[str] = []

    def line() -> str | None:
        text = proc.stdout.readline()
        if not text:
            raise AssertionError(f"exited ({proc.wait()}) before {marker!r}: {''.join(seen)}")
        seen.append(text)
        return text if marker in text else None

    return wait_for(line, timeout, interval=0, what=marker)


@pytest.mark.timeout(600)
def test_run_a_cluster(tmp_path):
    """Started with the section's command, grown by its fourth broker, the under-replicated
    partitions shown by its describe line, stopped with Ctrl-C: every broker hands its
    leadership on in one request, the last one included (nobody left to take it over is
    no reason to retry)."""
    text = section("Run a cluster")
    code = [c for lang, c, _ in blocks(text) if lang == "sh"]
    assert len(code) == 3, code
    start, fourth, describe = (c.strip() for c in code)
    assert start == "scripts/cluster --brokers 3"
    base, zk = free_ports(4), free_ports(1)
    data = tmp_path / "strom-cluster"

    def localize_cluster(line: str) -> str:
        for n in range(4):
            line = line.replace(f"127.0.0.1:{9092 + n}", f"127.0.0.1:{base + n}")
        line = line.replace("127.0.0.1:2181", f"127.0.0.1:{zk}").replace("strom-cluster/", f"{data}/")
        return line.replace(".venv/bin/strom", f"{sys.executable} -m strom")

    ready_line = re.search(r"It prints `(cluster ready: .*?)`", " ".join(text.split()))[1]
    errors = tmp_path / "cluster.err"
    cluster = subprocess.Popen(
        ["bash", "-c", f"exec {ROOT / start} --base-port {base} --zookeeper-port {zk} --data-dir {data}"],
        cwd=tmp_path, stdout=subprocess.PIPE, stderr=errors.open("w"), text=True)
    extra = None
    try:
        assert read_until(cluster, "cluster ready").strip() == localize_cluster(ready_line)
        extra = subprocess.Popen(["bash", "-c", "exec " + localize_cluster(fourth)], cwd=tmp_path,
                                 stdout=subprocess.PIPE, stderr=(tmp_path / "broker-4.err").open("w"),
                                 text=True)
        assert f"127.0.0.1:{base + 3}" in read_until(extra, " ready on ")
        topic = unique_name("readme-cluster")
        with Connection("127.0.0.1", base) as conn:
            def four_brokers() -> bool:
                body = conn.call(3, 12, {"topics": [], "allow_auto_topic_creation": False,
                                         "include_topic_authorized_operations": False})
                return len(body.brokers) == 4
            wait_for(four_brokers, 60, what="the fourth broker in the cluster's metadata")
            # CreateTopics goes to the controller, as a Kafka client sends it (another broker
            # answers NOT_CONTROLLER); which broker won the election is the cluster's choice.
            meta = conn.call(3, 12, {"topics": [], "allow_auto_topic_creation": False,
                                     "include_topic_authorized_operations": False})
            controller_port = next(b.port for b in meta.brokers if b.node_id == meta.controller_id)
        with Connection("127.0.0.1", controller_port) as conn:
            created = conn.call(19, 5, {"topics": [{
                "name": topic, "num_partitions": -1, "replication_factor": -1,
                "assignments": [{"partition_index": 0, "broker_ids": [4, 1, 2]}], "configs": []}],
                "timeout_ms": 30_000, "validate_only": False}).topics[0]
            assert created.error_code == 0, created
        extra.send_signal(signal.SIGTERM)
        assert extra.wait(60) == 0
        shown = f"\tTopic: {topic}\tPartition: 0\tLeader: 1\tReplicas: 4,1,2\tIsr: 1,2\n"

        def under_replicated() -> str:
            listed = subprocess.run(["bash", "-c", localize_cluster(describe)], capture_output=True,
                                    text=True, timeout=120)
            assert listed.returncode == 0, listed.stderr
            return listed.stdout

        # The brokers learn the new ISR from the controller a moment after it was decided.
        wait_for(lambda: shown in under_replicated(), 60, what=f"{shown!r} in the describe output")
    finally:
        if extra is not None and extra.poll() is None:
            extra.kill()
        cluster.send_signal(signal.SIGINT)  # Ctrl-C
        try:
            code = cluster.wait(120)
        finally:
            if cluster.poll() is None:
                cluster.kill()
    assert code == 0, errors.read_text()[-3000:]
    for broker_id in (1, 2, 3):
        log = (data / f"broker-{broker_id}" / "strom.log").read_text()
        tail = log[log.index("shutting down"):]
        assert "controlled shutdown succeeded" in tail, tail
        assert "still led here" not in tail and "Traceback" not in tail, tail


def test_a_zookeeper_that_is_not_there_is_one_line(tmp_path):
    """A broker pointed at an address where no ZooKeeper answers stops after the connection
    timeout with one line, as every other start-up failure does."""
    port = free_ports(1)
    done = subprocess.run([sys.executable, "-m", "strom", "serve", "--override",
                           f"zookeeper.connect=127.0.0.1:{port}/strom", "--override",
                           "zookeeper.connection.timeout.ms=1000", "--override", f"log.dirs={tmp_path}"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 1, done
    assert done.stderr.splitlines()[-1] == \
        f"strom: cannot start: cannot connect to ZooKeeper at 127.0.0.1:{port}/strom within 1000 ms"
    assert "Traceback" not in done.stderr and "kazoo" not in done.stderr, done.stderr
