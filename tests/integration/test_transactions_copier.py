"""Exactly-once under kill -9: a consume-transform-produce copier, and idempotent retries.

The copier (confluent-kafka: a read_committed consumer in a group, a transactional producer,
offsets sent with `send_offsets_to_transaction`) copies 100,000 records from 4 input partitions
to 4 output partitions while the broker is killed with SIGKILL and restarted three times. After
each crash the copier behaves like a restarted application: it drops its clients mid-transaction
(records produced, nothing committed), makes new ones (the new producer's init_transactions
fences the old one and aborts its transaction) and resumes from the group's committed offsets.
The output read with read_committed must be the input exactly.

Also here: an idempotent producer whose in-flight batches straddle two kill -9s (no duplicate,
no gap), and kill -9 racing an EndTxn (each transaction all or nothing across partitions).
"""

from __future__ import annotations

import threading
import time

import pytest
from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition

from strom.protocol import messages
from strom.protocol.records import TRANSACTIONAL_MASK, build_batch
from strom.testing import BrokerProcess, RawClient, create_topic, unique_name, wait_for

from .conftest import consumer
from .test_transactions import (
    TXN_OVERRIDES,
    describe_txn,
    list_offset,
    read_to_end,
    txn_producer,
    values,
)
from .test_transactions_errors import END_TXN, add_partitions, init_txn, produce, with_attributes

pytestmark = pytest.mark.timeout(180)

PARTITIONS = 4
PER_PARTITION = 25_000  # 100,000 records
TXN_RECORDS = 4_000  # records per copier transaction
CRASHES = 3


@pytest.fixture
def crash_broker():
    with BrokerProcess(overrides=TXN_OVERRIDES) as proc:
        yield proc


def fill_input(bootstrap: str, topic: str) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 20,
                         "batch.num.messages": 10000})
    failures = []
    for seq in range(PER_PARTITION):
        for p in range(PARTITIONS):
            while True:
                try:
                    producer.produce(topic, value=b"p%d-%06d" % (p, seq), partition=p,
                                     on_delivery=lambda err, msg: err and failures.append(err))
                    break
                except BufferError:
                    producer.poll(0.05)
        if seq % 1000 == 0:
            producer.poll(0)
    assert producer.flush(60) == 0
    assert not failures, failures[:3]


class Copier(threading.Thread):
    """Copies input partition p to output partition p, one transaction per ~TXN_RECORDS."""

    def __init__(self, bootstrap: str, source: str, sink: str, group: str,
                 per_partition: int = PER_PARTITION) -> None:
        super().__init__(daemon=True)
        self.per_partition = per_partition
        self.bootstrap, self.source, self.sink, self.group = bootstrap, source, sink, group
        self.tid = unique_name("copier")
        self.copied = 0  # records in committed transactions, as far as this copier knows
        self.restart = threading.Event()  # set by the test after each crash
        self.done = threading.Event()
        self.stop = threading.Event()
        self.error: BaseException | None = None
        self.sessions = 0
        self.abandoned = 0
        self.client_errors: list[str] = []
        self.phase = "starting"  # where the copier is, for failure messages

    def run(self) -> None:
        try:
            while not self.stop.is_set() and not self.done.is_set():
                self.sessions += 1
                self._session()
        except BaseException as e:  # reported by the test
            self.error = e

    def _session(self) -> None:
        # metadata.recovery.strategy=none: with librdkafka 2.16's default (rebootstrap), a broker
        # that is down for a moment makes the client decommission its broker handles; the
        # transactional producer then kept sending TxnOffsetCommit to the dead handle and hung in
        # send_offsets_to_transaction (a client problem: its debug log shows "Decommissioning 1
        # broker(s): re-bootstrap" and no TxnOffsetCommit sent after the restart).
        producer = txn_producer(self.bootstrap, self.tid, **{"transaction.timeout.ms": 60000,
                                                             "metadata.recovery.strategy": "none"})
        reader = Consumer({
            "bootstrap.servers": self.bootstrap, "group.id": self.group,
            "group.instance.id": "copier-0", "session.timeout.ms": 6000,
            "isolation.level": "read_committed", "enable.auto.commit": False,
            "auto.offset.reset": "earliest", "fetch.wait.max.ms": 50,
            "reconnect.backoff.max.ms": 200, "metadata.recovery.strategy": "none"})
        try:
            self.phase = f"session {self.sessions}: init_transactions"
            producer.init_transactions(60)  # fences the previous session, aborts its transaction
            reader.subscribe([self.source])
            ends = [TopicPartition(self.source, p) for p in range(PARTITIONS)]
            while not self.stop.is_set():
                self.phase = f"session {self.sessions}: consume"
                batch = reader.consume(num_messages=TXN_RECORDS, timeout=0.5)
                batch = [m for m in batch if m.error() is None]
                if not batch:
                    self.phase = f"session {self.sessions}: committed()"
                    committed = reader.committed(ends, timeout=30)
                    if all(tp.offset == self.per_partition for tp in committed):
                        self.done.set()
                        return
                    continue
                self.phase = f"session {self.sessions}: produce"
                producer.begin_transaction()
                positions: dict[int, int] = {}
                for m in batch:
                    self._produce(producer, m.value(), m.partition())
                    positions[m.partition()] = m.offset() + 1
                if self.restart.is_set():
                    # Crash of the application mid-transaction: the records are in the log,
                    # nothing is committed; the next session's init_transactions aborts them.
                    producer.flush(30)
                    self.restart.clear()
                    self.abandoned += 1
                    return
                self.phase = f"session {self.sessions}: send_offsets_to_transaction"
                producer.send_offsets_to_transaction(
                    [TopicPartition(self.source, p, o) for p, o in positions.items()],
                    reader.consumer_group_metadata(), 60)
                self.phase = f"session {self.sessions}: commit_transaction"
                producer.commit_transaction(60)
                self.copied += len(batch)
        except KafkaException as e:
            self.client_errors.append(str(e.args[0]))  # start a new session
        finally:
            producer.purge()
            reader.close()

    def _produce(self, producer: Producer, value: bytes, partition: int) -> None:
        while True:
            try:
                producer.produce(self.sink, value=value, partition=partition)
                return
            except BufferError:
                producer.poll(0.05)


