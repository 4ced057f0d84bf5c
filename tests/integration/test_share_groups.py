"""KIP-932 share groups with confluent-kafka's ShareConsumer (librdkafka 2.16) against one
real broker: records of one partition split between members, implicit and explicit
acknowledgement, RELEASE / REJECT, acquisition lock expiry, the delivery count limit,
read_committed, the admin side (ShareGroupDescribe, ListGroups, DeleteGroups, group configs),
dead-letter topics (KIP-1191's design) and, last, kill -9 of the broker with acknowledged and
unacknowledged records and dead letters in flight.

One broker for the module; each test has its own topic and group. Share groups start at the
log end by default, so each test sets share.auto.offset.reset=earliest on its group first.
"""

from __future__ import annotations

import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from typing import Any

import pytest
from confluent_kafka import (
    AcknowledgeType,
    Producer,
    ShareConsumer,
)

from strom.client import Connection
from strom.testing import (
    BrokerProcess,
    consume_all,
    create_topic,
    metric_value,
    report_broker_logs,
    scrape,
    unique_name,
    wait_for,
)

pytest_runtest_makereport = pytest.hookimpl(hookwrapper=True)(report_broker_logs)

GROUP_RESOURCE, INCREMENTAL_ALTER_CONFIGS, SHARE_GROUP_DESCRIBE, LIST_GROUPS, DELETE_GROUPS = 32, 44, 77, 16, 42
DESCRIBE_SHARE_GROUP_OFFSETS, ALTER_SHARE_GROUP_OFFSETS, DELETE_SHARE_GROUP_OFFSETS = 90, 91, 92
DESCRIBE_CONFIGS, METADATA, INVALID_CONFIG = 32, 3, 40
DLQ_ON = {"errors.deadletterqueue.group.enable": "true"}
SHARE_GROUP_HEARTBEAT = 76
SET = 0


@pytest.fixture(scope="module")
def share_broker():
    # Every test makes share groups of its own, more than ten (no group.share.max.groups).
    with BrokerProcess(overrides={"group.share.min.record.lock.duration.ms": "1000",
                                  "share.coordinator.state.topic.num.partitions": "3",
                                  "offsets.topic.num.partitions": "3", "metrics.port": "0"}) as proc:
        yield proc
    for conn in _session_connections.values():
        conn.close()
    _session_connections.clear()


SHARE_FETCH, SHARE_ACKNOWLEDGE = 78, 79
# A share session lives as long as the connection that opened it (Kafka 4.1): the module's
# ShareFetch and ShareAcknowledge requests go over one connection per broker address.
_session_connections: dict[str, Connection] = {}


def call(broker: BrokerProcess, api_key: int, version: int, fields: dict):
    host, port = broker.bootstrap.split(":")
    if api_key not in (SHARE_FETCH, SHARE_ACKNOWLEDGE):
        with Connection(host, int(port)) as conn:
            return conn.call(api_key, version, fields)
    conn = _session_connections.get(broker.bootstrap)
    if conn is not None:
        try:
            return conn.call(api_key, version, fields)
        except OSError:  # the broker restarted: its sessions are gone anyway
            conn.close()
    conn = _session_connections[broker.bootstrap] = Connection(host, int(port))
    return conn.call(api_key, version, fields)


def set_group_configs(broker: BrokerProcess, group: str, **configs: str) -> None:
    response = call(broker, INCREMENTAL_ALTER_CONFIGS, 1, {"resources": [{
        "resource_type": GROUP_RESOURCE, "resource_name": group,
        "configs": [{"name": k.replace("_", "."), "config_operation": SET, "value": v}
                    for k, v in configs.items()]}], "validate_only": False})
    assert [r.error_code for r in response.responses] == [0], response


def new_group(broker: BrokerProcess, **configs: str) -> str:
    group = unique_name("share")
    set_group_configs(broker, group, share_auto_offset_reset="earliest", **configs)
    return group


def produce(broker: BrokerProcess, topic: str, values: list[bytes], one_batch_each: bool = True) -> None:
    producer = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 0})
    for v in values:
        producer.produce(topic, value=v, partition=0)
        if one_batch_each:  # a batch per record: a share fetch acquires whole batches
            producer.flush()
    assert producer.flush(10) == 0


def consumer(broker: BrokerProcess, group: str, topic: str, **conf) -> ShareConsumer:
    c = ShareConsumer({"bootstrap.servers": broker.bootstrap, "group.id": group,
                       **{k.replace("_", "."): v for k, v in conf.items()}})
    c.subscribe([topic])
    return c


def poll_until(consumers: list[ShareConsumer], done: Callable[[], bool], on_message, timeout: float = 30.0,
               what: str = "records") -> None:
    deadline = time.monotonic() + timeout
    while not done():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        for i, c in enumerate(consumers):
            for m in c.poll(0.2):
                assert m.error() is None, m.error()
                on_message(i, m)


def test_share_consumers_split_one_partition(share_broker):
    topic = unique_name("share-split")
    create_topic(share_broker.bootstrap, topic, 1)
    group = new_group(share_broker)
    values = [b"r%03d" % i for i in range(120)]
    produce(share_broker, topic, values)
    consumers = [consumer(share_broker, group, topic, max_poll_records=7) for _ in range(3)]
    seen: dict[int, list[bytes]] = {0: [], 1: [], 2: []}
    try:
        poll_until(consumers, lambda: sum(map(len, seen.values())) >= len(values),
                   lambda i, m: seen[i].append(m.value()))
        everything = [v for vs in seen.values() for v in vs]
        assert sorted(everything) == values  # every record once: none twice, none missing
        assert all(seen[i] for i in seen), {i: len(v) for i, v in seen.items()}  # all took part
    finally:
        for c in consumers:
            c.close()


def test_a_share_group_starts_at_the_log_end_by_default(share_broker):
    topic = unique_name("share-latest")
    create_topic(share_broker.bootstrap, topic, 1)
    group = unique_name("share")  # no group config: share.auto.offset.reset=latest
    produce(share_broker, topic, [b"before%d" % i for i in range(3)], one_batch_each=False)
    c = consumer(share_broker, group, topic)
    got: list[int] = []
    try:
        describe = {"groups": [{"group_id": group, "topics": [{"topic_name": topic, "partitions": [0]}]}]}

        def start() -> int:
            c.poll(0.1)  # the first ShareFetch fixes where the group starts
            (g,) = call(share_broker, DESCRIBE_SHARE_GROUP_OFFSETS, 0, describe).groups
            return g.topics[0].partitions[0].start_offset if g.error_code == 0 else -1

        wait_for(lambda: start() == 3, timeout=20, what="the group to start at the log end")
        produce(share_broker, topic, [b"after"])
        poll_until([c], lambda: bool(got), lambda _, m: got.append(m.offset()))
        assert got == [3]
    finally:
        c.close()


def test_implicit_acknowledgement_is_not_redelivered(share_broker):
    topic = unique_name("share-implicit")
    create_topic(share_broker.bootstrap, topic, 1)
    group = new_group(share_broker)
    produce(share_broker, topic, [b"a%d" % i for i in range(5)], one_batch_each=False)
    first = consumer(share_broker, group, topic)
    got: list[tuple[int, int]] = []
    poll_until([first], lambda: len(got) >= 5, lambda _, m: got.append((m.offset(), m.delivery_count())))
    assert got == [(o, 1) for o in range(5)]
    first.poll(0.5)  # the next poll accepts what the previous one returned
    first.close()
    produce(share_broker, topic, [b"sentinel"])
    second = consumer(share_broker, group, topic)
    later: list[int] = []
    try:
        poll_until([second], lambda: 5 in later, lambda _, m: later.append(m.offset()))
        assert later == [5]
    finally:
        second.close()


def test_explicit_release_reject_and_delivery_limit(share_broker):
    topic = unique_name("share-explicit")
    create_topic(share_broker.bootstrap, topic, 1)
    group = new_group(share_broker)
    produce(share_broker, topic, [b"e%d" % i for i in range(5)], one_batch_each=False)
    c = consumer(share_broker, group, topic, share_acknowledgement_mode="explicit")
    deliveries: dict[int, list[int]] = {o: [] for o in range(7)}
    plan = {0: AcknowledgeType.ACCEPT, 1: AcknowledgeType.RELEASE, 2: AcknowledgeType.REJECT,
            3: AcknowledgeType.RELEASE, 4: AcknowledgeType.ACCEPT, 5: AcknowledgeType.ACCEPT,
            6: AcknowledgeType.ACCEPT}
    try:
        def on_message(_, m) -> None:
            deliveries[m.offset()].append(m.delivery_count())
            c.acknowledge(m, plan[m.offset()])

        # Released records come back with a growing delivery count until the limit (5).
        poll_until([c], lambda: len(deliveries[1]) >= 5 and len(deliveries[3]) >= 5, on_message,
                   what="five deliveries of the released records")
        c.commit_sync()
        produce(share_broker, topic, [b"sentinel"])  # offset 5: after it, nothing else may come
        poll_until([c], lambda: bool(deliveries[5]), on_message, what="the sentinel")
        c.commit_sync()
        assert deliveries[1] == deliveries[3] == [1, 2, 3, 4, 5]  # archived after the fifth
        assert deliveries[0] == deliveries[2] == deliveries[4] == [1]  # accepted, rejected: once
    finally:
        c.close()


