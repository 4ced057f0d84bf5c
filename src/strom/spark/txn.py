"""Exactly-once writes (sink option `transactionalIdPrefix`): Kafka transactions that the
tasks open and the driver ends, keyed by the streaming query and its batch id. Used by the
streaming sink, and by `df.write` inside a query's foreachBatch (strom.spark.foreach_batch):
both run within a micro-batch, whose tasks see the query id and batch id Spark sets.

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

The record names the query (Spark's query id, kept in its checkpoint). A new query reusing
the prefix (a new checkpoint: its batch ids start again at 0) takes the prefix over: it first
finishes a batch the earlier query had prepared, its producers fence the earlier query's,
the transactional ids the earlier query used beyond its own are fenced too (aborting what was
left open), and its batches are written from batch 0 on.
"""

from __future__ import annotations

import itertools
import json
import logging
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from pyspark import TaskContext
from pyspark.sql.datasource import WriterCommitMessage

from strom.spark import clients
from strom.spark.options import SinkOptions, StromOptionError
from strom.spark.produce import Delivery, check_delivered, produce_all, producer

if TYPE_CHECKING:
    import pyarrow as pa

log = logging.getLogger("strom.spark")

CONTROL_TOPIC = "_strom_spark_sink"  # one partition: prepared-batch records, and the group offsets
TIMEOUT_S = 30.0
RETRIABLE = {"CONCURRENT_TRANSACTIONS", "COORDINATOR_LOAD_IN_PROGRESS", "COORDINATOR_NOT_AVAILABLE",
             "NOT_COORDINATOR", "REQUEST_TIMED_OUT"}
# The local properties Spark gives the tasks of a micro-batch (foreachBatch writes included).
BATCH_ID, QUERY_ID = "streaming.sql.batchId", "sql.streaming.queryId"
OUTSIDE_A_QUERY = ("transactionalIdPrefix makes a write exactly-once per micro-batch of a streaming query: use "
                   "it with writeStream, or with df.write inside foreachBatch (strom.spark.foreach_batch), "
                   "not in a batch job")


@dataclass
class TxnCommit(WriterCommitMessage):
    task: int
    records: int
    producer_id: int = -1  # -1: nothing written (a replay of a batch already decided)
    producer_epoch: int = -1
    query: str = ""  # the streaming query's id, and the micro-batch
    batch: int = -1


@dataclass(frozen=True)
class State:
    committed: int  # the highest batch id known committed, -1 for none
    prepared: int | None  # a batch being committed when the driver stopped
    txns: tuple[tuple[int, int, int], ...] = ()  # its (task, producer id, epoch)s
    query: str | None = None  # the query these batches are of (None: none yet, or unrecorded)
    tasks: int = 0  # the query's tasks have used transactional ids <prefix>-0 .. <prefix>-(tasks-1)

    def of(self, query: str) -> State:
        """The state as `query` sees it: a different query starts afresh."""
        return self if self.query == query else State(-1, None, query=query)


def micro_batch() -> tuple[str, int]:
    """(query id, batch id) of the micro-batch the current task belongs to."""
    context = TaskContext.get()
    batch, query = context.getLocalProperty(BATCH_ID), context.getLocalProperty(QUERY_ID)
    if batch is None or query is None:
        raise StromOptionError(OUTSIDE_A_QUERY)
    return query, int(batch)


