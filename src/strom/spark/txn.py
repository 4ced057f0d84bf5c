"""Exactly-once streaming writes (sink option `transactionalIdPrefix`): Kafka transactions
that the tasks open and the driver ends.

Task (write): producer with transactional.id `<prefix>-<Spark partition id>`;
init_transactions() fences and aborts whatever an earlier attempt of the same task left open;
produce and flush inside one transaction, which is left open (librdkafka does not abort a
transaction when the producer is destroyed; the coordinator only would, after
transaction.timeout.ms). The commit message carries the producer id and epoch.

Driver (commit): record the batch as *prepared* (the list of transactions, as a record in the
control topic, pointed to by the committed-offset metadata of group `<prefix>`), send EndTxn
(commit) for each transaction, then record the batch as *committed* (committed offset =
batch id + 1). A batch id at or below the committed one, or equal to a prepared one, is a
replay after a crash: its tasks write nothing, and the driver finishes the prepared batch from
its record (EndTxn commit again is a no-op for transactions already committed) instead of
committing new data. abort() ends the batch's transactions with EndTxn (abort), unless the
batch is already prepared: then the commit is finished after the restart.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass

import pyarrow as pa
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from kafka.admin import KafkaAdminClient
from kafka.protocol.metadata import CoordinatorType
from kafka.protocol.producer.transaction import EndTxnRequest
from pyspark import TaskContext
from pyspark.sql.datasource import WriterCommitMessage

from strom.spark.options import SinkOptions
from strom.spark.sink import check_delivered, produce_all, producer_conf

log = logging.getLogger("strom.spark")

CONTROL_TOPIC = "_strom_spark_sink"  # one partition: prepared-batch records, and the group offsets
TIMEOUT_S = 30.0
RETRIABLE = {"CONCURRENT_TRANSACTIONS", "COORDINATOR_LOAD_IN_PROGRESS", "COORDINATOR_NOT_AVAILABLE",
             "NOT_COORDINATOR", "REQUEST_TIMED_OUT"}


@dataclass
class TxnCommit(WriterCommitMessage):
    task: int
    records: int
    producer_id: int = -1  # -1: nothing written (a replay of a batch already decided)
    producer_epoch: int = -1


@dataclass(frozen=True)
class State:
    committed: int  # the highest batch id known committed, -1 for none
    prepared: int | None  # a batch being committed when the driver stopped
    txns: tuple[tuple[int, int, int], ...] = ()  # its (task, producer id, epoch)s


class Transactions:
    """The sink's record of batches and the EndTxn calls, for one transactional id prefix."""

    def __init__(self, opts: SinkOptions, prefix: str) -> None:
        self.opts, self.prefix = opts, prefix
        self.control = TopicPartition(CONTROL_TOPIC, 0)

    def txn_id(self, task: int) -> str:
        return f"{self.prefix}-{task}"

    def _consumer(self) -> Consumer:
        return Consumer(self.opts.client.client_conf(**{
            "group.id": self.prefix, "enable.auto.commit": False, "isolation.level": "read_committed"}))

    def state(self) -> State:
        c = self._consumer()
        try:
            (tp,) = c.committed([self.control], timeout=TIMEOUT_S)
            committed = tp.offset - 1 if tp.offset >= 0 else -1
            marker = json.loads(tp.metadata) if tp.metadata else {}
            if "prepared" not in marker:
                return State(committed, None)
            c.assign([TopicPartition(CONTROL_TOPIC, 0, marker["at"])])
            deadline = time.monotonic() + TIMEOUT_S
            while time.monotonic() < deadline:
                msg = c.poll(0.5)
                if msg is not None and msg.error() is None:
                    record = json.loads(msg.value())
                    return State(committed, record["batch"], tuple(map(tuple, record["txns"])))
            raise TimeoutError(f"Could not read the prepared batch record at {CONTROL_TOPIC}-0 offset {marker['at']}")
        finally:
            c.close()

    def _mark(self, committed: int, metadata: str) -> None:
        c = self._consumer()
        try:
            c.commit(offsets=[TopicPartition(CONTROL_TOPIC, 0, committed + 1, metadata=metadata)],
                     asynchronous=False)
        finally:
            c.close()

    def prepare(self, batch: int, committed: int, txns: list[tuple[int, int, int]]) -> None:
        self._ensure_topic()
        offsets: list[int] = []
        errors: list[KafkaError] = []
        p = Producer(self.opts.client.client_conf(**{"enable.idempotence": True, "acks": "all"}))
        p.produce(CONTROL_TOPIC, json.dumps({"prefix": self.prefix, "batch": batch, "txns": txns}).encode(),
                  self.prefix.encode(), partition=0,
                  on_delivery=lambda err, msg: errors.append(err) if err else offsets.append(msg.offset()))
        check_delivered(p, errors)
        self._mark(committed, json.dumps({"prepared": batch, "at": offsets[0]}))

    def mark_committed(self, batch: int) -> None:
        self._mark(batch, "")

    def _ensure_topic(self) -> None:
        admin = AdminClient(self.opts.client.client_conf())
        future = admin.create_topics([NewTopic(CONTROL_TOPIC, 1, -1)], operation_timeout=TIMEOUT_S)[CONTROL_TOPIC]
        try:
            future.result(TIMEOUT_S)
        except KafkaException as e:
            if e.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                raise

    def end(self, txns: list[tuple[int, int, int]], commit: bool) -> None:
        """EndTxn for each (task, producer id, epoch), retried while the coordinator is busy.
        A failed commit raises; a failed abort is only logged (the next producer of that
        transactional id, or the transaction timeout, aborts it anyway)."""
        if not txns:
            return
        admin = KafkaAdminClient(bootstrap_servers=self.opts.client.bootstrap, **_security(self.opts))
        try:
            for task, producer_id, epoch in txns:
                try:
                    admin._manager.run(_end_txn, admin, self.txn_id(task), producer_id, epoch, commit)
                except RuntimeError as e:
                    if commit:
                        raise
                    log.warning("%s", e)
        finally:
            admin.close()


