"""What a hostile client still did to a broker, round 2: each case against a real broker
process, checking the client's answer, that a normal client is still served, what the broker's
memory did, that nothing acknowledged was lost and that the broker restarts cleanly."""

from __future__ import annotations

import socket
import struct
import threading
import time

from strom.client import Connection
from strom.protocol.messages import decode_response, encode_request
from strom.testing import (
    BrokerProcess,
    RawClient,
    memory_mb,
    produce_acked,
    read_values,
    unique_name,
)

DELETE_RECORDS, DESCRIBE_LOG_DIRS, LIST_OFFSETS = 21, 35, 2


def still_serving(broker: BrokerProcess) -> None:
    """A normal client: a new topic takes a record with acks=all and gives it back."""
    topic = unique_name("alive")
    produce_acked(broker.bootstrap, topic, [b"alive"])
    assert read_values(broker.bootstrap, topic, 1) == [b"alive"]


def warnings_since(broker: BrokerProcess, start: int) -> list[str]:
    return [line for line in broker.stderr_lines[start:] if " WARNING " in line or " ERROR " in line]


def log_start(broker: BrokerProcess, topic: str, partition: int) -> int:
    with RawClient(broker) as client:
        body = client.call(LIST_OFFSETS, 7, {"replica_id": -1, "isolation_level": 0, "topics": [
            {"name": topic, "partitions": [{"partition_index": partition, "current_leader_epoch": -1,
                                            "timestamp": -2}]}]})
    answer = body.topics[0].partitions[0]
    assert answer.error_code == 0, answer
    return answer.offset


# --- item 1: concurrent DeleteRecords do not take the log dir offline --------------------------
def test_concurrent_delete_records_keep_the_log_dir_online():
    # Checkpoints every 50 ms as well, so periodic writes race the requests' writes too.
    with BrokerProcess(overrides={"num.partitions": "4",
                                  "log.flush.offset.checkpoint.interval.ms": "50"}) as broker:
        topic = unique_name("race")
        for p in range(4):
            assert produce_acked(broker.bootstrap, topic, [b"r-%d" % i for i in range(400)],
                                 partition=p)[-1] == 399
        start = len(broker.stderr_lines)
        answers: dict[int, list[tuple[int, int]]] = {0: [], 1: []}

        def delete(client_no: int) -> None:
            # Two clients, each on partitions of its own, one record further each call.
            with RawClient(broker) as client:
                for offset in range(1, 201):
                    body = client.call(DELETE_RECORDS, 2, {"timeout_ms": 10_000, "topics": [
                        {"name": topic, "partitions": [
                            {"partition_index": p, "offset": offset} for p in (client_no, client_no + 2)]}]})
                    answers[client_no] += [(p.error_code, p.low_watermark) for p in body.topics[0].partitions]

        threads = [threading.Thread(target=delete, args=(n,)) for n in (0, 1)]
        for t in threads:
            t.start()
        # Meanwhile acks=all writes go on, to the partitions being trimmed.
        acked = produce_acked(broker.bootstrap, topic, [b"during-%d" % i for i in range(50)],
                              partition=1, batch_each=True)
        for t in threads:
            t.join(120)
        assert all(answers[n] == [(0, off) for off in range(1, 201) for _ in (0, 1)] for n in (0, 1))
        assert acked == list(range(400, 450))
        with RawClient(broker) as client:
            dirs = client.call(DESCRIBE_LOG_DIRS, 4, {"topics": None}).results
        assert [d.error_code for d in dirs] == [0]  # the dir stayed online
        noise = warnings_since(broker, start)
        assert not [line for line in noise if "checkpoint" in line], noise  # no write failed
        assert len(noise) <= 5, noise
        still_serving(broker)

        broker.kill()  # the log start offsets were checkpointed before each answer
        broker.start()
        assert [log_start(broker, topic, p) for p in range(4)] == [200] * 4
        assert read_values(broker.bootstrap, topic, 250, partition=1, start=200) == (
            [b"r-%d" % i for i in range(200, 400)] + [b"during-%d" % i for i in range(50)])
        still_serving(broker)


