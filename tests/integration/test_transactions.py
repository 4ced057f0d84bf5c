"""Kafka transactions (KIP-98) through real clients: confluent-kafka, kafka-python and aiokafka.

What each test pins down:
- read_committed sees committed records only, read_uncommitted sees everything, nobody sees the
  control records (commit/abort markers) as data, and each marker takes an offset;
- the last stable offset (LSO): read_committed stops at the first open transaction, and
  ListOffsets / Fetch report it;
- zombie fencing by a second producer with the same transactional id;
- consume-transform-produce offsets (`send_offsets_to_transaction`): visible only on commit;
- the coordinator aborts a transaction that outlives `transaction.timeout.ms`;
- the coordinator finishes (or aborts) what it had begun after a kill -9, and still applies
  timeouts to transactions left open across a crash; an open transaction survives a clean stop;
- the aborted-transaction index across segments and restarts, interleaved transactions of
  several producers, many concurrent producers;
- compaction never lets an aborted write win and never cleans into an open transaction;
- transactional.id.expiration.ms;
- DescribeTransactions / ListTransactions (raw and through kafka-python's admin client).

Shared helpers (`TXN_OVERRIDES`, `read_to_end`, `list_offset`, `raw_fetch`, `txn_producer`) are
imported by the other `test_transactions_*` modules.
"""

from __future__ import annotations

import asyncio
import struct
import time
import uuid

import pytest
from confluent_kafka import KafkaError, KafkaException, Message, Producer, TopicPartition

from strom.protocol import records as rec
from strom.testing import TIMESTAMP_BASE_MS, BrokerProcess, create_topic, unique_name, wait_for

from .conftest import (
    GROUP_OVERRIDES,
    Rec,
    admin,
    ck_produce,
    consumer,
    stored_batches,
    watermarks,
    wire_call,
)

pytestmark = pytest.mark.timeout(90)

LIST_OFFSETS, FETCH, OFFSET_FETCH, INIT_PRODUCER_ID = 2, 1, 9, 22
DESCRIBE_TRANSACTIONS, LIST_TRANSACTIONS = 65, 66
INVALID_TRANSACTION_TIMEOUT, UNSTABLE_OFFSET_COMMIT, TRANSACTIONAL_ID_NOT_FOUND = 50, 88, 105
RETRIABLE_COORDINATOR = (14, 15, 16, 51)  # LOAD_IN_PROGRESS, NOT_AVAILABLE, NOT_COORDINATOR, CONCURRENT

# Kafka's own config names; a small transaction topic, frequent timed-out-transaction scans.
TXN_OVERRIDES = {
    **GROUP_OVERRIDES,
    "offsets.topic.num.partitions": "4",
    "transaction.state.log.num.partitions": "4",
    "transaction.abort.timed.out.transaction.cleanup.interval.ms": "500",
    "transaction.max.timeout.ms": "900000",
}
COMMIT, ABORT = 1, 0  # control record types (key: version i16, type i16)
T_BASE = TIMESTAMP_BASE_MS
CODECS = {"gzip": 1, "snappy": 2, "lz4": 3, "zstd": 4}  # RecordBatch attributes


@pytest.fixture(scope="module")
def txn_broker():
    with BrokerProcess(overrides=TXN_OVERRIDES) as proc:
        yield proc


@pytest.fixture
def own_txn_broker():
    """A broker of the test's own, for tests that kill it."""
    with BrokerProcess(overrides=TXN_OVERRIDES) as proc:
        yield proc


# --- helpers ------------------------------------------------------------------------------------
def txn_producer(bootstrap: str, transactional_id: str, **conf) -> Producer:
    return Producer({"bootstrap.servers": bootstrap, "transactional.id": transactional_id,
                     "linger.ms": 5, "reconnect.backoff.max.ms": 200, **conf})


def read_to_end(bootstrap: str, topic: str, partitions, committed: bool = True,
                timeout: float = 20.0, **conf) -> dict[int, list[Message]]:
    """Every message of `partitions` from offset 0 until the consumer reports the end of each
    partition (the high watermark for read_uncommitted, the LSO for read_committed)."""
    partitions = list(partitions)
    c = consumer(bootstrap, **{"isolation.level": "read_committed" if committed else "read_uncommitted",
                               "enable.partition.eof": True, **conf})
    out: dict[int, list[Message]] = {p: [] for p in partitions}
    pending = set(partitions)
    try:
        c.assign([TopicPartition(topic, p, 0) for p in partitions])
        deadline = time.monotonic() + timeout
        while pending and time.monotonic() < deadline:
            msg = c.poll(0.2)
            if msg is None:
                continue
            err = msg.error()
            if err is not None:
                assert err.code() == KafkaError._PARTITION_EOF, f"consumer error: {err}"
                pending.discard(msg.partition())
                continue
            out[msg.partition()].append(msg)
        assert not pending, f"partitions {sorted(pending)} never reached their end in {timeout} s"
        return out
    finally:
        c.close()


def values(msgs: list[Message]) -> list[str]:
    return [m.value().decode() for m in msgs]


def offsets(msgs: list[Message]) -> list[int]:
    return [m.offset() for m in msgs]


def list_offset(bootstrap: str, topic: str, partition: int, isolation: int, timestamp: int = -1) -> int:
    """ListOffsets v5 (latest by default) with the given isolation level."""
    body = wire_call(bootstrap, LIST_OFFSETS, 5, {
        "replica_id": -1, "isolation_level": isolation,
        "topics": [{"name": topic, "partitions": [
            {"partition_index": partition, "current_leader_epoch": -1, "timestamp": timestamp}]}]})
    p = body.topics[0].partitions[0]
    assert p.error_code == 0, p.error_code
    return p.offset


def raw_fetch(bootstrap: str, topic: str, partition: int, isolation: int, offset: int = 0):
    """The partition data of a Fetch v4 (has last_stable_offset and aborted_transactions)."""
    body = wire_call(bootstrap, FETCH, 4, {
        "replica_id": -1, "max_wait_ms": 0, "min_bytes": 0, "max_bytes": 64 << 20,
        "isolation_level": isolation,
        "topics": [{"topic": topic, "partitions": [
            {"partition": partition, "fetch_offset": offset, "partition_max_bytes": 64 << 20}]}]})
    data = body.responses[0].partitions[0]
    assert data.error_code == 0, data.error_code
    return data


def control_markers(bootstrap: str, topic: str, partition: int) -> list[tuple[int, int]]:
    """(offset, type) of every control record of the partition, read raw (read_uncommitted)."""
    data = raw_fetch(bootstrap, topic, partition, isolation=0)
    buf, pos, out = data.records or b"", 0, []
    while pos < len(buf):
        header = rec.read_header(buf, pos)
        if header.is_control:
            for r in rec.iter_records(buf, pos):
                version, kind = struct.unpack(">hh", r.key)
                assert version == 0
                out.append((r.offset, kind))
        pos += header.size
    return out