async def _end_txn(admin: KafkaAdminClient, txn_id: str, producer_id: int, epoch: int, commit: bool) -> None:
    # kafka-python has the codec and the coordinator lookup but no public EndTxn call.
    deadline = time.monotonic() + TIMEOUT_S
    while True:
        node = await admin._find_coordinator_id(txn_id, CoordinatorType.TRANSACTION)
        response = await admin._manager.send(EndTxnRequest(
            transactional_id=txn_id, producer_id=producer_id, producer_epoch=epoch, committed=commit), node_id=node)
        error = KafkaError(response.error_code)
        if response.error_code == 0:
            return
        if error.name() not in RETRIABLE or time.monotonic() > deadline:
            raise RuntimeError(f"EndTxn({'commit' if commit else 'abort'}) of transaction {txn_id} (producer "
                               f"{producer_id}, epoch {epoch}) failed: {error.name()}")
        if error.name() in ("NOT_COORDINATOR", "COORDINATOR_NOT_AVAILABLE"):  # it moved: look it up again
            cache = admin._manager.cluster._coordinators
            for key_type in (CoordinatorType.TRANSACTION, CoordinatorType.TRANSACTION.value):
                cache.pop((key_type, txn_id), None)
        await admin._net.sleep(0.1)


def _security(opts: SinkOptions) -> dict:
    """The librdkafka security settings kafka-python understands, by their kafka-python names."""
    conf, out = opts.client.conf, {}
    names = {"security.protocol": "security_protocol", "sasl.mechanism": "sasl_mechanism",
             "sasl.mechanisms": "sasl_mechanism", "sasl.username": "sasl_plain_username",
             "sasl.password": "sasl_plain_password", "ssl.ca.location": "ssl_cafile"}
    for name, kp in names.items():
        if name in conf:
            out[kp] = conf[name].upper() if name == "security.protocol" else conf[name]
    return out


def write_task(opts: SinkOptions, prefix: str, batches: Iterator[pa.RecordBatch]) -> TxnCommit:
    context = TaskContext.get()
    task = context.partitionId()
    batch = int(context.getLocalProperty("streaming.sql.batchId"))
    txns = Transactions(opts, prefix)
    state = txns.state()
    if batch <= state.committed or batch == state.prepared:
        return TxnCommit(task, 0)  # decided before a restart: the driver finishes it
    errors: list[KafkaError] = []
    txn_id = txns.txn_id(task)
    # The transaction stays open until the driver's commit: allow it the broker's default
    # maximum (kafka.transaction.timeout.ms overrides).
    producer = Producer(producer_conf(opts, errors, **{"transactional.id": txn_id,
                                                       "transaction.timeout.ms": 900_000}))
    producer.init_transactions(TIMEOUT_S)  # also when there is nothing to write: it fences
    producer.begin_transaction()
    count = produce_all(producer, opts, batches)
    if count == 0:
        return TxnCommit(task, 0)  # no partition joined the transaction: nothing to end
    check_delivered(producer, errors)
    # librdkafka keeps its producer id to itself; the coordinator tells.
    admin = KafkaAdminClient(bootstrap_servers=opts.client.bootstrap, **_security(opts))
    try:
        described = admin.describe_transactions([txn_id])[txn_id]
    finally:
        admin.close()
    # Left open on purpose: destroying the producer does not abort it; the driver ends it.
    del producer
    return TxnCommit(task, count, described.producer_id, described.producer_epoch)


def commit_batch(opts: SinkOptions, prefix: str, messages: list, batch: int) -> None:
    txns = Transactions(opts, prefix)
    state = txns.state()
    written = [(m.task, m.producer_id, m.producer_epoch) for m in messages if m and m.producer_id >= 0]
    if batch <= state.committed:
        txns.end(written, commit=False)  # a replay of a committed batch: its new data goes
        return
    if state.prepared == batch:
        txns.end(list(state.txns), commit=True)  # finish what the stopped driver had decided
        txns.end(written, commit=False)
    else:
        txns.prepare(batch, state.committed, written)
        txns.end(written, commit=True)
    txns.mark_committed(batch)


def abort_batch(opts: SinkOptions, prefix: str, messages: list, batch: int) -> None:
    """A task failed: abort what the batch wrote, unless the driver had already decided to
    commit it (prepared), in which case the restarted query finishes the commit."""
    txns = Transactions(opts, prefix)
    state = txns.state()
    if state.prepared == batch or batch <= state.committed:
        return
    written = [(m.task, m.producer_id, m.producer_epoch) for m in messages if m and m.producer_id >= 0]
    txns.end(written, commit=False)
