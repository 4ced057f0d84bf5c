"""`strom topics` (kafka-topics.sh) run as a subprocess against real brokers: one standalone
broker for create/list/describe/alter/delete and their failures, a 3-broker ZooKeeper cluster
for replication factors, ISR and a kill -9."""

from __future__ import annotations

import subprocess
import sys

import pytest

from strom.testing import BrokerProcess, Cluster, unique_name
from strom.zookeeper_server import ZooKeeperServer

pytestmark = pytest.mark.timeout(180)  # a hang guard: many `strom` subprocesses per test


def strom_topics(bootstrap: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "strom", "topics", *args, "--bootstrap-server",
                           bootstrap], capture_output=True, text=True, timeout=45)


def ok(bootstrap: str, *args: str) -> str:
    done = strom_topics(bootstrap, *args)
    assert (done.returncode, done.stderr) == (0, ""), done
    return done.stdout


def fails(bootstrap: str, *args: str, code: int = 1) -> str:
    """The one line on stderr of a command that must fail with `code`."""
    done = strom_topics(bootstrap, *args)
    assert done.returncode == code, done
    return done.stderr.strip().splitlines()[-1]


def fields(line: str) -> dict[str, str]:
    """`Key: value` pairs of a tab-separated describe line."""
    return dict(part.split(": ", 1) for part in line.strip("\t").split("\t"))


def partitions(output: str) -> dict[tuple[str, int], dict[str, str]]:
    """The partition lines of `describe` by (topic, partition)."""
    rows = [fields(line) for line in output.splitlines() if line.startswith("\tTopic: ")]
    return {(r["Topic"], int(r["Partition"])): r for r in rows}


@pytest.fixture(scope="module")
def broker():
    with BrokerProcess(overrides={"num.partitions": "2"}) as proc:
        yield proc


def test_create_list_describe_alter_delete(broker):
    bootstrap = broker.bootstrap
    topic, other = unique_name("topics-cli"), unique_name("topics-cli-default")
    assert ok(bootstrap, "create", topic, "--partitions", "3", "--replication-factor", "1",
              "--config", "retention.ms=86400000",
              "--config", "cleanup.policy=compact,delete") == f"Created topic {topic}.\n"
    ok(bootstrap, "create", other)  # the broker's num.partitions
    listed = ok(bootstrap, "list").splitlines()
    assert {topic, other} <= set(listed) and listed == sorted(listed)

    head, *rest = ok(bootstrap, "describe", "--topic", topic).splitlines()
    summary = fields(head)
    assert (summary["Topic"], summary["PartitionCount"], summary["ReplicationFactor"]) == (topic, "3", "1")
    assert len(summary["TopicId"]) == 22  # Kafka's base64 Uuid
    assert summary["Configs"] == "cleanup.policy=compact,delete,retention.ms=86400000"
    assert head.count("\t") == 4 and all(line.startswith("\tTopic: ") for line in rest)
    described = partitions("\n".join(rest))
    assert sorted(described) == [(topic, 0), (topic, 1), (topic, 2)]
    assert {(r["Leader"], r["Replicas"], r["Isr"]) for r in described.values()} == {("0", "0", "0")}
    assert fields(ok(bootstrap, "describe", "--topic", other).splitlines()[0])["PartitionCount"] == "2"
    everything = partitions(ok(bootstrap, "describe"))
    assert {(topic, 2), (other, 1)} <= set(everything)
    assert ok(bootstrap, "describe", "--under-replicated-partitions") == ""
    assert ok(bootstrap, "describe", "--unavailable-partitions") == ""

    ok(bootstrap, "alter", topic, "--partitions", "5")
    assert sorted(partitions(ok(bootstrap, "describe", "--topic", topic))) == [(topic, p) for p in range(5)]

    assert ok(bootstrap, "delete", topic, other) == f"Deleted topic {topic}.\nDeleted topic {other}.\n"
    assert not {topic, other} & set(ok(bootstrap, "list").splitlines())