def test_lock_expiry_redelivers_to_another_member(share_broker):
    topic = unique_name("share-lock")
    create_topic(share_broker.bootstrap, topic, 1)
    group = new_group(share_broker, share_record_lock_duration_ms="1000")
    produce(share_broker, topic, [b"l%d" % i for i in range(4)], one_batch_each=False)
    stalled = consumer(share_broker, group, topic, share_acknowledgement_mode="explicit")
    held: list[int] = []
    started = time.monotonic()  # before the acquisition: its lock runs out a second after it
    poll_until([stalled], lambda: len(held) >= 4, lambda _, m: held.append(m.offset()))
    other = consumer(share_broker, group, topic)
    got: list[tuple[int, int]] = []
    try:  # `stalled` never acknowledges nor polls again: its locks run out
        poll_until([other], lambda: len(got) >= 4, lambda _, m: got.append((m.offset(), m.delivery_count())))
        assert time.monotonic() - started >= 0.9
        assert sorted(got) == [(o, 2) for o in range(4)]
    finally:
        other.close()
        stalled.close()


CONSUMER_PROCESS = """
import sys
from confluent_kafka import ShareConsumer
bootstrap, group, topic = sys.argv[1:4]
c = ShareConsumer({"bootstrap.servers": bootstrap, "group.id": group, "share.acknowledgement.mode": "explicit"})
c.subscribe([topic])
held = 0
while held < int(sys.argv[4]):
    for m in c.poll(0.2):
        if m.error() is None:
            print(m.offset(), flush=True)
            held += 1
print("holding", flush=True)
sys.stdin.read()  # until killed
"""