def describe_txn(bootstrap: str, transactional_id: str):
    body = wire_call(bootstrap, DESCRIBE_TRANSACTIONS, 0, {"transactional_ids": [transactional_id]})
    assert len(body.transaction_states) == 1
    return body.transaction_states[0]


def list_txns(bootstrap: str, states: list[str] | None = None, producer_ids: list[int] | None = None):
    return wire_call(bootstrap, LIST_TRANSACTIONS, 0, {"state_filters": states or [],
                                                       "producer_id_filters": producer_ids or []})


def init_producer_id_raw(bootstrap: str, transactional_id: str, timeout_ms: int):
    """InitProducerId v4, retried while the coordinator is loading or moving."""
    def call():
        body = wire_call(bootstrap, INIT_PRODUCER_ID, 4, {
            "transactional_id": transactional_id, "transaction_timeout_ms": timeout_ms,
            "producer_id": -1, "producer_epoch": -1})
        return None if body.error_code in RETRIABLE_COORDINATOR else body
    return wait_for(call, timeout=15, what="InitProducerId past coordinator loading")


def fenced(exc: KafkaException) -> bool:
    err = exc.args[0]
    return err.fatal() or err.code() in (KafkaError._FENCED, KafkaError.PRODUCER_FENCED,
                                         KafkaError.INVALID_PRODUCER_EPOCH)


# --- confluent-kafka ----------------------------------------------------------------------------
def test_confluent_commit_and_abort_read_committed_and_uncommitted(txn_broker, topic):
    bs = txn_broker.bootstrap
    create_topic(bs, topic, partitions=3)
    producer = txn_producer(bs, unique_name("txn-ck"))
    producer.init_transactions(30)

    def send(tag: str, n: int) -> None:
        for p in range(3):
            for i in range(n):
                producer.produce(topic, value=f"{tag}-{p}-{i}".encode(), partition=p)

    producer.begin_transaction()
    send("c1", 5)
    producer.commit_transaction(30)
    producer.begin_transaction()
    send("ab", 3)
    assert producer.flush(30) == 0  # the aborted records really are in the log
    producer.abort_transaction(30)
    producer.begin_transaction()
    send("c2", 2)
    producer.commit_transaction(30)

    committed = read_to_end(bs, topic, range(3), committed=True)
    uncommitted = read_to_end(bs, topic, range(3), committed=False)
    for p in range(3):
        c1 = [f"c1-{p}-{i}" for i in range(5)]
        ab = [f"ab-{p}-{i}" for i in range(3)]
        c2 = [f"c2-{p}-{i}" for i in range(2)]
        # c1 at 0-4, COMMIT marker at 5, ab at 6-8, ABORT marker at 9, c2 at 10-11, COMMIT at 12
        assert values(committed[p]) == c1 + c2
        assert offsets(committed[p]) == [0, 1, 2, 3, 4, 10, 11]
        assert values(uncommitted[p]) == c1 + ab + c2
        assert offsets(uncommitted[p]) == [0, 1, 2, 3, 4, 6, 7, 8, 10, 11]
        assert control_markers(bs, topic, p) == [(5, COMMIT), (9, ABORT), (12, COMMIT)]
        assert watermarks(bs, topic, p) == (0, 13)
        assert list_offset(bs, topic, p, isolation=1) == 13  # nothing open: LSO == high watermark
        assert list_offset(bs, topic, p, isolation=0) == 13
        batches = stored_batches(bs, topic, p)
        assert all(b.is_transactional for b in batches)
        assert [b.base_offset for b in batches if b.is_control] == [5, 9, 12]
        pid = batches[0].producer_id
        assert pid >= 0 and {b.producer_id for b in batches} == {pid}
        data = raw_fetch(bs, topic, p, isolation=1)
        assert data.last_stable_offset == 13 and data.high_watermark == 13
        assert [(a.producer_id, a.first_offset) for a in data.aborted_transactions or []] == [(pid, 6)]
        assert not raw_fetch(bs, topic, p, isolation=0).aborted_transactions  # only for read_committed


@pytest.mark.parametrize("codec", ["gzip", "snappy", "lz4", "zstd"])
def test_compressed_transactions(txn_broker, topic, codec):
    bs = txn_broker.bootstrap
    create_topic(bs, topic, partitions=2)
    producer = txn_producer(bs, unique_name(f"txn-{codec}"), **{"compression.codec": codec})
    producer.init_transactions(30)
    for t, commit in enumerate((True, False, True)):
        producer.begin_transaction()
        for i in range(50):
            producer.produce(topic, value=b"%d-%d-" % (t, i) + b"z" * 50, partition=i % 2)
        assert producer.flush(30) == 0
        (producer.commit_transaction if commit else producer.abort_transaction)(30)
    got = read_to_end(bs, topic, range(2), committed=True)
    for p in range(2):
        assert [v.split("-")[:2] for v in values(got[p])] == \
            [[str(t), str(i)] for t in (0, 2) for i in range(p, 50, 2)]
        batches = stored_batches(bs, topic, p)
        assert {b.compression for b in batches if not b.is_control} == {CODECS[codec]}
        assert [kind for _, kind in control_markers(bs, topic, p)] == [COMMIT, ABORT, COMMIT]


def test_read_committed_stops_at_open_transaction_lso(txn_broker, topic):
    bs = txn_broker.bootstrap
    create_topic(bs, topic, partitions=1)
    producer = txn_producer(bs, unique_name("txn-lso"))
    producer.init_transactions(30)
    producer.begin_transaction()
    for i in range(3):
        producer.produce(topic, value=b"txn-%d" % i, partition=0, timestamp=T_BASE + i)
    assert producer.flush(30) == 0
    # Records after the open transaction (not transactional): read_committed must not pass it.
    ck_produce(bs, topic, [Rec(b"plain-%d" % i, partition=0) for i in range(2)])

    assert read_to_end(bs, topic, [0], committed=True) == {0: []}
    assert values(read_to_end(bs, topic, [0], committed=False)[0]) == ["txn-0", "txn-1", "txn-2",
                                                                         "plain-0", "plain-1"]
    assert list_offset(bs, topic, 0, isolation=1) == 0  # the LSO: first offset of the open txn
    assert list_offset(bs, topic, 0, isolation=0) == 5
    # by timestamp: read_committed finds nothing at or above the LSO (Kafka answers offset -1)
    assert list_offset(bs, topic, 0, isolation=1, timestamp=T_BASE + 1) == -1
    assert list_offset(bs, topic, 0, isolation=0, timestamp=T_BASE + 1) == 1
    data = raw_fetch(bs, topic, 0, isolation=1)
    assert (data.high_watermark, data.last_stable_offset) == (5, 0)
    c = consumer(bs, **{"isolation.level": "read_committed"})
    try:
        assert c.get_watermark_offsets(TopicPartition(topic, 0), timeout=10) == (0, 0)
    finally:
        c.close()

    producer.commit_transaction(30)
    committed = read_to_end(bs, topic, [0], committed=True)[0]
    assert values(committed) == ["txn-0", "txn-1", "txn-2", "plain-0", "plain-1"]
    assert offsets(committed) == [0, 1, 2, 3, 4]
    assert control_markers(bs, topic, 0) == [(5, COMMIT)]
    assert list_offset(bs, topic, 0, isolation=1) == 6
    assert list_offset(bs, topic, 0, isolation=1, timestamp=T_BASE + 1) == 1
    assert raw_fetch(bs, topic, 0, isolation=1).last_stable_offset == 6


