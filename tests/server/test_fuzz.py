"""A bounded protocol fuzzer against a real broker: damaged versions of valid requests for
every api key and version the broker advertises, each on its own connection to 127.0.0.1.

The broker may answer, answer with an error, or close the connection (what Kafka does with a
request it cannot parse); it may not die, log an exception no code path meant to handle, write
a line a client can make arbitrarily long, or grow without bound. A normal client must still
work afterwards.

STROM_FUZZ_SECONDS (default 75) bounds the run; STROM_FUZZ_WORKERS (default 3) clients fuzz
at once, and now and then send one valid request from several connections at the same moment
(races between clients need two); STROM_FUZZ_SEED picks the cases (default fixed, so that
every run sends the same ones, though not in the same interleaving; set another to explore, e.g.
`STROM_FUZZ_SECONDS=900 STROM_FUZZ_SEED=$RANDOM .venv/bin/pytest -s tests/server/test_fuzz.py`).
A failure lists the cases sent just before the bad log line, as hex that
`python tests/server/fuzz_support.py replay HEX` sends to a fresh broker.
"""

from __future__ import annotations

import os
import random
import struct
import tempfile
import time
import tracemalloc

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from fuzz_support import (
    GROUPS,
    Fuzzer,
    RequestFactory,
    advertised_targets,
    bad_log_line,
    prepare_broker,
)

from strom.protocol import messages
from strom.protocol.frames import FrameDecoder, frame
from strom.testing import BrokerProcess, KRaftQuorum, RawClient, memory_mb, unique_name, wait_for

SECONDS = float(os.environ.get("STROM_FUZZ_SECONDS", "22"))  # 44,000 cases alone (2,000/s): 170 per (api, version) pair
WORKERS = int(os.environ.get("STROM_FUZZ_WORKERS", "3"))  # clients at once
SEED = int(os.environ.get("STROM_FUZZ_SEED", "20261124"))
CONTROLLER_SECONDS = float(os.environ.get("STROM_FUZZ_CONTROLLER_SECONDS", "10"))  # a KRaft node's controller listener
FORWARDED_SECONDS = float(os.environ.get("STROM_FUZZ_FORWARDED_SECONDS", "8"))  # what a KRaft broker forwards
# An idle broker holds ~50 MB; the fuzzer's requests are small, so anything near this bound
# means some request made the broker allocate far more than it sent.
PEAK_RSS_LIMIT_MB = 256
MIN_CASES_PER_VERSION = 20  # sent whatever the time it takes (Fuzzer.run)

# No auto-created topics from fuzzed Metadata requests; groups form at once. A flipped bit in
# a partition count is a valid CreateTopics or CreatePartitions of thousands of partitions, up
# to max.broker.partitions (20,000 by default): a minute of log creation on a busy 2-core
# machine, ahead of the topic the check after the fuzzing creates. What that costs is for
# tests/integration/test_partition_scale.py and benchmarks/partitions.py; here the broker
# holds at most 2,000 partitions (a few seconds of creation), so the check after the fuzzing
# sees what the cases broke, not how much valid work they queued.
OVERRIDES = {"auto.create.topics.enable": "false", "group.initial.rebalance.delay.ms": "0",
             "max.broker.partitions": "2000"}

pytestmark = pytest.mark.timeout(max(SECONDS, CONTROLLER_SECONDS) + 180)


