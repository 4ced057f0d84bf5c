"""Three KRaft controllers as real processes (one quorum for the module, plus one broker node):
DescribeQuorum from clients, CreateTopics replicated into identical images, a killed leader
replaced, a paused leader stepping down with its uncommitted tail truncated, and a restarted
controller catching up from a snapshot."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import pytest
from kafka.admin import KafkaAdminClient
from kraft_support import (
    BROKER_HEARTBEAT,
    call_active,
    create_topics,
    image_state,
    metadata_dir,
    read_log,
    register_brokers,
    replay,
    topic_names_in,
    wait_caught_up,
)

from strom.client import Connection
from strom.metadata.image import MetadataImage
from strom.metadata.storage import METADATA_PARTITION_DIR
from strom.raft.snapshots import read_snapshot
from strom.testing import KRaftQuorum, metric_value, scrape, unique_name, wait_for

# Kafka's defaults, halved, so the module runs in seconds; snapshots every ~16 KB of records.
OVERRIDES = {"controller.quorum.election.timeout.ms": "500", "controller.quorum.fetch.timeout.ms": "1000",
             "controller.quorum.request.timeout.ms": "1000",
             "metadata.log.max.record.bytes.between.snapshots": "16384",
             "broker.session.timeout.ms": "600000"}


@pytest.fixture(scope="module")
def quorum():
    """Controllers only; brokers 1001-1003 are registrations made here (no processes), so that
    replica placement is known."""
    with KRaftQuorum(3, overrides={**OVERRIDES, "metrics.port": "0"}) as q:
        q.leader()
        register_brokers(q, [1001, 1002, 1003])
        yield q


@pytest.fixture
def with_broker():
    """Controllers and one real broker (process.roles=broker, node 100)."""
    with KRaftQuorum(3, brokers=1, overrides=OVERRIDES) as q:
        yield q


def _strom(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "strom", *args], capture_output=True, text=True, timeout=60)


def test_describe_quorum_from_kafka_python_and_the_cli(with_broker):
    quorum = with_broker
    leader = quorum.leader()
    wait_caught_up(quorum, quorum.nodes)
    broker = quorum.brokers[100]
    admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap, request_timeout_ms=10000)
    try:
        described = admin.describe_metadata_quorum()
    finally:
        admin.close()
    part = described["topics"][0]["partitions"][0]
    assert part["error"] is None and part["leader_id"] == leader and part["leader_epoch"] >= 1
    assert part["high_watermark"] > 0
    voters = {v["replica_id"]: v for v in part["current_voters"]}
    assert set(voters) == {1, 2, 3}
    for v in voters.values():  # each voter's log end and fetch time, from which lag follows
        assert v["log_end_offset"] >= 0 and part["high_watermark"] - v["log_end_offset"] <= part["high_watermark"]
    assert {n["node_id"] for n in described["nodes"]} == {1, 2, 3}

    status = _strom("metadata-quorum", "--bootstrap-controller", quorum.bootstrap_controllers, "describe", "--status")
    assert status.returncode == 0, status.stderr
    lines = dict(line.split(":", 1) for line in status.stdout.splitlines())
    assert lines["ClusterId"].strip() == quorum.cluster_id and int(lines["LeaderId"]) == leader
    assert int(lines["HighWatermark"]) >= part["high_watermark"] and int(lines["MaxFollowerLag"]) >= 0
    replication = _strom("metadata-quorum", "--bootstrap-server", broker.bootstrap, "describe", "--replication")
    assert replication.returncode == 0, replication.stderr
    rows = [line.split() for line in replication.stdout.splitlines()[1:]]
    assert sorted(int(r[0]) for r in rows) == [1, 2, 3, 100]  # the broker follows as an observer
    assert [r[6] for r in rows if int(r[0]) == 100] == ["Observer"]
    assert [r[6] for r in rows if int(r[0]) == leader] == ["Leader"]


def test_create_topics_gives_every_controller_the_same_image(quorum):
    names = [unique_name("orders"), unique_name("events")]
    results = create_topics(quorum, [(names[0], 6, 3, {"retention.ms": "60000"}), (names[1], 3, 2, {})])
    assert [(t.name, t.error_code) for t in results] == [(names[0], 0), (names[1], 0)]
    assert [t.num_partitions for t in results] == [6, 3]
    again = create_topics(quorum, [(names[0], 1, 1, {})])
    assert again[0].error_code == 36  # TOPIC_ALREADY_EXISTS
    hw = wait_caught_up(quorum, [1, 2, 3])
    images = {n: replay(metadata_dir(quorum, n), hw) for n in (1, 2, 3)}
    assert image_state(images[1]) == image_state(images[2]) == image_state(images[3])
    topic = images[1].topics[names[0]]
    assert topic.topic_id == results[0].topic_id and len(topic.partitions) == 6
    for state in topic.partitions.values():
        assert sorted(state.replicas) == [1001, 1002, 1003] and state.leader == state.replicas[0]
        assert state.isr == state.replicas and state.leader_epoch == 0
    assert images[1].topic_configs(names[0]) == {"retention.ms": "60000"}


def test_dedicated_controllers_serve_their_metrics(quorum):
    """process.roles=controller with metrics.port: each controller serves the quorum's raft
    metrics, and the active one the cluster as its image has it (Grafana's active-controller panel
    reads 1 on exactly one node)."""
    name = unique_name("metered")
    assert create_topics(quorum, [(name, 4, 3, {})])[0].error_code == 0
    leader = quorum.leader()

    def scraped() -> dict[int, dict] | None:
        samples = {n: scrape(node.metrics_url) for n, node in quorum.nodes.items()}
        ready = all(metric_value(s, "strom_raft_current_leader") == leader for s in samples.values()) and \
            metric_value(samples[leader], "strom_global_partitions") >= 4
        return samples if ready else None

    samples = wait_for(scraped, 30, what="every controller's metrics naming the leader")
    assert [n for n, s in samples.items() if metric_value(s, "strom_active_controller") == 1] == [leader]
    for n, s in samples.items():
        state = "Leader" if n == leader else "Follower"
        assert metric_value(s, "strom_raft_current_state", state=state) == 1
        assert metric_value(s, "strom_raft_voters") == 3
        assert metric_value(s, "strom_raft_high_watermark") > 0
        assert metric_value(s, "strom_raft_current_epoch") == metric_value(samples[leader], "strom_raft_current_epoch")
    assert metric_value(samples[leader], "strom_offline_partitions") == 0  # brokers registered, none fenced yet
    assert any(name == "strom_requests_total" for name, _ in samples[leader])


def test_kill_of_the_leader_elects_another_that_commits(quorum):
    old = quorum.leader()
    epoch = quorum.describe()["leader_epoch"]
    quorum.nodes[old].kill()
    new = quorum.leader(exclude=[old])
    assert new != old and quorum.describe()["leader_epoch"] > epoch
    name = unique_name("after-kill")
    assert create_topics(quorum, [(name, 2, 3, {})])[0].error_code == 0
    quorum.nodes[old].restart()
    hw = wait_caught_up(quorum, [1, 2, 3])
    assert name in replay(metadata_dir(quorum, old), hw).topics


def test_paused_leader_steps_down_and_its_uncommitted_tail_is_truncated(quorum):
    old = quorum.leader()
    followers = [n for n in quorum.nodes if n != old]
    wait_caught_up(quorum, [1, 2, 3])
    for f in followers:
        quorum.nodes[f].pause()
    # Fetches the followers had parked at the leader are answered within the long poll's wait
    # (500 ms); an append before that would reach them when they resume, and commit.
    time.sleep(1.0)
    lost = unique_name("never-committed")
    # The leader appends this alone: no follower fetches it, so it cannot commit.
    with Connection("127.0.0.1", quorum.ports[old], timeout_s=30) as conn:
        conn.send_raw(_create_topics_request(lost))
        wait_for(lambda: lost in topic_names_in(metadata_dir(quorum, old)), 10, what="the leader's own append")
        with Connection("127.0.0.1", quorum.ports[old], timeout_s=10) as probe:
            part = probe.call(55, 2, {"topics": [{"topic_name": "__cluster_metadata",
                                                  "partitions": [{"partition_index": 0}]}]}).topics[0].partitions[0]
        mine = next(v for v in part.current_voters if v.replica_id == old)
        assert part.leader_id == old and part.high_watermark < mine.log_end_offset  # uncommitted
        quorum.nodes[old].pause()
        for f in followers:
            quorum.nodes[f].resume()
        new = quorum.leader(exclude=[old])
        kept = unique_name("committed-meanwhile")
        assert create_topics(quorum, [(kept, 1, 3, {})])[0].error_code == 0
        quorum.nodes[old].resume()
        hw = wait_caught_up(quorum, [1, 2, 3])
    assert quorum.leader() == new
    # The old leader took the new epoch's log: its uncommitted topic is gone from its files.
    assert lost not in topic_names_in(metadata_dir(quorum, old))
    assert kept in topic_names_in(metadata_dir(quorum, old))
    assert all(lost not in topic_names_in(metadata_dir(quorum, n)) for n in quorum.nodes)
    images = [replay(metadata_dir(quorum, n), hw) for n in (1, 2, 3)]
    assert image_state(images[0]) == image_state(images[1]) == image_state(images[2])


def _create_topics_request(name: str) -> bytes:
    from strom.protocol.messages import encode_request

    return encode_request(19, 7, {"timeout_ms": 30000, "validate_only": False, "topics": [
        {"name": name, "num_partitions": 1, "replication_factor": 3, "assignments": [], "configs": []}]}, 7)


def test_restarted_controller_catches_up_from_a_snapshot(quorum):
    leader = quorum.leader()
    follower = next(n for n in quorum.nodes if n != leader)
    quorum.nodes[follower].stop()
    start_before = read_log(metadata_dir(quorum, leader))[0]
    names = [unique_name("bulk") for _ in range(40)]
    for i in range(0, len(names), 10):
        results = create_topics(quorum, [(n, 8, 3, {"cleanup.policy": "compact"}) for n in names[i:i + 10]])
        assert all(t.error_code == 0 for t in results), results
    # The leader snapshotted past where the stopped follower's log ends, and dropped that log.
    wait_for(lambda: read_log(metadata_dir(quorum, leader))[0] > start_before, 30, what="a new leader snapshot")
    quorum.nodes[follower].restart()
    hw = wait_caught_up(quorum, [1, 2, 3])
    time.sleep(0)
    follower_start = read_log(metadata_dir(quorum, follower))[0]
    assert follower_start > start_before  # it loaded a snapshot fetched from the leader
    mine, theirs = replay(metadata_dir(quorum, follower), hw), replay(metadata_dir(quorum, leader), hw)
    assert image_state(mine) == image_state(theirs)
    assert set(names) <= set(mine.topics)


def test_a_dedicated_broker_snapshots_its_copy_of_the_metadata_log(with_broker):
    """A broker's observer log is bounded like a controller's: past
    metadata.log.max.record.bytes.between.snapshots it snapshots the image it applied and drops
    the log before it; restarted, it starts from that snapshot and knows every topic."""
    quorum = with_broker
    quorum.leader()
    broker = quorum.brokers[100]
    directory = broker.data_dir / "logs" / METADATA_PARTITION_DIR
    names = [unique_name("snapshotted") for _ in range(4)]
    for name in names:  # ~100 records of ~60 bytes each: past the 16 KB between snapshots
        assert create_topics(quorum, [(name, 100, 1, {})])[0].error_code == 0
    wait_for(lambda: read_log(directory)[0] > 0, 30, what="a snapshot by the broker")
    start, snapshot, _ = read_log(directory)
    image = MetadataImage()
    image.replay_values(read_snapshot(snapshot).values)
    assert image.brokers and 100 in image.brokers
    assert len([n for n in names if n in image.topics]) >= 1
    broker.stop()
    broker.start()
    with Connection("127.0.0.1", broker.port, timeout_s=30) as conn:
        def listed() -> set[str]:
            body = conn.call(3, 12, {"topics": None, "allow_auto_topic_creation": False,
                                     "include_topic_authorized_operations": False})
            return {t.name for t in body.topics if t.error_code == 0}
        wait_for(lambda: set(names) <= listed(), 30, what="every topic known after the restart")
    assert read_log(directory)[0] >= start


def test_controllers_stopped_together_let_a_broker_finish_its_controlled_shutdown():
    """Every node stopped at once (Ctrl-C on a local cluster): a broker half-way through its
    controlled shutdown needs the quorum for its last step, so the controllers asked to stop keep
    their vote until it is done, and then leave at once."""
    with KRaftQuorum(3, overrides=OVERRIDES) as q:
        leader = q.leader()
        epoch = register_brokers(q, [1001])[1001]

        def heartbeat():
            return call_active(q, BROKER_HEARTBEAT, 1, {
                "broker_id": 1001, "broker_epoch": epoch, "current_metadata_offset": 1 << 40,
                "want_fence": False, "want_shut_down": True, "offline_log_dirs": []})

        first = heartbeat()  # recorded: broker 1001 is in controlled shutdown
        assert first.error_code == 0 and not first.should_shut_down and not first.is_fenced
        wait_caught_up(q, [1, 2, 3])
        time.sleep(0.5)  # the followers learn the new high watermark in their next fetch
        others = [n for n in q.nodes if n != leader]
        for n in others:
            q.nodes[n].proc.send_signal(signal.SIGTERM)
        time.sleep(1.0)
        assert all(q.nodes[n].proc.poll() is None for n in others), "a controller left before the broker was done"
        last = heartbeat()  # the fence that lets it go: committed by the controllers still there
        assert last.error_code == 0 and last.should_shut_down and last.is_fenced
        for n in others:  # and now nothing holds them (the session timeout is 10 minutes)
            assert q.nodes[n].proc.wait(30) == 0
            assert "keeps its vote until broker(s) 1001 finish" in q.nodes[n].log_text()