def test_interleaved_transactions_lso_and_aborted_index(txn_broker, topic):
    """Two producers' transactions interleaved in one partition: the LSO is the first offset of
    the earliest open one, and a read_committed fetch that starts inside an aborted transaction
    still learns it was aborted."""
    bs = txn_broker.bootstrap
    create_topic(bs, topic, partitions=1)
    a = txn_producer(bs, unique_name("txn-a"), **{"linger.ms": 0})
    b = txn_producer(bs, unique_name("txn-b"), **{"linger.ms": 0})
    a.init_transactions(30)
    b.init_transactions(30)
    a.begin_transaction()
    b.begin_transaction()

    def write(producer: Producer, value: bytes) -> None:
        producer.produce(topic, value=value, partition=0)
        assert producer.flush(30) == 0

    write(a, b"a1")  # 0
    write(b, b"b1")  # 1
    write(a, b"a2")  # 2
    write(b, b"b2")  # 3
    assert list_offset(bs, topic, 0, isolation=1) == 0
    b.commit_transaction(30)  # COMMIT marker at 4; a is still open at 0
    assert list_offset(bs, topic, 0, isolation=1) == 0
    assert read_to_end(bs, topic, [0], committed=True) == {0: []}
    write(a, b"a3")  # 5
    a.abort_transaction(30)  # ABORT marker at 6
    assert list_offset(bs, topic, 0, isolation=1) == 7

    got = read_to_end(bs, topic, [0], committed=True)[0]
    assert [(m.offset(), m.value()) for m in got] == [(1, b"b1"), (3, b"b2")]
    assert control_markers(bs, topic, 0) == [(4, COMMIT), (6, ABORT)]
    a_pid = stored_batches(bs, topic, 0)[0].producer_id
    for start in (0, 2, 3, 5):  # a fetch from inside the aborted transaction
        data = raw_fetch(bs, topic, 0, isolation=1, offset=start)
        assert [(t.producer_id, t.first_offset) for t in data.aborted_transactions or []] == [(a_pid, 0)], start
    assert not raw_fetch(bs, topic, 0, isolation=1, offset=7).aborted_transactions
    c = consumer(bs, **{"isolation.level": "read_committed", "enable.partition.eof": True})
    try:
        c.assign([TopicPartition(topic, 0, 2)])
        seen = []
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            msg = c.poll(0.2)
            if msg is None:
                continue
            if msg.error() is not None:
                assert msg.error().code() == KafkaError._PARTITION_EOF, msg.error()
                break
            seen.append(msg.value())
        assert seen == [b"b2"]
    finally:
        c.close()


def test_many_concurrent_producers_commit_and_abort(txn_broker, topic):
    """8 transactional producers in threads, 15 transactions each over 3 partitions, every third
    aborted: read_committed returns exactly the committed records, each producer's in order."""
    import threading

    bs = txn_broker.bootstrap
    create_topic(bs, topic, partitions=3)
    errors: list[BaseException] = []

    def run(n: int) -> None:
        try:
            producer = txn_producer(bs, unique_name(f"txn-many-{n}"), **{"linger.ms": 1})
            producer.init_transactions(30)
            for t in range(15):
                producer.begin_transaction()
                for i in range(9):
                    producer.produce(topic, value=f"{n}:{t}:{i}".encode(), partition=i % 3)
                if t % 3 == 2:
                    assert producer.flush(30) == 0
                    producer.abort_transaction(30)
                else:
                    producer.commit_transaction(30)
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=run, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors[:3]

    committed = read_to_end(bs, topic, range(3), committed=True)
    uncommitted = read_to_end(bs, topic, range(3), committed=False)
    for p in range(3):
        for n in range(8):
            mine = [v for v in values(committed[p]) if v.startswith(f"{n}:")]
            assert mine == [f"{n}:{t}:{i}" for t in range(15) if t % 3 != 2 for i in range(p, 9, 3)]
        assert len(uncommitted[p]) == 8 * 15 * 3
        assert list_offset(bs, topic, p, isolation=1) == list_offset(bs, topic, p, isolation=0) \
            == 8 * 15 * 3 + 8 * 15  # records + one marker per transaction


def test_aborted_transactions_survive_restarts_and_segment_rolls(own_txn_broker, topic):
    """The aborted-transaction index (`.txnindex`) comes back after kill -9 and after a clean
    stop, also for transactions that span segments."""
    broker = own_txn_broker
    bs = broker.bootstrap
    create_topic(bs, topic, partitions=1, config={"segment.bytes": "2048"})
    producer = txn_producer(bs, unique_name("txn-segments"), **{"linger.ms": 0})
    producer.init_transactions(30)
    expected = []
    for t in range(8):
        producer.begin_transaction()
        for i in range(6):
            producer.produce(topic, value=b"t%d-%d-" % (t, i) + b"x" * 200, partition=0)
            producer.poll(0)
        if t % 2:
            assert producer.flush(30) == 0
            producer.abort_transaction(30)
        else:
            producer.commit_transaction(30)
            expected += [f"t{t}-{i}-" + "x" * 200 for i in range(6)]
    del producer

    pid = stored_batches(bs, topic, 0)[0].producer_id

    def check() -> None:
        assert values(read_to_end(bs, topic, [0], committed=True)[0]) == expected
        assert len(read_to_end(bs, topic, [0], committed=False)[0]) == 8 * 6
        assert list_offset(bs, topic, 0, isolation=1) == list_offset(bs, topic, 0, isolation=0) == 8 * 7
        for t in range(1, 8, 2):  # a fetch from the middle of each aborted transaction
            data = raw_fetch(bs, topic, 0, isolation=1, offset=t * 7 + 3)
            assert (pid, t * 7) in [(a.producer_id, a.first_offset) for a in data.aborted_transactions or []], t

    check()
    segments = list((broker.data_dir / "logs" / f"{topic}-0").glob("*.log"))
    assert len(segments) > 3, "the transactions should span several segments"
    broker.kill()
    broker.restart()
    check()
    assert broker.stop() == 0
    # Kafka's .txnindex layout: entries of version i16, producer id, first offset, last offset
    # (the ABORT marker), last stable offset (i64s), in the segment holding the marker.
    entries = set()
    for index in (broker.data_dir / "logs" / f"{topic}-0").glob("*.txnindex"):
        data = index.read_bytes()
        assert len(data) % 34 == 0, index.name
        for i in range(0, len(data), 34):
            version, entry_pid, first, last, _ = struct.unpack_from(">hqqqq", data, i)
            assert version == 0
            entries.add((entry_pid, first, last))
    assert entries == {(pid, t * 7, t * 7 + 6) for t in range(1, 8, 2)}
    broker.restart()
    check()


