"""`strom cluster up` in its default mode, KRaft, as a user runs it: three combined nodes formatted
and started by the command, used through their brokers and controllers by `strom topics`,
`strom metadata-quorum` (as kafka-metadata-quorum) and `strom dump-log` on the metadata log they
wrote, stopped with Ctrl-C and started again on the same directories; a node killed is started
again, a node added by hand is started and stopped with the others."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from strom.client import Connection
from strom.metadata.storage import read_meta
from strom.protocol.errors import ErrorCode
from strom.protocol.raft_records import data_batch
from strom.raft.snapshots import parse_filename
from strom.testing import unique_name, wait_for

from .conftest import fails, free_port_run, ok, strom

pytestmark = pytest.mark.timeout(300)

NODES = 3
# A snapshot of the metadata log once it holds a few KB, so that the module sees one.
OVERRIDES = ("metadata.log.max.record.bytes.between.snapshots=2048",)


class LocalCluster:
    """One `strom cluster up` process and the directory it keeps its nodes in (given to it
    relative to `cwd` when there is one, as a user in that directory would)."""

    def __init__(self, data: Path, nodes: int = NODES, cwd: Path | None = None) -> None:
        self.data, self.nodes, self.cwd = data, nodes, cwd
        self.base = free_port_run(3 * nodes)  # brokers, controllers, inter-broker: no run overlaps another
        self.controller_base = self.base + nodes
        self.internal_base = self.base + 2 * nodes
        self.proc: subprocess.Popen | None = None
        self.ready_line = ""
        self.errors: list[str] = []  # its stderr so far, read as it comes

    @property
    def bootstrap(self) -> str:
        return ",".join(f"127.0.0.1:{self.base + i}" for i in range(self.nodes))

    @property
    def controllers(self) -> str:
        return ",".join(f"127.0.0.1:{self.controller_base + i}" for i in range(self.nodes))

    def start(self, *more: str) -> None:
        data = self.data if self.cwd is None else self.data.relative_to(self.cwd)
        args = [sys.executable, "-m", "strom", "cluster", "up", "--brokers", str(self.nodes),
                "--base-port", str(self.base), "--controller-port", str(self.controller_base),
                "--internal-port", str(self.internal_base), "--data-dir", str(data), *more]
        for item in OVERRIDES:
            args += ["--override", item]
        self.proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=self.cwd)
        self.errors = []
        self._reader = threading.Thread(target=self._read_errors, args=(self.proc.stderr,), daemon=True)
        self._reader.start()
        self.ready_line = self.proc.stdout.readline()
        assert self.ready_line.startswith("cluster ready"), (self.ready_line, self.stop_now())

    def _read_errors(self, stream) -> None:
        for line in stream:
            self.errors.append(line)

    def stop(self) -> tuple[int, str]:
        """Ctrl-C, as a user stops it: its exit code and stderr."""
        self.proc.send_signal(signal.SIGINT)
        self.proc.wait(timeout=120)
        self._reader.join(10)
        return self.proc.returncode, "".join(self.errors)

    def stop_now(self) -> str:
        self.proc.kill()
        self.proc.wait()
        self._reader.join(10)
        return "".join(self.errors)[-3000:]

    def node_pid(self, node_id: int) -> int | None:
        """The pid of node `node_id`'s `strom serve`, a child of this `strom cluster up`."""
        config = f"node-{node_id}/server.properties".encode()
        for entry in Path("/proc").iterdir():
            try:
                args = (entry / "cmdline").read_bytes().split(b"\0")
                parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            if parent == self.proc.pid and any(arg.endswith(config) for arg in args):
                return int(entry.name)
        return None

    @property
    def admin(self) -> tuple[str, str]:
        return "--command-config", str(self.data / "admin.properties")

    def node_log(self, node_id: int) -> str:
        return (self.data / f"node-{node_id}" / "strom.log").read_text()

    def metadata_dir(self, node_id: int) -> Path:
        return self.data / f"node-{node_id}" / "logs" / "__cluster_metadata-0"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = LocalCluster(tmp_path_factory.mktemp("cluster") / "strom-cluster")
    c.start()
    try:
        yield c
    finally:
        if c.proc.poll() is None:
            c.stop()