# --- item 11: warnings are rate-limited per cause -----------------------------------------------
def test_repeated_malformed_requests_log_a_few_lines():
    with BrokerProcess() as broker:
        start = len(broker.stderr_lines)
        # 200 connections, each one malformed 18-byte request: a Metadata v12 request cut
        # inside its header.
        request = encode_request(3, 12, {"topics": [{"name": "t"}], "allow_auto_topic_creation": False,
                                         "include_topic_authorized_operations": False})
        cut = struct.pack(">i", 14) + request[4:18]
        for _ in range(200):
            with socket.create_connection(("127.0.0.1", broker.port), timeout=5) as s:
                s.sendall(cut)
                assert s.recv(100) == b""  # closed, as Kafka closes on a request it cannot parse
        still_serving(broker)
        lines = [line for line in warnings_since(broker, start) if "closing connection" in line]
        assert 1 <= len(lines) <= 10, lines
        assert "runs past the end of the request" in lines[0]


def test_the_rate_limit_counts_per_cause_and_says_what_it_held_back():
    import logging

    from strom.config.log_levels import RateLimit

    now = [0.0]
    limit = RateLimit(window_s=10, per_cause=3, per_template=5, clock=lambda: now[0])

    def line(msg: str, *args) -> bool:
        record = logging.LogRecord("strom.x", logging.WARNING, __file__, 1, msg, args, None)
        return limit.filter(record) and record.getMessage()

    # One cause: the port and the size differ, the rest does not.
    passed = [line("closing connection from %s: frame of %s bytes", f"127.0.0.1:{40000 + i}", i)
              for i in range(50)]
    assert len([p for p in passed if p]) == 3
    # Another cause of the same template passes, and says what was held back meanwhile.
    other = line("closing connection from %s: frame of %s bytes", "127.0.0.1:1", "huge")
    assert other.endswith("huge bytes (47 more like this were not logged)"), other
    assert line("closing connection from %s: %s", "127.0.0.1:1", "other cause")
    # The template's share (5 per window) is used up by causes enough.
    assert [bool(line("closing connection from %s: frame of %s bytes", "h", f"x{c}")) for c in "abc"] == [
        True, False, False]
    # Infos are never held back.
    info = logging.LogRecord("strom.x", logging.INFO, __file__, 1, "created %s", ("t",), None)
    assert all(limit.filter(info) for _ in range(100))
    now[0] = 10.5  # the next window
    first = line("closing connection from %s: frame of %s bytes", "127.0.0.1:2", 5)
    assert first == "closing connection from 127.0.0.1:2: frame of 5 bytes (2 more like this were not logged)"


# --- item 3: no memory before bytes ------------------------------------------------------------
def test_connections_announcing_large_frames_cost_what_they_sent():
    with BrokerProcess() as broker:
        topic = unique_name("kept")
        produce_acked(broker.bootstrap, topic, [b"before"])
        before = memory_mb(broker.proc.pid)
        socks = []
        try:
            # 2,000 connections, each announcing a 1 MiB request and sending 10 bytes of it.
            for i in range(2000):
                s = socket.create_connection(("127.0.0.1", broker.port), timeout=10)
                s.sendall(struct.pack(">i", (1 << 20) + i) + b"0123456789")
                socks.append(s)
            with RawClient(broker) as client:  # answered meanwhile, and after all of them
                assert client.call(18, 3, {"client_software_name": "t",
                                           "client_software_version": "1"}).error_code == 0
            grown = memory_mb(broker.proc.pid) - before
            print(f"RSS {before:.0f} MB -> {before + grown:.0f} MB with 2,000 such connections")
            # Each connection's own objects (transport, protocol, task) are a few KB; a buffer
            # each was 1 MiB (2 GB in all).
            assert grown < 40, f"RSS grew by {grown:.0f} MB for 2,000 connections of 14 bytes"
            still_serving(broker)
        finally:
            for s in socks:
                s.close()
        assert read_values(broker.bootstrap, topic, 1) == [b"before"]
        broker.stop()
        broker.start()
        assert read_values(broker.bootstrap, topic, 1) == [b"before"]