def test_a_killed_consumer_process_has_its_records_delivered_again(share_broker):
    """kill -9 of a member's process: its connection closes, and the broker gives back what its
    share session held at once (Kafka 4.1), not when the 30 s acquisition locks run out: another
    member gets the records within 15 s, with delivery count 2."""
    topic = unique_name("share-killed")
    create_topic(share_broker.bootstrap, topic, 1)
    group = new_group(share_broker, share_record_lock_duration_ms="30000")
    produce(share_broker, topic, [b"k%d" % i for i in range(5)], one_batch_each=False)
    member = subprocess.Popen([sys.executable, "-c", CONSUMER_PROCESS, share_broker.bootstrap, group, topic, "5"],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        lines = [member.stdout.readline().strip() for _ in range(6)]
        assert lines[-1] == "holding" and sorted(map(int, lines[:-1])) == list(range(5)), lines
    finally:
        member.kill()
        member.wait()
    other = consumer(share_broker, group, topic)
    got: list[tuple[int, int]] = []
    try:
        poll_until([other], lambda: len(got) >= 5, lambda _, m: got.append((m.offset(), m.delivery_count())),
                   timeout=15, what="the killed member's records, before their locks expire")
        assert sorted(got) == [(o, 2) for o in range(5)]
    finally:
        other.close()


def test_read_committed_share_group_skips_aborted_records(share_broker):
    topic = unique_name("share-txn")
    create_topic(share_broker.bootstrap, topic, 1)
    group = new_group(share_broker, share_isolation_level="read_committed")
    producer = Producer({"bootstrap.servers": share_broker.bootstrap, "transactional.id": unique_name("tx")})
    producer.init_transactions()
    for outcome, values in (("commit", [b"c1", b"c2"]), ("abort", [b"x1", b"x2"]), ("commit", [b"c3"])):
        producer.begin_transaction()
        for v in values:
            producer.produce(topic, value=v, partition=0)
        producer.flush()
        (producer.commit_transaction if outcome == "commit" else producer.abort_transaction)()
    c = consumer(share_broker, group, topic)
    got: list[bytes] = []
    try:
        poll_until([c], lambda: b"c3" in got, lambda _, m: got.append(m.value()))
        assert got == [b"c1", b"c2", b"c3"]
    finally:
        c.close()


def test_describe_list_and_delete_share_group(share_broker):
    topic = unique_name("share-admin")
    create_topic(share_broker.bootstrap, topic, 1)
    group = new_group(share_broker)
    produce(share_broker, topic, [b"d"])
    c = consumer(share_broker, group, topic)
    got: list[int] = []
    poll_until([c], lambda: bool(got), lambda _, m: got.append(m.offset()))
    described = call(share_broker, SHARE_GROUP_DESCRIBE, 1, {"group_ids": [group, "no-such-group"],
                                                             "include_authorized_operations": False})
    mine, missing = described.groups
    assert (mine.error_code, mine.group_state, len(mine.members)) == (0, "Stable", 1)
    assignment = mine.members[0].assignment.topic_partitions
    assert [(t.topic_name, list(t.partitions)) for t in assignment] == [(topic, [0])]
    assert missing.error_code == 69  # GROUP_ID_NOT_FOUND
    listed = call(share_broker, LIST_GROUPS, 5, {"states_filter": [], "types_filter": ["share"]})
    assert (group, "share", "Stable") in {(g.group_id, g.group_type, g.group_state) for g in listed.groups}
    consumers_only = call(share_broker, LIST_GROUPS, 5, {"states_filter": [], "types_filter": ["consumer"]})
    assert group not in {g.group_id for g in consumers_only.groups}
    configs = call(share_broker, 32, 4, {"resources": [{"resource_type": GROUP_RESOURCE, "resource_name": group,
                                                         "configuration_keys": None}],
                                         "include_synonyms": False, "include_documentation": False})
    (result,) = configs.results
    values = {c.name: (c.value, c.config_source) for c in result.configs}
    assert values["share.auto.offset.reset"] == ("earliest", 8)  # GROUP_CONFIG: this group's override
    assert values["share.isolation.level"] == ("read_uncommitted", 5)  # DEFAULT_CONFIG
    bad = call(share_broker, INCREMENTAL_ALTER_CONFIGS, 1, {"resources": [{
        "resource_type": GROUP_RESOURCE, "resource_name": group, "configs": [
            {"name": "share.record.lock.duration.ms", "config_operation": SET, "value": "10"}]}],
        "validate_only": False})
    assert bad.responses[0].error_code == 40  # INVALID_CONFIG: below group.share.min.record.lock.duration.ms
    busy = call(share_broker, DELETE_GROUPS, 2, {"groups_names": [group]})
    assert busy.results[0].error_code == 68  # NON_EMPTY_GROUP
    c.close()  # leaves the group
    deleted = call(share_broker, DELETE_GROUPS, 2, {"groups_names": [group]})
    assert deleted.results[0].error_code == 0
    listed = call(share_broker, LIST_GROUPS, 5, {"states_filter": [], "types_filter": ["share"]})
    assert group not in {g.group_id for g in listed.groups}


def test_share_fetch_session_errors(share_broker):
    """Kafka's answers to a member that gets its share session wrong (the client never does)."""
    topic = unique_name("share-session")
    create_topic(share_broker.bootstrap, topic, 1)
    group, member = unique_name("share"), str(uuid.uuid4())
    stranger = {"group_id": group, "member_id": member, "share_session_epoch": 0, "max_wait_ms": 0,
                "min_bytes": 1, "max_bytes": 1 << 20, "max_records": 10, "batch_size": 10, "topics": [],
                "forgotten_topics_data": []}
    assert call(share_broker, 78, 1, stranger).error_code == 25  # UNKNOWN_MEMBER_ID: only members open sessions
    joined = call(share_broker, SHARE_GROUP_HEARTBEAT, 1, {"group_id": group, "member_id": member, "member_epoch": 0,
                                                           "rack_id": None, "subscribed_topic_names": [topic]})
    assert joined.error_code == 0
    base = {"group_id": group, "member_id": member, "max_wait_ms": 0, "min_bytes": 1, "max_bytes": 1 << 20,
            "max_records": 10, "batch_size": 10, "topics": [], "forgotten_topics_data": []}
    assert call(share_broker, 78, 1, {**base, "share_session_epoch": 3}).error_code == 122  # not found
    assert call(share_broker, 78, 1, {**base, "share_session_epoch": 0}).error_code == 0
    assert call(share_broker, 78, 1, {**base, "share_session_epoch": 5}).error_code == 123  # bad epoch
    assert call(share_broker, 78, 1, {**base, "share_session_epoch": 1}).error_code == 0
    ack = {"group_id": group, "member_id": member, "topics": []}
    assert call(share_broker, 79, 1, {**ack, "share_session_epoch": 0}).error_code == 123
    assert call(share_broker, 79, 1, {**ack, "share_session_epoch": 2}).error_code == 0
    assert call(share_broker, 79, 1, {**ack, "share_session_epoch": -1}).error_code == 0  # closed
    assert call(share_broker, 79, 1, {**ack, "share_session_epoch": 3}).error_code == 122
    call(share_broker, SHARE_GROUP_HEARTBEAT, 1, {"group_id": group, "member_id": member, "member_epoch": -1,
                                                  "rack_id": None, "subscribed_topic_names": None})


def test_share_group_heartbeat_errors_and_the_feature_gate(share_broker):
    topic = unique_name("share-hb")
    create_topic(share_broker.bootstrap, topic, 2)
    group, member = unique_name("share"), str(uuid.uuid4())

    def heartbeat(epoch: int, member_id: str = member, group_id: str = group, topics=None):
        return call(share_broker, SHARE_GROUP_HEARTBEAT, 1, {
            "group_id": group_id, "member_id": member_id, "member_epoch": epoch, "rack_id": None,
            "subscribed_topic_names": topics})

    assert heartbeat(0).error_code == 42  # INVALID_REQUEST: the first heartbeat names its topics
    first = heartbeat(0, topics=[topic])
    assert (first.error_code, first.member_epoch) == (0, 1)
    assert [sorted(t.partitions) for t in first.assignment.topic_partitions] == [[0, 1]]
    other = str(uuid.uuid4())
    second = heartbeat(0, other, topics=[topic])  # a second member: the partitions are split
    assert second.member_epoch == 2 and len(second.assignment.topic_partitions[0].partitions) == 1
    moved = heartbeat(1)  # the first member learns its share of the new assignment
    assert moved.member_epoch == 2 and len(moved.assignment.topic_partitions[0].partitions) == 1
    assert heartbeat(7).error_code == 110  # FENCED_MEMBER_EPOCH
    assert heartbeat(3, str(uuid.uuid4())).error_code == 25  # UNKNOWN_MEMBER_ID
    assert heartbeat(-1).error_code == 0 and heartbeat(-1, other).error_code == 0
    # A share group's id is not a consumer group's, and a consumer group's not a share group's.
    kip848 = call(share_broker, 68, 0, {"group_id": group, "member_id": "", "member_epoch": 0, "instance_id": None,
                                        "rack_id": None, "rebalance_timeout_ms": 30000,
                                        "subscribed_topic_names": [topic], "server_assignor": None,
                                        "topic_partitions": []})
    assert kip848.error_code == 69  # GROUP_ID_NOT_FOUND
    consumer_group = unique_name("kip848")
    assert call(share_broker, 68, 0, {"group_id": consumer_group, "member_id": "", "member_epoch": 0,
                                      "instance_id": None, "rack_id": None, "rebalance_timeout_ms": 30000,
                                      "subscribed_topic_names": [topic], "server_assignor": None,
                                      "topic_partitions": []}).error_code == 0
    assert heartbeat(0, group_id=consumer_group, topics=[topic]).error_code == 69
    # share.version 0 turns share groups away, as a Kafka 4.1 broker with them off.
    features = {"timeout_ms": 10000, "validate_only": False}
    down = call(share_broker, 57, 1, {**features, "feature_updates": [
        {"feature": "share.version", "max_version_level": 0, "upgrade_type": 2}]})
    assert down.error_code == 0
    try:
        wait_for(lambda: heartbeat(0, topics=[topic]).error_code == 35, timeout=10, what="UNSUPPORTED_VERSION")
    finally:
        up = call(share_broker, 57, 1, {**features, "feature_updates": [
            {"feature": "share.version", "max_version_level": 1, "upgrade_type": 1}]})
        assert up.error_code == 0
    wait_for(lambda: heartbeat(0, topics=[topic]).error_code == 0, timeout=10, what="share groups back")


def test_share_group_offsets_describe_alter_delete(share_broker):
    topic = unique_name("share-offsets")
    create_topic(share_broker.bootstrap, topic, 1)
    group = new_group(share_broker)
    produce(share_broker, topic, [b"o%d" % i for i in range(6)], one_batch_each=False)
    c = consumer(share_broker, group, topic)
    got: list[int] = []
    poll_until([c], lambda: len(got) >= 6, lambda _, m: got.append(m.offset()))
    c.poll(0.5)  # accepts 0-5: the start offset moves to 6
    describe = {"groups": [{"group_id": group, "topics": None}]}

    def start_offsets() -> dict[int, int]:
        (g,) = call(share_broker, DESCRIBE_SHARE_GROUP_OFFSETS, 0, describe).groups
        assert g.error_code == 0, g
        return {p.partition_index: p.start_offset for t in g.topics if t.topic_name == topic for p in t.partitions}

    wait_for(lambda: start_offsets() == {0: 6}, timeout=10, what="start offset 6")
    # KIP-1226: v1 answers the lag (end 6 - start 6 - none done past it); v0 has no such field.
    (g,) = call(share_broker, DESCRIBE_SHARE_GROUP_OFFSETS, 1, describe).groups
    assert [(p.start_offset, p.lag, p.error_code) for t in g.topics if t.topic_name == topic
            for p in t.partitions] == [(6, 0, 0)]
    produce(share_broker, topic, [b"late"], one_batch_each=False)
    (g,) = call(share_broker, DESCRIBE_SHARE_GROUP_OFFSETS, 1,
                {"groups": [{"group_id": group, "topics": [{"topic_name": topic, "partitions": [0, 7]}]}]}).groups
    assert [(p.partition_index, p.start_offset, p.lag, p.error_code) for p in g.topics[0].partitions] == [
        (0, 6, 1, 0), (7, -1, -1, 3)]  # 7: UNKNOWN_TOPIC_OR_PARTITION
    alter = {"group_id": group, "topics": [{"topic_name": topic, "partitions": [{"partition_index": 0,
                                                                                 "start_offset": 2}]}]}
    busy = call(share_broker, ALTER_SHARE_GROUP_OFFSETS, 0, alter)
    assert busy.responses[0].partitions[0].error_code == 68  # NON_EMPTY_GROUP: a member is in
    c.close()
    done = call(share_broker, ALTER_SHARE_GROUP_OFFSETS, 0, alter)
    assert done.responses[0].partitions[0].error_code == 0
    assert start_offsets() == {0: 2}
    again = consumer(share_broker, group, topic)
    redelivered: list[int] = []
    try:  # the group reads from 2 again
        poll_until([again], lambda: len(redelivered) >= 5, lambda _, m: redelivered.append(m.offset()))
        assert redelivered == [2, 3, 4, 5, 6]
    finally:
        again.close()
    deleted = call(share_broker, DELETE_SHARE_GROUP_OFFSETS, 0, {"group_id": group, "topics": [{"topic_name": topic}]})
    assert deleted.error_code == 0 and [p.error_code for p in deleted.responses[0].partitions] == [0]
    (g,) = call(share_broker, DESCRIBE_SHARE_GROUP_OFFSETS, 0,
                {"groups": [{"group_id": group, "topics": [{"topic_name": topic, "partitions": [0]}]}]}).groups
    assert [p.start_offset for p in g.topics[0].partitions] == [-1]  # no state left


def test_strom_groups_cli_shows_share_groups(share_broker):
    topic = unique_name("share-cli")
    create_topic(share_broker.bootstrap, topic, 1)
    group = new_group(share_broker)
    produce(share_broker, topic, [b"c%d" % i for i in range(10)], one_batch_each=False)
    c = consumer(share_broker, group, topic, share_acknowledgement_mode="explicit")
    got = []
    poll_until([c], lambda: len(got) >= 10, lambda _, m: got.append(m))
    for m in got:
        c.acknowledge(m, AcknowledgeType.RELEASE if m.offset() == 4 else AcknowledgeType.ACCEPT)
    c.commit_sync()  # start offset 4, and of 4-9 only 4 still to do: lag 1 (KIP-1226)

    def strom(*args: str) -> str:
        done = subprocess.run([sys.executable, "-m", "strom", "groups", *args,
                               "--bootstrap-server", share_broker.bootstrap],
                              capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        return done.stdout

    try:
        assert group in strom("list").split()
        rows = [line.split() for line in strom("describe", group).splitlines()]
        assert rows[0] == ["GROUP", "TOPIC", "PARTITION", "START-OFFSET", "LOG-END-OFFSET", "LAG", "#MEMBERS"]
        assert rows[1] == [group, topic, "0", "4", "10", "1", "1"]
    finally:
        c.close()


def topic_id_of(broker: BrokerProcess, topic: str) -> uuid.UUID:
    answer = call(broker, 3, 12, {"topics": [{"topic_id": uuid.UUID(int=0), "name": topic}],
                                  "allow_auto_topic_creation": False, "include_topic_authorized_operations": False})
    (t,) = answer.topics
    return t.topic_id


def join(broker: BrokerProcess, group: str, topic: str) -> str:
    return first_heartbeat(broker, group, topic).member_id


def first_heartbeat(broker: BrokerProcess, group: str, topic: str) -> Any:
    """A new member's ShareGroupHeartbeat, once the group coordinator answers."""
    member = str(uuid.uuid4())

    def joined() -> Any:  # FindCoordinator makes __consumer_offsets, which then loads
        call(broker, 10, 4, {"key_type": 0, "coordinator_keys": [group]})
        answer = call(broker, SHARE_GROUP_HEARTBEAT, 1, {"group_id": group, "member_id": member, "member_epoch": 0,
                                                         "rack_id": None, "subscribed_topic_names": [topic]})
        assert answer.error_code in (0, 14, 15, 16), answer  # COORDINATOR_LOAD_IN_PROGRESS/_NOT_AVAILABLE, NOT_
        return answer if answer.error_code == 0 else None

    return wait_for(joined, what="the member joined")


def share_fetch(broker: BrokerProcess, group: str, member: str, epoch: int, topic_id: uuid.UUID,
                batches: list[dict] | None = None, **fields) -> Any:
    return call(broker, 78, 1, {
        "group_id": group, "member_id": member, "share_session_epoch": epoch, "max_wait_ms": 0, "min_bytes": 1,
        "max_bytes": 1 << 20, "max_records": 5000, "batch_size": 5000, "forgotten_topics_data": [],
        "topics": [{"topic_id": topic_id, "partitions": [{"partition_index": 0,
                                                          "acknowledgement_batches": batches or []}]}],
        **fields})


def share_acknowledge(broker: BrokerProcess, group: str, member: str, epoch: int, topic_id: uuid.UUID,
                      batches: list[dict]) -> Any:
    return call(broker, 79, 1, {"group_id": group, "member_id": member, "share_session_epoch": epoch, "topics": [
        {"topic_id": topic_id, "partitions": [{"partition_index": 0, "acknowledgement_batches": batches}]}]})


def ack(first: int, last: int, *types: int) -> dict:
    return {"first_offset": first, "last_offset": last, "acknowledge_types": list(types or [1])}


def test_repeated_or_overlapping_acknowledgement_batches_are_refused_at_once(share_broker):
    """20,000 copies of the batch that acknowledges 2,000 held records: INVALID_REQUEST for the
    partition, as Kafka answers batches out of order or overlapping, nothing applied, and the
    broker goes on serving everyone (no walk over the claimed offsets)."""
    topic = unique_name("share-badack")
    create_topic(share_broker.bootstrap, topic, 1)
    group = new_group(share_broker)
    produce(share_broker, topic, [b"b%d" % i for i in range(2000)], one_batch_each=False)
    tid = topic_id_of(share_broker, topic)
    member = join(share_broker, group, topic)
    held: list[tuple[int, int]] = []
    epoch = 0
    while sum(b - a + 1 for a, b in held) < 2000:
        fetched = share_fetch(share_broker, group, member, epoch, tid)
        epoch += 1
        (p,) = fetched.responses[0].partitions
        assert p.error_code == 0, p
        held += [(r.first_offset, r.last_offset) for r in p.acquired_records]
    first, last = held[0][0], held[-1][1]
    assert (first, last) == (0, 1999)
    flood = [ack(first, last)] * 20_000
    answer = share_acknowledge(share_broker, group, member, epoch, tid, flood)
    assert answer.error_code == 0
    assert answer.responses[0].partitions[0].error_code == 42  # INVALID_REQUEST
    # Piggybacked on a ShareFetch alike: the acknowledgement error is the partition's.
    overlapping = [ack(0, 10), ack(10, 20), ack(5, 1999)]
    fetched = share_fetch(share_broker, group, member, epoch + 1, tid, overlapping)
    assert fetched.responses[0].partitions[0].acknowledge_error_code == 42
    for bad in ([ack(20, 10)], [ack(0, 2, 1, 1)], [ack(0, 0, 5)], [ack(5, 9), ack(0, 4)]):
        answer = share_acknowledge(share_broker, group, member, epoch + 2, tid, bad)
        assert answer.responses[0].partitions[0].error_code == 42, bad
        epoch += 1
    # Nothing was applied: the member still holds every record and accepts them once.
    done = share_acknowledge(share_broker, group, member, epoch + 2, tid, [ack(0, 999), ack(1000, 1999)])
    assert done.responses[0].partitions[0].error_code == 0
    # Another member of another group is served as usual.
    other_topic = unique_name("share-badack-other")
    create_topic(share_broker.bootstrap, other_topic, 1)
    other_group = new_group(share_broker)
    produce(share_broker, other_topic, [b"o"])
    c = consumer(share_broker, other_group, other_topic)
    got: list[bytes] = []
    try:
        poll_until([c], lambda: bool(got), lambda _, m: got.append(m.value()))
        assert got == [b"o"]
    finally:
        c.close()


def test_partitions_that_do_not_exist_are_answered_but_not_kept_in_the_session(share_broker):
    topic = unique_name("share-bogus")
    create_topic(share_broker.bootstrap, topic, 1)
    group = new_group(share_broker)
    tid = topic_id_of(share_broker, topic)
    member = join(share_broker, group, topic)
    bogus = [{"topic_id": uuid.uuid4(), "partitions": [{"partition_index": 0, "acknowledgement_batches": []}]}
             for _ in range(1000)]
    bogus.append({"topic_id": tid, "partitions": [{"partition_index": 7, "acknowledgement_batches": []}]})
    first = share_fetch(share_broker, group, member, 0, tid, topics=bogus)
    errors = {(t.topic_id, p.partition_index): p.error_code for t in first.responses for p in t.partitions}
    assert errors.pop((tid, 7)) == 3  # UNKNOWN_TOPIC_OR_PARTITION
    assert len(errors) == 1000 and set(errors.values()) == {100}  # UNKNOWN_TOPIC_ID
    second = share_fetch(share_broker, group, member, 1, tid, topics=[])
    assert second.error_code == 0 and second.responses == []  # the session kept none of them


def test_any_number_of_share_groups_and_empty_ones_stay(share_broker):
    """No group.share.max.groups (Kafka 4.1 removed it): a dozen share groups, each left
    empty by its member, and a dozen more after them, all join."""
    topic = unique_name("share-many")
    create_topic(share_broker.bootstrap, topic, 1)
    groups = [unique_name("share-many") for _ in range(24)]
    for group in groups:
        member = join(share_broker, group, topic)
        left = call(share_broker, SHARE_GROUP_HEARTBEAT, 1, {"group_id": group, "member_id": member,
                                                             "member_epoch": -1, "rack_id": None,
                                                             "subscribed_topic_names": None})
        assert left.error_code == 0
    listed = call(share_broker, LIST_GROUPS, 5, {"states_filter": ["Empty"], "types_filter": ["share"]})
    assert set(groups) <= {g.group_id for g in listed.groups}
    # No member and no share-partition state: still described, as Empty.
    described = call(share_broker, SHARE_GROUP_DESCRIBE, 1, {"group_ids": groups[:1],
                                                             "include_authorized_operations": False})
    assert [(g.error_code, g.group_state, list(g.members)) for g in described.groups] == [(0, "Empty", [])]


def test_acknowledgements_sent_while_closing_count(share_broker):
    """A consumer that acknowledges and closes: its leave heartbeat gives nothing back, so its
    final ShareAcknowledge (epoch -1) accepts the records instead of INVALID_RECORD_STATE, and
    they never come again; what it holds without acknowledging comes back at once."""
    topic = unique_name("share-close")
    create_topic(share_broker.bootstrap, topic, 1)
    group = new_group(share_broker)
    produce(share_broker, topic, [b"c%d" % i for i in range(6)], one_batch_each=False)
    c = consumer(share_broker, group, topic, share_acknowledgement_mode="explicit")
    messages = []
    poll_until([c], lambda: len(messages) >= 6, lambda _, m: messages.append(m))
    for m in messages:
        c.acknowledge(m, AcknowledgeType.ACCEPT)
    c.close()
    produce(share_broker, topic, [b"after"])
    again = consumer(share_broker, group, topic)
    got: list[bytes] = []
    try:
        poll_until([again], lambda: b"after" in got, lambda _, m: got.append(m.value()))
        assert got == [b"after"]
    finally:
        again.close()
    # The same with raw requests: leave first, then the final ShareAcknowledge.
    topic = unique_name("share-close-raw")
    create_topic(share_broker.bootstrap, topic, 1)
    group = new_group(share_broker)
    tid = topic_id_of(share_broker, topic)
    produce(share_broker, topic, [b"r1", b"r2"], one_batch_each=False)
    member = join(share_broker, group, topic)
    (p,) = share_fetch(share_broker, group, member, 0, tid).responses[0].partitions
    (held,) = p.acquired_records
    left = call(share_broker, SHARE_GROUP_HEARTBEAT, 1, {"group_id": group, "member_id": member, "member_epoch": -1,
                                                         "rack_id": None, "subscribed_topic_names": None})
    assert left.error_code == 0
    closing = share_acknowledge(share_broker, group, member, -1, tid,
                                [ack(held.first_offset, held.first_offset)])
    assert closing.responses[0].partitions[0].error_code == 0
    # The other record went back with the session: a new member gets it, delivered twice.
    member = join(share_broker, group, topic)
    (p,) = share_fetch(share_broker, group, member, 0, tid).responses[0].partitions
    assert [(r.first_offset, r.last_offset, r.delivery_count) for r in p.acquired_records] == [
        (held.last_offset, held.last_offset, 2)]


def test_max_bytes_zero_is_one_batch_not_unlimited(share_broker):
    topic = unique_name("share-maxbytes")
    create_topic(share_broker.bootstrap, topic, 1)
    group = new_group(share_broker)
    produce(share_broker, topic, [b"m%d" % i for i in range(5)])  # five batches
    tid = topic_id_of(share_broker, topic)
    member = join(share_broker, group, topic)
    (p,) = share_fetch(share_broker, group, member, 0, tid, max_bytes=0).responses[0].partitions
    assert [(r.first_offset, r.last_offset) for r in p.acquired_records] == [(0, 0)]
    (p,) = share_fetch(share_broker, group, member, 1, tid).responses[0].partitions
    assert [(r.first_offset, r.last_offset) for r in p.acquired_records] == [(1, 4)]


def test_share_fetch_and_acknowledge_v2_record_limit_and_renew(share_broker):
    """Kafka 4.2's v2: ShareAcquireMode record_limit (KIP-1206) acquires at most MaxRecords;
    RENEW (KIP-1222) keeps records locked past their first lock, on ShareAcknowledge and on a
    ShareFetch that only renews (IsRenewAck, its fetch fields 0); v1 knows no RENEW, and a v2
    request not saying IsRenewAck may not carry one."""
    topic = unique_name("share-v2")
    create_topic(share_broker.bootstrap, topic, 1)
    group = new_group(share_broker, share_record_lock_duration_ms="1000")
    produce(share_broker, topic, [b"v%d" % i for i in range(10)], one_batch_each=False)
    tid = topic_id_of(share_broker, topic)
    member = join(share_broker, group, topic)
    fetch2 = {"share_acquire_mode": 1, "is_renew_ack": False}
    fetched = call(share_broker, 78, 2, {
        "group_id": group, "member_id": member, "share_session_epoch": 0, "max_wait_ms": 0, "min_bytes": 1,
        "max_bytes": 1 << 20, "max_records": 3, "batch_size": 3, "forgotten_topics_data": [], **fetch2,
        "topics": [{"topic_id": tid, "partitions": [{"partition_index": 0, "acknowledgement_batches": []}]}]})
    (p,) = fetched.responses[0].partitions
    assert [(r.first_offset, r.last_offset) for r in p.acquired_records] == [(0, 2)]  # not the whole batch
    assert fetched.acquisition_lock_timeout_ms == 1000

    def acknowledge(version: int, epoch: int, types: list[int], **fields) -> Any:
        return call(share_broker, 79, version, {
            "group_id": group, "member_id": member, "share_session_epoch": epoch, **fields, "topics": [
                {"topic_id": tid, "partitions": [{"partition_index": 0, "acknowledgement_batches": [
                    {"first_offset": 0, "last_offset": 2, "acknowledge_types": types}]}]}]})

    assert acknowledge(1, 1, [4]).responses[0].partitions[0].error_code == 42  # v1: no RENEW
    # v2 RENEW only with IsRenewAck (Kafka 4.2's check): INVALID_REQUEST for the partition.
    assert acknowledge(2, 2, [4], is_renew_ack=False).responses[0].partitions[0].error_code == 42
    epoch = 3
    renewing = {"share_session_epoch": 0, "max_wait_ms": 0, "min_bytes": 0, "max_bytes": 0, "max_records": 0,
                "batch_size": 0, "forgotten_topics_data": [], "share_acquire_mode": 0, "is_renew_ack": True,
                "group_id": group, "member_id": member,
                "topics": [{"topic_id": tid, "partitions": [{"partition_index": 0, "acknowledgement_batches": [
                    {"first_offset": 0, "last_offset": 2, "acknowledge_types": [4]}]}]}]}
    bad = call(share_broker, 78, 2, {**renewing, "share_session_epoch": epoch, "max_records": 5})
    assert bad.error_code == 42  # IsRenewAck with a fetch field set
    started = time.monotonic()
    while time.monotonic() - started < 2.0:  # twice the lock duration, renewed every 0.25 s
        if epoch % 2:
            answer = acknowledge(2, epoch, [4], is_renew_ack=True)
            assert answer.responses[0].partitions[0].error_code == 0
            assert answer.acquisition_lock_timeout_ms == 1000
        else:
            answer = call(share_broker, 78, 2, {**renewing, "share_session_epoch": epoch})
            (p,) = answer.responses[0].partitions
            assert (p.acknowledge_error_code, list(p.acquired_records)) == (0, [])  # renewed, nothing fetched
        epoch += 1
        time.sleep(0.25)
    # Kafka 4.3's group config share.renew.acknowledge.enable=false refuses RENEW.
    set_group_configs(share_broker, group, share_renew_acknowledge_enable="false")
    refused = acknowledge(2, epoch, [4], is_renew_ack=True).responses[0].partitions[0].error_code
    epoch += 1
    assert refused == 121  # INVALID_RECORD_STATE
    # Still the member's: accepted now, they are done.
    assert acknowledge(2, epoch, [1]).responses[0].partitions[0].error_code == 0


def test_share_session_timeout_and_heartbeat_interval_group_configs(share_broker):
    topic = unique_name("share-hbcfg")
    create_topic(share_broker.bootstrap, topic, 1)
    group = new_group(share_broker, share_heartbeat_interval_ms="7000", share_session_timeout_ms="50000")
    assert first_heartbeat(share_broker, group, topic).heartbeat_interval_ms == 7000
    bad = call(share_broker, INCREMENTAL_ALTER_CONFIGS, 1, {"resources": [{
        "resource_type": GROUP_RESOURCE, "resource_name": group, "configs": [
            {"name": "share.session.timeout.ms", "config_operation": SET, "value": "1000"}]}],
        "validate_only": False})
    assert bad.responses[0].error_code == 40  # INVALID_CONFIG: below group.share.min.session.timeout.ms


def _ms() -> int:
    return int(time.time() * 1000)


def _not_before(value: bytes, at_ms: int) -> tuple[bytes, list]:
    return value, [("strom.not-before", str(at_ms).encode())]


def produce_with_headers(broker: BrokerProcess, topic: str, records: list[tuple[bytes, list]]) -> None:
    producer = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 0})
    for value, headers in records:
        producer.produce(topic, value=value, partition=0, headers=headers)
        producer.flush()  # a batch each
    assert producer.flush(10) == 0


