"""Transactions version 2 (KIP-890 part 2), spoken by hand as a Kafka 4.0 producer speaks it
when `transaction.version` is finalized at 2 (no client library here does yet): Produce v12
and TxnOffsetCommit v5 without AddPartitionsToTxn / AddOffsetsToTxn, EndTxn v5 bumping the
epoch; read_committed consumers (confluent-kafka) see exactly the committed transactions."""

from __future__ import annotations

import time

import pytest
from confluent_kafka import Consumer, TopicPartition

from strom.protocol.errors import ErrorCode
from strom.protocol.records import build_batch
from strom.testing import BrokerProcess, RawClient, create_topic, unique_name, wait_for

PRODUCE, OFFSET_FETCH, FIND_COORDINATOR, INIT_PRODUCER_ID, END_TXN, TXN_OFFSET_COMMIT = 0, 9, 10, 22, 26, 28
DESCRIBE_TRANSACTIONS = 65
RETRIABLE = {ErrorCode.NOT_ENOUGH_REPLICAS, ErrorCode.COORDINATOR_LOAD_IN_PROGRESS,
             ErrorCode.COORDINATOR_NOT_AVAILABLE, ErrorCode.NOT_COORDINATOR, ErrorCode.CONCURRENT_TRANSACTIONS}


@pytest.fixture
def broker():
    with BrokerProcess(overrides={"transaction.state.log.num.partitions": "1",
                                  "offsets.topic.num.partitions": "1"}) as proc:
        yield proc


class Tv2Producer:
    """The requests a transactions-version-2 producer sends, and nothing else."""

    def __init__(self, client: RawClient, txn_id: str) -> None:
        """`client` is connected to the transaction coordinator (any broker, when only one)."""
        self.client, self.txn_id = client, txn_id
        self.sequences: dict[tuple[str, int], int] = {}
        found = client.call(FIND_COORDINATOR, 4, {"key_type": 1, "coordinator_keys": [txn_id]})
        self.coordinator_id = found.coordinators[0].node_id
        body = self._retry(lambda: client.call(INIT_PRODUCER_ID, 5, {
            "transactional_id": txn_id, "transaction_timeout_ms": 60000, "producer_id": -1, "producer_epoch": -1}))
        self.producer_id, self.epoch = body.producer_id, body.producer_epoch

    @staticmethod
    def _retry(call, error=lambda body: body.error_code):
        deadline = time.monotonic() + 30
        while True:
            body = call()
            if error(body) not in RETRIABLE or time.monotonic() > deadline:
                return body
            time.sleep(0.1)

    def produce(self, topic: str, partition: int, values: list[bytes], epoch: int | None = None,
                leader: RawClient | None = None) -> int:
        epoch = self.epoch if epoch is None else epoch
        leader = leader or self.client
        seq = self.sequences.get((topic, partition), 0)
        batch = build_batch([(None, v) for v in values], timestamp=int(time.time() * 1000),
                            producer_id=self.producer_id, producer_epoch=epoch, base_sequence=seq,
                            transactional=True)
        body = self._retry(lambda: leader.call(PRODUCE, 12, {
            "transactional_id": self.txn_id, "acks": -1, "timeout_ms": 10000, "topic_data": [
                {"name": topic, "partition_data": [{"index": partition, "records": batch}]}]}),
            lambda b: b.responses[0].partition_responses[0].error_code)
        error = body.responses[0].partition_responses[0].error_code
        if error == 0:
            self.sequences[(topic, partition)] = seq + len(values)
        return error

    def commit_offsets(self, group: str, topic: str, offsets: dict[int, int]) -> list[int]:
        self.client.call(FIND_COORDINATOR, 4, {"key_type": 0, "coordinator_keys": [group]})
        body = self._retry(lambda: self.client.call(TXN_OFFSET_COMMIT, 5, {
            "transactional_id": self.txn_id, "group_id": group, "producer_id": self.producer_id,
            "producer_epoch": self.epoch, "generation_id": -1, "member_id": "", "group_instance_id": None,
            "topics": [{"name": topic, "partitions": [
                {"partition_index": p, "committed_offset": o, "committed_leader_epoch": -1,
                 "committed_metadata": ""} for p, o in offsets.items()]}]}),
            lambda b: b.topics[0].partitions[0].error_code)
        return [p.error_code for t in body.topics for p in t.partitions]

    def end(self, committed: bool, epoch: int | None = None):
        body = self._retry(lambda: self.client.call(END_TXN, 5, {
            "transactional_id": self.txn_id, "producer_id": self.producer_id,
            "producer_epoch": self.epoch if epoch is None else epoch, "committed": committed}))
        if body.error_code == 0 and epoch is None:
            self.producer_id, self.epoch = body.producer_id, body.producer_epoch
            self.sequences.clear()  # a new epoch starts its sequences at 0
        return body


def read_committed(bootstrap: str, topic: str, partitions: int) -> list[bytes]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": unique_name("rc"),
                         "isolation.level": "read_committed", "enable.auto.commit": False})
    try:
        consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
        values = []
        idle_since = time.monotonic()
        while time.monotonic() - idle_since < 2:
            for msg in consumer.consume(100, 0.5):
                if msg.error() is None:
                    values.append(msg.value())
                    idle_since = time.monotonic()
        return sorted(values)
    finally:
        consumer.close()