def test_copier_exactly_once_through_three_kill_9(crash_broker, topic):
    broker = crash_broker
    bs = broker.bootstrap
    source, sink, group = topic + "-in", topic + "-out", unique_name("copier-group")
    create_topic(bs, source, partitions=PARTITIONS)
    create_topic(bs, sink, partitions=PARTITIONS)
    fill_input(bs, source)

    copier = Copier(bs, source, sink, group)
    copier.start()
    try:
        total = PARTITIONS * PER_PARTITION
        for crash in range(1, CRASHES + 1):
            wait_for(lambda crash=crash: copier.copied >= crash * total // (CRASHES + 1) or copier.error
                     or copier.done.is_set(), timeout=60, interval=0.02,
                     what=f"copier progress before crash {crash} ({copier.phase})")
            assert copier.error is None, repr(copier.error)
            assert not copier.done.is_set(), "the copy finished before all crashes happened"
            broker.kill()
            broker.restart()
            copier.restart.set()
        wait_for(lambda: copier.done.is_set() or copier.error, timeout=90, interval=0.1,
                 what=f"the copy to finish (copied {copier.copied}, {copier.phase})")
        assert copier.error is None, repr(copier.error)
    finally:
        copier.stop.set()
        copier.join(30)
    # each crash made the copier drop one open transaction (records in the log, not committed)
    assert copier.sessions >= CRASHES + 1 and copier.abandoned == CRASHES, \
        (copier.sessions, copier.abandoned, copier.client_errors)

    out = read_to_end(bs, sink, range(PARTITIONS), committed=True, timeout=60)
    for p in range(PARTITIONS):
        got = values(out[p])
        expected = [f"p{p}-{seq:06d}" for seq in range(PER_PARTITION)]
        if got != expected:
            dupes = len(got) - len(set(got))
            missing = len(set(expected) - set(got))
            first = next((i for i, (a, b) in enumerate(zip(got, expected, strict=False)) if a != b), None)
            pytest.fail(f"partition {p}: {len(got)} records, {dupes} duplicates, {missing} missing, "
                        f"first difference at index {first}; copier errors {copier.client_errors[:5]}")
        # nothing is left open: the LSO is the high watermark
        assert list_offset(bs, sink, p, isolation=1) == list_offset(bs, sink, p, isolation=0)

    # the abandoned transactions' records are in the log; read_uncommitted sees them
    raw = read_to_end(bs, sink, range(PARTITIONS), committed=False, timeout=60)
    assert sum(len(v) for v in raw.values()) > PARTITIONS * PER_PARTITION

    c = consumer(bs, **{"group.id": group})
    try:
        committed = c.committed([TopicPartition(source, p) for p in range(PARTITIONS)], timeout=20)
    finally:
        c.close()
    assert [tp.offset for tp in committed] == [PER_PARTITION] * PARTITIONS
    assert "Traceback" not in broker.log_text()


