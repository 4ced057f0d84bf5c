"""The README's code runs as printed: "Run a cluster" in both modes (KRaft: started, grown by a
dedicated broker, looked at with its describe, metadata-quorum and dump-log lines, stopped with
Ctrl-C; ZooKeeper: started, grown by a fourth broker, stopped), the install line and the client
examples of "Connect your client", "Schemas" (a broker with its registry), and every block of "PySpark" (the scripts as the files the
text names, then the shell lines that run them), against real brokers. Only addresses and ports, the interpreter's path, data and
/tmp checkpoint paths are substituted; a shell line's trailing `# comment` is output it must
print."""

from __future__ import annotations

import importlib.metadata
import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from cli.conftest import free_port_run
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


def run_shell_line(line: str, work: Path, env: dict[str, str] | None = None) -> None:
    command, _, expected = line.partition("#")
    done = subprocess.run(["bash", "-c", command], cwd=work, capture_output=True, text=True, timeout=300, env=env)
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
    """Every block of "PySpark" as printed (`clicks.py` through `strom spark-submit`,
    `click_counts.py` through the venv's Python), with none of PYSPARK_PYTHON,
    PYSPARK_DRIVER_PYTHON and SPARK_HOME set and a `python3` on PATH that fails: Spark finds its
    home, the `strom` source and its workers' Python through what the README runs alone."""
    no_python3 = tmp_path / "bin"
    no_python3.mkdir()
    (no_python3 / "python3").write_text("#!/bin/sh\necho 'python3 from PATH is not for Spark here' >&2\nexit 127\n")
    (no_python3 / "python3").chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k not in ("PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON", "SPARK_HOME")}
    env["PATH"] = f"{no_python3}:{env.get('PATH', '')}"
    ran = []
    for lang, code, name in blocks(section("PySpark")):
        code = localize(code, broker, tmp_path).replace(".venv/bin/strom", str(Path(sys.executable).parent / "strom"))
        if lang == "python":
            assert name, f"a PySpark block with no file name before it:\n{code}"
            (tmp_path / name).write_text(code)  # run by the shell block that follows
        else:
            assert lang == "sh"
            for line in code.splitlines():
                run_shell_line(line, tmp_path, env)
                ran.append(line)
    assert any("strom spark-submit clicks.py" in line for line in ran)
    assert any("python click_counts.py" in line for line in ran)