def test_failures(broker):
    bootstrap = broker.bootstrap
    topic, missing = unique_name("topics-cli-fail"), unique_name("topics-cli-missing")
    ok(bootstrap, "create", topic, "--partitions", "2")
    assert fails(bootstrap, "create", topic) == f"Error: Topic '{topic}' already exists."
    assert ok(bootstrap, "create", topic, "--if-not-exists") == ""
    assert fails(bootstrap, "create", unique_name("rf"), "--replication-factor", "3") == \
        "Error: Replication factor: 3 larger than available brokers: 1."
    assert "unknown broker ids [7]" in fails(bootstrap, "create", unique_name("ra"),
                                              "--replica-assignment", "7")
    assert "twice" in fails(bootstrap, "create", unique_name("ra"), "--replica-assignment", "0:0", code=2)
    assert "cannot be used" in fails(bootstrap, "create", unique_name("ra"), "--partitions", "2",
                                     "--replica-assignment", "0", code=2)
    assert fails(bootstrap, "alter", topic, "--partitions", "1") == \
        "Error: Topic currently has 2 partitions, 1 would not be an increase."

    gone = f"Error: Topic '{missing}' does not exist."
    assert fails(bootstrap, "describe", "--topic", missing) == gone
    assert fails(bootstrap, "alter", missing, "--partitions", "4") == gone
    assert ok(bootstrap, "alter", missing, "--partitions", "4", "--if-exists") == ""
    # One missing topic fails the command but does not stop the others' deletion.
    done = strom_topics(bootstrap, "delete", missing, topic)
    assert (done.returncode, done.stdout, done.stderr) == (1, f"Deleted topic {topic}.\n", gone + "\n")
    assert ok(bootstrap, "delete", missing, "--if-exists") == ""
    assert missing not in ok(bootstrap, "list")  # describe and list never auto-create
    assert "cannot connect to 127.0.0.1:1" in fails("127.0.0.1:1", "list")


def test_kafka_topics_command_lines(broker, tmp_path):
    """kafka-topics.sh's lines as scripts have them: the action as a flag anywhere, the topic as
    --topic, --config, --command-config."""
    bootstrap = broker.bootstrap
    topic, other = unique_name("kafka-style"), unique_name("kafka-style-2")
    assert ok(bootstrap, "--create", "--topic", topic, "--partitions", "3", "--replication-factor", "1",
              "--config", "retention.ms=3600000") == f"Created topic {topic}.\n"
    assert ok(bootstrap, "create", "--topic", other) == f"Created topic {other}.\n"
    assert topic in ok(bootstrap, "--list").splitlines()
    assert ok(bootstrap, "--list", "--topic", topic) == f"{topic}\n"
    head = ok(bootstrap, "--describe", "--topic", topic).splitlines()[0]
    assert (fields(head)["PartitionCount"], fields(head)["Configs"]) == ("3", "retention.ms=3600000")
    assert fields(ok(bootstrap, "describe", other).splitlines()[0])["Topic"] == other
    assert ok(bootstrap, "--alter", "--topic", topic, "--partitions", "4") == f"Topic {topic} now has 4 partitions.\n"
    assert sorted(partitions(ok(bootstrap, "describe", "--topic", topic))) == [(topic, p) for p in range(4)]
    props = tmp_path / "admin.properties"
    props.write_text(f"bootstrap.servers={bootstrap}\n")
    done = subprocess.run([sys.executable, "-m", "strom", "topics", "--command-config", str(props),
                           "--delete", "--topic", topic, "--topic", other], capture_output=True,
                          text=True, timeout=45)
    assert (done.returncode, done.stdout) == (0, f"Deleted topic {topic}.\nDeleted topic {other}.\n"), done
    assert not {topic, other} & set(ok(bootstrap, "list").splitlines())
    # Wrong lines are still refused as such (exit 2), in kafka-topics' form too.
    assert "only one of --create" in fails(bootstrap, "--create", "--delete", "--topic", topic, code=2)
    assert "name one topic" in fails(bootstrap, "--create", "--partitions", "1", code=2)
    assert "one topic at a time" in fails(bootstrap, "create", topic, "--topic", other, code=2)
    assert "name the topics to delete" in fails(bootstrap, "--delete", code=2)