class Transactions:
    """The sink's record of batches and the EndTxn calls, for one transactional id prefix."""

    def __init__(self, opts: SinkOptions, prefix: str) -> None:
        self.opts, self.prefix = opts, prefix
        self.control = TopicPartition(CONTROL_TOPIC, 0)

    def txn_id(self, task: int) -> str:
        return f"{self.prefix}-{task}"

    def _consumer(self) -> Consumer:
        return clients.make(Consumer, self.opts.client, "consumer", forced={
            "group.id": self.prefix, "enable.auto.commit": False, "isolation.level": "read_committed"})

    def state(self) -> State:
        c = self._consumer()
        try:
            (tp,) = c.committed([self.control], timeout=TIMEOUT_S)
            committed = tp.offset - 1 if tp.offset >= 0 else -1
            marker = json.loads(tp.metadata) if tp.metadata else {}
            query, tasks = marker.get("query"), marker.get("tasks", 0)
            if "prepared" not in marker:
                return State(committed, None, query=query, tasks=tasks)
            c.assign([TopicPartition(CONTROL_TOPIC, 0, marker["at"])])
            deadline = time.monotonic() + TIMEOUT_S
            while time.monotonic() < deadline:
                msg = c.poll(0.5)
                if msg is not None and msg.error() is None:
                    record = json.loads(msg.value())
                    return State(committed, record["batch"], tuple(map(tuple, record["txns"])), query, tasks)
            raise TimeoutError(f"Could not read the prepared batch record at {CONTROL_TOPIC}-0 offset {marker['at']}")
        finally:
            c.close()

    def _mark(self, committed: int, marker: dict) -> None:
        c = self._consumer()
        try:
            c.commit(offsets=[TopicPartition(CONTROL_TOPIC, 0, committed + 1, metadata=json.dumps(marker))],
                     asynchronous=False)
        finally:
            c.close()

    def prepare(self, batch: int, state: State, txns: list[tuple[int, int, int]]) -> None:
        """Record that `batch` is to be committed, with its transactions."""
        self._ensure_topic()
        offsets: list[int] = []
        delivery = Delivery(self.opts.client.bootstrap)
        p = clients.make(Producer, self.opts.client, "producer", delivery.broker,
                         forced={"enable.idempotence": True, "acks": "all"})
        p.produce(CONTROL_TOPIC, json.dumps({"prefix": self.prefix, "batch": batch, "txns": txns}).encode(),
                  self.prefix.encode(), partition=0, on_delivery=lambda err, msg: offsets.append(msg.offset())
                  if err is None else delivery.failed.append(err))
        check_delivered(p, delivery)
        self._mark(state.committed, {"query": state.query, "tasks": state.tasks, "prepared": batch,
                                     "at": offsets[0]})

    def mark_committed(self, batch: int, state: State) -> None:
        self._mark(batch, {"query": state.query, "tasks": state.tasks})

    def _ensure_topic(self) -> None:
        admin = clients.make(AdminClient, self.opts.client, "admin")
        future = admin.create_topics([NewTopic(CONTROL_TOPIC, 1, -1)], operation_timeout=TIMEOUT_S)[CONTROL_TOPIC]
        try:
            future.result(TIMEOUT_S)
        except KafkaException as e:
            if e.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                raise

    def end(self, txns: Iterable[tuple[int, int, int]], commit: bool) -> None:
        """EndTxn for each (task, producer id, epoch), retried while the coordinator is busy.
        A failed commit raises; a failed abort is only logged (the next producer of that
        transactional id, or the transaction timeout, aborts it anyway)."""
        txns = list(txns)
        if not txns:
            return
        admin = _admin_client(self.opts)
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

    def settle(self, earlier: State) -> None:
        """Before another query's producers fence the transactions of `earlier`: commit the
        batch it had decided to commit (prepared), as its own restart would have."""
        if earlier.prepared is not None:
            log.warning("transactionalIdPrefix %s: finishing batch %d that query %s prepared", self.prefix,
                        earlier.prepared, earlier.query)
            self.end(earlier.txns, commit=True)

    def fence(self, tasks: Iterable[int]) -> None:
        """Abort what the producers of these tasks' transactional ids left open (a new producer
        with the same id fences them)."""
        for task in tasks:
            p = transactional_producer(self.opts, Delivery(self.opts.client.bootstrap), self.txn_id(task))
            p.init_transactions(TIMEOUT_S)
            del p


def transactional_producer(opts: SinkOptions, delivery: Delivery, txn_id: str) -> Producer:
    # A task's transaction stays open until the driver's commit: allow it the broker's default
    # maximum (kafka.transaction.timeout.ms overrides).
    return producer(opts, delivery, **{"transactional.id": txn_id, "transaction.timeout.ms": 900_000})


def _admin_client(opts: SinkOptions) -> Any:
    """kafka-python's admin client (imported here: only exactly-once writes need it). It has
    what librdkafka does not offer: DescribeTransactions, and the codec for EndTxn."""
    from kafka.admin import KafkaAdminClient

    return KafkaAdminClient(bootstrap_servers=opts.client.bootstrap, **_security(opts))


