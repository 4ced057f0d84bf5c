"""`strom reassign-partitions` (kafka-reassign-partitions.sh) run as a subprocess against a real
3-broker ZooKeeper cluster with a fourth broker added: generate, execute under load and verify a
move onto {2,3,4}; list and cancel a move that cannot finish; bad files and unknown topics."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from strom.testing import Cluster, unique_name
from strom.zookeeper_server import ZooKeeperServer

pytestmark = pytest.mark.timeout(90)

OVERRIDES = {"offsets.topic.num.partitions": "3", "group.initial.rebalance.delay.ms": "0"}


def strom(bootstrap: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "strom", *args, "--bootstrap-server", bootstrap],
                          capture_output=True, text=True, timeout=60)


def reassign(bootstrap: str, *args: str) -> subprocess.CompletedProcess:
    return strom(bootstrap, "reassign-partitions", *args)


def ok(bootstrap: str, *args: str) -> str:
    done = reassign(bootstrap, *args)
    assert (done.returncode, done.stderr) == (0, ""), done
    return done.stdout


def fails(bootstrap: str, *args: str, code: int = 1) -> str:
    """The one line on stderr of a command that must fail with `code`."""
    done = reassign(bootstrap, *args)
    assert done.returncode == code, done
    lines = done.stderr.strip().splitlines()
    assert code == 2 or len(lines) == 1, done
    return lines[-1]


def write_json(path: Path, data: object) -> str:
    path.write_text(json.dumps(data))
    return str(path)


def plan(*partitions: tuple[str, int, list[int]]) -> dict:
    return {"version": 1, "partitions": [{"topic": t, "partition": p, "replicas": r} for t, p, r in partitions]}


def described(bootstrap: str, topic: str) -> dict[int, tuple[list[int], list[int]]]:
    """partition -> (replicas, isr) as `strom topics describe` shows them."""
    done = strom(bootstrap, "topics", "describe", "--topic", topic)
    assert done.returncode == 0, done
    rows = [dict(f.split(": ", 1) for f in line.strip("\t").split("\t"))
            for line in done.stdout.splitlines() if line.startswith("\tTopic: ")]
    return {int(r["Partition"]): ([int(b) for b in r["Replicas"].split(",")],
                                  [int(b) for b in r["Isr"].split(",")]) for r in rows}


@pytest.fixture(scope="module")
def cluster():
    # A 10 s session: a broker paused for the cancel test stays registered meanwhile.
    with ZooKeeperServer(fsync=False) as zk, Cluster(3, zookeeper=zk, overrides=OVERRIDES,
                                                     session_timeout_ms=10_000) as c:
        c.add_broker(4)
        yield c


def create(cluster: Cluster, topic: str, assignment: str) -> None:
    done = strom(cluster.bootstrap, "topics", "create", topic, "--replica-assignment", assignment)
    assert done.returncode == 0, done
    cluster.wait_for(lambda: all(len(isr) == len(r) for r, isr in described(cluster.bootstrap, topic).values()),
                     20, "the topic's full ISR")


def test_generate_execute_verify_under_load(cluster, tmp_path):
    bootstrap, topic = cluster.bootstrap, unique_name("move")
    create(cluster, topic, "1:2:3,2:3:1")
    move = write_json(tmp_path / "move.json", {"version": 1, "topics": [{"topic": topic}]})
    out = ok(bootstrap, "--generate", "--topics-to-move-json-file", move, "--broker-list", "2,3,4")
    current_head, current, blank, proposed_head, proposed = out.splitlines()
    assert (current_head, blank, proposed_head) == (
        "Current partition replica assignment", "", "Proposed partition reassignment configuration")
    assert json.loads(current) == {"version": 1, "partitions": [
        {"topic": topic, "partition": 0, "replicas": [1, 2, 3], "log_dirs": ["any"] * 3},
        {"topic": topic, "partition": 1, "replicas": [2, 3, 1], "log_dirs": ["any"] * 3}]}
    proposal = json.loads(proposed)["partitions"]
    assert [(p["topic"], p["partition"], sorted(p["replicas"]), p["log_dirs"]) for p in proposal] == [
        (topic, 0, [2, 3, 4], ["any"] * 3), (topic, 1, [2, 3, 4], ["any"] * 3)]
    assert proposal[0]["replicas"][0] != proposal[1]["replicas"][0]  # leaders spread round-robin
    target = write_json(tmp_path / "plan.json", {"version": 1, "partitions": proposal})

    stop, acked, failed = threading.Event(), [], []

    def produce() -> None:
        producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": True,
                             "linger.ms": 5})
        i = 0
        while not stop.is_set():
            try:
                producer.produce(topic, b"%07d" % i, partition=i % 2, on_delivery=lambda err, msg: (
                    failed if err else acked).append(err or msg.value()))
                i += 1
            except BufferError:
                pass
            producer.poll(0.002)
        producer.flush(60)

    writer = threading.Thread(target=produce)
    writer.start()
    try:
        cluster.wait_for(lambda: len(acked) > 2000, 30, "records before the move")
        done = reassign(bootstrap, "--execute", "--reassignment-json-file", target, "--throttle", "1000000")
        assert done.returncode == 0, done
        assert done.stderr.count("\n") == 1 and "--throttle" in done.stderr and "ignored" in done.stderr
        lines = done.stdout.splitlines()
        assert lines[:2] == ["Current partition replica assignment", ""] and json.loads(lines[2]) == json.loads(current)
        assert lines[3:] == ["", "Save this to use as the --reassignment-json-file option during rollback",
                             f"Successfully started partition reassignments for {topic}-0,{topic}-1"]

        completed = [f"Reassignment of partition {topic}-{p} is completed." for p in (0, 1)]

        def verified() -> bool:
            status = ok(bootstrap, "--verify", "--reassignment-json-file", target).splitlines()
            assert status[0] == "Status of partition reassignment:" and len(status) == 3
            assert all(s in completed or s.endswith("is still in progress.") for s in status[1:]), status
            return status[1:] == completed

        cluster.wait_for(verified, 40, "the reassignment to complete")
        mark = len(acked)
        cluster.wait_for(lambda: len(acked) > mark + 1000, 30, "records after the move")
    finally:
        stop.set()
        writer.join(90)
    assert not failed, failed[:3]
    assert ok(bootstrap, "--list") == "No partition reassignments found.\n"
    wanted = {p["partition"]: p["replicas"] for p in proposal}
    cluster.wait_for(lambda: all(r == wanted[p] and sorted(isr) == [2, 3, 4]
                                 for p, (r, isr) in described(bootstrap, topic).items()), 20, "the new replicas")

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": unique_name("check"),
                         "enable.auto.commit": False})
    got = []
    try:
        consumer.assign([TopicPartition(topic, p, 0) for p in (0, 1)])
        cluster.wait_for(lambda: got.extend(m.value() for m in consumer.consume(1000, 1) if m.error() is None)
                         or len(got) >= len(acked), 60, "every record read back")
    finally:
        consumer.close()
    assert sorted(got) == sorted(acked) == [b"%07d" % i for i in range(len(acked))]


def test_list_and_cancel_a_move_that_cannot_finish(cluster, tmp_path):
    bootstrap, topic = cluster.bootstrap, unique_name("cancel")
    controller = cluster.controller_id()
    others = [b for b in (1, 2, 3, 4) if b != controller]
    keep, leave, paused = controller, others[0], others[1]  # never pause the controller
    create(cluster, topic, f"{keep}:{leave}")
    target = write_json(tmp_path / "plan.json", plan((topic, 0, [keep, paused])))
    # A new replica on a paused broker cannot catch up: the move stays in progress.
    os.kill(cluster.brokers[paused].proc.pid, signal.SIGSTOP)
    try:
        assert ok(bootstrap, "--execute", "--reassignment-json-file", target).endswith(
            f"Successfully started partition reassignment for {topic}-0\n")
        assert ok(bootstrap, "--list") == (f"Current partition reassignments:\n{topic}-0: replicas: "
                                           f"{keep},{paused},{leave}. adding: {paused}. removing: {leave}.\n")
        assert ok(bootstrap, "--verify", "--reassignment-json-file", target) == (
            f"Status of partition reassignment:\nReassignment of partition {topic}-0 is still in progress.\n")
        assert fails(bootstrap, "--execute", "--reassignment-json-file", target).startswith(
            "Error: Cannot execute because there is an existing partition assignment. Use --additional")
        assert ok(bootstrap, "--cancel", "--reassignment-json-file", target) == (
            f"Successfully cancelled partition reassignment for: {topic}-0\n")
    finally:
        os.kill(cluster.brokers[paused].proc.pid, signal.SIGCONT)
    assert ok(bootstrap, "--list") == "No partition reassignments found.\n"
    assert ok(bootstrap, "--cancel", "--reassignment-json-file", target) == (
        "None of the specified partition reassignments are active.\n")
    assert described(bootstrap, topic)[0][0] == [keep, leave]
    assert ok(bootstrap, "--verify", "--reassignment-json-file", target).splitlines()[1] == (
        f"There is no active reassignment of partition {topic}-0, but replica set is {keep},{leave} "
        f"rather than {keep},{paused}.")


def test_bad_files_and_unknown_topics(cluster, tmp_path):
    bootstrap, topic, missing = cluster.bootstrap, unique_name("errors"), unique_name("missing")
    create(cluster, topic, "1:2")
    bad = tmp_path / "bad.json"
    bad.write_text('{"version": 1, "partitions": [')
    for action in ("--execute", "--verify", "--cancel"):
        assert fails(bootstrap, action, "--reassignment-json-file", str(bad)).startswith(
            f"Error: {bad} is not valid JSON: ")
    assert fails(bootstrap, "--generate", "--topics-to-move-json-file", str(bad), "--broker-list", "1,2").startswith(
        f"Error: {bad} is not valid JSON: ")
    assert fails(bootstrap, "--execute", "--reassignment-json-file", str(tmp_path / "nope.json")) == (
        f"Error: cannot read {tmp_path / 'nope.json'}: No such file or directory")
    duplicated = write_json(tmp_path / "dup.json", plan((topic, 0, [1, 1])))
    assert fails(bootstrap, "--execute", "--reassignment-json-file", duplicated) == (
        f"Error: {duplicated}: the replica list of {topic}-0 lists a broker twice: [1, 1]")

    gone = f"Error: Topic '{missing}' does not exist."
    move = write_json(tmp_path / "move.json", {"version": 1, "topics": [{"topic": missing}]})
    assert fails(bootstrap, "--generate", "--topics-to-move-json-file", move, "--broker-list", "1,2") == gone
    unknown = write_json(tmp_path / "unknown.json", plan((missing, 0, [1, 2])))
    for action in ("--execute", "--verify"):
        assert fails(bootstrap, action, "--reassignment-json-file", unknown) == gone
    assert fails(bootstrap, "--cancel", "--reassignment-json-file", unknown) == (
        f"Error cancelling the reassignment of partition {missing}-0: partition {missing}-0 does not exist")
    no_partition = write_json(tmp_path / "p5.json", plan((topic, 5, [1, 2])))
    assert fails(bootstrap, "--execute", "--reassignment-json-file", no_partition) == (
        f"Error: Partition {topic}-5 does not exist.")

    mine = write_json(tmp_path / "mine.json", {"version": 1, "topics": [{"topic": topic}]})
    assert fails(bootstrap, "--generate", "--topics-to-move-json-file", mine, "--broker-list", "1,9") == (
        "Error: broker(s) 9 of --broker-list are not in the cluster")
    assert fails(bootstrap, "--generate", "--topics-to-move-json-file", mine, "--broker-list", "3") == (
        "Error: Replication factor: 2 larger than available brokers: 1.")
    # Refused by the controller, partition by partition.
    dead = write_json(tmp_path / "dead.json", plan((topic, 0, [1, 9])))
    assert fails(bootstrap, "--execute", "--reassignment-json-file", dead) == (
        f"Error reassigning partition {topic}-0: INVALID_REPLICA_ASSIGNMENT: "
        "replicas [1, 9] must be distinct live brokers")
    assert "exactly one action" in fails(bootstrap, "--list", "--verify", code=2)
    assert "--broker-list" in fails(bootstrap, "--generate", "--topics-to-move-json-file", mine, code=2)


def test_help_shows_examples():
    done = subprocess.run([sys.executable, "-m", "strom", "reassign-partitions", "--help"],
                          capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done
    for action in ("--generate", "--execute", "--verify", "--list", "--cancel"):
        assert f"strom reassign-partitions {action}" in done.stdout