def test_a_record_with_a_not_before_header_waits_for_it_and_others_do_not(share_broker):
    """Delayed delivery (a Strom extension): a record whose `strom.not-before` header names a
    time 1.5 s ahead is delivered only after it; the records produced after it are not held."""
    topic = unique_name("share-notbefore")
    create_topic(share_broker.bootstrap, topic, 1)
    group = new_group(share_broker)
    produce(share_broker, topic, [b"warm-up"])
    c = consumer(share_broker, group, topic)
    got: dict[bytes, int] = {}
    try:
        poll_until([c], lambda: b"warm-up" in got, lambda _, m: got.setdefault(m.value(), _ms()))
        not_before = _ms() + 1500
        produce_with_headers(share_broker, topic, [_not_before(b"later", not_before), (b"now-1", []),
                                                   (b"now-2", [])])
        poll_until([c], lambda: b"later" in got, lambda _, m: got.setdefault(m.value(), _ms()))
        assert got[b"later"] >= not_before  # never before its time (the broker's clock is this host's)
        assert got[b"now-1"] < got[b"later"] and got[b"now-2"] < got[b"later"]
    finally:
        c.close()


def test_share_release_delay_ms_delays_a_released_record(share_broker):
    topic = unique_name("share-reldelay")
    create_topic(share_broker.bootstrap, topic, 1)
    group = new_group(share_broker, share_release_delay_ms="1000")
    produce(share_broker, topic, [b"retry-me", b"fine"])
    c = consumer(share_broker, group, topic, share_acknowledgement_mode="explicit")
    deliveries: list[tuple[bytes, int, int]] = []
    released_at = 0
    try:
        def on_message(_, m) -> None:
            nonlocal released_at
            deliveries.append((m.value(), m.delivery_count(), _ms()))
            if m.value() == b"retry-me" and m.delivery_count() == 1:
                released_at = _ms()
                c.acknowledge(m, AcknowledgeType.RELEASE)
            else:
                c.acknowledge(m, AcknowledgeType.ACCEPT)

        poll_until([c], lambda: len(deliveries) >= 2, on_message)
        c.commit_sync()  # the RELEASE reaches the broker at once
        poll_until([c], lambda: len(deliveries) >= 3, on_message, what="the released record again")
        c.commit_sync()
        value, count, at = deliveries[2]
        assert (value, count) == (b"retry-me", 2)
        assert at >= released_at + 1000
        bad = call(share_broker, INCREMENTAL_ALTER_CONFIGS, 1, {"resources": [{
            "resource_type": GROUP_RESOURCE, "resource_name": group, "configs": [
                {"name": "share.release.delay.ms", "config_operation": SET, "value": "-1"}]}],
            "validate_only": False})
        assert bad.responses[0].error_code == 40  # INVALID_CONFIG
    finally:
        c.close()