# --- item 2: controller requests only from the controller ---------------------------------------
CLUSTER_AUTHORIZATION_FAILED, STALE_CONTROLLER_EPOCH = 31, 11
LEADER_AND_ISR, STOP_REPLICA, UPDATE_METADATA, CONTROLLED_SHUTDOWN, ALTER_PARTITION = 4, 5, 6, 7, 56


def forged_controller_requests(controller_id: int, epoch: int, topic: str) -> list[tuple[int, int, dict]]:
    """What a controller (or a broker, to it) would send, claiming `controller_id` and `epoch`:
    an empty broker list, a partition led by nobody, a replica deleted, a broker shut down."""
    return [
        (UPDATE_METADATA, 8, {"controller_id": controller_id, "is_k_raft_controller": False,
                              "controller_epoch": epoch, "broker_epoch": -1, "topic_states": [],
                              "live_brokers": []}),
        (LEADER_AND_ISR, 7, {"controller_id": controller_id, "is_k_raft_controller": False,
                             "controller_epoch": epoch, "broker_epoch": -1, "request_type": 0,
                             "topic_states": [{"topic_name": topic, "topic_id": None, "partition_states": [
                                 {"partition_index": 0, "controller_epoch": epoch, "leader": -1,
                                  "leader_epoch": 1 << 20, "isr": [], "partition_epoch": 1 << 20,
                                  "replicas": [1000], "adding_replicas": [], "removing_replicas": [],
                                  "is_new": False, "leader_recovery_state": 0}]}],
                             "live_leaders": []}),
        (STOP_REPLICA, 4, {"controller_id": controller_id, "is_k_raft_controller": False,
                           "controller_epoch": epoch, "broker_epoch": -1, "topic_states": [
                               {"topic_name": topic, "partition_states": [
                                   {"partition_index": 0, "leader_epoch": -1, "delete_partition": True}]}]}),
        (CONTROLLED_SHUTDOWN, 3, {"broker_id": controller_id, "broker_epoch": -1}),
        (ALTER_PARTITION, 1, {"broker_id": controller_id, "broker_epoch": -1, "topics": []}),
    ]


def call_on(port: int, api_key: int, version: int, fields: dict):
    """One request, then ApiVersions on the same connection: a refusal must not close it."""
    with Connection("127.0.0.1", port) as conn:
        body = conn.call(api_key, version, fields)
        assert conn.call(18, 3, {"client_software_name": "t", "client_software_version": "1"}).error_code == 0
    return body


def test_the_embedded_broker_refuses_controller_requests_from_clients():
    with BrokerProcess(overrides={"num.partitions": "1"}) as broker:
        topic = unique_name("kept")
        produce_acked(broker.bootstrap, topic, [b"acked-%d" % i for i in range(10)])
        start = len(broker.stderr_lines)
        for epoch in (2**30, 1, 0):  # made up, the embedded controller's own, stale
            for api_key, version, fields in forged_controller_requests(0, epoch, topic):
                body = call_on(broker.port, api_key, version, fields)
                assert body.error_code == CLUSTER_AUTHORIZATION_FAILED, (api_key, epoch, body)
        assert len(warnings_since(broker, start)) <= 5 * 3  # rate-limited per cause
        # Clients still bootstrap, and the topic is still served.
        from confluent_kafka.admin import AdminClient
        cluster = AdminClient({"bootstrap.servers": broker.bootstrap}).list_topics(timeout=10)
        assert list(cluster.brokers) == [0] and topic in cluster.topics
        assert produce_acked(broker.bootstrap, topic, [b"after"]) == [10]
        broker.stop()
        broker.start()
        assert read_values(broker.bootstrap, topic, 11) == [b"acked-%d" % i for i in range(10)] + [b"after"]