@pytest.fixture(scope="module")
def topic(cluster) -> str:
    """A topic of 3 partitions on every node, created through a broker (which forwards it to
    the active controller)."""
    name = unique_name("kraft-cli")
    ok("topics", "create", name, "--partitions", "3", "--replication-factor", "3",
       "--bootstrap-server", f"127.0.0.1:{cluster.base + 1}")
    return name


def test_three_combined_nodes_serve_as_one_cluster(cluster, topic):
    assert cluster.ready_line.strip() == (f"cluster ready: bootstrap {cluster.bootstrap} "
                                          f"(kraft, controllers {cluster.controllers}, "
                                          f"secure: admin {cluster.data / 'admin.properties'})")
    config = (cluster.data / "node-2" / "server.properties").read_text()
    voters = ",".join(f"{n + 1}@127.0.0.1:{cluster.controller_base + n}" for n in range(NODES))
    assert "process.roles=broker,controller\n" in config and f"controller.quorum.voters={voters}\n" in config
    cluster_id = (cluster.data / "cluster-id").read_text().strip()
    for n in range(1, NODES + 1):
        meta = read_meta(cluster.data / f"node-{n}" / "logs")
        assert meta.node_id == n and meta.cluster_id == cluster_id

    described = ok("topics", "describe", "--topic", topic, "--bootstrap-server", f"127.0.0.1:{cluster.base}")
    rows = re.findall(r"Partition: (\d+)\tLeader: (\d+)\tReplicas: ([\d,]+)\tIsr: ([\d,]+)", described)
    assert len(rows) == 3
    for _, leader, replicas, isr in rows:
        assert sorted(replicas.split(",")) == ["1", "2", "3"] and leader in isr.split(",")
    ok("produce", topic, "--bootstrap-server", f"127.0.0.1:{cluster.base + 2}", "--sync", "--acks", "all",
       input="one\ntwo\n")
    out = ok("consume", topic, "--from-beginning", "--max-messages", "2", "--bootstrap-server",
             f"127.0.0.1:{cluster.base}", allow_stderr=True)
    assert sorted(out.split()) == ["one", "two"]


@pytest.mark.parametrize("through", ["--bootstrap-server", "--bootstrap-controller"])
def test_metadata_quorum_describe(cluster, through, tmp_path):
    servers = cluster.bootstrap if through == "--bootstrap-server" else cluster.controllers
    # The controller listener is the nodes' (and the administrator's): SASL.
    admin = () if through == "--bootstrap-server" else cluster.admin
    status = ok("metadata-quorum", through, servers.split(",")[1], *admin, "describe", "--status")
    fields = dict(line.split(":", 1) for line in status.splitlines())
    fields = {k: v.strip() for k, v in fields.items()}
    assert fields["ClusterId"] == (cluster.data / "cluster-id").read_text().strip()
    assert fields["LeaderId"] in {"1", "2", "3"} and int(fields["LeaderEpoch"]) >= 1
    assert int(fields["HighWatermark"]) > 0 and int(fields["MaxFollowerLag"]) >= 0
    voters = re.findall(r'"id": (\d+), "directoryId": "[\w-]+", "endpoints": \["CONTROLLER://127.0.0.1:(\d+)"\]',
                        fields["CurrentVoters"])
    assert [(int(n), int(p)) for n, p in voters] == [(n + 1, cluster.controller_base + n) for n in range(NODES)]
    assert fields["CurrentObservers"] == "[]"  # every broker is a voter's own

    replication = ok("metadata-quorum", through, servers, *admin, "describe", "--replication")
    header, *rows = [line.split() for line in replication.splitlines()]
    assert header == ["NodeId", "DirectoryId", "LogEndOffset", "Lag", "LastFetchTimestamp",
                      "LastCaughtUpTimestamp", "Status"]
    assert sorted(int(r[0]) for r in rows) == [1, 2, 3]
    assert [r[0] for r in rows if r[6] == "Leader"] == [fields["LeaderId"]]
    assert {r[6] for r in rows} == {"Leader", "Follower"}
    assert all(int(r[2]) > 0 and int(r[3]) >= 0 for r in rows)

    # --command-config's client properties are used: TLS to a plaintext listener fails.
    props = tmp_path / "client.properties"
    props.write_text("security.protocol=SSL\nrequest.timeout.ms=5000\n")
    line = fails("metadata-quorum", through, servers, "--command-config", str(props), "describe", "--status")
    assert line.startswith("Error: "), line


FETCH, VOTE = 1, 52