@pytest.fixture
def cleaner_txn_broker():
    with BrokerProcess(overrides={**TXN_OVERRIDES, "log.cleaner.backoff.ms": "100",
                                  "log.retention.check.interval.ms": "200"}) as proc:
        yield proc


def test_compaction_drops_aborted_records_and_never_cleans_an_open_transaction(cleaner_txn_broker, topic):
    """On a compacted topic an aborted write must not count as a key's latest value, and the
    cleaner must leave an undecided transaction alone: once it commits, its values win."""
    broker = cleaner_txn_broker
    bs = broker.bootstrap
    create_topic(bs, topic, partitions=1, config={"cleanup.policy": "compact", "segment.bytes": "8192",
                                                  "min.cleanable.dirty.ratio": "0.01",
                                                  "delete.retention.ms": "1000"})
    producer = txn_producer(bs, unique_name("txn-compact"))
    producer.init_transactions(30)
    pad = b"." * 100

    def txn(tag: str, keys: range, commit: bool) -> None:
        producer.begin_transaction()
        for k in keys:
            producer.produce(topic, key=b"k%d" % k, value=tag.encode() + pad, partition=0)
        assert producer.flush(30) == 0
        (producer.commit_transaction if commit else producer.abort_transaction)(30)

    def roll(tag: str) -> None:  # a record larger than segment.bytes rolls the segment
        ck_produce(bs, topic, [Rec(b"x" * 9000, b"sentinel-" + tag.encode(), partition=0)])

    def view(committed: bool) -> dict[bytes, bytes]:
        latest: dict[bytes, bytes] = {}
        for m in read_to_end(bs, topic, [0], committed=committed)[0]:
            if not m.key().startswith(b"sentinel"):
                latest[m.key()] = m.value()[:2]
        return latest

    txn("c1", range(50), commit=True)
    txn("ab", range(50), commit=False)
    txn("c3", range(25), commit=True)
    expected = {b"k%d" % k: (b"c3" if k < 25 else b"c1") for k in range(50)}
    # Open transaction over k0..k9, then enough writes to roll segments and start cleaning.
    producer.begin_transaction()
    for k in range(10):
        producer.produce(topic, key=b"k%d" % k, value=b"t4" + pad, partition=0)
    assert producer.flush(30) == 0
    roll("a")
    roll("b")

    def cleaned_without_aborted() -> bool:
        raw = read_to_end(bs, topic, [0], committed=False)[0]
        keys = [m.key() for m in raw if not m.key().startswith(b"sentinel")]
        return not any(m.value().startswith(b"ab") for m in raw) and len(keys) < 50 + 50 + 25 + 10
    wait_for(cleaned_without_aborted, timeout=30, interval=0.3, what="a cleaning pass dropping aborted records")
    assert view(committed=True) == expected
    raw = view(committed=False)
    assert all(raw[b"k%d" % k] == b"t4" for k in range(10)), "the open transaction was cleaned away"

    producer.commit_transaction(30)
    roll("c")
    expected.update({b"k%d" % k: b"t4" for k in range(10)})
    wait_for(lambda: view(committed=True) == expected, timeout=30, interval=0.3,
             what="the committed transaction's values to be the latest")
    assert view(committed=False) == expected
    assert "Traceback" not in broker.log_text()


def test_commit_after_a_topic_of_the_transaction_was_deleted(txn_broker, topic):
    """A topic deleted while a transaction writes to it: the commit still completes (Kafka
    drops the markers of partitions that no longer exist) and the other topic's records are
    committed."""
    bs = txn_broker.bootstrap
    keep, drop = topic + "-keep", topic + "-drop"
    create_topic(bs, keep, partitions=1)
    create_topic(bs, drop, partitions=1)
    tid = unique_name("txn-deleted-topic")
    producer = txn_producer(bs, tid)
    producer.init_transactions(30)
    producer.begin_transaction()
    producer.produce(keep, value=b"kept", partition=0)
    producer.produce(drop, value=b"dropped", partition=0)
    assert producer.flush(30) == 0
    client = admin(bs)
    client.delete_topics([drop], operation_timeout=10)[drop].result(15)
    producer.commit_transaction(30)
    wait_for(lambda: describe_txn(bs, tid).transaction_state == "CompleteCommit", timeout=15,
             what="the commit to complete without the deleted topic")
    assert values(read_to_end(bs, keep, [0], committed=True)[0]) == ["kept"]
    assert control_markers(bs, keep, 0) == [(1, COMMIT)]
    producer.begin_transaction()  # the transactional id is usable again
    producer.produce(keep, value=b"next", partition=0)
    producer.commit_transaction(30)
    assert values(read_to_end(bs, keep, [0], committed=True)[0]) == ["kept", "next"]