def test_a_cluster_takes_controller_requests_only_from_its_controller():
    from confluent_kafka.admin import AdminClient

    from strom.testing import Cluster, create_topic

    two_listeners = {"listeners": "PLAINTEXT://127.0.0.1:0,INTERNAL://127.0.0.1:0",
                     "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,INTERNAL:PLAINTEXT",
                     "inter.broker.listener.name": "INTERNAL"}
    with Cluster(2, overrides=two_listeners) as cluster:
        topic = unique_name("replicated")
        create_topic(cluster.bootstrap, topic, 1, replication_factor=2)
        acked = produce_acked(cluster.bootstrap, topic, [b"acked-%d" % i for i in range(20)], acks="all")
        controller, epoch = cluster.controller_id(), cluster.controller_epoch()
        other = next(b for i, b in cluster.brokers.items() if i != controller)
        internal, plaintext = other.ports["INTERNAL"], other.ports["PLAINTEXT"]
        start = len(other.stderr_lines)
        # On the client listener: refused, whatever the request claims.
        for request in forged_controller_requests(controller, epoch, topic):
            assert call_on(plaintext, *request).error_code == CLUSTER_AUTHORIZATION_FAILED
        # On the inter-broker listener, claiming a controller or an epoch the store does not
        # hold, or a broker that is not live: refused.
        for claimed in ((controller, epoch + 1000), (other_id := 3 - controller, epoch)):
            for request in forged_controller_requests(*claimed, topic)[:3]:
                assert call_on(internal, *request).error_code == CLUSTER_AUTHORIZATION_FAILED, (claimed, request[0])
        for request in forged_controller_requests(999, epoch, topic)[3:]:
            port = cluster.brokers[controller].ports["INTERNAL"]
            assert call_on(port, *request).error_code == CLUSTER_AUTHORIZATION_FAILED
        # A stale epoch is Kafka's STALE_CONTROLLER_EPOCH, as from a deposed controller.
        stale = forged_controller_requests(controller, epoch - 1, topic)[0]
        assert call_on(internal, *stale).error_code == STALE_CONTROLLER_EPOCH
        assert len(warnings_since(other, start)) <= 20
        # Clients still see both brokers, and every acknowledged record.
        for broker in cluster.brokers.values():
            listed = AdminClient({"bootstrap.servers": broker.bootstrap}).list_topics(timeout=10)
            assert sorted(listed.brokers) == [1, 2]
            assert [p.replicas for p in listed.topics[topic].partitions.values()][0] in ([1, 2], [2, 1])
        assert acked == list(range(20))
        other.stop()  # a clean restart of the broker the requests were aimed at
        other.start()
        cluster.wait_for(lambda: len(AdminClient({"bootstrap.servers": other.bootstrap}).list_topics(
            timeout=10).topics[topic].partitions[0].isrs) == 2, what="both replicas in sync again")
        assert read_values(other.bootstrap, topic, 20) == [b"acked-%d" % i for i in range(20)]
        assert other_id in cluster.brokers