def read_to_end(broker: BrokerProcess, topic: str, partition: int = 0) -> list:
    """Every record of a partition up to its high watermark."""
    return consume_all(broker.bootstrap, topic, [partition], allow_empty=True)


def dead_letters(broker: BrokerProcess, topic: str, partition: int = 0) -> list[tuple]:
    """(source offset, delivery count, cause, key, value) of each dead letter, in log order."""
    out = []
    for m in read_to_end(broker, topic, partition):
        h = {k: v.decode() for k, v in m.headers() or []}
        out.append((int(h["__dlq.errors.offset"]), int(h["__dlq.errors.delivery.count"]), h["__dlq.errors.message"],
                    m.key(), m.value()))
    return out


def share_start(broker: BrokerProcess, group: str, topic: str) -> int:
    (g,) = call(broker, DESCRIBE_SHARE_GROUP_OFFSETS, 0, {"groups": [{"group_id": group, "topics": [
        {"topic_name": topic, "partitions": [0]}]}]}).groups
    return g.topics[0].partitions[0].start_offset if g.error_code == 0 else -1


def test_rejected_and_exhausted_records_are_dead_letters(share_broker):
    topic, dlq = unique_name("share-dlq-src"), "dlq." + unique_name("share")
    create_topic(share_broker.bootstrap, topic, 1)
    create_topic(share_broker.bootstrap, dlq, 2, config=DLQ_ON)
    group = new_group(share_broker, errors_deadletterqueue_topic_name=dlq,
                      errors_deadletterqueue_copy_record_enable="true")
    producer = Producer({"bootstrap.servers": share_broker.bootstrap})
    for i in range(5):
        producer.produce(topic, key=b"key%d" % i, value=b"v%d" % i, partition=0,
                         headers=[("h", b"x")])  # one batch: all acquired together
    assert producer.flush(10) == 0
    c = consumer(share_broker, group, topic, share_acknowledgement_mode="explicit")
    plan = {0: AcknowledgeType.ACCEPT, 1: AcknowledgeType.REJECT, 2: AcknowledgeType.RELEASE,
            3: AcknowledgeType.REJECT, 4: AcknowledgeType.ACCEPT}
    deliveries: dict[int, int] = {}

    def on_message(_, m) -> None:
        deliveries[m.offset()] = m.delivery_count()
        c.acknowledge(m, plan[m.offset()])

    try:
        # 2 is released until its fifth delivery; then the window may move past all five.
        poll_until([c], lambda: deliveries.get(2) == 5, on_message, what="five deliveries of offset 2")
        c.commit_sync()
        wait_for(lambda: share_start(share_broker, group, topic) == 5, timeout=20, what="every record done")
    finally:
        c.close()
    # Kafka's headers, the source's key and value (copy.record.enable), the source partition's
    # dead-letter partition (0 % 2); the source's own headers first (a Strom choice).
    letters = dead_letters(share_broker, dlq)
    assert sorted(letters) == [(1, 1, "Offset rejected by client.", b"key1", b"v1"),
                               (2, 5, "Offset delivery count exceeded the threshold.", b"key2", b"v2"),
                               (3, 1, "Offset rejected by client.", b"key3", b"v3")]
    (m, *_) = read_to_end(share_broker, dlq)
    assert m.headers()[0] == ("h", b"x")
    headers = dict(m.headers())
    assert headers["__dlq.errors.topic"] == topic.encode() and headers["__dlq.errors.group"] == group.encode()
    assert headers["__dlq.errors.partition"] == b"0"
    assert read_to_end(share_broker, dlq, 1) == []
    samples = scrape(share_broker.metrics_url)
    assert metric_value(samples, "strom_share_dead_letter_records_total", group=group, topic=dlq) == 3