def test_help_shows_examples():
    for command in ("create", "list", "describe", "alter", "delete"):
        done = subprocess.run([sys.executable, "-m", "strom", "topics", command, "--help"],
                              capture_output=True, text=True, timeout=30)
        assert done.returncode == 0 and f"strom topics {command} " in done.stdout, done


@pytest.fixture(scope="module")
def zookeeper():
    with ZooKeeperServer(fsync=False) as zk:
        yield zk


@pytest.fixture
def cluster(zookeeper):
    with Cluster(3, zookeeper=zookeeper) as c:
        yield c


def test_replicas_isr_and_a_dead_broker(cluster):
    replicated, pinned = unique_name("rf3"), unique_name("pinned")
    ok(cluster.bootstrap, "create", replicated, "--partitions", "3", "--replication-factor", "3",
       "--config", "min.insync.replicas=3")
    # RF 2 on chosen brokers: each broker holds two of the three partitions.
    ok(cluster.bootstrap, "create", pinned, "--replica-assignment", "1:2,2:3,3:1")

    def full_isr() -> bool:  # every broker's metadata, as each answers Metadata itself
        return all(len(shown) == 6 and all(set(r["Isr"].split(",")) == set(r["Replicas"].split(","))
                                           for r in shown.values())
                   for shown in (partitions(ok(b.bootstrap, "describe"))
                                 for b in cluster.brokers.values()))

    cluster.wait_for(full_isr, 20, "full ISR on every broker")
    head, *_ = ok(cluster.bootstrap, "describe", "--topic", replicated).splitlines()
    assert (fields(head)["PartitionCount"], fields(head)["ReplicationFactor"]) == ("3", "3")
    for row in partitions(ok(cluster.bootstrap, "describe", "--topic", replicated)).values():
        assert sorted(row["Replicas"].split(",")) == ["1", "2", "3"] == sorted(row["Isr"].split(","))
    assert ok(cluster.bootstrap, "describe", "--under-replicated-partitions") == ""
    # kafka-topics' other filters: min ISR (the RF 3 topic wants all three), overrides, regexes.
    assert set(partitions(ok(cluster.bootstrap, "describe", "--at-min-isr-partitions"))) == \
        {(replicated, p) for p in range(3)}
    assert ok(cluster.bootstrap, "describe", "--under-min-isr-partitions") == ""
    overridden = ok(cluster.bootstrap, "describe", "--topics-with-overrides")
    assert [fields(line)["Topic"] for line in overridden.splitlines()] == [replicated]
    assert "Configs: min.insync.replicas=3" in overridden
    matched = ok(cluster.bootstrap, "describe", "--topic", f"{replicated}|no-such-topic")
    assert {t for t, _ in partitions(matched)} == {replicated}
    assert fails(cluster.bootstrap, "describe", "--topic", "no-such-.*") == \
        "Error: Topic 'no-such-.*' does not exist as expected"

    # kill -9 a broker other than the controller: its ZooKeeper session ends after 4 s and
    # the controller takes it out of every ISR and moves its leaderships.
    victim = next(b for b in (3, 2, 1) if b != cluster.controller_id())
    cluster.brokers[victim].kill()
    expected = {tp for tp, r in partitions(ok(cluster.bootstrap, "describe")).items()
                if str(victim) in r["Replicas"].split(",")}
    assert len(expected) == 5  # the RF 3 topic's 3 partitions and 2 of the pinned ones

    def shrunk() -> bool:
        return set(partitions(ok(cluster.bootstrap, "describe", "--under-replicated-partitions"))) == expected

    cluster.wait_for(shrunk, 20, f"broker {victim} to leave the ISR")
    under = partitions(ok(cluster.bootstrap, "describe", "--under-replicated-partitions"))
    assert all(str(victim) not in r["Isr"].split(",") and r["Leader"] != str(victim)
               for r in under.values())
    assert ok(cluster.bootstrap, "describe", "--unavailable-partitions") == ""
    assert set(partitions(ok(cluster.bootstrap, "describe", "--under-min-isr-partitions"))) == \
        {(replicated, p) for p in range(3)}