# --- item 5: internal topics, the rest ------------------------------------------------------------
def test_internal_topics_keep_their_records_policy_and_partition_count():
    from confluent_kafka import Consumer, TopicPartition

    from strom.coordinator import partition_for

    INVALID_TOPIC_EXCEPTION, INVALID_PARTITIONS, INVALID_CONFIG, INVALID_REQUEST = 17, 37, 40, 42
    with BrokerProcess(overrides={"num.partitions": "1", "offsets.topic.num.partitions": "50"}) as broker:
        topic, group = unique_name("data"), unique_name("group")
        produce_acked(broker.bootstrap, topic, [b"a", b"b", b"c"])
        consumer = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": group,
                             "enable.auto.commit": False})
        consumer.commit(offsets=[TopicPartition(topic, 0, 3)], asynchronous=False)
        consumer.close()
        offsets_partition = partition_for(group, 50)
        with RawClient(broker) as client:
            body = client.call(DELETE_RECORDS, 2, {"timeout_ms": 10_000, "topics": [{
                "name": "__consumer_offsets", "partitions": [{"partition_index": offsets_partition,
                                                              "offset": -1}]}]})
            assert body.topics[0].partitions[0].error_code == INVALID_TOPIC_EXCEPTION
            altered = client.call(33, 2, {"validate_only": False, "resources": [{
                "resource_type": 2, "resource_name": "__consumer_offsets", "configs": [
                    {"name": "cleanup.policy", "value": "delete"}, {"name": "retention.ms", "value": "1"}]}]})
            assert altered.responses[0].error_code == INVALID_CONFIG
            assert "cleanup.policy must stay compact" in altered.responses[0].error_message
            for op, value in ((1, None), (0, "compact,delete")):  # DELETE the override, SET another
                altered = client.call(44, 1, {"validate_only": False, "resources": [{
                    "resource_type": 2, "resource_name": "__consumer_offsets", "configs": [
                        {"name": "cleanup.policy", "config_operation": op, "value": value}]}]})
                assert altered.responses[0].error_code == INVALID_CONFIG
            grown = client.call(37, 3, {"timeout_ms": 10_000, "validate_only": False, "topics": [
                {"name": "__consumer_offsets", "count": 60, "assignments": None}]})
            assert grown.results[0].error_code == INVALID_PARTITIONS
            made = client.call(19, 7, {"timeout_ms": 10_000, "validate_only": False, "topics": [{
                "name": "__transaction_state", "num_partitions": 1, "replication_factor": 1,
                "assignments": [], "configs": [{"name": "cleanup.policy", "value": "delete"}]}]})
            assert made.topics[0].error_code == INVALID_REQUEST
            # What may change still can: a segment size under the compact policy.
            altered = client.call(33, 2, {"validate_only": False, "resources": [{
                "resource_type": 2, "resource_name": "__consumer_offsets", "configs": [
                    {"name": "cleanup.policy", "value": "compact"}, {"name": "segment.bytes", "value": "104857600"}]}]})
            assert altered.responses[0].error_code == 0
        still_serving(broker)
        broker.stop()
        broker.start()
        consumer = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": group})
        committed = consumer.committed([TopicPartition(topic, 0)], timeout=30)
        consumer.close()
        assert committed[0].offset == 3
        from confluent_kafka.admin import AdminClient
        listed = AdminClient({"bootstrap.servers": broker.bootstrap}).list_topics(timeout=10)
        assert len(listed.topics["__consumer_offsets"].partitions) == 50
        assert "__transaction_state" not in listed.topics


# --- item 4: dynamic configs within what the machine can run ----------------------------------------
def incremental_set(broker: BrokerProcess, entity: str, key: str, value: str):
    with RawClient(broker) as client:
        body = client.call(44, 1, {"validate_only": False, "resources": [{
            "resource_type": 4, "resource_name": entity,
            "configs": [{"name": key, "config_operation": 0, "value": value}]}]})
    return body.responses[0]