def _produce_and_consume(broker: BrokerProcess) -> list[bytes]:
    """A record through confluent-kafka, to a topic made after the fuzzing, and back."""
    topic = unique_name("after-fuzz")
    with RawClient(broker) as client:
        body = client.call(19, 5, {"topics": [{"name": topic, "num_partitions": 1, "replication_factor": 1,
                                               "assignments": [], "configs": []}], "timeout_ms": 10000})
    assert body.topics[0].error_code == 0, body
    producer = Producer({"bootstrap.servers": broker.bootstrap, "acks": "all"})
    delivered = []
    producer.produce(topic, b"still-serving", on_delivery=lambda err, msg: delivered.append(err))
    producer.flush(30)
    assert delivered == [None]
    consumer = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": unique_name("after-fuzz"),
                         "enable.auto.commit": False})
    consumer.assign([TopicPartition(topic, 0, 0)])
    values = []
    deadline = time.monotonic() + 30
    while not values and time.monotonic() < deadline:
        msg = consumer.poll(0.5)
        if msg is not None and msg.error() is None:
            values.append(msg.value())
    consumer.close()
    return values


def _keep_log(broker: BrokerProcess) -> None:
    """The whole broker log, kept in a file a failure names: a fuzz failure is often a race,
    seen once, and the lines before the assertion are what explains it."""
    fd, path = tempfile.mkstemp(prefix=f"strom-fuzz-{SEED}-", suffix=".log")
    with os.fdopen(fd, "w") as f:
        f.write(broker.log_text() + "\n")
    print(f"broker log ({len(broker.stderr_lines)} lines): {path}")


def test_fuzzed_requests_do_not_hurt_the_broker():
    with BrokerProcess(overrides=OVERRIDES) as broker:
        try:
            _fuzz(broker)
        except BaseException:
            _keep_log(broker)
            raise


def _fuzz(broker: BrokerProcess) -> None:
    prepare_broker(broker.port)
    _fuzz_listener(broker, broker.port, SECONDS, prepare_broker)


def _fuzz_listener(node: BrokerProcess, port: int, seconds: float, prepare, settle=None,
                   apis: frozenset[int] | None = None) -> None:
    """Fuzz the listener on `port` of `node` (every version it advertises of `apis`, default all);
    then the node must be unhurt (see the module's docstring) and, once `settle` returns, serve a
    producer and a consumer on its broker listener."""
    targets = [t for t in advertised_targets(port) if apis is None or t[0] in apis]
    print(f"fuzzing {len(targets)} (api key, version) pairs for {seconds:.0f} s from {WORKERS} "
          f"clients at once, seed {SEED} (STROM_FUZZ_SEED)")
    fuzzer = Fuzzer(port, SEED, targets, node.stderr_lines, alive=lambda: node.proc.poll() is None,
                    prepare=prepare, workers=WORKERS)
    report = fuzzer.run(seconds, min_cases=MIN_CASES_PER_VERSION)
    print(report.summary())
    for case in report.held:
        print("held:", case.describe())

    assert not report.died_after, "the broker died; the last cases:\n" + "\n".join(
        c.describe() for c in report.died_after)
    assert node.proc.poll() is None
    findings = "\n\n".join(
        "\n".join(f.lines) + "\n  after one of:\n" + "\n".join("  " + c.describe() for c in f.suspects)
        for f in report.findings)
    assert not report.findings, f"seed {SEED}: the broker logged what it should not have:\n{findings}"
    # The unmutated request of every pair must be served: the fuzzer's requests are valid.
    assert not report.valid_rejected, "valid requests refused:\n" + "\n".join(
        c.describe() for c in report.valid_rejected)
    thin = {t: report.by_api[t] for t in targets if report.by_api[t] < MIN_CASES_PER_VERSION}
    assert not thin, f"too few cases for {thin}"
    assert report.outcomes["closed"] > 0 and report.outcomes["answered"] > 0
    if WORKERS > 1:
        assert report.valid_outcomes["answered"] and any(m == "burst" for m, _ in report.by_mutation)

    if settle is not None:
        settle()
    assert _produce_and_consume(node) == [b"still-serving"]
    peak = memory_mb(node.proc.pid, "VmHWM")
    print(f"broker peak RSS {peak:.0f} MB")
    assert peak < PEAK_RSS_LIMIT_MB
    time.sleep(0.5)  # the log arrives through a pipe
    late = [line for line in node.stderr_lines[fuzzer.seen_lines :] if bad_log_line(line)]
    assert not late, late