def test_idempotent_retries_across_kill_9_no_duplicates_no_gaps(crash_broker, topic):
    broker = crash_broker
    bs = broker.bootstrap
    create_topic(bs, topic, partitions=2)
    producer = Producer({"bootstrap.servers": bs, "enable.idempotence": True, "acks": "all",
                         "linger.ms": 2, "message.timeout.ms": 60000, "retry.backoff.ms": 50,
                         "reconnect.backoff.max.ms": 200, "metadata.recovery.strategy": "none"})
    acked: list[int] = []
    failed: list[str] = []

    def report(err, msg) -> None:
        if err is None:
            acked.append(int(msg.value()))
        else:
            failed.append(str(err))

    stop = threading.Event()
    sent = [0]  # records handed to produce() so far

    def produce_forever() -> None:
        while not stop.is_set():
            n = sent[0]
            try:
                producer.produce(topic, value=b"%d" % n, partition=n % 2, on_delivery=report)
                sent[0] = n + 1
            except BufferError:
                producer.poll(0.01)
            if n % 100 == 0:
                producer.poll(0)

    thread = threading.Thread(target=produce_forever, daemon=True)
    thread.start()
    try:
        for round_ in range(2):
            target = len(acked) + 20_000
            wait_for(lambda target=target: len(acked) >= target, timeout=30, interval=0.005,
                     what=f"acks before kill {round_ + 1}")
            broker.kill()  # with batches in flight, written or not, acknowledged or not
            broker.restart()
        target = len(acked) + 5_000
        wait_for(lambda: len(acked) >= target, timeout=30, what="acks after the last restart")
    finally:
        stop.set()
        thread.join(10)
    assert producer.flush(60) == 0
    assert not failed, failed[:3]
    assert len(acked) == sent[0]

    got = read_to_end(bs, topic, range(2), committed=False, timeout=60)
    for p in range(2):
        numbers = [int(v) for v in values(got[p])]
        assert numbers == list(range(p, sent[0], 2)), (
            f"partition {p}: {len(numbers)} records, {len(numbers) - len(set(numbers))} duplicates")
    assert "Traceback" not in broker.log_text()



def end_txn_answer(client: RawClient) -> int | None:
    """The error code of the EndTxn answer on `client`'s socket, or None where the connection
    ended without one (within the socket's timeout)."""
    try:
        frame = client.read_frame()
    except OSError:  # reset, or nothing within the timeout
        return None
    if frame is None:
        return None
    correlation, body = messages.decode_response(END_TXN, 3, frame)
    assert correlation == 99
    return body.error_code


def test_kill_9_racing_end_txn_keeps_transactions_atomic(crash_broker, topic):
    """EndTxn(commit) is sent and the broker is killed 0-10 ms later, before or after it decided,
    wrote markers or answered; in a last round, only once it answered. After the restart each
    transaction must be all or nothing across its 4 partitions, every commit that was answered
    must be committed, and the next InitProducerId must settle whatever was left open."""
    broker = crash_broker
    bs = broker.bootstrap
    create_topic(bs, topic, partitions=PARTITIONS)
    tid = unique_name("txn-race")
    delays: list[float | None] = [0.0, 0.0, 0.0001, 0.0002, 0.0003, 0.0005, 0.001, 0.002, 0.004, 0.01, None]
    answered: dict[int, int] = {}  # round -> the error code of the EndTxn answer read for it
    for round_, delay in enumerate(delays):
        client = RawClient(broker)
        pid, epoch = init_txn(client, tid)  # settles the previous round's transaction first
        assert add_partitions(client, tid, pid, epoch, topic, list(range(PARTITIONS))) == [0] * PARTITIONS
        for p in range(PARTITIONS):
            batch = with_attributes(build_batch([(None, b"r%d-p%d" % (round_, p))], producer_id=pid,
                                                producer_epoch=epoch, base_sequence=0), TRANSACTIONAL_MASK)
            assert produce(client, topic, batch, tid=tid, partition=p)[0] == 0
        client.send_raw(messages.encode_request(END_TXN, 3, {
            "transactional_id": tid, "producer_id": pid, "producer_epoch": epoch, "committed": True}, 99))
        if delay is None:
            client.sock.settimeout(30)
            answered[round_] = end_txn_answer(client)
            assert answered[round_] == 0, f"EndTxn(commit) answered {answered[round_]}"
            broker.kill()
        else:
            time.sleep(delay)  # where the crash lands; not an assertion
            broker.kill()
            # An answer sent before the kill is still in this socket's receive buffer.
            client.sock.settimeout(10)
            code = end_txn_answer(client)
            if code is not None:
                answered[round_] = code
        client.close()
        broker.restart()
    client = RawClient(broker)
    init_txn(client, tid)  # settles the last round
    client.close()
    wait_for(lambda: describe_txn(bs, tid).transaction_state in ("Empty", "CompleteCommit", "CompleteAbort"),
             what="the transactional id to settle")
    # Nothing but a commit can have been answered: there was no other transaction to wait for.
    assert set(answered.values()) == {0}, answered

    got = read_to_end(bs, topic, range(PARTITIONS), committed=True)
    committed_rounds = []
    for round_ in range(len(delays)):
        present = [p for p in range(PARTITIONS) if f"r{round_}-p{p}" in values(got[p])]
        assert present in ([], list(range(PARTITIONS))), f"round {round_}: only partitions {present} committed"
        if present:
            committed_rounds.append(round_)
    # An answered commit survives the crash (the coordinator had logged its decision first).
    assert set(answered) <= set(committed_rounds), (answered, committed_rounds)
    assert len(delays) - 1 in committed_rounds
    for p in range(PARTITIONS):
        assert list_offset(bs, topic, p, isolation=1) == list_offset(bs, topic, p, isolation=0)
    assert "Traceback" not in broker.log_text()
