"""A `__consumer_offsets` partition taken over on election is replayed off the event loop: while
a long one loads, its groups are answered COORDINATOR_LOAD_IN_PROGRESS and the new leader goes
on answering Produce; once loaded, every committed offset is there."""

from __future__ import annotations

import signal

import pytest

from strom.protocol.errors import ErrorCode
from strom.protocol.records import build_batch
from strom.testing import RawClient, unique_name

from .test_cluster import create, live_brokers

pytestmark = pytest.mark.timeout(120)

PRODUCE, OFFSET_COMMIT, OFFSET_FETCH, FIND_COORDINATOR = 0, 8, 9, 10
PARTITIONS, COMMITS = 250, 200  # 50,000 offset records in the group's partition


def coordinator_of(broker, group: str) -> int | None:
    with RawClient(broker) as client:
        body = client.call(FIND_COORDINATOR, 4, {"key_type": 0, "coordinator_keys": [group]})
    return body.coordinators[0].node_id if body.coordinators[0].error_code == 0 else None


def fetch(client: RawClient, group: str, topic: str):
    body = client.call(OFFSET_FETCH, 8, {"require_stable": False, "groups": [
        {"group_id": group, "topics": [{"name": topic, "partition_indexes": list(range(PARTITIONS))}]}]})
    (g,) = body.groups
    return g.error_code, {p.partition_index: p.committed_offset for t in g.topics for p in t.partitions}


def test_a_long_offsets_partition_loads_while_produce_is_answered(cluster):
    group, offsets_of, data = unique_name("load"), unique_name("committed"), unique_name("data")
    old = cluster.wait_for(lambda: coordinator_of(live_brokers(cluster)[0], group), 30, "the group's coordinator")
    other = next(b for i, b in cluster.brokers.items() if i != old)
    create(cluster, offsets_of, PARTITIONS, 1)
    ids = sorted(cluster.brokers)
    create(cluster, data, assignment=[[b] for b in ids])  # partition i led by broker ids[i]
    with RawClient(cluster.brokers[old]) as client:
        for n in range(COMMITS):
            body = client.call(OFFSET_COMMIT, 8, {
                "group_id": group, "generation_id_or_member_epoch": -1, "member_id": "",
                "group_instance_id": None, "topics": [{"name": offsets_of, "partitions": [
                    {"partition_index": p, "committed_offset": n * 1000 + p, "committed_leader_epoch": -1,
                     "committed_metadata": None} for p in range(PARTITIONS)]}]})
            assert {p.error_code for t in body.topics for p in t.partitions} == {ErrorCode.NONE}

    # SIGTERM, a controlled shutdown: a follower of the partition leads it at once (not waited
    # for here: the new leader's load is to be seen while it runs).
    cluster.brokers[old].proc.send_signal(signal.SIGTERM)
    new = cluster.wait_for(lambda: (c := coordinator_of(other, group)) not in (None, old) and c, 30,
                           "a new coordinator")
    with RawClient(cluster.brokers[new]) as client:
        # FindCoordinator names the new leader as soon as it leads; it may be asked before it
        # hears so itself (NOT_COORDINATOR), then it loads.
        error, _ = cluster.wait_for(lambda: (got := fetch(client, group, offsets_of))[0] != ErrorCode.NOT_COORDINATOR
                                    and got, 30, "the new coordinator's answer")
        assert error == ErrorCode.COORDINATOR_LOAD_IN_PROGRESS, "the partition was loaded before it answered"
        body = client.call(PRODUCE, 9, {"transactional_id": None, "acks": 1, "timeout_ms": 5000, "topic_data": [
            {"name": data, "partition_data": [{"index": ids.index(new), "records": build_batch([(None, b"v")])}]}]})
        assert body.responses[0].partition_responses[0].error_code == ErrorCode.NONE
        # Answered while the partition still loads: the replay did not hold the event loop.
        assert fetch(client, group, offsets_of)[0] == ErrorCode.COORDINATOR_LOAD_IN_PROGRESS
        error, committed = cluster.wait_for(
            lambda: (got := fetch(client, group, offsets_of))[0] != ErrorCode.COORDINATOR_LOAD_IN_PROGRESS and got,
            30, "the load")
        assert error == ErrorCode.NONE
        assert committed == {p: (COMMITS - 1) * 1000 + p for p in range(PARTITIONS)}
    cluster.brokers[old].stop()