def committed_offset(client: RawClient, group: str, topic: str) -> int:
    body = client.call(OFFSET_FETCH, 7, {"group_id": group, "require_stable": True,
                                         "topics": [{"name": topic, "partition_indexes": [0]}]})
    return body.topics[0].partitions[0].committed_offset


def test_a_tv2_producer_commits_and_aborts_without_adding_partitions(broker):
    topic, group = unique_name("tv2"), unique_name("tv2-group")
    create_topic(broker.bootstrap, topic, partitions=2)
    with RawClient(broker) as client:
        p = Tv2Producer(client, unique_name("tv2-txn"))
        pid, epoch = p.producer_id, p.epoch
        assert p.produce(topic, 0, [b"c1", b"c2"]) == 0
        assert p.produce(topic, 1, [b"c3"]) == 0
        assert p.commit_offsets(group, topic, {0: 2}) == [0]
        state = client.call(DESCRIBE_TRANSACTIONS, 0, {"transactional_ids": [p.txn_id]}).transaction_states[0]
        assert state.transaction_state == "Ongoing"
        assert sorted((t.topic, tuple(t.partitions)) for t in state.topics) == sorted(
            [(topic, (0, 1)), ("__consumer_offsets", (0,))])
        assert read_committed(broker.bootstrap, topic, 2) == []  # still open
        end = p.end(committed=True)
        assert (end.error_code, end.producer_id, end.producer_epoch) == (0, pid, epoch + 1)
        assert committed_offset(client, group, topic) == 2

        # EndTxn retried with the epoch the producer had: the same answer.
        retry = p.end(committed=True, epoch=epoch)
        assert (retry.error_code, retry.producer_id, retry.producer_epoch) == (0, pid, epoch + 1)

        # The old epoch is fenced now, by the leader as much as by the coordinator.
        assert p.produce(topic, 0, [b"zombie"], epoch=epoch) in (ErrorCode.INVALID_PRODUCER_EPOCH,
                                                                 ErrorCode.PRODUCER_FENCED)
        # The next transaction, at the new epoch, aborted: neither records nor offsets count.
        assert p.produce(topic, 0, [b"a1"]) == 0
        assert p.commit_offsets(group, topic, {0: 99}) == [0]
        end = p.end(committed=False)
        assert (end.error_code, end.producer_epoch) == (0, epoch + 2)
        assert committed_offset(client, group, topic) == 2
        # And one more committed, reusing partition 0 right after the abort's marker.
        assert p.produce(topic, 0, [b"c4"]) == 0
        assert p.end(committed=True).error_code == 0
    assert read_committed(broker.bootstrap, topic, 2) == [b"c1", b"c2", b"c3", b"c4"]


def test_tv2_epoch_rules_survive_a_broker_restart(broker):
    topic = unique_name("tv2-restart")
    create_topic(broker.bootstrap, topic)
    with RawClient(broker) as client:
        p = Tv2Producer(client, unique_name("tv2-txn"))
        old_epoch = p.epoch
        assert p.produce(topic, 0, [b"before"]) == 0
        assert p.end(committed=True).error_code == 0
    broker.stop()
    broker.start()
    with RawClient(broker) as client:
        p.client = client
        # The coordinator that loaded the state knows the transaction followed version 2 rules.
        retry = p.end(committed=True, epoch=old_epoch)
        assert (retry.error_code, retry.producer_epoch) == (0, old_epoch + 1)
        assert p.produce(topic, 0, [b"after"]) == 0
        assert p.end(committed=True).error_code == 0
    wait_for(lambda: read_committed(broker.bootstrap, topic, 1) == [b"after", b"before"], timeout=30,
             what="both committed transactions readable")


def test_tv1_producers_still_need_add_partitions(broker):
    """Produce v11 is still checked (KIP-890 part 1): a transactional batch for a partition that
    was never added is TRANSACTION_ABORTABLE, and nothing is written."""
    topic = unique_name("tv1")
    create_topic(broker.bootstrap, topic)
    with RawClient(broker) as client:
        p = Tv2Producer(client, unique_name("tv1-txn"))
        batch = build_batch([(None, b"x")], producer_id=p.producer_id, producer_epoch=p.epoch,
                            base_sequence=0, transactional=True)
        body = client.call(PRODUCE, 11, {"transactional_id": p.txn_id, "acks": -1, "timeout_ms": 5000,
                                         "topic_data": [{"name": topic, "partition_data": [
                                             {"index": 0, "records": batch}]}]})
        assert body.responses[0].partition_responses[0].error_code == ErrorCode.TRANSACTION_ABORTABLE
        # TxnOffsetCommit v4 likewise wants AddOffsetsToTxn first.
        body = client.call(TXN_OFFSET_COMMIT, 4, {
            "transactional_id": p.txn_id, "group_id": "g", "producer_id": p.producer_id,
            "producer_epoch": p.epoch, "generation_id": -1, "member_id": "", "group_instance_id": None,
            "topics": [{"name": topic, "partitions": [{"partition_index": 0, "committed_offset": 1,
                                                       "committed_leader_epoch": -1, "committed_metadata": ""}]}]})
        assert body.topics[0].partitions[0].error_code == ErrorCode.TRANSACTION_ABORTABLE
