"""ACL authorization with real clients: principals from SASL PLAIN (admin is a super user;
alice, bob, carol are not), ACLs made with `strom acls`, and what Kafka's semantics say each
request gets: deny wins, prefixed and wildcard patterns, implied DESCRIBE, topics hidden from
Metadata, groups, idempotent producers, and no ACL meaning no access."""

from __future__ import annotations

import subprocess
import sys

import pytest
from confluent_kafka import Consumer, KafkaError, Producer
from confluent_kafka.admin import AdminClient, NewTopic

from strom.client import ClientSecurity, Connection
from strom.protocol.errors import ErrorCode
from strom.testing import BrokerProcess, acl_broker_overrides, unique_name, wait_for

USERS = ("admin", "alice", "bob", "carol")
METADATA = {"topics": None, "allow_auto_topic_creation": False, "include_topic_authorized_operations": False}


@pytest.fixture(scope="module")
def broker():
    with BrokerProcess(overrides=acl_broker_overrides(USERS, {
            "group.initial.rebalance.delay.ms": "0", "auto.create.topics.enable": "false"})) as b:
        yield b


def conf(broker, user: str) -> dict[str, str]:
    return {"bootstrap.servers": f"127.0.0.1:{broker.ports['SASL_PLAINTEXT']}", "security.protocol": "SASL_PLAINTEXT",
            "sasl.mechanisms": "PLAIN", "sasl.username": user, "sasl.password": f"{user}-secret"}


def connect(broker, user: str) -> Connection:
    return Connection("127.0.0.1", broker.ports["SASL_PLAINTEXT"], security=ClientSecurity(
        sasl_mechanism="PLAIN", username=user, password=f"{user}-secret"))


def acls(broker, *args: str) -> subprocess.CompletedProcess:
    props = broker.data_dir / "admin.properties"
    props.write_text("security.protocol=SASL_PLAINTEXT\nsasl.mechanism=PLAIN\n"
                     "sasl.username=admin\nsasl.password=admin-secret\n")
    return subprocess.run([sys.executable, "-m", "strom", "acls", *args, "--bootstrap-server",
                           f"127.0.0.1:{broker.ports['SASL_PLAINTEXT']}", "--command-config", str(props)],
                          capture_output=True, text=True, timeout=60)


def make_topic(broker, name: str) -> None:
    admin = AdminClient(conf(broker, "admin"))
    admin.create_topics([NewTopic(name, 1, 1)])[name].result(30)


def produce(broker, user: str, topic: str, **extra: str) -> list:
    errors: list = []
    producer = Producer({**conf(broker, user), "message.timeout.ms": 5000, **extra})
    producer.produce(topic, value=b"v", on_delivery=lambda err, _m: errors.append(err))
    producer.flush(15)
    return errors


def test_without_an_acl_nobody_but_super_users(broker):
    topic = unique_name("closed")
    make_topic(broker, topic)
    errors = produce(broker, "alice", topic)
    assert errors and errors[0].code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
    assert produce(broker, "admin", topic) == [None]
    with connect(broker, "alice") as conn:
        assert topic not in [t.name for t in conn.call(3, 9, METADATA).topics]  # hidden
        named = conn.call(3, 9, {**METADATA, "topics": [{"name": topic}]}).topics[0]
        assert named.error_code == ErrorCode.TOPIC_AUTHORIZATION_FAILED


def test_allow_read_and_write_then_deny_wins(broker):
    topic = unique_name("orders")
    make_topic(broker, topic)
    added = acls(broker, "add", "--allow-principal", "User:alice", "--operation", "write", "--operation", "read",
                 "--topic", topic)
    assert added.returncode == 0, added.stderr
    assert produce(broker, "alice", topic) == [None]
    with connect(broker, "alice") as conn:  # READ implies DESCRIBE: the topic shows
        assert topic in [t.name for t in conn.call(3, 9, METADATA).topics]
    assert acls(broker, "add", "--deny-principal", "User:alice", "--operation", "write", "--topic", topic).returncode == 0
    errors = produce(broker, "alice", topic)
    assert errors and errors[0].code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
    listed = acls(broker, "list", "--topic", topic).stdout
    assert f"(principal=User:alice, host=*, operation=WRITE, permissionType=DENY) on TOPIC:LITERAL:{topic}" in listed
    removed = acls(broker, "remove", "--topic", topic, "--principal", "User:alice")
    assert removed.returncode == 0 and "Removed 3 ACL(s)." in removed.stdout
    errors = produce(broker, "alice", topic)
    assert errors and errors[0].code() == KafkaError.TOPIC_AUTHORIZATION_FAILED


def test_prefixed_and_wildcard_patterns(broker):
    prefix = unique_name("team-a")
    make_topic(broker, f"{prefix}.events")
    make_topic(broker, f"{prefix}-other.events")
    assert acls(broker, "add", "--allow-principal", "User:bob", "--operation", "write", "--topic", f"{prefix}.",
                "--resource-pattern-type", "prefixed").returncode == 0
    assert produce(broker, "bob", f"{prefix}.events") == [None]
    errors = produce(broker, "bob", f"{prefix}-other.events")
    assert errors and errors[0].code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
    assert acls(broker, "add", "--allow-principal", "User:carol", "--operation", "describe", "--topic", "*").returncode == 0
    with connect(broker, "carol") as conn:
        names = [t.name for t in conn.call(3, 9, METADATA).topics]
    assert f"{prefix}.events" in names and f"{prefix}-other.events" in names