def test_doubling_a_dynamic_config_stops_at_what_the_machine_can_run():
    import os

    from strom.controller.store import LocalMetadataStore

    with BrokerProcess(overrides={"num.partitions": "1"}) as broker:
        topic = unique_name("kept")
        produce_acked(broker.bootstrap, topic, [b"acked-%d" % i for i in range(10)])
        before = memory_mb(broker.proc.pid)
        threads, accepted = 1, [1]
        while threads < 200_000:  # 1 -> 2 -> ... as the 18 doublings
            threads *= 2
            answer = incremental_set(broker, "", "log.cleaner.threads", str(threads))
            if answer.error_code:
                break
            accepted.append(threads)
        assert answer.error_code == 40 and "cores" in answer.error_message, answer
        assert accepted[-1] <= max(4, 2 * len(os.sched_getaffinity(0)))
        for key, value in (("log.cleaner.dedupe.buffer.size", str(1 << 60)), ("log.cleaner.backoff.ms", "0"),
                           ("log.segment.bytes", "14"), ("log.roll.ms", "1"),
                           ("log.index.size.max.bytes", "4")):
            answer = incremental_set(broker, "0", key, value)
            assert answer.error_code == 40 and key in answer.error_message, (key, answer)
        assert memory_mb(broker.proc.pid) - before < 30
        still_serving(broker)
        broker.stop()
        # What an older version (or a hand) may have stored: 200,000 threads, a value that is
        # not a number, and one good config. The broker starts, leaves the first two out, says
        # so, and applies the third.
        store = LocalMetadataStore(broker.data_dir / "logs" / "strom-metadata.json")
        store.set("/config/brokers/<default>", {"version": 1, "config": {
            "log.cleaner.threads": "200000", "log.cleaner.backoff.ms": "soon", "log.retention.ms": "123456789"}})
        store.close()
        broker.start()
        refused = [line for line in broker.stderr_lines if "ignoring the stored dynamic broker config" in line]
        assert len(refused) == 2 and "log.cleaner.threads=200000" in refused[0] and "soon" in refused[1], refused
        from confluent_kafka.admin import AdminClient, ConfigResource, ResourceType
        resource = ConfigResource(ResourceType.BROKER, "0")
        admin = AdminClient({"bootstrap.servers": broker.bootstrap})  # alive until the answer
        configs = admin.describe_configs([resource])[resource].result(30)
        assert configs["log.retention.ms"].value == "123456789"
        assert int(configs["log.cleaner.threads"].value) <= accepted[-1]
        assert read_values(broker.bootstrap, topic, 10) == [b"acked-%d" % i for i in range(10)]
        assert memory_mb(broker.proc.pid) < before + 30
        still_serving(broker)


# --- item 8: out of descriptors, a new topic's first write fails alone ----------------------------------
def test_a_first_write_out_of_descriptors_fails_alone_and_is_made_later():
    """A new topic needs no file (its logs make theirs with their first write), so it is
    created whole even out of descriptors. The first writes then cannot make their segment
    files (beyond the few descriptors the open-file cache gives back): those partitions answer
    KAFKA_STORAGE_ERROR, the log dir stays online, nothing is half made, and once descriptors
    are back the same partitions take their writes, which survive a kill -9."""
    import os
    import subprocess

    from strom.protocol.records import build_batch

    with BrokerProcess(overrides={"num.partitions": "1"}) as broker:
        pid = broker.proc.pid
        # The descriptors a broker holds for its whole life, opened first: numbers 0 to n-1. A
        # limit of n leaves no free number for a new one, whatever connections and files above
        # them open and close meanwhile (a limit of "all open now" did: a client's connection
        # or a segment file closed just after it left a gap).
        lifelong = len(os.listdir(f"/proc/{pid}/fd"))
        topic, fresh = unique_name("kept"), unique_name("fresh")
        produce_acked(broker.bootstrap, topic, [b"acked-%d" % i for i in range(10)])
        limit = subprocess.run(["prlimit", "--pid", str(pid), "--nofile", "--output=SOFT", "--noheadings"],
                               check=True, capture_output=True, text=True).stdout.strip()

        def produce(client: RawClient, value: bytes) -> list[int]:
            body = client.call(0, 9, {"transactional_id": None, "acks": -1, "timeout_ms": 5000,
                                      "topic_data": [{"name": fresh, "partition_data": [
                                          {"index": p, "records": build_batch([(None, value)])}
                                          for p in range(40)]}]})
            return [p.error_code for p in sorted(body.responses[0].partition_responses, key=lambda p: p.index)]

        with RawClient(broker) as client:
            client.sock.settimeout(60)
            client.call(18, 0, {})  # the broker has accepted this connection: it has its descriptor
            subprocess.run(["prlimit", "--pid", str(pid), f"--nofile={lifelong}:"], check=True)
            try:
                created = client.call(19, 7, {"timeout_ms": 20_000, "validate_only": False, "topics": [{
                    "name": fresh, "num_partitions": 40, "replication_factor": 1, "assignments": [],
                    "configs": []}]}).topics[0]
                failed = produce(client, b"first")
            finally:
                subprocess.run(["prlimit", "--pid", str(pid), f"--nofile={limit}:"], check=True)
            assert created.error_code == 0, created
            assert set(failed) <= {0, 56} and 56 in failed, failed  # 56: KAFKA_STORAGE_ERROR
            assert produce(client, b"whole") == [0] * 40
        still_serving(broker)
        assert read_values(broker.bootstrap, topic, 10) == [b"acked-%d" % i for i in range(10)]
        broker.kill()
        broker.start()
        for p, error in enumerate(failed):
            expected = [b"whole"] if error else [b"first", b"whole"]
            assert read_values(broker.bootstrap, fresh, len(expected), partition=p) == expected
        assert read_values(broker.bootstrap, topic, 10) == [b"acked-%d" % i for i in range(10)]


