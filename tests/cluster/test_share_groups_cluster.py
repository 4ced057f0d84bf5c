"""KIP-932 share groups on three real brokers, with confluent-kafka's ShareConsumer: share
partitions live on each data partition's leader, their state with the share coordinator (the
leader of the `__share_group_state` partition that owns the key, RF 3, min ISR 2), reached
over the share-state RPCs when that is another broker. Group ids are picked so that the share
coordinator is another broker than the data leader, and, where a broker is killed, so that
the group coordinator survives it.

- records of partitions led by different brokers are delivered exactly once across members;
- kill -9 of a data partition's leader: nothing accepted comes again, everything acquired but
  not acknowledged comes again from the new leader with its delivery count + 1; the records
  rejected just before the kill are in the group's dead-letter topic (made on first use) once;
- kill -9 of the share coordinator, which is also the group coordinator: the state is the new
  coordinator's, and writes go on; the members are the new group coordinator's too, with their
  member ids, epochs and assignments (they do not rejoin); dead letters in flight at the kill
  are in the topic once;
- a group config in the store whose change notification has not reached the data leader yet
  decides where the share partition starts: the leader reads the store when it initializes the
  partition (ZooKeeper); a KRaft broker has a group config once its metadata log has it.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable

import pytest
from confluent_kafka import (
    AcknowledgeType,
    Producer,
    ShareConsumer,
)

from strom.config.repository import sanitize
from strom.coordinator import partition_for
from strom.coordinator.share.state_store import SharePartitionKey
from strom.testing import KRAFT, Cluster, RawClient, consume_all, unique_name

from .conftest import CLUSTER_OVERRIDES
from .test_cluster import create, live_brokers, metadata, partition_view

CLUSTER_MODES = ("zookeeper", "kraft")

FIND_COORDINATOR, INCREMENTAL_ALTER_CONFIGS, DESCRIBE_SHARE_GROUP_OFFSETS = 10, 44, 90
DESCRIBE_CONFIGS, SHARE_GROUP_HEARTBEAT, SHARE_GROUP_DESCRIBE, SHARE_FETCH = 32, 76, 77, 78
COORDINATOR_NOT_AVAILABLE = 15
GROUP_KEY, SHARE_KEY = 0, 2
STATE_TOPIC, OFFSETS_TOPIC = "__share_group_state", "__consumer_offsets"
STATE_PARTITIONS = 3
OVERRIDES = {**CLUSTER_OVERRIDES, "share.coordinator.state.topic.num.partitions": str(STATE_PARTITIONS),
             "group.share.min.record.lock.duration.ms": "1000",
             "errors.deadletterqueue.auto.create.topics.enable": "true"}


@pytest.fixture
def cluster(zookeeper):
    with Cluster(3, zookeeper=zookeeper, overrides=OVERRIDES) as c:
        yield c


def any_broker(cluster: Cluster):
    return live_brokers(cluster)[0]


def topic_id(cluster: Cluster, topic: str):
    (t,) = [t for t in metadata(any_broker(cluster), [topic]).topics if t.name == topic]
    return t.topic_id


def ensure_state_topic(cluster: Cluster) -> dict[int, int]:
    """`__share_group_state` made (FindCoordinator with a share key makes it, as the first
    share fetch would) and known everywhere: its partition -> leader."""
    with RawClient(any_broker(cluster)) as client:
        body = client.call(FIND_COORDINATOR, 6, {"key_type": SHARE_KEY,
                                                 "coordinator_keys": ["g:AAAAAAAAAAAAAAAAAAAAAA:0"]})
    assert body.coordinators[0].error_code == 0, body
    cluster.wait_for(lambda: all(len(partition_view(b, STATE_TOPIC)) == STATE_PARTITIONS
                                 for b in live_brokers(cluster)), 30, "the state topic on every broker")
    return {p: v[0] for p, v in partition_view(any_broker(cluster), STATE_TOPIC).items()}


def share_coordinator(cluster: Cluster, group: str, tid, partition: int) -> int:
    """The broker FindCoordinator names for the share partition (checked against the state
    topic's leader that owns the key)."""
    key = SharePartitionKey(group, tid, partition).coordinator_key

    def agreed() -> int | None:
        # Two requests: metadata moving between them (a failover) is asked again.
        with RawClient(any_broker(cluster)) as client:
            body = client.call(FIND_COORDINATOR, 6, {"key_type": SHARE_KEY, "coordinator_keys": [key]})
        (found,) = body.coordinators
        assert found.error_code in (0, COORDINATOR_NOT_AVAILABLE), found
        leaders = {p: v[0] for p, v in partition_view(any_broker(cluster), STATE_TOPIC).items()}
        return found.node_id if found.error_code == 0 and found.node_id == leaders[
            partition_for(key, STATE_PARTITIONS)] else None

    return cluster.wait_for(agreed, 30, "FindCoordinator naming the state partition's leader")


class Placement:
    """Where a group's coordinators are, computed as FindCoordinator computes it, from the
    internal topics' leaders now (so that many candidate group ids cost no request each)."""

    def __init__(self, cluster: Cluster, tid) -> None:
        self.tid = tid
        self.state = ensure_state_topic(cluster)
        group_coordinator(cluster, "any")  # makes __consumer_offsets
        cluster.wait_for(lambda: len(partition_view(any_broker(cluster), OFFSETS_TOPIC)) == 6, 30, "offsets topic")
        self.offsets = {p: v[0] for p, v in partition_view(any_broker(cluster), OFFSETS_TOPIC).items()}

    def share(self, group: str, partition: int) -> int:
        key = SharePartitionKey(group, self.tid, partition).coordinator_key
        return self.state[partition_for(key, STATE_PARTITIONS)]

    def group(self, group: str) -> int:
        return self.offsets[partition_for(group, len(self.offsets))]


def group_coordinator(cluster: Cluster, group: str) -> int:
    with RawClient(any_broker(cluster)) as client:
        body = client.call(FIND_COORDINATOR, 4, {"key_type": GROUP_KEY, "coordinator_keys": [group]})
    assert body.coordinators[0].error_code == 0, body
    return body.coordinators[0].node_id


def pick_group(cluster: Cluster, ok: Callable[[str], bool]) -> str:
    for _ in range(200):
        group = unique_name("share")
        if ok(group):
            return group
    raise AssertionError("no group id with the wanted coordinators")


def set_earliest(cluster: Cluster, group: str, **configs: str) -> None:
    """share.auto.offset.reset=earliest, and `configs` (underscores for dots)."""
    configs = {"share.auto.offset.reset": "earliest", **{k.replace("_", "."): v for k, v in configs.items()}}
    with RawClient(any_broker(cluster)) as client:
        response = client.call(INCREMENTAL_ALTER_CONFIGS, 1, {"resources": [{
            "resource_type": 32, "resource_name": group, "configs": [
                {"name": k, "config_operation": 0, "value": v} for k, v in configs.items()]}],
            "validate_only": False})
    assert [r.error_code for r in response.responses] == [0], response


def dead_letter_offsets(cluster: Cluster, topic: str) -> list[int]:
    """The source offsets of the dead letters in partition 0 of `topic`, in log order, read up to
    its high watermark."""
    return [int(dict(m.headers())["__dlq.errors.offset"])
            for m in consume_all(cluster.bootstrap, topic, [0], allow_empty=True, timeout=30)]


def start_offsets(cluster: Cluster, group: str, topic: str, partitions: list[int], *,
                  field: str = "start_offset") -> dict[int, int]:
    """DescribeShareGroupOffsets at the group coordinator: the start offsets the share
    coordinators hold (or, v1, `field="lag"`: KIP-1226's lag, from each leader's high watermark)."""
    broker = cluster.brokers[group_coordinator(cluster, group)]
    with RawClient(broker) as client:
        (g,) = client.call(DESCRIBE_SHARE_GROUP_OFFSETS, 0 if field == "start_offset" else 1, {"groups": [{
            "group_id": group, "topics": [{"topic_name": topic, "partitions": partitions}]}]}).groups
    if g.error_code != 0:
        return {}
    return {p.partition_index: getattr(p, field) for t in g.topics for p in t.partitions if p.error_code == 0}


def describe_members(cluster: Cluster, group: str) -> tuple[int, dict[str, tuple[int, list]]]:
    """ShareGroupDescribe at the group coordinator: the group epoch, and each member's epoch and
    assigned partitions."""
    with RawClient(cluster.brokers[group_coordinator(cluster, group)]) as client:
        (g,) = client.call(SHARE_GROUP_DESCRIBE, 1, {"group_ids": [group],
                                                     "include_authorized_operations": False}).groups
    assert g.error_code == 0, g
    return g.group_epoch, {m.member_id: (m.member_epoch, [(t.topic_id, sorted(t.partitions))
                                                          for t in m.assignment.topic_partitions])
                           for m in g.members}


def produce(cluster: Cluster, topic: str, values: list[bytes], partitions: int = 1) -> None:
    producer = Producer({"bootstrap.servers": cluster.bootstrap, "acks": "all", "linger.ms": 5})
    for i, v in enumerate(values):
        producer.produce(topic, value=v, partition=i % partitions)
    assert producer.flush(30) == 0


def share_consumer(cluster: Cluster, group: str, topic: str, **conf: str) -> ShareConsumer:
    c = ShareConsumer({"bootstrap.servers": cluster.bootstrap, "group.id": group,
                       **{k.replace("_", "."): v for k, v in conf.items()}})
    c.subscribe([topic])
    return c


def poll_until(consumers: list[ShareConsumer], done: Callable[[], bool], on_message, timeout: float = 60.0,
               what: str = "records") -> None:
    deadline = time.monotonic() + timeout
    while not done():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        for i, c in enumerate(consumers):
            for m in c.poll(0.2):
                if m.error() is None:
                    on_message(i, m)


def test_partitions_led_by_different_brokers_are_delivered_once(cluster, zookeeper):
    topic = unique_name("share-spread")
    create(cluster, topic, 3, 3, configs={"min.insync.replicas": "2"})
    leaders = {p: v[0] for p, v in partition_view(any_broker(cluster), topic).items()}
    assert len(set(leaders.values())) == 3  # one partition led by each broker
    where = Placement(cluster, topic_id(cluster, topic))
    # At least one share partition whose state another broker coordinates (almost any group).
    group = pick_group(cluster, lambda g: any(where.share(g, p) != leaders[p] for p in leaders))
    assert any(share_coordinator(cluster, group, where.tid, p) != leaders[p] for p in leaders)
    set_earliest(cluster, group)
    values = [b"v%04d" % i for i in range(300)]
    produce(cluster, topic, values, partitions=3)
    consumers = [share_consumer(cluster, group, topic, max_poll_records="20") for _ in range(3)]
    seen: list[bytes] = []
    try:
        poll_until(consumers, lambda: len(seen) >= len(values), lambda _, m: seen.append(m.value()))
        # Every record is accepted (the next poll acknowledges): the share coordinators' start
        # offsets reach each partition's end, and nothing came twice meanwhile.
        poll_until(consumers, lambda: start_offsets(cluster, group, topic, [0, 1, 2]) == {0: 100, 1: 100, 2: 100},
                   lambda _, m: seen.append(m.value()), what="every record accepted")
        assert sorted(seen) == values
    finally:
        for c in consumers:
            c.close()
    # KIP-1226's lag, at the group coordinator: each partition's high watermark from its leader
    # (ListOffsets to the two it does not lead), less the start offset and what is done.
    assert start_offsets(cluster, group, topic, [0, 1, 2], field="lag") == {0: 0, 1: 0, 2: 0}
    produce(cluster, topic, [b"late"] * 6, partitions=3)
    assert start_offsets(cluster, group, topic, [0, 1, 2], field="lag") == {0: 2, 1: 2, 2: 2}
    assert first_fetch_after_a_config_set_elsewhere(cluster, zookeeper == KRAFT, topic, where.tid,
                                                    leaders[0])[:1] == [(0, 1)]  # from the log start


def first_fetch_after_a_config_set_elsewhere(cluster: Cluster, kraft: bool, topic: str, tid, leader: int) -> list:
    """A member of a new group joins, the group is set to `earliest`, and the member fetches
    from the leader of partition 0 at once: what it acquires."""
    group = unique_name("share-config")
    member = str(uuid.uuid4())
    with RawClient(cluster.brokers[group_coordinator(cluster, group)]) as client:
        joined = client.call(SHARE_GROUP_HEARTBEAT, 1, {"group_id": group, "member_id": member, "member_epoch": 0,
                                                        "rack_id": None, "subscribed_topic_names": [topic]})
    assert joined.error_code == 0, joined
    with RawClient(cluster.brokers[leader]) as at_leader:
        if kraft:  # set at another broker; the leader has it once its metadata log has it
            with RawClient(cluster.brokers[next(b for b in cluster.brokers if b != leader)]) as at_other:
                response = at_other.call(INCREMENTAL_ALTER_CONFIGS, 1, {"validate_only": False, "resources": [{
                    "resource_type": 32, "resource_name": group, "configs": [
                        {"name": "share.auto.offset.reset", "config_operation": 0, "value": "earliest"}]}]})
            assert response.responses[0].error_code == 0, response

            def followed() -> bool:
                (r,) = at_leader.call(DESCRIBE_CONFIGS, 4, {"resources": [{
                    "resource_type": 32, "resource_name": group, "configuration_keys": ["share.auto.offset.reset"]}],
                    "include_synonyms": False, "include_documentation": False}).results
                return [c.value for c in r.configs] == ["earliest"]

            cluster.wait_for(followed, 30, "the group config at the leader")
        else:  # in the store, its /config/changes notification not yet at the leader (as when it comes late)
            config = {"version": 1, "config": {"share.auto.offset.reset": "earliest"}}
            cluster.zk().create(f"/config/groups/{sanitize(group)}", json.dumps(config).encode(), makepath=True)
        fetched = at_leader.call(SHARE_FETCH, 1, {
            "group_id": group, "member_id": member, "share_session_epoch": 0, "max_wait_ms": 0, "min_bytes": 1,
            "max_bytes": 1 << 20, "max_records": 10, "batch_size": 10, "forgotten_topics_data": [],
            "topics": [{"topic_id": tid, "partitions": [{"partition_index": 0, "acknowledgement_batches": []}]}]})
    (p,) = fetched.responses[0].partitions
    assert p.error_code == 0, p
    return [(r.first_offset, r.delivery_count) for r in p.acquired_records]


def test_kill_9_of_a_data_leader_redelivers_only_what_was_not_acknowledged(cluster):
    topic = unique_name("share-leader-crash")
    controller = cluster.controller_id()
    victim = next(b for b in cluster.brokers if b != controller)
    others = [b for b in cluster.brokers if b != victim]
    create(cluster, topic, assignment=[[victim, *others]], configs={"min.insync.replicas": "2"})
    where = Placement(cluster, topic_id(cluster, topic))
    group = pick_group(cluster, lambda g: where.share(g, 0) != victim and where.group(g) != victim)
    assert share_coordinator(cluster, group, where.tid, 0) != victim and group_coordinator(cluster, group) != victim
    dlq = "dlq." + unique_name("leader-crash")  # made by the data leader on first use
    set_earliest(cluster, group, errors_deadletterqueue_topic_name=dlq)
    produce(cluster, topic, [b"k%d" % i for i in range(20)])
    c = share_consumer(cluster, group, topic, share_acknowledgement_mode="explicit")
    messages = []
    poll_until([c], lambda: len(messages) >= 20, lambda _, m: messages.append(m))
    assert sorted((m.offset(), m.delivery_count()) for m in messages) == [(o, 1) for o in range(20)]
    for m in messages:
        if m.offset() < 10:
            c.acknowledge(m, AcknowledgeType.ACCEPT)
        elif m.offset() < 12:
            c.acknowledge(m, AcknowledgeType.REJECT)
    # 0-9 done and 10-11 dead letters (written to the share coordinator); 12-19 acquired when the
    # leader dies, the dead letters of 10-11 in flight or just written, their archiving not yet
    # persisted (or just): the new leader writes what is not in the topic.
    c.commit_sync()
    assert start_offsets(cluster, group, topic, [0])[0] in (10, 12)
    cluster.brokers[victim].kill()
    cluster.wait_for(lambda: partition_view(any_broker(cluster), topic).get(0, (-1,))[0] in others, 30,
                     "a new leader")
    produce(cluster, topic, [b"sentinel"])  # offset 20
    after = share_consumer(cluster, group, topic)
    again: list[tuple[int, int]] = []
    try:
        poll_until([after], lambda: 20 in [o for o, _ in again],
                   lambda _, m: again.append((m.offset(), m.delivery_count())))
        assert sorted(again) == [(o, 2) for o in range(12, 20)] + [(20, 1)]
        cluster.wait_for(lambda: start_offsets(cluster, group, topic, [0]).get(0, 0) >= 12, 30, "10-11 archived")
        assert dead_letter_offsets(cluster, dlq) == [10, 11]  # once each
    finally:
        after.close()
        c.close()


def test_kill_9_of_the_share_coordinator_keeps_the_state(cluster):
    topic = unique_name("share-coordinator-crash")
    controller = cluster.controller_id()
    leader = next(b for b in cluster.brokers if b != controller)
    create(cluster, topic, assignment=[[leader, *[b for b in cluster.brokers if b != leader]]],
           configs={"min.insync.replicas": "2"})
    where = Placement(cluster, topic_id(cluster, topic))
    tid = where.tid
    # The share coordinator is also the group coordinator, and neither the data leader (the
    # share partition stays where it is) nor the controller (whose successor would not take
    # the dead broker out of the data partition's ISR at once).
    group = pick_group(cluster, lambda g: where.share(g, 0) not in (leader, controller)
                       and where.group(g) == where.share(g, 0))
    victim = share_coordinator(cluster, group, tid, 0)
    assert victim not in (leader, controller) and group_coordinator(cluster, group) == victim
    # A dead-letter topic made beforehand, away from the victim: what the kill may cut here is
    # the state writes around the dead letters, not the topic itself.
    dlq = "dlq." + unique_name("coordinator-crash")
    create(cluster, dlq, assignment=[[leader, controller]], configs={"errors.deadletterqueue.group.enable": "true"})
    set_earliest(cluster, group, errors_deadletterqueue_topic_name=dlq)
    produce(cluster, topic, [b"c%d" % i for i in range(20)])
    c = share_consumer(cluster, group, topic, share_acknowledgement_mode="explicit")
    messages = []
    poll_until([c], lambda: len(messages) >= 20, lambda _, m: messages.append(m))
    for m in messages[:10]:
        c.acknowledge(m, AcknowledgeType.ACCEPT)
    c.commit_sync()
    assert start_offsets(cluster, group, topic, [0]) == {0: 10}
    for m in messages[10:12]:
        c.acknowledge(m, AcknowledgeType.REJECT)
    c.commit_sync()  # pending dead letters durable; their writing and archiving go on through the kill
    group_epoch, members = describe_members(cluster, group)
    assert len(members) == 1 and group_epoch >= 1, members
    ((member_id, (member_epoch, assigned)),) = members.items()
    assert member_epoch == group_epoch and assigned == [(tid, [0])]
    cluster.brokers[victim].kill()
    cluster.wait_for(lambda: share_coordinator(cluster, group, tid, 0) != victim, 30, "a new share coordinator")
    cluster.wait_for(lambda: group_coordinator(cluster, group) != victim, 30, "a new group coordinator")
    # The membership is the new group coordinator's, from __consumer_offsets: the member's
    # heartbeat, with its id and epoch, is answered as before (no UNKNOWN_MEMBER_ID, no rejoin).
    assert describe_members(cluster, group) == (group_epoch, members)
    with RawClient(cluster.brokers[group_coordinator(cluster, group)]) as client:
        beat = client.call(SHARE_GROUP_HEARTBEAT, 1, {"group_id": group, "member_id": member_id,
                                                      "member_epoch": member_epoch, "rack_id": None,
                                                      "subscribed_topic_names": None})
    assert (beat.error_code, beat.member_epoch) == (0, member_epoch), beat
    # The state is the new coordinator's: what was accepted stays done, the dead letters are
    # archived once written, and writes go on there.
    cluster.wait_for(lambda: start_offsets(cluster, group, topic, [0]) == {0: 12}, 30, "10-11 archived")
    assert dead_letter_offsets(cluster, dlq) == [10, 11]
    for m in messages[12:15]:
        c.acknowledge(m, AcknowledgeType.ACCEPT)
    c.commit_sync()
    assert start_offsets(cluster, group, topic, [0]) == {0: 15}
    assert describe_members(cluster, group) == (group_epoch, members)  # the client did not rejoin
    c.close()  # 15-19 go back to the group
    produce(cluster, topic, [b"sentinel"])  # offset 20
    after = share_consumer(cluster, group, topic)
    again: list[tuple[int, int]] = []
    try:
        poll_until([after], lambda: 20 in [o for o, _ in again],
                   lambda _, m: again.append((m.offset(), m.delivery_count())))
        assert sorted(again) == [(o, 2) for o in range(15, 20)] + [(20, 1)]
    finally:
        after.close()