def test_consumers_need_read_on_their_group(broker):
    topic, group = unique_name("consumed"), unique_name("readers")
    make_topic(broker, topic)
    assert produce(broker, "admin", topic) == [None]
    assert acls(broker, "add", "--allow-principal", "User:carol", "--operation", "read", "--topic", topic).returncode == 0
    errors: list = []
    consumer = Consumer({**conf(broker, "carol"), "group.id": group, "auto.offset.reset": "earliest",
                         "error_cb": errors.append})
    consumer.subscribe([topic])
    wait_for(lambda: [m for m in consumer.consume(1, 0.5) if m.error()] or errors, timeout=20,
             what="a group authorization error")
    consumer.close()
    assert acls(broker, "add", "--allow-principal", "User:carol", "--operation", "read", "--group", group).returncode == 0
    consumer = Consumer({**conf(broker, "carol"), "group.id": group, "auto.offset.reset": "earliest"})
    consumer.subscribe([topic])
    got: list = []
    wait_for(lambda: got.extend(m for m in consumer.consume(1, 0.5) if not m.error()) or got, timeout=30,
             what="the record once the group is allowed")
    consumer.close()


def test_the_admin_apis_need_cluster_permissions(broker):
    with connect(broker, "bob") as conn:
        described = conn.call(29, 3, {"resource_type_filter": 1, "resource_name_filter": None, "pattern_type_filter": 1,
                                      "principal_filter": None, "host_filter": None, "operation": 1,
                                      "permission_type": 1})
        assert described.error_code == ErrorCode.CLUSTER_AUTHORIZATION_FAILED
        created = conn.call(19, 7, {"topics": [{"name": unique_name("nope"), "num_partitions": 1,
                                                "replication_factor": 1, "assignments": [], "configs": []}],
                                    "timeout_ms": 5000, "validate_only": False})
        assert created.topics[0].error_code == ErrorCode.TOPIC_AUTHORIZATION_FAILED
    with Connection("127.0.0.1", broker.port) as anonymous:  # PLAINTEXT: User:ANONYMOUS, no ACLs
        assert anonymous.call(3, 9, METADATA).topics == []


def test_acl_apis_without_an_authorizer_say_security_disabled():
    with BrokerProcess() as b, Connection("127.0.0.1", b.port) as conn:
        body = conn.call(30, 3, {"creations": [{"resource_type": 2, "resource_name": "t", "resource_pattern_type": 3,
                                                "principal": "User:x", "host": "*", "operation": 3,
                                                "permission_type": 3}]})
        assert body.results[0].error_code == ErrorCode.SECURITY_DISABLED


def test_an_unknown_authorizer_class_stops_the_start():
    broker = BrokerProcess(overrides={"authorizer.class.name": "com.example.MyAuthorizer"})
    with pytest.raises(RuntimeError, match="did not become ready"):
        broker.start(timeout=20)
    broker.close()
    assert any("authorizer.class.name=com.example.MyAuthorizer is not an authorizer" in line
               for line in broker.stderr_lines)


def test_remove_takes_only_the_acls_it_names_and_the_shortcuts_need_their_resources(broker):
    topic = unique_name("narrow")
    assert acls(broker, "add", "--allow-principal", "User:dave", "--operation", "read", "--operation", "write",
                "--topic", topic).returncode == 0
    assert acls(broker, "add", "--deny-principal", "User:dave", "--operation", "read", "--topic", topic,
                "--deny-host", "10.0.0.1").returncode == 0

    def listed() -> set[str]:
        out = acls(broker, "list", "--topic", topic).stdout
        return {line.split(" on ")[0] for line in out.splitlines() if line.startswith("(")}

    removed = acls(broker, "remove", "--topic", topic, "--allow-principal", "User:dave", "--operation", "read")
    assert removed.returncode == 0 and "Removed 1 ACL(s)." in removed.stdout, removed
    assert listed() == {"(principal=User:dave, host=*, operation=WRITE, permissionType=ALLOW)",
                        "(principal=User:dave, host=10.0.0.1, operation=READ, permissionType=DENY)"}
    assert "Removed 0 ACL(s)." in acls(broker, "remove", "--topic", topic, "--deny-principal", "User:dave",
                                       "--deny-host", "10.0.0.2").stdout
    assert "Removed 1 ACL(s)." in acls(broker, "remove", "--topic", topic, "--deny-principal", "User:dave").stdout
    assert listed() == {"(principal=User:dave, host=*, operation=WRITE, permissionType=ALLOW)"}

    for args, why in ((("--consumer", "--topic", topic), "With --consumer you must specify a --topic and a --group"),
                      (("--consumer", "--group", "g"), "With --consumer you must specify a --topic and a --group"),
                      (("--producer", "--group", "g"), "With --producer you must specify a --topic"),
                      (("--idempotent", "--topic", topic), "only available if --producer is set")):
        refused = acls(broker, "add", "--allow-principal", "User:dave", *args)
        assert refused.returncode == 2 and why in refused.stderr, refused


def test_kafka_acls_command_lines(broker):
    """kafka-acls.sh's --add / --list / --remove, the script's name changed only."""
    topic = unique_name("kafka-style")
    added = acls(broker, "--add", "--allow-principal", "User:erin", "--producer", "--topic", topic)
    assert added.returncode == 0 and "Added 3 ACL(s)." in added.stdout, added
    listed = acls(broker, "--list", "--topic", topic).stdout
    assert "(principal=User:erin, host=*, operation=WRITE, permissionType=ALLOW)" in listed
    removed = acls(broker, "--remove", "--allow-principal", "User:erin", "--producer", "--topic", topic)
    assert "Removed 3 ACL(s)." in removed.stdout, removed
    assert "No ACLs." in acls(broker, "--list", "--topic", topic).stdout