def _listed_brokers(node: BrokerProcess) -> list[int]:
    """The brokers the node's Metadata names (in KRaft: the unfenced ones)."""
    with RawClient(node) as client:
        body = client.call(3, 12, {"topics": [], "allow_auto_topic_creation": False,
                                   "include_topic_authorized_operations": False})
    return sorted(b.node_id for b in body.brokers)


NODE = 100  # the KRaft node's id: one the fuzzer's broker and replica ids (-1 to 2) never name


def test_fuzzed_requests_do_not_hurt_a_kraft_controller():
    """The same on a KRaft node's controller listener, which serves Raft (Vote, Fetch,
    FetchSnapshot...) and the quorum controller's APIs to other nodes: a combined node of a
    quorum of one, fuzzed there, keeps leading its quorum and serving clients on its broker
    listener. Fuzzed Raft requests name other nodes and epochs; none may break it.

    The node is node 100: the cases name brokers -1 to 2. Like Kafka's, this listener trusts
    whoever reaches it with a broker's requests (secure it where that matters), and a valid
    BrokerRegistration, heartbeat asking to shut down or UnregisterBroker naming the node's own
    id would legitimately take its broker out of service. Those of brokers 0-2 register
    brokers that never heartbeat, and are fenced."""
    with KRaftQuorum(1, combined=True, overrides=OVERRIDES, first_id=NODE) as quorum:
        node = quorum.nodes[NODE]

        def still_led_and_unfenced() -> None:
            assert quorum.leader(30) == NODE
            wait_for(lambda: NODE in _listed_brokers(node), 60, interval=0.2, what=f"broker {NODE} listed")

        try:
            _fuzz_listener(node, quorum.ports[NODE], CONTROLLER_SECONDS, None, still_led_and_unfenced)
        except BaseException:
            _keep_log(node)
            raise


def test_fuzzed_forwarded_requests_do_not_hurt_a_kraft_cluster():
    """What a KRaft broker passes on to the active controller (topic and config changes, and the
    Envelope's requests: elections, reassignments, features, ACLs, quotas, SCRAM users), fuzzed
    on the broker listener of a combined node at every version it advertises: the forwarding,
    the Envelope and the controller's handlers unhurt, the node still leading and serving."""
    from strom.server.kraft.forwarding import (
        CREATE_PARTITIONS,
        CREATE_TOPICS,
        DELETE_TOPICS,
        ENVELOPED,
        INCREMENTAL_ALTER_CONFIGS,
    )

    alter_configs = 33
    forwarded = ENVELOPED | {CREATE_TOPICS, DELETE_TOPICS, CREATE_PARTITIONS, INCREMENTAL_ALTER_CONFIGS,
                             alter_configs}
    with KRaftQuorum(1, combined=True, overrides=OVERRIDES, first_id=NODE) as quorum:
        node = quorum.nodes[NODE]
        prepare_broker(node.port)
        try:
            _fuzz_listener(node, node.port, FORWARDED_SECONDS, prepare_broker,
                           lambda: quorum.leader(30) == NODE, apis=forwarded)
        except BaseException:
            _keep_log(node)
            raise


# --- what the fuzzer found, kept fixed ----------------------------------------------------------

def _payload(api_key: int, version: int, fields: dict) -> bytes:
    return messages.encode_request(api_key, version, fields)[4:]


_PARTITION_WITHOUT_ISR = {"partition_index": 0, "leader_epoch": 0, "new_isr": None,
                          "leader_recovery_state": 0, "partition_epoch": 0}