def test_confluent_zombie_is_fenced_and_its_transaction_aborted(txn_broker, topic):
    bs = txn_broker.bootstrap
    create_topic(bs, topic, partitions=2)
    tid = unique_name("txn-zombie")
    zombie = txn_producer(bs, tid)
    zombie.init_transactions(30)
    zombie.begin_transaction()
    for i in range(4):
        zombie.produce(topic, value=b"zombie-%d" % i, partition=i % 2)
    assert zombie.flush(30) == 0

    successor = txn_producer(bs, tid)
    successor.init_transactions(30)  # bumps the epoch and aborts the zombie's open transaction
    with pytest.raises(KafkaException) as raised:
        zombie.produce(topic, value=b"zombie-late", partition=0)
        zombie.flush(10)
        zombie.commit_transaction(10)
    assert fenced(raised.value), raised.value.args[0]

    successor.begin_transaction()
    for i in range(4):
        successor.produce(topic, value=b"ok-%d" % i, partition=i % 2)
    successor.commit_transaction(30)

    committed = read_to_end(bs, topic, range(2), committed=True)
    assert sorted(values(committed[0] + committed[1])) == ["ok-0", "ok-1", "ok-2", "ok-3"]
    uncommitted = read_to_end(bs, topic, range(2), committed=False)
    seen = values(uncommitted[0] + uncommitted[1])
    assert "zombie-late" not in seen
    assert sorted(v for v in seen if v.startswith("zombie")) == ["zombie-0", "zombie-1", "zombie-2", "zombie-3"]
    for p in range(2):
        assert [kind for _, kind in control_markers(bs, topic, p)] == [ABORT, COMMIT]
        assert list_offset(bs, topic, p, isolation=1) == list_offset(bs, topic, p, isolation=0)
    state = describe_txn(bs, tid)
    assert state.error_code == 0 and state.transaction_state == "CompleteCommit"


def test_send_offsets_to_transaction_visible_only_on_commit(txn_broker, topic):
    bs = txn_broker.bootstrap
    source, sink, group = topic + "-in", topic + "-out", unique_name("txn-group")
    create_topic(bs, source, partitions=2)
    create_topic(bs, sink, partitions=2)
    ck_produce(bs, source, [Rec(b"in-%d-%d" % (p, i), partition=p) for p in range(2) for i in range(10)])

    reader = consumer(bs, **{"group.id": group, "isolation.level": "read_committed"})
    # librdkafka's default is read_committed, whose OffsetFetch sets require_stable and retries
    # UNSTABLE_OFFSET_COMMIT: the observer is read_uncommitted to see what is committed now.
    observer = consumer(bs, **{"group.id": group, "isolation.level": "read_uncommitted"})
    producer = txn_producer(bs, unique_name("txn-cp"))
    try:
        reader.commit(offsets=[TopicPartition(source, p, 2) for p in range(2)], asynchronous=False)
        producer.init_transactions(30)
        reader.assign([TopicPartition(source, p, 2) for p in range(2)])
        got = []
        deadline = time.monotonic() + 20
        while len(got) < 16 and time.monotonic() < deadline:
            msg = reader.poll(0.2)
            if msg is not None and msg.error() is None:
                got.append(msg)
        assert len(got) == 16

        def committed() -> list[int]:
            return [tp.offset for tp in observer.committed([TopicPartition(source, p) for p in range(2)],
                                                           timeout=10)]

        producer.begin_transaction()
        for msg in got:
            producer.produce(sink, value=msg.value().replace(b"in", b"out"), partition=msg.partition())
        producer.send_offsets_to_transaction([TopicPartition(source, p, 10) for p in range(2)],
                                             reader.consumer_group_metadata(), 30)
        assert committed() == [2, 2]  # pending transactional offsets are not visible yet
        stable = wire_call(bs, OFFSET_FETCH, 7, {"group_id": group, "require_stable": True,
                                                 "topics": [{"name": source, "partition_indexes": [0, 1]}]})
        assert [p.error_code for p in stable.topics[0].partitions] == [UNSTABLE_OFFSET_COMMIT] * 2
        producer.commit_transaction(30)
        assert committed() == [10, 10]
        stable = wire_call(bs, OFFSET_FETCH, 7, {"group_id": group, "require_stable": True,
                                                 "topics": [{"name": source, "partition_indexes": [0, 1]}]})
        assert [(p.error_code, p.committed_offset) for p in stable.topics[0].partitions] == [(0, 10)] * 2

        producer.begin_transaction()
        producer.produce(sink, value=b"never", partition=0)
        producer.send_offsets_to_transaction([TopicPartition(source, p, 7) for p in range(2)],
                                             reader.consumer_group_metadata(), 30)
        producer.abort_transaction(30)
        assert committed() == [10, 10]
        assert [tp.offset for tp in reader.committed([TopicPartition(source, p) for p in range(2)],
                                                     timeout=10)] == [10, 10]
    finally:
        reader.close()
        observer.close()

    out = read_to_end(bs, sink, range(2), committed=True)
    for p in range(2):
        assert values(out[p]) == [f"out-{p}-{i}" for i in range(2, 10)]


def test_a_commit_with_offsets_found_prepared_at_start_is_finished(own_txn_broker, topic):
    """A broker killed between a transaction's PREPARE_COMMIT and its COMPLETE_COMMIT finishes
    it at start-up: markers on every partition, __consumer_offsets among them, whose offsets
    the group coordinator then applies. It did not start: the markers were written before the
    group coordinator was in place. The state log's last record (COMPLETE_COMMIT) is cut off
    after the kill, which leaves the transaction as such a kill does."""
    from strom.coordinator import TRANSACTION_STATE_TOPIC, partition_for
    from strom.log import Log, LogConfig

    broker = own_txn_broker
    bs = broker.bootstrap
    source, sink, group = topic + "-in", topic + "-out", unique_name("txn-group")
    create_topic(bs, source, partitions=1)
    create_topic(bs, sink, partitions=1)
    tid = unique_name("txn-prepared")
    reader = consumer(bs, **{"group.id": group})
    producer = txn_producer(bs, tid)
    try:
        producer.init_transactions(30)
        producer.begin_transaction()
        producer.produce(sink, value=b"copied", partition=0)
        producer.send_offsets_to_transaction([TopicPartition(source, 0, 5)], reader.consumer_group_metadata(), 30)
        producer.commit_transaction(30)
    finally:
        reader.close()
    broker.kill()
    state_partition = partition_for(tid, int(TXN_OVERRIDES["transaction.state.log.num.partitions"]))
    state_log = Log.open(broker.data_dir / "logs" / f"{TRANSACTION_STATE_TOPIC}-{state_partition}", LogConfig())
    state_log.truncate_to(state_log.log_end_offset - 1)  # the COMPLETE_COMMIT record
    state_log.close()
    broker.restart()
    assert describe_txn(bs, tid).transaction_state == "CompleteCommit"
    observer = consumer(bs, **{"group.id": group, "isolation.level": "read_uncommitted"})
    try:
        assert [tp.offset for tp in observer.committed([TopicPartition(source, 0)], timeout=10)] == [5]
    finally:
        observer.close()
    assert values(read_to_end(bs, sink, [0], committed=True)[0]) == ["copied"]