def test_dead_letter_configs_and_the_topics_rules(share_broker):
    # Kafka's group config validation, and the defaults described.
    for name, value in (("errors.deadletterqueue.topic.name", "__internal"),
                        ("errors.deadletterqueue.copy.record.enable", "maybe")):
        response = call(share_broker, INCREMENTAL_ALTER_CONFIGS, 1, {"resources": [{
            "resource_type": GROUP_RESOURCE, "resource_name": unique_name("share"),
            "configs": [{"name": name, "config_operation": SET, "value": value}]}], "validate_only": False})
        assert response.responses[0].error_code == INVALID_CONFIG, response
    topic, refused, missing = unique_name("share-dlq-rules"), "dlq." + unique_name("no-opt-in"), "dlq." + unique_name("none")
    tiny = "dlq." + unique_name("tiny")
    create_topic(share_broker.bootstrap, topic, 1)
    create_topic(share_broker.bootstrap, refused, 1)  # without errors.deadletterqueue.group.enable
    group = new_group(share_broker, errors_deadletterqueue_topic_name=refused)
    (described,) = call(share_broker, DESCRIBE_CONFIGS, 4, {"resources": [{
        "resource_type": GROUP_RESOURCE, "resource_name": group, "configuration_keys": None}],
        "include_synonyms": False, "include_documentation": False}).results
    values = {c.name: c.value for c in described.configs}
    assert values["errors.deadletterqueue.topic.name"] == refused
    assert values["errors.deadletterqueue.copy.record.enable"] == "false"
    produce(share_broker, topic, [b"a"])
    c = consumer(share_broker, group, topic, share_acknowledgement_mode="explicit")
    got: list[int] = []

    def reject(_, m) -> None:
        got.append(m.offset())
        c.acknowledge(m, AcknowledgeType.REJECT)

    try:
        # A topic that did not opt in gets nothing: the record is archived without a dead letter.
        poll_until([c], lambda: 0 in got, reject, what="offset 0")
        c.commit_sync()
        wait_for(lambda: share_start(share_broker, group, topic) == 1, timeout=20, what="offset 0 archived")
        # Nor is a missing topic made while errors.deadletterqueue.auto.create.topics.enable is off.
        set_group_configs(share_broker, group, share_auto_offset_reset="earliest",
                          errors_deadletterqueue_topic_name=missing)
        produce(share_broker, topic, [b"b"])
        poll_until([c], lambda: 1 in got, reject, what="offset 1")
        c.commit_sync()
        wait_for(lambda: share_start(share_broker, group, topic) == 2, timeout=20, what="offset 1 archived")
        # A dead letter the topic refuses (larger than its max.message.bytes) is not retried for good.
        create_topic(share_broker.bootstrap, tiny, 1, config={**DLQ_ON, "max.message.bytes": "400"})
        set_group_configs(share_broker, group, share_auto_offset_reset="earliest",
                          errors_deadletterqueue_topic_name=tiny, errors_deadletterqueue_copy_record_enable="true")
        produce(share_broker, topic, [b"x" * 1000])
        poll_until([c], lambda: 2 in got, reject, what="offset 2")
        c.commit_sync()
        wait_for(lambda: share_start(share_broker, group, topic) == 3, timeout=20, what="offset 2 archived")
    finally:
        c.close()
    assert read_to_end(share_broker, refused) == []
    samples = scrape(share_broker.metrics_url)
    assert metric_value(samples, "strom_share_dead_letter_records_dropped_total", group=group, topic=refused) == 1
    assert metric_value(samples, "strom_share_dead_letter_records_dropped_total", group=group, topic=missing) == 1
    assert metric_value(samples, "strom_share_dead_letter_records_dropped_total", group=group, topic=tiny) == 1
    assert read_to_end(share_broker, tiny) == []
    (t,) = call(share_broker, METADATA, 9, {"topics": [{"name": missing}], "allow_auto_topic_creation": False,
                                             "include_topic_authorized_operations": False}).topics
    assert t.error_code == 3  # UNKNOWN_TOPIC_OR_PARTITION