def test_schemas(tmp_path):
    """"Schemas" as printed, against a broker with its registry: the serializer's record goes in,
    the unframed one is refused, the order comes back decoded."""
    text = section("Schemas")
    (lang, code, name), (shell_lang, shell, _) = blocks(text)
    assert (lang, name, shell_lang) == ("python", "schemas.py", "sh")
    port = free_port_run(1)
    with BrokerProcess(overrides={"schema.registry.listeners": f"http://127.0.0.1:{port}"}) as registry_broker:
        code = localize(code, registry_broker, tmp_path).replace("127.0.0.1:8081", f"127.0.0.1:{port}")
        (tmp_path / name).write_text(code)
        [line] = shell.splitlines()
        command, _, expected = localize(line, registry_broker, tmp_path).partition("#")
        done = subprocess.run(["bash", "-c", command], cwd=tmp_path, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stdout + done.stderr[-3000:]
        assert done.stdout.splitlines() == ["refused: INVALID_RECORD", expected.strip()], done.stdout
        assert "It prints `refused: INVALID_RECORD`" in " ".join(text.split())


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


def localizer(data: Path, ports: dict[int, int]):
    """The README's shell text with its ports (9092 -> a free one), `strom-cluster/` and
    `.venv/bin/strom` replaced by what this run uses."""
    def localize(text: str) -> str:
        text = re.sub(r"127\.0\.0\.1:(\d+)", lambda m: f"127.0.0.1:{ports.get(int(m[1]), int(m[1]))}", text)
        text = text.replace("strom-cluster/", f"{data}/")
        return text.replace(".venv/bin/strom", f"{sys.executable} -m strom")
    return localize


def ready_lines(text: str) -> list[str]:
    return re.findall(r"It prints `(cluster ready: .*?)`", " ".join(text.split()))


def start_cluster(command: str, tmp_path: Path) -> tuple[subprocess.Popen, Path]:
    errors = tmp_path / "cluster.err"
    proc = subprocess.Popen(["bash", "-c", f"exec {ROOT / command}"], cwd=tmp_path, stdout=subprocess.PIPE,
                            stderr=errors.open("w"), text=True)
    return proc, errors


def start_node(line: str, tmp_path: Path, name: str) -> tuple[subprocess.Popen, str]:
    """The node the README's line starts, once it printed its ready line (which is returned)."""
    errors = tmp_path / f"{name}.err"
    proc = subprocess.Popen(["bash", "-c", "exec " + line], cwd=tmp_path, stdout=subprocess.PIPE,
                            stderr=errors.open("w"), text=True)
    try:
        return proc, read_until(proc, " ready on ")
    except AssertionError as e:
        raise AssertionError(f"{e}\n{errors.read_text()[-3000:]}") from None


def stop_cluster(cluster: subprocess.Popen, errors: Path, logs: list[Path]) -> None:
    """Ctrl-C: the command exits 0, and every node handed its leadership on in one request, the
    last ones included (nobody left to take it over is no reason to retry or wait)."""
    cluster.send_signal(signal.SIGINT)
    try:
        code = cluster.wait(120)
    finally:
        if cluster.poll() is None:
            cluster.kill()
    assert code == 0, errors.read_text()[-3000:]
    for path in logs:
        log = path.read_text()
        tail = log[log.rindex("shutting down"):]
        assert "controlled shutdown succeeded" in tail, tail
        assert "still led here" not in tail and "incomplete" not in tail and "Traceback" not in tail, tail


def broker_count(port: int) -> int:
    with Connection("127.0.0.1", port) as conn:
        return len(conn.call(3, 12, {"topics": [], "allow_auto_topic_creation": False,
                                     "include_topic_authorized_operations": False}).brokers)


def section_blocks() -> tuple[str, list[str]]:
    text = section("Run a cluster")
    code = [c for lang, c, _ in blocks(text) if lang == "sh"]
    assert len(code) == 5, code  # KRaft: start, a fourth node, what to look at; ZooKeeper: start, a fourth
    return text, code


@pytest.mark.timeout(600)
def test_run_a_cluster(tmp_path):
    """KRaft, as the section runs it: started with its command, grown by a dedicated broker
    formatted with the cluster's id, the under-replicated partition, the quorum and the
    metadata log's records shown by its lines, stopped with Ctrl-C."""
    text, code = section_blocks()
    start, fourth, inspect = (c.strip() for c in code[:3])
    assert start == "scripts/cluster --brokers 3"
    base = free_port_run(11)  # brokers 1-4, the three controllers, the inter-broker listeners 1-4
    controllers, internal = base + 4, base + 7
    ports = ({9092 + n: base + n for n in range(4)} | {9192 + n: controllers + n for n in range(3)}
             | {9292 + n: internal + n for n in range(4)})
    data = tmp_path / "strom-cluster"
    localize = localizer(data, ports)

    cluster, errors = start_cluster(f"{start} --base-port {base} --controller-port {controllers} "
                                    f"--internal-port {internal} --data-dir {data}", tmp_path)
    extra = None
    try:
        assert read_until(cluster, "cluster ready").strip() == localize(ready_lines(text)[0])
        *setup, serve = localize(fourth).splitlines()
        done = subprocess.run(["bash", "-c", "set -e\n" + "\n".join(setup)], cwd=tmp_path, capture_output=True,
                              text=True, timeout=120)
        assert done.returncode == 0, done.stdout + done.stderr
        assert "Formatting metadata directory" in done.stdout
        extra, ready = start_node(serve, tmp_path, "node-4")
        assert f"broker 4 ready on PLAINTEXT://127.0.0.1:{base + 3}" in ready
        wait_for(lambda: broker_count(base) == 4, 60, what="the fourth broker in the cluster's metadata")
        topic = unique_name("readme-cluster")
        created = subprocess.run([sys.executable, "-m", "strom", "topics", "create", topic, "--replica-assignment",
                                  "4:1:2", "--bootstrap-server", f"127.0.0.1:{base + 1}"],
                                 capture_output=True, text=True, timeout=60)
        assert created.returncode == 0, created.stderr
        extra.send_signal(signal.SIGTERM)
        assert extra.wait(60) == 0

        describe, quorum, dump = (localize(line) for line in inspect.splitlines())
        shown = f"\tTopic: {topic}\tPartition: 0\tLeader: 1\tReplicas: 4,1,2\tIsr: 1,2\n"

        def run(line: str) -> str:
            done = subprocess.run(["bash", "-c", line], cwd=tmp_path, capture_output=True, text=True, timeout=120)
            assert done.returncode == 0, done.stderr
            return done.stdout

        # The brokers learn the new ISR from the metadata log a moment after it was decided.
        wait_for(lambda: shown in run(describe), 60, what=f"{shown!r} in the describe output")
        status = dict(line.split(":", 1) for line in run(quorum).splitlines())
        assert status["ClusterId"].strip() == (data / "cluster-id").read_text().strip()
        assert status["LeaderId"].strip() in {"1", "2", "3"}
        assert f'"name":"{topic}"' in run(dump)
    finally:
        if extra is not None and extra.poll() is None:
            extra.kill()
        stop_cluster(cluster, errors, [data / f"node-{n}" / "strom.log" for n in (1, 2, 3)])


@pytest.mark.timeout(600)
def test_run_a_cluster_in_zookeeper_mode(tmp_path):
    """The alternative the section shows: ZooKeeper and three brokers, a fourth broker by hand,
    Ctrl-C."""
    text, code = section_blocks()
    start, fourth = (c.strip() for c in code[3:])
    assert start == "scripts/cluster --brokers 3 --zookeeper"
    base = free_port_run(9)  # brokers 1-4, ZooKeeper, the inter-broker listeners 1-4
    zk, internal = base + 4, base + 5
    data = tmp_path / "strom-cluster"
    localize = localizer(data, {9092 + n: base + n for n in range(4)} | {2181: zk}
                         | {9292 + n: internal + n for n in range(4)})

    cluster, errors = start_cluster(f"{start} --base-port {base} --zookeeper-port {zk} --internal-port {internal} "
                                    f"--data-dir {data}", tmp_path)
    extra = None
    try:
        assert read_until(cluster, "cluster ready").strip() == localize(ready_lines(text)[1])
        extra, ready = start_node(localize(fourth), tmp_path, "broker-4")
        assert f"127.0.0.1:{base + 3}" in ready
        wait_for(lambda: broker_count(base) == 4, 60, what="the fourth broker in the cluster's metadata")
        extra.send_signal(signal.SIGTERM)
        assert extra.wait(60) == 0
    finally:
        if extra is not None and extra.poll() is None:
            extra.kill()
        stop_cluster(cluster, errors, [data / f"broker-{n}" / "strom.log" for n in (1, 2, 3)])


def test_a_zookeeper_that_is_not_there_is_one_line(tmp_path):
    """A broker pointed at an address where no ZooKeeper answers stops after the connection
    timeout with one line, as every other start-up failure does."""
    port = free_port_run(1)
    done = subprocess.run([sys.executable, "-m", "strom", "serve", "--override",
                           f"zookeeper.connect=127.0.0.1:{port}/strom", "--override",
                           "zookeeper.connection.timeout.ms=1000", "--override", f"log.dirs={tmp_path}"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 1, done
    assert done.stderr.splitlines()[-1] == \
        f"strom: cannot start: cannot connect to ZooKeeper at 127.0.0.1:{port}/strom within 1000 ms"
    assert "Traceback" not in done.stderr and "kazoo" not in done.stderr, done.stderr


@pytest.mark.timeout(300)
def test_tiered_storage(tmp_path):
    """"Tiered storage" as printed: the local S3 server with its properties file, a broker
    started with them, a tiered topic written and described until its remote size shows, then
    read whole from offset 0. Ports, /tmp paths and the broker's data dir are substituted, and
    the client lines get the broker's address."""
    text = section("Tiered storage")
    setup, serve, topic = (code.strip() for lang, code, _ in blocks(text) if lang == "sh")
    bootstrap, s3_line = setup.splitlines()
    assert bootstrap == "scripts/bootstrap tiered" and "s3-server" in s3_line
    assert "S3 ready at http://127.0.0.1:8333" in text
    done = subprocess.run(["bash", "-c", bootstrap], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    s3_port, broker_port = free_port_run(1), free_port_run(1)

    def local(line: str) -> str:
        return re.sub(r"/tmp/([\w.-]+)", lambda m: str(tmp_path / m[1]), line)

    s3 = subprocess.Popen(["bash", "-c", f"exec {local(s3_line)} --port {s3_port}"], cwd=ROOT,
                          stdout=subprocess.DEVNULL, stderr=(tmp_path / "s3.err").open("w"))
    broker = None
    try:
        wait_for(lambda: (tmp_path / "tiered.properties").exists(), 120, what="the S3 server's properties file")
        assert f"http://127.0.0.1:{s3_port}" in (tmp_path / "tiered.properties").read_text()
        # scripts/serve moves to the checkout itself: started from tmp_path, its error log stays there
        broker, ready = start_node(f"{ROOT}/{local(serve)} --override listeners=PLAINTEXT://127.0.0.1:{broker_port} "
                                   f"--override log.dirs={tmp_path / 'strom-data'}", tmp_path, "tiered-broker")
        address = f"--bootstrap-server 127.0.0.1:{broker_port}"
        create, produce, describe = (f"{line} {address}" for line in topic.splitlines())
        for line in (create, produce):
            done = subprocess.run(["bash", "-c", line], cwd=ROOT, capture_output=True, text=True, timeout=120)
            assert done.returncode == 0, f"{line}\n{done.stderr[-3000:]}"

        def tiered() -> bool:
            shown = subprocess.run(["bash", "-c", describe], cwd=ROOT, capture_output=True, text=True, timeout=60)
            remote = re.search(r"RemoteSize: (\d+)", shown.stdout)
            local_start = re.search(r"LocalLogStartOffset: (\d+)", shown.stdout)
            return bool(remote and local_start and int(remote[1]) > 0 and int(local_start[1]) > 0)

        wait_for(tiered, 90, interval=1, what="the topic's remote size in describe")
        consumed = subprocess.run(["bash", "-c", f".venv/bin/strom consume clicks --from-beginning --exit-at-end "
                                   f"{address} | wc -l"], cwd=ROOT, capture_output=True, text=True, timeout=120)
        assert consumed.stdout.strip() == "100000", consumed.stderr[-2000:]
    finally:
        if broker is not None:
            broker.send_signal(signal.SIGTERM)
            assert broker.wait(60) == 0
        s3.send_signal(signal.SIGINT)
        s3.wait(30)


@pytest.mark.timeout(300)
def test_iceberg_topics(tmp_path):
    """"Iceberg topics" as printed: the broker started by its scripts/serve line (on a free port,
    data under this test's directory), the topic and records by the CLI lines, and the table read
    by the Python file, which prints the three values."""
    text = section("Iceberg topics")
    (_, setup, _), (_, topic, _), (lang, code, name), (_, run, _) = blocks(text)
    bootstrap, serve = setup.strip().splitlines()
    assert (bootstrap, lang, name, run.strip()) == ("scripts/bootstrap iceberg", "python", "pageviews_table.py",
                                                    ".venv/bin/python pageviews_table.py")
    done = subprocess.run(["bash", "-c", bootstrap], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    port, data = free_port_run(1), tmp_path / "strom-data"
    broker, _ = start_node(f"{ROOT}/{serve} --override listeners=PLAINTEXT://127.0.0.1:{port} "
                           f"--override log.dirs={data}", tmp_path, "iceberg-broker")
    try:
        for line in topic.strip().splitlines():
            line = f"{line} --bootstrap-server 127.0.0.1:{port}"
            done = subprocess.run(["bash", "-c", line], cwd=ROOT, capture_output=True, text=True, timeout=120)
            assert done.returncode == 0, f"{line}\n{done.stderr[-3000:]}"
        assert 'Path("strom-data/iceberg/catalog.db")' in code  # the broker's data dir, here the test's
        (tmp_path / name).write_text(code.replace('Path("strom-data/', f'Path("{data}/'))
        printed = run.strip().replace(".venv/bin/python", sys.executable)
        done = subprocess.run(["bash", "-c", printed], cwd=tmp_path, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr[-3000:]
        expected = re.search(r"It prints `(.*?)`", text)[1]
        assert done.stdout.strip() == expected == "[b'cart', b'checkout', b'home']"
    finally:
        broker.send_signal(signal.SIGTERM)
        assert broker.wait(60) == 0