# --- item 10: wide requests cost about their answer -----------------------------------------------
def _peak_during(pid: int, work) -> tuple[float, object]:
    """(peak RSS in MB while `work()` runs, its result)."""
    stop, peak = threading.Event(), [memory_mb(pid)]

    def sample() -> None:
        while not stop.is_set():
            peak[0] = max(peak[0], memory_mb(pid))
            stop.wait(0.01)

    sampler = threading.Thread(target=sample)
    sampler.start()
    try:
        result = work()
    finally:
        stop.set()
        sampler.join()
    return peak[0], result


def _wide_metadata(port: int, names: list[str]):
    with Connection("127.0.0.1", port, timeout_s=300) as conn:
        return conn.call(3, 12, {"topics": [{"name": n} for n in names], "allow_auto_topic_creation": False,
                                 "include_topic_authorized_operations": False})


def test_metadata_naming_a_million_unknown_topics_costs_about_its_answer():
    from concurrent.futures import ThreadPoolExecutor

    with BrokerProcess() as broker:
        topic = unique_name("kept")
        produce_acked(broker.bootstrap, topic, [b"acked"])
        pid, before = broker.proc.pid, memory_mb(broker.proc.pid)
        names = [f"no-such-topic-{i:07d}" for i in range(200_000)] + [topic, "bad name!"]
        peak, body = _peak_during(pid, lambda: _wide_metadata(broker.port, names))
        assert [t.error_code for t in body.topics[:3]] == [3, 3, 3]  # UNKNOWN_TOPIC_OR_PARTITION
        assert len(body.topics) == 200_002 and body.topics[-2].name == topic and body.topics[-2].error_code == 0
        assert body.topics[-1].error_code == 17  # INVALID_TOPIC_EXCEPTION
        print(f"200,000 unknown names: RSS {before:.0f} MB, peak {peak:.0f} MB")
        assert peak - before < 100  # was 45 MB -> 640 MB
        # Four at once, 250,000 names each (a million in all). One request, sent on four
        # connections: encoding and decoding a quarter of a million names costs the test seconds
        # of CPU apiece, and the four answers must be the same bytes anyway; one is decoded.
        request = encode_request(3, 12, {"topics": [{"name": f"no-such-{i}"} for i in range(250_000)],
                                         "allow_auto_topic_creation": False,
                                         "include_topic_authorized_operations": False}, 1, "wide")

        def raw_call(_) -> bytes:
            with Connection("127.0.0.1", broker.port, timeout_s=300) as conn:
                conn.send_raw(request)
                return bytes(conn.read_frame())

        with ThreadPoolExecutor(4) as pool:
            peak, answers = _peak_during(pid, lambda: list(pool.map(raw_call, range(4))))
        assert len(set(answers)) == 1
        correlation, body = decode_response(3, 12, answers[0])
        assert correlation == 1 and len(body.topics) == 250_000 and body.topics[-1].error_code == 3
        print(f"4 x 250,000 unknown names: peak {peak:.0f} MB")
        assert peak - before < 300  # was 2.65 GB for four of a million
        still_serving(broker)
        # The memory goes back to the system once the answers are gone.
        wait_for_rss = time.monotonic() + 10
        while memory_mb(pid) > before + 40 and time.monotonic() < wait_for_rss:
            time.sleep(0.2)
        assert memory_mb(pid) < before + 40
        broker.stop()
        broker.start()
        assert read_values(broker.bootstrap, topic, 1) == [b"acked"]