def test_transaction_timeout_aborts_and_lso_moves_on(txn_broker, topic):
    bs = txn_broker.bootstrap
    create_topic(bs, topic, partitions=1)
    tid = unique_name("txn-timeout")
    producer = txn_producer(bs, tid, **{"transaction.timeout.ms": 2000})
    producer.init_transactions(30)
    producer.begin_transaction()
    for i in range(3):
        producer.produce(topic, value=b"stale-%d" % i, partition=0)
    assert producer.flush(30) == 0
    first = describe_txn(bs, tid)
    assert (first.transaction_state, first.transaction_timeout_ms) == ("Ongoing", 2000)
    assert list_offset(bs, topic, 0, isolation=1) == 0

    # The producer goes silent; the coordinator must abort (and write the ABORT marker at 3).
    wait_for(lambda: list_offset(bs, topic, 0, isolation=1) == 4, timeout=20,
             what="the LSO to move past the timed-out transaction")
    assert control_markers(bs, topic, 0) == [(3, ABORT)]
    state = describe_txn(bs, tid)
    assert state.transaction_state == "CompleteAbort"
    assert state.producer_epoch > first.producer_epoch  # the timeout fences the silent producer
    assert read_to_end(bs, topic, [0], committed=True) == {0: []}
    ck_produce(bs, topic, [Rec(b"after", partition=0)])
    assert values(read_to_end(bs, topic, [0], committed=True)[0]) == ["after"]

    with pytest.raises(KafkaException) as raised:
        producer.commit_transaction(10)
    err = raised.value.args[0]
    assert fenced(raised.value) or err.txn_requires_abort(), err
    assert read_to_end(bs, topic, [0], committed=True)[0][0].offset() == 4


def test_transaction_timeout_above_max_is_rejected(txn_broker):
    bs = txn_broker.bootstrap
    body = init_producer_id_raw(bs, unique_name("txn-max"), 900_001)
    assert (body.error_code, body.producer_id) == (INVALID_TRANSACTION_TIMEOUT, -1)
    body = init_producer_id_raw(bs, unique_name("txn-max"), 900_000)
    assert body.error_code == 0 and body.producer_id >= 0 and body.producer_epoch == 0
    body = init_producer_id_raw(bs, unique_name("txn-max"), 0)
    assert body.error_code == INVALID_TRANSACTION_TIMEOUT

    producer = txn_producer(bs, unique_name("txn-max-ck"), **{"transaction.timeout.ms": 900_001})
    with pytest.raises(KafkaException) as raised:
        producer.init_transactions(15)
    assert raised.value.args[0].code() == KafkaError.INVALID_TRANSACTION_TIMEOUT, raised.value.args[0]


def test_coordinator_kill_9_completes_committed_and_aborts_open(own_txn_broker, topic):
    broker = own_txn_broker
    bs = broker.bootstrap
    create_topic(bs, topic, partitions=2)
    tid = unique_name("txn-crash")

    producer = txn_producer(bs, tid)
    producer.init_transactions(30)
    producer.begin_transaction()
    for i in range(10):
        producer.produce(topic, value=b"committed-%d" % i, partition=i % 2)
    producer.commit_transaction(30)
    broker.kill()  # right after EndTxn: the markers may or may not be written yet
    del producer
    broker.restart()

    def committed_seen():
        got = read_to_end(bs, topic, range(2), committed=True)
        return sorted(values(got[0] + got[1])) if got[0] and got[1] else None
    assert wait_for(committed_seen, timeout=20, what="the committed transaction after restart") == \
        sorted(f"committed-{i}" for i in range(10))
    for p in range(2):
        assert control_markers(bs, topic, p) == [(5, COMMIT)]

    # An open transaction at the crash: after restart the coordinator still knows it; the next
    # producer with the same id aborts it.
    producer = txn_producer(bs, tid)
    producer.init_transactions(30)
    producer.begin_transaction()
    for i in range(4):
        producer.produce(topic, value=b"open-%d" % i, partition=i % 2)
    assert producer.flush(30) == 0
    broker.kill()
    del producer
    broker.restart()
    assert list_offset(bs, topic, 0, isolation=1) == 6  # still open: the LSO holds

    producer = txn_producer(bs, tid)
    producer.init_transactions(30)
    producer.begin_transaction()
    producer.produce(topic, value=b"after", partition=0)
    producer.commit_transaction(30)
    got = read_to_end(bs, topic, range(2), committed=True)
    assert values(got[0]) == [f"committed-{i}" for i in range(0, 10, 2)] + ["after"]
    assert values(got[1]) == [f"committed-{i}" for i in range(1, 10, 2)]
    assert [kind for _, kind in control_markers(bs, topic, 0)] == [COMMIT, ABORT, COMMIT]
    assert [kind for _, kind in control_markers(bs, topic, 1)] == [COMMIT, ABORT]
    assert "Traceback" not in broker.log_text()


def test_transaction_timeout_still_applies_after_kill_9(own_txn_broker, topic):
    """A transaction left open across a crash, whose producer never comes back, is aborted by
    the restarted coordinator once its timeout has passed."""
    broker = own_txn_broker
    bs = broker.bootstrap
    create_topic(bs, topic, partitions=2)
    tid = unique_name("txn-orphan")
    producer = txn_producer(bs, tid, **{"transaction.timeout.ms": 2000})
    producer.init_transactions(30)
    producer.begin_transaction()
    for i in range(4):
        producer.produce(topic, value=b"orphan-%d" % i, partition=i % 2)
    assert producer.flush(30) == 0
    broker.kill()
    producer.purge()
    del producer
    broker.restart()
    assert describe_txn(bs, tid).transaction_state == "Ongoing"
    wait_for(lambda: describe_txn(bs, tid).transaction_state == "CompleteAbort", timeout=20,
             what="the restarted coordinator to abort the orphaned transaction")
    for p in range(2):
        wait_for(lambda p=p: list_offset(bs, topic, p, isolation=1) == 3, timeout=10,
                 what=f"the LSO of partition {p} to pass the ABORT marker")
        assert control_markers(bs, topic, p) == [(2, ABORT)]
    assert read_to_end(bs, topic, range(2), committed=True) == {0: [], 1: []}


def test_open_transaction_survives_a_clean_stop(own_txn_broker, topic):
    """SIGTERM with a transaction open: the producer state written at shutdown must keep the
    transaction's first offset, so the LSO still holds after the restart until it is aborted."""
    broker = own_txn_broker
    bs = broker.bootstrap
    create_topic(bs, topic, partitions=1)
    ck_produce(bs, topic, [Rec(b"before", partition=0)])
    tid = unique_name("txn-clean-stop")
    producer = txn_producer(bs, tid)
    producer.init_transactions(30)
    producer.begin_transaction()
    producer.produce(topic, value=b"open", partition=0)
    assert producer.flush(30) == 0
    ck_produce(bs, topic, [Rec(b"after", partition=0)])
    assert list_offset(bs, topic, 0, isolation=1) == 1
    assert broker.stop() == 0
    producer.purge()
    del producer
    broker.restart()
    assert list_offset(bs, topic, 0, isolation=0) == 3
    assert list_offset(bs, topic, 0, isolation=1) == 1
    assert values(read_to_end(bs, topic, [0], committed=True)[0]) == ["before"]
    assert describe_txn(bs, tid).transaction_state == "Ongoing"

    successor = txn_producer(bs, tid)
    successor.init_transactions(30)  # aborts the open transaction
    assert list_offset(bs, topic, 0, isolation=1) == 4
    assert values(read_to_end(bs, topic, [0], committed=True)[0]) == ["before", "after"]
    assert control_markers(bs, topic, 0) == [(3, ABORT)]