async def _end_txn(admin: Any, txn_id: str, producer_id: int, epoch: int, commit: bool) -> None:
    # kafka-python has the codec and the coordinator lookup but no public EndTxn call.
    from kafka.protocol.metadata import CoordinatorType
    from kafka.protocol.producer.transaction import EndTxnRequest

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


def _nonempty(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch] | None:
    """`batches` again, or None when they hold no row."""
    for first in batches:
        if first.num_rows:
            return itertools.chain([first], batches)
    return None


def write_task(opts: SinkOptions, prefix: str, batches: Iterator[pa.RecordBatch]) -> TxnCommit:
    task = TaskContext.get().partitionId()
    query, batch = micro_batch()
    rows = _nonempty(batches)
    if rows is None:
        # Nothing to write, and nothing to fence: Spark runs a micro-batch again on the same
        # input, so an earlier attempt of this task had no rows either.
        return TxnCommit(task, 0, query=query, batch=batch)
    txns = Transactions(opts, prefix)
    found = txns.state()
    if found.query != query:
        txns.settle(found)  # before this task's producer fences the earlier query's transaction
    state = found.of(query)
    if batch <= state.committed or batch == state.prepared:
        return TxnCommit(task, 0, query=query, batch=batch)  # decided before a restart: the driver finishes it
    delivery = Delivery(opts.client.bootstrap)
    txn_id = txns.txn_id(task)
    p = transactional_producer(opts, delivery, txn_id)
    p.init_transactions(TIMEOUT_S)  # fences an earlier attempt of this task, aborting what it wrote
    p.begin_transaction()
    count = produce_all(p, opts, rows, delivery)
    check_delivered(p, delivery)
    # librdkafka keeps its producer id to itself; the coordinator tells.
    admin = _admin_client(opts)
    try:
        described = admin.describe_transactions([txn_id])[txn_id]
    finally:
        admin.close()
    # Left open on purpose: destroying the producer does not abort it; the driver ends it.
    del p
    return TxnCommit(task, count, described.producer_id, described.producer_epoch, query, batch)


def _written(messages: list) -> list[tuple[int, int, int]]:
    return [(m.task, m.producer_id, m.producer_epoch) for m in messages if m and m.producer_id >= 0]


def commit_batch(opts: SinkOptions, prefix: str, messages: list, batch: int | None = None) -> None:
    """The driver's commit of a micro-batch, from its tasks' messages (`batch`: the batch id
    Spark gives a streaming sink; a foreachBatch write takes it from the messages)."""
    reported = [m for m in messages if m]
    if not reported:
        return  # no task ran: nothing was written
    query = reported[0].query
    batch = reported[0].batch if batch is None else batch
    txns = Transactions(opts, prefix)
    found = txns.state()
    state = found.of(query)
    if found.query != query:
        if found.query is not None:
            log.warning("transactionalIdPrefix %s was used by query %s; query %s takes it over", prefix,
                        found.query, query)
        txns.settle(found)
        txns.fence(set(range(found.tasks)) - {m.task for m in reported})
    tasks = max([state.tasks] + [m.task + 1 for m in reported])
    state = State(state.committed, state.prepared, state.txns, query, tasks)
    written = _written(reported)
    if batch <= state.committed:
        txns.end(written, commit=False)  # a replay of a committed batch: its new data goes
        return
    if state.prepared == batch:
        txns.end(state.txns, commit=True)  # finish what the stopped driver had decided
        txns.end(written, commit=False)
    else:
        txns.prepare(batch, state, written)
        txns.end(written, commit=True)
    txns.mark_committed(batch, state)


def abort_batch(opts: SinkOptions, prefix: str, messages: list, batch: int | None = None) -> None:
    """A task failed: abort what the batch wrote, unless the driver had already decided to
    commit it (prepared), in which case the restarted query finishes the commit."""
    reported = [m for m in messages if m]
    if not reported:
        return
    batch = reported[0].batch if batch is None else batch
    state = Transactions(opts, prefix).state().of(reported[0].query)
    if state.prepared == batch or batch <= state.committed:
        return
    Transactions(opts, prefix).end(_written(reported), commit=False)