@pytest.mark.parametrize("payload, problem", [
    # CreateTopics with a null topics array: its handler iterated None (TypeError).
    (_payload(19, 5, {"topics": None, "timeout_ms": 1000, "validate_only": False}),
     "non-nullable field topics was null"),
    # AlterPartition with a null ISR: a traceback from the controller's event loop.
    (_payload(56, 1, {"broker_id": 0, "broker_epoch": 0, "topics": [
        {"topic_name": "t", "partitions": [_PARTITION_WITHOUT_ISR]}]}),
     "non-nullable field topics.partitions.new_isr was null"),
    # OffsetCommit with a null group id: AttributeError on None.encode() in its handler.
    (_payload(8, 8, {"group_id": None, "generation_id_or_member_epoch": -1, "member_id": "",
                     "group_instance_id": None, "topics": []}),
     "non-nullable field group_id was null"),
    # DescribeGroups naming a 10-byte group of which 3 bytes arrive: the codec read "abc".
    (_payload(15, 0, {"groups": []})[:-4] + struct.pack(">ih", 1, 10) + b"abc",
     "past the end of the request"),
])
def test_found_requests_are_refused_as_malformed(payload: bytes, problem: str):
    with pytest.raises(messages.InvalidRequest, match=problem):
        messages.parse_request(payload)


def test_a_join_that_must_be_answered_at_once_has_a_group_of_its_own():
    """A valid JoinGroup of the first round joins a group no other request names: a join into
    fuzz-group waits for the members other clients' joins left there to rejoin (up to their
    rebalance timeout, as Kafka's coordinator does), which would count as refused."""
    factory = RequestFactory(random.Random(7))
    joins = [messages.parse_request(factory.build(11, v, answered=True, alone=True).payload).body.group_id
             for v in range(10) for _ in range(20)]
    named = [g for g in joins if g]  # "" is refused at once (INVALID_GROUP_ID): kept
    assert named and len(set(named)) == len(named) and not set(named) & set(GROUPS)
    later = [messages.parse_request(factory.build(11, v).payload).body.group_id for v in range(10) for _ in range(20)]
    assert set(GROUPS) <= set(later)  # the other rounds share the groups, so members meet


def test_offset_commit_with_the_longest_retention_is_kept():
    """Seed 32680: an OffsetCommit v3 asking for a retention of 2^63-2 ms made an expiry past
    the int64 its record stores, and the handler failed ("int too large to convert", the
    connection closed). The commit is kept, as one that never expires."""
    topic, group = unique_name("retention"), unique_name("retention")
    with BrokerProcess() as broker, RawClient(broker) as client:
        created = client.call(19, 5, {"topics": [{"name": topic, "num_partitions": 1, "replication_factor": 1,
                                                  "assignments": [], "configs": []}], "timeout_ms": 10000})
        assert created.topics[0].error_code == 0
        found = client.call(10, 4, {"key_type": 0, "coordinator_keys": [group]})  # makes __consumer_offsets
        assert found.coordinators[0].error_code == 0
        committed = client.call(8, 3, {"group_id": group, "generation_id_or_member_epoch": -1, "member_id": "",
                                       "retention_time_ms": (1 << 63) - 2, "topics": [{"name": topic, "partitions": [
                                           {"partition_index": 0, "committed_offset": 7, "committed_metadata": "m"}]}]})
        assert committed.topics[0].partitions[0].error_code == 0
        fetched = client.call(9, 3, {"group_id": group, "topics": [{"name": topic, "partition_indexes": [0]}]})
        assert fetched.topics[0].partitions[0].committed_offset == 7
        time.sleep(0.5)  # the log arrives through a pipe
        assert not [line for line in broker.stderr_lines if bad_log_line(line)]


def test_valid_requests_still_parse():
    """The checks behind the cases above do not refuse what clients send."""
    raw = messages.encode_request(19, 5, {"topics": [], "timeout_ms": 1000, "validate_only": False})
    assert messages.parse_request(raw[4:]).body.topics == []
    raw = messages.encode_request(3, 12, {"topics": None, "allow_auto_topic_creation": False,
                                          "include_topic_authorized_operations": False})
    assert messages.parse_request(raw[4:]).body.all_topics  # nullable: all topics