def test_secure_by_default(cluster, topic):
    """The nodes reach each other over SASL with credentials made for this cluster; a client of
    the PLAINTEXT listener works with topics but cannot act as a node (a follower's fetch, a
    quorum's Vote) nor grant itself more; the administrator can."""
    for name in ("credentials.properties", "admin.properties", "node-security.properties",
                 "node-1/server.properties"):
        assert (cluster.data / name).stat().st_mode & 0o077 == 0, name  # passwords: the owner's only
    config = (cluster.data / "node-1" / "server.properties").read_text()
    assert "CONTROLLER:SASL_PLAINTEXT" in config and "inter.broker.listener.name=INTERNAL\n" in config
    assert "authorizer.class.name=org.apache.kafka.metadata.authorizer.StandardAuthorizer\n" in config
    password = re.search(r"node\.password=(\S+)", (cluster.data / "credentials.properties").read_text())[1]
    assert len(password) >= 24 and f'password="{password}"' in config

    # A forged follower's fetch needs ClusterAction on the cluster, which anonymous clients lack:
    # each partition is refused.
    body = {"replica_id": 2, "replica_state": {"replica_id": 2, "replica_epoch": -1}, "max_wait_ms": 0,
            "min_bytes": 1, "max_bytes": 1 << 20, "isolation_level": 0, "session_id": 0, "session_epoch": -1,
            "forgotten_topics_data": [], "rack_id": "",
            "topics": [{"topic": topic, "topic_id": b"\0" * 16, "partitions": [
                {"partition": 0, "current_leader_epoch": -1, "fetch_offset": 0, "last_fetched_epoch": -1,
                 "log_start_offset": -1, "partition_max_bytes": 1 << 20}]}]}
    for port in range(cluster.base, cluster.base + NODES):
        with Connection("127.0.0.1", port) as conn:
            answer = conn.call(FETCH, 12, body).responses[0].partitions[0]
            assert answer.error_code == ErrorCode.CLUSTER_AUTHORIZATION_FAILED and answer.records in (b"", None)
    # The controller listener wants SASL first: a Vote without it ends the connection.
    with Connection("127.0.0.1", cluster.controller_base) as conn, pytest.raises((ConnectionError, OSError)):
        conn.call(VOTE, 1, {"cluster_id": None, "voter_id": 1, "topics": []})
    # Nor may an anonymous client add the ACL that would make it a node.
    line = fails("acls", "add", "--allow-principal", "User:ANONYMOUS", "--operation", "clusteraction",
                 "--cluster", "--bootstrap-server", cluster.bootstrap)
    assert "Cluster authorization failed" in line, line
    # The administrator may, through the INTERNAL listeners its properties name.
    admin_bootstrap = ",".join(f"127.0.0.1:{cluster.internal_base + i}" for i in range(NODES))
    user = unique_name("ops")
    ok("acls", "add", "--allow-principal", f"User:{user}", "--operation", "alter", "--cluster", *cluster.admin,
       "--bootstrap-server", admin_bootstrap)
    assert f"principal=User:{user}" in ok("acls", "list", *cluster.admin, "--bootstrap-server", admin_bootstrap)