def test_kill_9_keeps_acknowledged_records_done_and_redelivers_the_rest(share_broker):
    """Last in the module: it kills the broker. The group's members are the restarted broker's
    (from `__consumer_offsets`), with their epochs. Accepted and rejected records are never
    delivered again; acquired but unacknowledged ones are, with the delivery count of the
    last state write (as in Kafka, an acquisition alone is not written: records acquired after
    it come back as never delivered)."""
    topic = unique_name("share-crash")
    create_topic(share_broker.bootstrap, topic, 1)
    group = new_group(share_broker)
    produce(share_broker, topic, [b"k%d" % i for i in range(20)], one_batch_each=False)
    c = consumer(share_broker, group, topic, share_acknowledgement_mode="explicit")
    got: list[int] = []
    messages = []
    poll_until([c], lambda: len(got) >= 20, lambda _, m: (got.append(m.offset()), messages.append(m)))
    for m in messages:
        if m.offset() < 10:
            c.acknowledge(m, AcknowledgeType.ACCEPT)
        elif m.offset() < 12:
            c.acknowledge(m, AcknowledgeType.REJECT)
    c.commit_sync()  # 0-11 done, 12-19 written as delivered once and still acquired
    # Delayed delivery across the crash: a record whose not-before is after the restart, and
    # one released under share.release.delay.ms just before the kill.
    delayed_topic = unique_name("share-crash-delayed")
    create_topic(share_broker.bootstrap, delayed_topic, 1)
    delayed_group = new_group(share_broker, share_release_delay_ms="2000")
    not_before = _ms() + 3500
    produce_with_headers(share_broker, delayed_topic, [_not_before(b"later", not_before), (b"retry-me", [])])
    e = consumer(share_broker, delayed_group, delayed_topic, share_acknowledgement_mode="explicit")
    first: list = []
    poll_until([e], lambda: bool(first), lambda _, m: first.append(m))
    assert [m.value() for m in first] == [b"retry-me"]
    released_at = _ms()
    e.acknowledge(first[0], AcknowledgeType.RELEASE)
    e.commit_sync()
    produce(share_broker, topic, [b"late%d" % i for i in range(3)], one_batch_each=False)  # 20-22
    d = consumer(share_broker, group, topic, share_acknowledgement_mode="explicit")
    late: list[int] = []
    poll_until([d], lambda: len(late) >= 3, lambda _, m: late.append(m.offset()))
    assert sorted(late) == [20, 21, 22]  # acquired by d, nothing acknowledged: nothing written
    gone = consumer(share_broker, group, topic)  # joins and leaves: tombstones for it
    deadline = time.monotonic() + 30
    while len(_members(share_broker, group)[1]) < 3:
        assert time.monotonic() < deadline, "the third member did not join"
        gone.poll(0.1)
    gone.close()
    members = _members(share_broker, group)
    assert len(members[1]) == 2, members
    # Dead letters: another group rejects 4 records; once their dead letters are in the topic
    # the broker is killed, their archiving (persisted a moment later) most likely not yet
    # written: the restarted broker must find them in the topic and not write them again.
    rejected_topic, dlq = unique_name("share-crash-rejected"), "dlq." + unique_name("crash")
    create_topic(share_broker.bootstrap, rejected_topic, 1)
    create_topic(share_broker.bootstrap, dlq, 1, config=DLQ_ON)
    rejecting = new_group(share_broker, errors_deadletterqueue_topic_name=dlq)
    produce(share_broker, rejected_topic, [b"bad%d" % i for i in range(4)], one_batch_each=False)
    f = consumer(share_broker, rejecting, rejected_topic, share_acknowledgement_mode="explicit")
    bad: list[int] = []
    poll_until([f], lambda: len(bad) >= 4, lambda _, m: (bad.append(m.offset()), f.acknowledge(m, AcknowledgeType.REJECT)))
    f.commit_sync()
    wait_for(lambda: len(dead_letters(share_broker, dlq)) == 4, timeout=20, what="four dead letters")
    share_broker.kill()
    share_broker.restart()
    wait_for(lambda: _serves(share_broker), timeout=30, what="the restarted broker")
    # The membership came back from __consumer_offsets: the same group epoch (a member that
    # rejoined would have moved it), members and assignments; a member's epoch may have caught
    # up with the group's by a heartbeat since.
    epoch, now = _members(share_broker, group)
    assert epoch == members[0] and now.keys() == members[1].keys(), (members, epoch, now)
    for member_id, (member_epoch, assigned) in now.items():
        assert member_epoch in (members[1][member_id][0], epoch) and assigned == members[1][member_id][1]
    produce(share_broker, topic, [b"sentinel"])  # offset 23
    after = consumer(share_broker, group, topic)
    restarted_at = _ms()
    e2 = consumer(share_broker, delayed_group, delayed_topic)
    delayed: dict[bytes, tuple[int, int]] = {}
    again: list[tuple[int, int]] = []
    try:
        poll_until([after], lambda: 23 in [o for o, _ in again],
                   lambda _, m: again.append((m.offset(), m.delivery_count())), timeout=60)
        assert sorted(again) == [(o, 2) for o in range(12, 20)] + [(o, 1) for o in range(20, 24)]
        produce(share_broker, rejected_topic, [b"good"])  # offset 4: fetched once 0-3 are settled
        f2 = consumer(share_broker, rejecting, rejected_topic, share_acknowledgement_mode="explicit")
        good: list[int] = []
        poll_until([f2], lambda: 4 in good, lambda _, m: (good.append(m.offset()), f2.acknowledge(m)))
        assert good == [4]
        f2.commit_sync()
        f2.close()
        wait_for(lambda: share_start(share_broker, rejecting, rejected_topic) == 5, timeout=20, what="0-4 done")
        assert [(o, n) for o, n, *_ in dead_letters(share_broker, dlq)] == [(o, 1) for o in range(4)]  # each once
        poll_until([e2], lambda: len(delayed) >= 2,
                   lambda _, m: delayed.setdefault(m.value(), (m.delivery_count(), _ms())), timeout=60)
        # Never early after the crash: the header is read from the log again; the released
        # record's not-before was persisted with the release.
        assert delayed[b"later"][0] == 1 and delayed[b"later"][1] >= not_before, (restarted_at, delayed)
        assert delayed[b"retry-me"][0] == 2 and delayed[b"retry-me"][1] >= released_at + 2000, (restarted_at, delayed)
        print(f"delayed after restart: not-before in {not_before - restarted_at} ms, release delay to "
              f"{released_at + 2000 - restarted_at} ms")
    finally:
        f.close()
        e.close()
        e2.close()
        after.close()
        c.close()
        d.close()