# --- hostile framing: what idle, slow and interleaved connections cost ------------------------

def _frames_in_pieces(decoders: int, seed: int) -> None:
    """Several decoders on one thread, reads of random sizes interleaved at random: every
    decoder still gets exactly its own frames (reads land in one shared buffer)."""
    import random

    rng = random.Random(seed)
    streams, expected = [], []
    for d in range(decoders):
        payloads = [bytes([d]) * rng.choice((0, 1, 5, 300, 70000, 1 << 21)) + b"%d" % i for i in range(6)]
        expected.append(payloads)
        streams.append(memoryview(b"".join(frame(p) for p in payloads)))
    decs = [FrameDecoder(4 << 20) for _ in range(decoders)]
    got: list[list[bytes]] = [[] for _ in range(decoders)]
    while any(streams):
        d = rng.choice([i for i, s in enumerate(streams) if s])
        buf = decs[d].get_buffer()
        n = min(len(buf), len(streams[d]), rng.choice((1, 3, 4, 100, 5000, 1 << 20)))
        buf[:n] = streams[d][:n]
        streams[d] = streams[d][n:]
        got[d] += [bytes(f) for f in decs[d].buffer_updated(n)]
        if decs[d].awaiting_admission and rng.random() < 0.5:  # admitted now or at a later turn
            got[d] += [bytes(f) for f in decs[d].admit()]
    for d, dec in enumerate(decs):  # bytes that arrived before admission, all the rest
        while dec.awaiting_admission:
            got[d] += [bytes(f) for f in dec.admit()]
    assert got == expected


@pytest.mark.parametrize("seed", range(5))
def test_interleaved_connections_get_their_own_frames(seed: int):
    _frames_in_pieces(4, seed)


def test_frames_from_two_threads():
    import threading

    errors = []

    def work(seed: int) -> None:
        try:
            _frames_in_pieces(3, seed)
        except BaseException as e:  # noqa: B036 - reported by the main thread
            errors.append(e)

    threads = [threading.Thread(target=work, args=(s,)) for s in (10, 11)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors


def test_idle_decoders_hold_no_buffer():
    """2,000 connections that each sent a request and wait: no 64 KiB buffer each (that was
    140 MB for 2,000 idle connections)."""
    import tracemalloc

    request = frame(b"\x00\x12\x00\x00\x00\x00\x00\x01\xff\xff")
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        decoders = [FrameDecoder(100 << 20) for _ in range(2000)]
        for d in decoders:
            buf = d.get_buffer()
            buf[: len(request)] = request
            assert len(d.buffer_updated(len(request))) == 1
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert held < 2000 * 4096, f"{held / 2000:.0f} bytes per idle decoder"


def test_a_trickled_large_frame_holds_about_what_arrived():
    """A client announcing 100 MB and sending 10 MB of it: the decoder holds ~10 MB (the pieces
    that arrived), not the announced size and not a doubled buffer. Counted by tracemalloc, not
    by the process's RSS, which memory freed by earlier tests in the same process would hide."""
    decoder = FrameDecoder(100 << 20)

    def held_mb(base: int) -> float:
        return (tracemalloc.get_traced_memory()[0] - base) / (1 << 20)

    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        assert decoder.feed(struct.pack(">i", 100 << 20)) == []
        sent = 0
        chunk = bytes(range(256)) * 256  # 64 KiB
        while sent < 10 << 20:
            assert decoder.feed(chunk) == []
            sent += len(chunk)
        held = held_mb(base)
        assert 8 <= held < 30, held
        rest = (100 << 20) - sent
        frames = decoder.feed(chunk * (rest // len(chunk)))
        assert len(frames) == 1 and len(frames[0]) == 100 << 20
        assert frames[0][: 1 << 16] == chunk and frames[0][-(1 << 16) :] == chunk
        del frames  # the frame is the only holder of its bytes
        assert held_mb(base) < 30
    finally:
        tracemalloc.stop()