def test_insecure_keeps_plaintext_nodes(tmp_path):
    base = free_port_run(2)
    done = strom("cluster", "up", "--brokers", "1", "--base-port", str(base), "--controller-port", str(base + 1),
                 "--insecure", "--internal-port", str(base + 5), "--data-dir", str(tmp_path / "c"))
    assert done.returncode == 2 and "not with --insecure" in done.stderr
    proc = subprocess.Popen([sys.executable, "-m", "strom", "cluster", "up", "--brokers", "1", "--base-port", str(base),
                             "--controller-port", str(base + 1), "--insecure", "--data-dir", str(tmp_path / "c")],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        ready = proc.stdout.readline()
        assert ready.strip().endswith(", insecure)"), ready
        config = (tmp_path / "c" / "node-1" / "server.properties").read_text()
        assert "CONTROLLER:PLAINTEXT" in config and "authorizer" not in config
        assert not (tmp_path / "c" / "credentials.properties").exists()
    finally:
        proc.send_signal(signal.SIGINT)
        proc.communicate(timeout=120)


def _payloads(out: str, kind: str) -> list[str]:
    return [line for line in out.splitlines() if f'payload: {{"type":"{kind}"' in line]


def test_dump_log_decodes_the_metadata_log(cluster, topic):
    out = ok("dump-log", str(cluster.metadata_dir(1)))
    assert "Dumping " in out and "isvalid: true" in out and "isvalid: false" not in out
    state = out.split("quorum-state\n", 1)[1].splitlines()[0]
    assert re.match(r'\{.*"leaderId":[123],"leaderEpoch":\d+', state), state
    created = [line for line in _payloads(out, "TOPIC_RECORD") if f'"name":"{topic}"' in line]
    assert len(created) == 1
    topic_id = re.search(r'"topicId":"([\w-]+)"', created[0])[1]
    partitions = [line for line in _payloads(out, "PARTITION_RECORD") if f'"topicId":"{topic_id}"' in line]
    assert sorted(int(re.search(r'"partitionId":(\d+)', p)[1]) for p in partitions) == [0, 1, 2]
    assert all(re.search(r'"replicas":\[\d,\d,\d\]', p) for p in partitions)
    registered = {int(re.search(r'"brokerId":(\d+)', line)[1]) for line in _payloads(out, "REGISTER_BROKER_RECORD")}
    assert registered == {1, 2, 3}
    ports = {int(p) for p in re.findall(r'"name":"PLAINTEXT","host":"127.0.0.1","port":(\d+)', out)}
    assert ports == {cluster.base, cluster.base + 1, cluster.base + 2}
    assert re.search(r'LeaderChange: \{"version":0,"leaderId":[123],"voters":\[\{"voterId":1\}', out)
    assert _payloads(out, "FEATURE_LEVEL_RECORD")  # metadata.version, from the bootstrap checkpoint

    # The same segment elsewhere is decoded when asked (--cluster-metadata-decoder), as Kafka's tool
    # does, and shown as bytes otherwise.
    segment = sorted(cluster.metadata_dir(1).glob("*.log"))[0]
    asked = ok("dump-log", str(segment), "--cluster-metadata-decoder")
    assert [line for line in asked.splitlines() if line.startswith("| ")] == \
        [line for line in ok("dump-log", str(segment)).splitlines() if line.startswith("| ")]
    copy = cluster.data.parent / "copy" / segment.name
    copy.parent.mkdir()
    copy.write_bytes(segment.read_bytes())
    plain = ok("dump-log", str(copy))
    assert "payload:" not in plain and "baseOffset: 0" in plain
    assert _payloads(ok("dump-log", str(copy), "--cluster-metadata-decoder"), "TOPIC_RECORD")


def test_dump_log_decodes_snapshots(cluster, topic):
    def snapshots() -> list[Path]:
        """The snapshots once the newest holds the topic (one taken before it was made may not)."""
        found = sorted(p for p in cluster.metadata_dir(2).glob("*.checkpoint") if parse_filename(p.name).offset > 0)
        if found and f'"name":"{topic}"' in ok("dump-log", str(found[-1])):
            return found
        # more records, until the log holds enough for a snapshot
        ok("topics", "create", unique_name("more"), "--bootstrap-server", cluster.bootstrap)
        return []

    snapshots = wait_for(snapshots, 120, interval=0.5, what="a snapshot of the metadata log with the topic")
    out = ok("dump-log", str(snapshots[-1]))
    snapshot_id = parse_filename(snapshots[-1].name)
    assert f"Snapshot end offset: {snapshot_id.offset}, epoch: {snapshot_id.epoch}" in out
    records = [line for line in out.splitlines() if line.startswith("| ")]
    assert re.search(r' SnapshotHeader: \{"version":0,"lastContainedLogTimestamp":\d+\}$', records[0])
    assert records[-1].endswith('SnapshotFooter: {"version":0}')
    assert any(f'"name":"{topic}"' in line for line in _payloads(out, "TOPIC_RECORD"))
    assert len(_payloads(out, "REGISTER_BROKER_RECORD")) == 3  # the image: one per broker

    bootstrap = ok("dump-log", str(cluster.data / "node-1" / "logs" / "bootstrap.checkpoint"))
    assert "Bootstrap snapshot" in bootstrap
    assert any('"name":"metadata.version"' in line for line in _payloads(bootstrap, "FEATURE_LEVEL_RECORD"))


def test_dump_log_reports_what_is_not_a_metadata_record(tmp_path):
    partition = tmp_path / "__cluster_metadata-0"
    partition.mkdir()
    # A batch with a valid CRC whose record is not a framed metadata record.
    (partition / "00000000000000000000.log").write_bytes(data_batch([b"\x01\x7f\x00junk"], 0, 1, 0))
    assert fails("dump-log", str(partition / "00000000000000000000.log")) == \
        "Error: 1 problem(s) found in 1 file(s)"
    done = strom("dump-log", str(partition / "00000000000000000000.log"))
    assert "record at offset 0 does not decode: unknown metadata record type 127" in done.stderr
    # A snapshot without its header and footer.
    (partition / "00000000000000000005-0000000001.checkpoint").write_bytes(data_batch([b"\x01\x02\x00\x00"], 0, 1, 0))
    done = strom("dump-log", str(partition / "00000000000000000005-0000000001.checkpoint"))
    assert done.returncode == 1
    assert "does not begin with a SnapshotHeader control record" in done.stderr
    assert "does not end with a SnapshotFooter control record" in done.stderr


def test_a_node_that_cannot_start_stops_the_others(tmp_path):
    import socket

    base = free_port_run(2 * NODES)
    controllers = base + NODES
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", base + 1))  # node 2's broker port
        taken.listen()
        done = strom("cluster", "up", "--base-port", str(base), "--controller-port", str(controllers),
                     "--insecure", "--data-dir", str(tmp_path / "c"), timeout=180)
    assert done.returncode == 1, done
    assert f"strom: node 2 did not start (log: {tmp_path / 'c' / 'node-2' / 'strom.log'}):" in done.stderr
    assert "stopping the cluster" in done.stderr
    assert "Traceback" not in done.stderr.split("did not start")[0]


def test_ctrl_c_stops_every_node_cleanly_and_a_restart_keeps_the_cluster(cluster, topic):
    """Every node hands on what another can still take and goes: the last ones, with nobody to
    take their leadership, do not wait for the controller's session timeout. Started again on the
    same directories, the cluster is the same (nothing formatted again) and every partition has
    a leader."""
    ok("produce", topic, "--bootstrap-server", cluster.bootstrap, "--sync", "--acks", "all", input="kept\n")
    cluster_id = (cluster.data / "cluster-id").read_text().strip()
    directory_ids = {n: read_meta(cluster.data / f"node-{n}" / "logs").directory_id for n in range(1, NODES + 1)}
    code, err = cluster.stop()
    assert code == 0, err[-3000:]
    assert "stopping the cluster" in err
    for n in range(1, NODES + 1):
        log = cluster.node_log(n)
        tail = log[log.rindex("shutting down"):]
        assert "controlled shutdown succeeded" in tail, tail
        assert "incomplete" not in tail and "Traceback" not in tail, tail

    cluster.start()
    assert (cluster.data / "cluster-id").read_text().strip() == cluster_id
    for n in range(1, NODES + 1):
        meta = read_meta(cluster.data / f"node-{n}" / "logs")
        assert (meta.cluster_id, meta.directory_id) == (cluster_id, directory_ids[n])

    def led() -> bool:
        out = ok("topics", "describe", "--topic", topic, "--bootstrap-server", f"127.0.0.1:{cluster.base}")
        leaders = re.findall(r"Leader: (\S+)", out)
        return len(leaders) == 3 and all(x in {"1", "2", "3"} for x in leaders)

    wait_for(led, 60, what="a leader for every partition after the restart")
    out = ok("consume", topic, "--from-beginning", "--exit-at-end", "--bootstrap-server",
             f"127.0.0.1:{cluster.base + 1}", allow_stderr=True)
    assert "kept" in out.split()


def test_a_brokers_configs_go_to_that_broker(cluster):
    """As Kafka's kafka-configs: a broker's resource is described and altered at that broker,
    whichever one the bootstrap server is."""
    described = ok("configs", "describe", "--broker", "3", "--all", "--bootstrap-server", f"127.0.0.1:{cluster.base}")
    assert described.startswith("All configs for broker 3 are:")
    assert f"advertised.listeners=PLAINTEXT://127.0.0.1:{cluster.base + 2}," in described  # broker 3's own
    admin_bootstrap = f"127.0.0.1:{cluster.internal_base}"
    ok("configs", "alter", "--broker", "2", "--add-config", "log.cleaner.threads=2", *cluster.admin,
       "--bootstrap-server", admin_bootstrap)
    assert "log.cleaner.threads=2 " in ok("configs", "describe", "--broker", "2", "--bootstrap-server",
                                          f"127.0.0.1:{cluster.base}")
    ok("configs", "alter", "--broker", "2", "--delete-config", "log.cleaner.threads", *cluster.admin,
       "--bootstrap-server", admin_bootstrap)
    line = fails("configs", "describe", "--broker", "9", "--bootstrap-server", f"127.0.0.1:{cluster.base}")
    assert line == "Error: broker 9 is not in the cluster (brokers: 1, 2, 3)"


def test_a_node_that_dies_is_started_again(cluster, topic):
    """kill -9 of a node: `strom cluster up` says so in one line and starts it again, and the
    cluster serves through it."""
    pid = cluster.node_pid(3)
    readies = cluster.node_log(3).count(" ready on ")
    os.kill(pid, signal.SIGKILL)
    wait_for(lambda: cluster.node_log(3).count(" ready on ") > readies, 120, what="node 3 ready again")
    assert cluster.node_pid(3) not in (None, pid)
    assert "strom cluster up: node 3 exited with code -9, starting it again\n" in cluster.node_log(3)
    line = (f"strom: node 3 exited with code -9 (SIGKILL) (log: {cluster.data / 'node-3' / 'strom.log'}); "
            "starting it again in 1 s\n")
    assert line in cluster.errors
    ok("produce", topic, "--bootstrap-server", f"127.0.0.1:{cluster.base + 2}", "--sync", "--acks", "all",
       input="after the restart\n")
    out = ok("consume", topic, "--from-beginning", "--exit-at-end", "--bootstrap-server",
             f"127.0.0.1:{cluster.base + 2}", allow_stderr=True)
    assert "restart" in out.split()


def test_no_restart_and_a_node_added_by_hand(tmp_path):
    """With --no-restart a killed node is reported and stays down; a broker added by hand as the
    README adds one (its properties, the cluster's security settings, `strom storage format`) is
    started by the next `strom cluster up` on that directory, after the others, and stopped
    before them."""
    c = LocalCluster(tmp_path / "strom-cluster", nodes=1, cwd=tmp_path)
    c.start("--no-restart")
    try:
        os.kill(c.node_pid(1), signal.SIGKILL)
        line = "strom: node 1 exited with code -9 (SIGKILL) (log: strom-cluster/node-1/strom.log)\n"
        wait_for(lambda: line in c.errors, 60, what="the report of node 1's exit")
        time.sleep(2)  # longer than the first restart's backoff
        assert c.node_pid(1) is None and c.node_log(1).count(" ready on ") == 1
    finally:
        code, err = c.stop()
    assert code == 0, err
    assert "starting it again" not in err + c.node_log(1)

    broker_port, internal_port = free_port_run(1), free_port_run(1)
    (tmp_path / "strom-cluster" / "node-2").mkdir()
    config = tmp_path / "strom-cluster" / "node-2" / "server.properties"
    config.write_text("process.roles=broker\nnode.id=2\n"
                      f"listeners=PLAINTEXT://127.0.0.1:{broker_port},INTERNAL://127.0.0.1:{internal_port}\n"
                      f"controller.listener.names=CONTROLLER\ncontroller.quorum.bootstrap.servers={c.controllers}\n"
                      "log.dirs=strom-cluster/node-2/logs\n"
                      + (tmp_path / "strom-cluster" / "node-security.properties").read_text())
    cluster_id = (tmp_path / "strom-cluster" / "cluster-id").read_text().strip()
    done = subprocess.run([sys.executable, "-m", "strom", "storage", "format", "-t", cluster_id, "-c",
                           "strom-cluster/node-2/server.properties"], cwd=tmp_path, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr

    c.start()
    try:
        assert ", added by hand: node 2, secure: admin " in c.ready_line, c.ready_line
        assert c.node_log(2).count(" ready on ") == 1 and c.node_pid(2) is not None
        described = ok("configs", "describe", "--broker", "2", "--all", "--bootstrap-server", c.bootstrap)
        assert f"\n  listeners=PLAINTEXT://127.0.0.1:{broker_port},INTERNAL://" in described
    finally:
        code, err = c.stop()
    assert code == 0, err
    log = c.node_log(2)
    assert "controlled shutdown succeeded" in log[log.rindex("shutting down"):]  # the controller was still up