@pytest.fixture
def expiring_broker():
    with BrokerProcess(overrides={**TXN_OVERRIDES, "transactional.id.expiration.ms": "1500",
                                  "transaction.remove.expired.transaction.cleanup.interval.ms": "300"}) as proc:
        yield proc


def test_transactional_id_expiration(expiring_broker, topic):
    """transactional.id.expiration.ms forgets idle, finished transactional ids (a tombstone in
    __transaction_state, so also after kill -9) but never an open transaction."""
    broker = expiring_broker
    bs = broker.bootstrap
    create_topic(bs, topic, partitions=1)
    idle, busy = unique_name("txn-idle"), unique_name("txn-busy")
    done = txn_producer(bs, idle)
    done.init_transactions(30)
    done.begin_transaction()
    done.produce(topic, value=b"done", partition=0)
    done.commit_transaction(30)
    old_pid = describe_txn(bs, idle).producer_id
    open_ = txn_producer(bs, busy)
    open_.init_transactions(30)
    open_.begin_transaction()
    open_.produce(topic, value=b"open", partition=0)
    assert open_.flush(30) == 0

    wait_for(lambda: describe_txn(bs, idle).error_code == TRANSACTIONAL_ID_NOT_FOUND, timeout=15,
             what="the idle transactional id to expire")
    assert describe_txn(bs, busy).transaction_state == "Ongoing"
    assert idle not in {t.transactional_id for t in list_txns(bs).transaction_states}
    broker.kill()
    broker.restart()
    assert describe_txn(bs, idle).error_code == TRANSACTIONAL_ID_NOT_FOUND
    assert describe_txn(bs, busy).transaction_state == "Ongoing"

    again = txn_producer(bs, idle)
    again.init_transactions(30)
    state = describe_txn(bs, idle)
    assert state.error_code == 0 and state.producer_id != old_pid and state.producer_epoch == 0
    open_.purge()
    successor = txn_producer(bs, busy)
    successor.init_transactions(30)  # aborts the open one
    assert values(read_to_end(bs, topic, [0], committed=True)[0]) == ["done"]


def test_describe_and_list_transactions(txn_broker, topic):
    bs = txn_broker.bootstrap
    create_topic(bs, topic, partitions=2)
    tid = unique_name("txn-admin")
    producer = txn_producer(bs, tid, **{"transaction.timeout.ms": 45000})
    producer.init_transactions(30)
    empty = describe_txn(bs, tid)
    assert (empty.error_code, empty.transaction_state, list(empty.topics)) == (0, "Empty", [])

    producer.begin_transaction()
    producer.produce(topic, value=b"a", partition=0)
    producer.produce(topic, value=b"b", partition=1)
    assert producer.flush(30) == 0
    state = describe_txn(bs, tid)
    assert state.error_code == 0 and state.transactional_id == tid
    assert state.transaction_state == "Ongoing"
    assert state.transaction_timeout_ms == 45000
    assert state.producer_id == empty.producer_id >= 0 and state.producer_epoch == empty.producer_epoch
    assert abs(state.transaction_start_time_ms - time.time() * 1000) < 60_000
    assert [(t.topic, sorted(t.partitions)) for t in state.topics] == [(topic, [0, 1])]

    listing = list_txns(bs)
    assert listing.error_code == 0
    mine = [(t.producer_id, t.transaction_state) for t in listing.transaction_states if t.transactional_id == tid]
    assert mine == [(state.producer_id, "Ongoing")]
    assert tid in {t.transactional_id for t in list_txns(bs, ["Ongoing"]).transaction_states}
    assert tid not in {t.transactional_id for t in list_txns(bs, ["CompleteCommit"]).transaction_states}
    assert [t.transactional_id for t in list_txns(bs, producer_ids=[state.producer_id]).transaction_states] == [tid]
    assert list(list_txns(bs, ["Bogus"]).unknown_state_filters) == ["Bogus"]

    def running_longer_than(ms: int) -> set[str]:  # ListTransactions v1 (KIP-994)
        body = wire_call(bs, LIST_TRANSACTIONS, 1, {"state_filters": [], "producer_id_filters": [],
                                                    "duration_filter": ms})
        return {t.transactional_id for t in body.transaction_states}
    assert tid in running_longer_than(0)
    assert tid not in running_longer_than(600_000)

    producer.commit_transaction(30)
    done = describe_txn(bs, tid)
    assert (done.transaction_state, list(done.topics)) == ("CompleteCommit", [])
    assert tid in {t.transactional_id for t in list_txns(bs, ["CompleteCommit"]).transaction_states}

    unknown = describe_txn(bs, "no-such-" + uuid.uuid4().hex)
    assert unknown.error_code == TRANSACTIONAL_ID_NOT_FOUND

    # kafka-python's admin client reads the same answers
    from kafka.admin import KafkaAdminClient
    admin = KafkaAdminClient(bootstrap_servers=bs)
    try:
        described = admin.describe_transactions([tid])[tid]
        assert (described.state, described.producer_id) == ("CompleteCommit", state.producer_id)
        listed = [t for txns in admin.list_transactions().values() for t in txns if t.transactional_id == tid]
        assert [(t.producer_id, t.state) for t in listed] == [(state.producer_id, "CompleteCommit")]
    finally:
        admin.close()


# --- kafka-python -------------------------------------------------------------------------------
def kp_read(bootstrap: str, topic: str, partition: int, end: int, isolation: str) -> list:
    """kafka-python consumer from offset 0 until its position reaches `end`."""
    from kafka import KafkaConsumer
    from kafka import TopicPartition as KTP

    c = KafkaConsumer(bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False,
                      isolation_level=isolation)
    try:
        tp = KTP(topic, partition)
        c.assign([tp])
        c.seek(tp, 0)
        out: list = []
        deadline = time.monotonic() + 20
        while c.position(tp) < end and time.monotonic() < deadline:
            for batch in c.poll(timeout_ms=200).values():
                out.extend(batch)
        assert c.position(tp) == end, f"position {c.position(tp)}, expected {end}"
        return out
    finally:
        c.close()


