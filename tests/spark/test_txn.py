"""The exactly-once sink's driver side against a real broker, without Spark: a batch the
driver had recorded as prepared when it stopped is finished on replay, abort undoes an open
batch, and a new query reusing a prefix takes it over instead of taking its batches for
replays."""

from __future__ import annotations

from confluent_kafka import Producer
from kafka.admin import KafkaAdminClient

from strom.spark.options import sink_options
from strom.spark.txn import State, Transactions, TxnCommit, abort_batch, commit_batch
from strom.testing import consume_all, create_topic

from .conftest import end_offsets


def open_transaction(bootstrap: str, txn_id: str, topic: str, values: list[bytes]) -> tuple[int, int]:
    """What a task does: write inside a transaction, flush, leave it open; (producer id, epoch)."""
    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": txn_id})
    producer.init_transactions(15)
    producer.begin_transaction()
    for value in values:
        producer.produce(topic, value)
    assert producer.flush(15) == 0
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        described = admin.describe_transactions([txn_id])[txn_id]
    finally:
        admin.close()
    del producer  # librdkafka leaves the transaction open
    return described.producer_id, described.producer_epoch


def committed_values(bootstrap: str, topic: str) -> list[bytes]:
    return sorted(m.value() for m in consume_all(bootstrap, topic, **{"isolation.level": "read_committed"}))


def test_replay_finishes_a_prepared_batch(broker, topic):
    create_topic(broker.bootstrap, topic)
    opts = sink_options({"kafka.bootstrap.servers": broker.bootstrap, "topic": topic})
    prefix = "eos-" + topic
    txns = Transactions(opts, prefix)
    pid, epoch = open_transaction(broker.bootstrap, txns.txn_id(0), topic, [b"a", b"b", b"c"])
    [(lso, hw)] = end_offsets(broker.bootstrap, topic)
    assert (lso, hw) == (0, 3), "destroying the producer must leave its transaction open"

    # The driver recorded batch 0 as prepared, then stopped before any EndTxn.
    txns.prepare(0, State(-1, None, query="q1", tasks=1), [(0, pid, epoch)])
    assert txns.state() == State(-1, 0, ((0, pid, epoch),), "q1", 1)
    # Spark replays batch 0 after the restart; its tasks wrote nothing.
    commit_batch(opts, prefix, [TxnCommit(0, 0, query="q1", batch=0)], 0)
    assert txns.state() == State(0, None, query="q1", tasks=1)
    assert committed_values(broker.bootstrap, topic) == [b"a", b"b", b"c"]
    # Replayed once more: still nothing new.
    commit_batch(opts, prefix, [TxnCommit(0, 0, query="q1", batch=0)], 0)
    assert committed_values(broker.bootstrap, topic) == [b"a", b"b", b"c"]

    # Batch 1 fails: abort ends its open transaction, nothing of it is ever read.
    pid, epoch = open_transaction(broker.bootstrap, txns.txn_id(0), topic, [b"x"])
    abort_batch(opts, prefix, [TxnCommit(0, 1, pid, epoch, "q1", 1)], 1)
    [(lso, hw)] = end_offsets(broker.bootstrap, topic)
    assert lso == hw
    assert committed_values(broker.bootstrap, topic) == [b"a", b"b", b"c"]
    assert txns.state() == State(0, None, query="q1", tasks=1)


def test_abort_leaves_a_prepared_batch_to_be_finished(broker, topic):
    """A batch the driver had decided to commit (prepared) is never aborted: a failure during
    its EndTxns must not leave it half committed."""
    create_topic(broker.bootstrap, topic)
    opts = sink_options({"kafka.bootstrap.servers": broker.bootstrap, "topic": topic})
    prefix = "eos-" + topic
    txns = Transactions(opts, prefix)
    pid, epoch = open_transaction(broker.bootstrap, txns.txn_id(3), topic, [b"p", b"q"])
    txns.prepare(7, State(6, None, query="q1", tasks=4), [(3, pid, epoch)])
    abort_batch(opts, prefix, [TxnCommit(3, 2, pid, epoch, "q1", 7)], 7)
    [(lso, hw)] = end_offsets(broker.bootstrap, topic)
    assert lso < hw, "the prepared transaction must still be open"
    commit_batch(opts, prefix, [TxnCommit(3, 0, query="q1", batch=7)], 7)  # the replay after the restart
    assert committed_values(broker.bootstrap, topic) == [b"p", b"q"]
    assert txns.state() == State(7, None, query="q1", tasks=4)


def test_a_new_query_takes_a_used_prefix_over(broker, topic):
    """Query q1 committed up to batch 19, prepared batch 20 and stopped; it had also left a
    transaction open on a third transactional id. Query q2 (a new checkpoint: batch ids from 0)
    with the same prefix: q1's prepared batch is finished, the id q2 does not use is fenced
    (its open transaction aborted), and q2's batch 0 is committed, not taken for a replay."""
    create_topic(broker.bootstrap, topic)
    opts = sink_options({"kafka.bootstrap.servers": broker.bootstrap, "topic": topic})
    prefix = "eos-" + topic
    txns = Transactions(opts, prefix)
    prepared = open_transaction(broker.bootstrap, txns.txn_id(0), topic, [b"q1-20"])
    left_open = open_transaction(broker.bootstrap, txns.txn_id(2), topic, [b"q1-lost"])
    txns.prepare(20, State(19, None, query="q1", tasks=3), [(0, *prepared)])
    assert txns.state().of("q2") == State(-1, None, query="q2")

    new = open_transaction(broker.bootstrap, txns.txn_id(1), topic, [b"q2-0"])
    commit_batch(opts, prefix, [TxnCommit(0, 0, query="q2", batch=0), TxnCommit(1, 1, *new, "q2", 0)], 0)
    assert committed_values(broker.bootstrap, topic) == [b"q1-20", b"q2-0"]
    assert txns.state() == State(0, None, query="q2", tasks=2)
    [(lso, hw)] = end_offsets(broker.bootstrap, topic)
    assert lso == hw, f"{left_open} was left open"