def _members(broker: BrokerProcess, group: str) -> tuple[int, dict]:
    (g,) = call(broker, SHARE_GROUP_DESCRIBE, 1, {"group_ids": [group], "include_authorized_operations": False}).groups
    assert g.error_code == 0, g
    return g.group_epoch, {m.member_id: (m.member_epoch, [(t.topic_id, sorted(t.partitions))
                                                          for t in m.assignment.topic_partitions]) for m in g.members}


def _serves(broker: BrokerProcess) -> bool:
    try:
        call(broker, 18, 0, {})
        return True
    except OSError:
        return False


# --- KIP-1240's group configs (Kafka 4.3) and share.auto.offset.reset=by_duration ------------------
def describe_group_configs(broker: BrokerProcess, group: str) -> dict[str, tuple]:
    (result,) = call(broker, DESCRIBE_CONFIGS, 4, {
        "resources": [{"resource_type": GROUP_RESOURCE, "resource_name": group, "configuration_keys": None}],
        "include_synonyms": False, "include_documentation": True}).results
    return {c.name: (c.value, c.config_source, c.config_type, c.documentation) for c in result.configs}


def connect(broker: BrokerProcess) -> Connection:
    """One connection for a share session's requests: closing it ends the session."""
    host, port = broker.bootstrap.split(":")
    return Connection(host, int(port))


def fetch_on(conn: Connection, group: str, member: str, epoch: int, topic_id: uuid.UUID,
             batches: list[dict] | None = None) -> Any:
    """One partition's answer to a ShareFetch of partition 0 on `conn`, checked error-free."""
    answer = conn.call(78, 1, {
        "group_id": group, "member_id": member, "share_session_epoch": epoch, "max_wait_ms": 0, "min_bytes": 1,
        "max_bytes": 1 << 20, "max_records": 5000, "batch_size": 5000, "forgotten_topics_data": [],
        "topics": [{"topic_id": topic_id, "partitions": [{"partition_index": 0,
                                                          "acknowledgement_batches": batches or []}]}]})
    assert answer.error_code == 0, answer
    (p,) = answer.responses[0].partitions
    assert (p.error_code, p.acknowledge_error_code) == (0, 0), p
    return p


def test_kip_1240_group_configs_are_bounded_by_the_broker_and_described(share_broker):
    group = new_group(share_broker, share_delivery_count_limit="3", share_partition_max_record_locks="150",
                      share_assignment_interval_ms="2000")
    described = describe_group_configs(share_broker, group)
    assert described["share.delivery.count.limit"][:3] == ("3", 8, 3)  # GROUP_CONFIG, INT
    assert described["share.partition.max.record.locks"][:3] == ("150", 8, 3)
    assert described["share.assignment.interval.ms"][:3] == ("2000", 8, 3)
    assert described["consumer.assignment.interval.ms"][:3] == ("1000", 5, 3)  # DEFAULT_CONFIG
    assert described["share.auto.offset.reset"][:3] == ("earliest", 8, 2)  # STRING
    assert all(doc for *_, doc in described.values())

    def refused(name: str, value: str) -> str:
        answer = call(share_broker, INCREMENTAL_ALTER_CONFIGS, 1, {"resources": [{
            "resource_type": GROUP_RESOURCE, "resource_name": group,
            "configs": [{"name": name, "config_operation": SET, "value": value}]}], "validate_only": False})
        (r,) = answer.responses
        assert r.error_code == INVALID_CONFIG, (name, value, r)
        return r.error_message

    # Kafka 4.3's messages; the bounds are the broker's group.share/consumer.min/max.* defaults.
    assert refused("share.delivery.count.limit", "11") == "share.delivery.count.limit must be in the range 2 to 10 inclusive."
    assert refused("share.delivery.count.limit", "1").startswith("share.delivery.count.limit must be in the range")
    assert refused("share.partition.max.record.locks", "4001") == \
        "share.partition.max.record.locks must be in the range 100 to 4000 inclusive."
    assert refused("share.assignment.interval.ms", "15001") == \
        "share.assignment.interval.ms must be in the range 0 to 15000 inclusive."
    assert "Not a number of type INT" in refused("consumer.assignment.interval.ms", "soon")
    for bad in ("by_duration:-PT1H", "by_duration:PT-1H", "by_duration:1H", "by_duration:", "by_duration:PT",
                "by_duration:PT" + "9" * 40 + "S", "yesterday"):
        assert "by_duration:<PnDTnHnMn.nS.>" in refused("share.auto.offset.reset", bad)
    assert describe_group_configs(share_broker, group)["share.delivery.count.limit"][0] == "3"  # unchanged


def test_a_group_delivery_count_limit_of_2_archives_after_two_deliveries(share_broker):
    """share.delivery.count.limit=2 on a broker whose default is 5: a record released twice is
    done (the window moves past it); with a dead-letter topic it is a dead letter of count 2."""
    topic, dlq = unique_name("share-limit"), "dlq." + unique_name("share-limit")
    create_topic(share_broker.bootstrap, topic, 1)
    create_topic(share_broker.bootstrap, dlq, 1, config=DLQ_ON)
    produce(share_broker, topic, [b"a", b"b"])
    tid = topic_id_of(share_broker, topic)
    plain = new_group(share_broker, share_delivery_count_limit="2")
    lettered = new_group(share_broker, share_delivery_count_limit="2", errors_deadletterqueue_topic_name=dlq)
    for group in (plain, lettered):
        member = join(share_broker, group, topic)
        counts = []
        with connect(share_broker) as conn:
            for epoch in range(3):  # each fetch releases what the one before acquired
                p = fetch_on(conn, group, member, epoch, tid, [ack(0, 0, 2)] if epoch else [])
                counts.append([(r.first_offset, r.delivery_count) for r in p.acquired_records if r.first_offset == 0])
        assert counts == [[(0, 1)], [(0, 2)], []]  # offset 0 is done after its second delivery
        wait_for(lambda g=group: share_start(share_broker, g, topic) == 1, timeout=20, what="offset 0 archived")
    assert [(o, n) for o, n, *_ in dead_letters(share_broker, dlq)] == [(0, 2)]


def test_a_group_max_record_locks_bounds_what_it_acquires(share_broker):
    """share.partition.max.record.locks=100 (the broker's is 2000): a member acquires 100 of
    150 single-record batches, nothing more until some are done; then more."""
    topic = unique_name("share-locks")
    create_topic(share_broker.bootstrap, topic, 1)
    produce(share_broker, topic, [b"r%d" % i for i in range(150)])
    tid = topic_id_of(share_broker, topic)
    group = new_group(share_broker, share_partition_max_record_locks="100")
    member = join(share_broker, group, topic)
    with connect(share_broker) as conn:
        def acquired(epoch: int, batches: list[dict] | None = None) -> int:
            p = fetch_on(conn, group, member, epoch, tid, batches)
            return sum(r.last_offset - r.first_offset + 1 for r in p.acquired_records)

        assert acquired(0) == 100
        assert acquired(1) == 0  # the window is full
        assert acquired(2, [ack(0, 29)]) == 30  # 30 accepted: 30 more
        set_group_configs(share_broker, group, share_auto_offset_reset="earliest",
                          share_partition_max_record_locks="200")  # dynamic: the rest fits now
        assert acquired(3) == 20


def test_by_duration_starts_at_the_first_record_that_recent(share_broker):
    """share.auto.offset.reset=by_duration:PT1H starts a share partition at the first record
    whose timestamp (CreateTime) is within the last hour: not the older ones before it."""
    topic = unique_name("share-duration")
    create_topic(share_broker.bootstrap, topic, 1)
    now = _ms()
    producer = Producer({"bootstrap.servers": share_broker.bootstrap, "linger.ms": 0})
    for i, age_ms in enumerate([3 * 3_600_000, 2 * 3_600_000, 1_800_000, 60_000]):
        producer.produce(topic, value=b"t%d" % i, partition=0, timestamp=now - age_ms)
        producer.flush()
    assert producer.flush(10) == 0
    recent = new_group(share_broker)
    set_group_configs(share_broker, recent, share_auto_offset_reset="by_duration:PT1H")
    future = new_group(share_broker)  # nothing that recent: the log end
    set_group_configs(share_broker, future, share_auto_offset_reset="by_duration:PT0S")
    tid = topic_id_of(share_broker, topic)
    for group, first in ((recent, 2), (future, None)):
        member = join(share_broker, group, topic)
        with connect(share_broker) as conn:
            p = fetch_on(conn, group, member, 0, tid)
        assert [r.first_offset for r in p.acquired_records][:1] == ([] if first is None else [first])
        assert share_start(share_broker, group, topic) == (first if first is not None else 4)