def test_kafka_python_commit_and_abort(txn_broker, topic):
    from kafka import KafkaProducer

    bs = txn_broker.bootstrap
    create_topic(bs, topic, partitions=2)
    producer = KafkaProducer(bootstrap_servers=bs, transactional_id=unique_name("txn-kp"), linger_ms=5)
    try:
        producer.init_transactions()
        producer.begin_transaction()
        for i in range(6):
            producer.send(topic, value=b"kc-%d" % i, partition=i % 2)
        producer.commit_transaction()
        producer.begin_transaction()
        futures = [producer.send(topic, value=b"ka-%d" % i, partition=i % 2) for i in range(4)]
        producer.flush()
        assert all(f.succeeded() for f in futures)
        producer.abort_transaction()
        producer.begin_transaction()
        producer.send(topic, value=b"kd-0", partition=0)
        producer.commit_transaction()
    finally:
        producer.close(timeout=10)

    # partition 0: kc-0 kc-2 kc-4 (0-2), COMMIT 3, ka-0 ka-2 (4-5), ABORT 6, kd-0 (7), COMMIT 8
    committed = kp_read(bs, topic, 0, 9, "read_committed")
    assert [(r.offset, r.value) for r in committed] == [(0, b"kc-0"), (1, b"kc-2"), (2, b"kc-4"), (7, b"kd-0")]
    uncommitted = kp_read(bs, topic, 0, 9, "read_uncommitted")
    assert [r.value for r in uncommitted] == [b"kc-0", b"kc-2", b"kc-4", b"ka-0", b"ka-2", b"kd-0"]
    assert [r.value for r in kp_read(bs, topic, 1, 7, "read_committed")] == [b"kc-1", b"kc-3", b"kc-5"]
    assert control_markers(bs, topic, 0) == [(3, COMMIT), (6, ABORT), (8, COMMIT)]
    assert control_markers(bs, topic, 1) == [(3, COMMIT), (6, ABORT)]
    # and librdkafka agrees on the same log
    assert values(read_to_end(bs, topic, [1], committed=True)[1]) == ["kc-1", "kc-3", "kc-5"]


def test_kafka_python_zombie_fenced(txn_broker, topic):
    from kafka import KafkaProducer
    from kafka.errors import KafkaError as KPError

    bs = txn_broker.bootstrap
    create_topic(bs, topic, partitions=1)
    tid = unique_name("txn-kp-zombie")
    zombie = KafkaProducer(bootstrap_servers=bs, transactional_id=tid, linger_ms=5)
    successor = KafkaProducer(bootstrap_servers=bs, transactional_id=tid, linger_ms=5)
    try:
        zombie.init_transactions()
        zombie.begin_transaction()
        zombie.send(topic, value=b"zombie", partition=0).get(timeout=20)
        successor.init_transactions()
        with pytest.raises(KPError) as raised:
            zombie.send(topic, value=b"zombie-late", partition=0)
            zombie.commit_transaction()
        assert "Fenced" in type(raised.value).__name__ or "Epoch" in type(raised.value).__name__, \
            repr(raised.value)
        successor.begin_transaction()
        successor.send(topic, value=b"winner", partition=0)
        successor.commit_transaction()
    finally:
        zombie.close(timeout=5)
        successor.close(timeout=10)
    assert values(read_to_end(bs, topic, [0], committed=True)[0]) == ["winner"]


def test_kafka_python_send_offsets_to_transaction(txn_broker, topic):
    from kafka import KafkaConsumer, KafkaProducer
    from kafka import TopicPartition as KTP
    from kafka.structs import OffsetAndMetadata

    bs = txn_broker.bootstrap
    group = unique_name("txn-kp-group")
    create_topic(bs, topic, partitions=2)
    observer = KafkaConsumer(bootstrap_servers=bs, group_id=group, enable_auto_commit=False)
    producer = KafkaProducer(bootstrap_servers=bs, transactional_id=unique_name("txn-kp-offsets"))
    try:
        producer.init_transactions()
        # (offsets sent, commit?, committed offsets afterwards): the aborted 9/10 never show
        for offset, commit, expected in ((5, True, [5, 6]), (9, False, [5, 6]), (7, True, [7, 8])):
            producer.begin_transaction()
            producer.send(topic, value=b"out-%d" % offset, partition=0)
            producer.send_offsets_to_transaction(
                {KTP(topic, p): OffsetAndMetadata(offset + p, "", -1) for p in range(2)}, group)
            (producer.commit_transaction if commit else producer.abort_transaction)()
            assert [observer.committed(KTP(topic, p)) for p in range(2)] == expected, offset
    finally:
        producer.close(timeout=10)
        observer.close()
    assert values(read_to_end(bs, topic, [0], committed=True)[0]) == ["out-5", "out-7"]


# --- aiokafka -----------------------------------------------------------------------------------
def test_aiokafka_transaction_context(txn_broker, topic):
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
    from aiokafka import TopicPartition as ATP

    bs = txn_broker.bootstrap
    create_topic(bs, topic, partitions=1)

    class Rollback(Exception):
        pass

    async def run() -> list:
        producer = AIOKafkaProducer(bootstrap_servers=bs, transactional_id=unique_name("txn-aio"))
        await producer.start()
        try:
            async with producer.transaction():
                for i in range(3):
                    await producer.send_and_wait(topic, b"aio-%d" % i, partition=0)
            with pytest.raises(Rollback):
                async with producer.transaction():
                    await producer.send_and_wait(topic, b"aio-aborted", partition=0)
                    raise Rollback
            async with producer.transaction():
                await producer.send_and_wait(topic, b"aio-last", partition=0)
        finally:
            await producer.stop()
        c = AIOKafkaConsumer(bootstrap_servers=bs, group_id=None, enable_auto_commit=False,
                             isolation_level="read_committed")
        await c.start()
        try:
            tp = ATP(topic, 0)
            c.assign([tp])
            c.seek(tp, 0)
            out: list = []
            async with asyncio.timeout(20):
                while await c.position(tp) < 7:
                    for batch in (await c.getmany(tp, timeout_ms=200)).values():
                        out.extend(batch)
            return [(r.offset, r.value) for r in out]
        finally:
            await c.stop()

    # aio-0..2 at 0-2, COMMIT 3, aio-aborted 4, ABORT 5, aio-last 6, COMMIT 7
    assert asyncio.run(run()) == [(0, b"aio-0"), (1, b"aio-1"), (2, b"aio-2"), (6, b"aio-last")]
    assert control_markers(bs, topic, 0) == [(3, COMMIT), (5, ABORT), (7, COMMIT)]
