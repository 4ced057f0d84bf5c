"""The cluster's acceptance test: producers (idempotent and transactional) and a consumer
group run while a nemesis kill -9s a random broker, SIGSTOPs one past its session timeout,
restarts the controller and does a rolling restart. Afterwards every acknowledged record is
there in order and once per producer epoch (the broker de-duplicates every retry; see
idempotence.written_once for what only the client can repeat), committed transactions are
wholly visible to read_committed and aborted ones invisible, the group resumes from its
committed offsets, and every partition is fully replicated again. The idempotent producers'
topic is tiered to a real S3 server (SeaweedFS) with its local copies deleted once uploaded, so
its read-back goes through remote storage; the transactional one stays on the brokers' disks."""

from __future__ import annotations

import os
import random
import signal
import threading
import time
from collections import defaultdict

import pytest
from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition

from strom.s3_server import S3Server
from strom.testing import Cluster, consume_all, free_ports, tiered_overrides, unique_name

from .conftest import CLUSTER_OVERRIDES
from .idempotence import log_batches, values_of, written_once
from .replicas import wait_fully_replicated
from .test_cluster import create, live_brokers, partition_view

CLUSTER_MODES = ("zookeeper", "kraft")

PARTITIONS = 3
SEED = int(os.environ.get("STROM_NEMESIS_SEED", "1234"))  # which brokers the faults hit


class Workload:
    def __init__(self, cluster: Cluster, topic: str, txn_topic: str, group: str) -> None:
        self.cluster, self.topic, self.txn_topic, self.group = cluster, topic, txn_topic, group
        self.stop = threading.Event()
        self.acked: dict[int, list[tuple[int, bytes]]] = defaultdict(list)
        self.failed: list = []
        self.committed_txns: list[list[bytes]] = []
        self.aborted_txns: list[list[bytes]] = []
        self.consumed = 0
        self.errors: list[BaseException] = []
        self.progress: dict[str, str] = {}

    def run_idempotent(self) -> None:
        producer = Producer({"bootstrap.servers": self.cluster.bootstrap, "acks": "all",
                             "enable.idempotence": True, "linger.ms": 5, "message.timeout.ms": 300000})

        def report(err, msg):
            if err:
                self.failed.append(err)
            else:
                self.acked[msg.partition()].append((msg.offset(), msg.value()))

        i = 0
        while not self.stop.is_set():
            try:
                producer.produce(self.topic, b"r%08d" % i, partition=i % PARTITIONS, on_delivery=report)
                i += 1
            except BufferError:
                pass
            producer.poll(0.002)
        self.progress["idempotent"] = f"flushing {i} at {time.monotonic():.0f}"
        producer.flush(120)
        self.progress["idempotent"] = f"flushed at {time.monotonic():.0f}"

    def run_transactional(self) -> None:
        producer = Producer({"bootstrap.servers": self.cluster.bootstrap,
                             "transactional.id": unique_name("nemesis-txn"), "transaction.timeout.ms": 60000})
        producer.init_transactions(120)
        n = 0
        while not self.stop.is_set():
            values = [b"t%06d-%d" % (n, k) for k in range(6)]
            commit = n % 3 != 2
            self.progress["txn"] = f"transaction {n} {'commit' if commit else 'abort'} at {time.monotonic():.0f}"
            try:
                producer.begin_transaction()
                for k, value in enumerate(values):
                    producer.produce(self.txn_topic, value, partition=k % PARTITIONS)
                if commit:
                    producer.commit_transaction(60)
                    self.committed_txns.append(values)
                else:
                    producer.abort_transaction(60)
                    self.aborted_txns.append(values)
            except KafkaException as e:
                error = e.args[0]
                if error.fatal():
                    raise
                # Outcome unknown or refused: abort; its records must then never be visible.
                self.progress["txn-error"] = f"{error} at {time.monotonic():.0f}"
                try:
                    producer.abort_transaction(60)
                except KafkaException:
                    pass
                self.aborted_txns.append(values)
            n += 1
            time.sleep(0.05)

    def run_consumer(self) -> None:
        consumer = Consumer({"bootstrap.servers": self.cluster.bootstrap, "group.id": self.group,
                             "auto.offset.reset": "earliest", "enable.auto.commit": False,
                             "session.timeout.ms": 10000})
        consumer.subscribe([self.topic])
        try:
            while not self.stop.is_set():
                msgs = [m for m in consumer.consume(500, 0.5) if m.error() is None]
                self.consumed += len(msgs)
                if msgs:
                    try:
                        consumer.commit(asynchronous=False)
                    except KafkaException:
                        pass  # retried with the next batch
        finally:
            consumer.close()

    def guarded(self, fn):
        def run():
            try:
                fn()
            except BaseException as e:  # noqa: BLE001 - reported by the test
                self.errors.append(e)
        return threading.Thread(target=run, daemon=True)


def _nemesis(cluster: Cluster, rng: random.Random, log: list[str]) -> None:
    ids = sorted(cluster.brokers)
    victim = rng.choice(ids)  # 1. kill -9 a random broker, restart it
    log.append(f"kill -9 broker {victim}")
    cluster.brokers[victim].kill()
    time.sleep(2)
    cluster.brokers[victim].start()
    time.sleep(3)
    paused = rng.choice(ids)  # 2. SIGSTOP one past its session timeout
    log.append(f"SIGSTOP broker {paused} for 7 s")
    os.kill(cluster.brokers[paused].proc.pid, signal.SIGSTOP)
    time.sleep(7)
    os.kill(cluster.brokers[paused].proc.pid, signal.SIGCONT)
    time.sleep(5)
    controller = cluster.controller_id()  # 3. restart the controller
    log.append(f"kill -9 the controller (broker {controller}) and restart it")
    cluster.brokers[controller].kill()
    cluster.brokers[controller].start()
    time.sleep(3)
    for broker_id in ids:  # 4. rolling restart
        log.append(f"rolling restart: broker {broker_id}")
        assert cluster.brokers[broker_id].stop() == 0
        cluster.brokers[broker_id].start()
        time.sleep(2)


# Longer than the waits below add up to (joins, two reads of 180 s): when one runs out, its
# message says what was missing, where pytest-timeout would only show where it was.
@pytest.fixture(scope="module")
def s3():
    with S3Server(ports=free_ports) as server:
        yield server


@pytest.mark.timeout(900)
def test_nemesis(zookeeper, s3):
    """The idempotent producers' topic is tiered, its local copies gone as soon as they are
    uploaded, so what is read back after the faults comes mostly from the object store; the
    transactional one is not, and is read from the replicas' disks."""
    run_nemesis(zookeeper, tiered_overrides(s3.rsm_config(key_prefix=f"{unique_name('nemesis')}/"), **{
                    "log.retention.check.interval.ms": "500", "log.segment.delete.delay.ms": "60000",
                    "rlmm.config.remote.log.metadata.topic.num.partitions": "3"}),
                {"remote.storage.enable": "true", "segment.bytes": "65536", "local.retention.ms": "1"})


def run_nemesis(zookeeper, extra_overrides: dict[str, str], topic_configs: dict[str, str]) -> None:
    """The run on a fresh cluster with `extra_overrides`, the idempotent producers' topic made with
    `topic_configs`."""
    overrides = {**CLUSTER_OVERRIDES, "replica.lag.time.max.ms": "5000",
                 "controlled.shutdown.retry.backoff.ms": "500", **extra_overrides}
    with Cluster(3, zookeeper=zookeeper, overrides=overrides, session_timeout_ms=4000) as cluster:
        topic, txn_topic = unique_name("nemesis"), unique_name("nemesis-txn")
        create(cluster, topic, PARTITIONS, configs={"min.insync.replicas": "2", **topic_configs})
        create(cluster, txn_topic, PARTITIONS, configs={"min.insync.replicas": "2"})
        work = Workload(cluster, topic, txn_topic, unique_name("nemesis-group"))
        threads = [work.guarded(f) for f in (work.run_idempotent, work.run_transactional, work.run_consumer)]
        for t in threads:
            t.start()
        time.sleep(3)
        log: list[str] = []
        _nemesis(cluster, random.Random(SEED), log)
        time.sleep(3)
        work.stop.set()
        for t in threads:
            t.join(150)
        stuck = [name for t, name in zip(threads, ("idempotent", "transactional", "consumer"), strict=True)
                 if t.is_alive()]
        assert not stuck, f"still running: {stuck}; progress {work.progress}; nemesis {log}"
        assert not work.errors, work.errors
        assert not work.failed, work.failed[:3]

        # Every acknowledged record once per producer epoch and in order, per partition (see
        # idempotence.written_once: librdkafka may resend under a new epoch what a leader that
        # stepped down had written), and a consumer reads the log as its leader serves it.
        everything = _read_all(cluster, topic, "read_uncommitted")
        leaders = {p: leader for p, (leader, _, _) in partition_view(live_brokers(cluster)[0], topic).items()}
        again = 0
        for p in range(PARTITIONS):
            acked = [v for _, v in sorted(work.acked[p])]
            assert acked == sorted(acked), f"partition {p}: acknowledged out of the order produced"
            log_ = log_batches(cluster, topic, p, leaders[p])
            assert [v for _, v in everything[p]] == values_of(log_), f"partition {p}"
            again += written_once(p, acked, log_)
        # Committed transactions whole, aborted ones invisible.
        visible = {v for vs in _read_all(cluster, txn_topic, "read_committed").values() for _, v in vs}
        committed = {v for vs in work.committed_txns for v in vs}
        aborted = {v for vs in work.aborted_txns for v in vs}
        assert committed <= visible and not (aborted & visible)
        # The group resumes from its committed offsets.
        consumer = Consumer({"bootstrap.servers": cluster.bootstrap, "group.id": work.group,
                             "enable.auto.commit": False})
        try:
            committed_offsets = consumer.committed([TopicPartition(topic, p) for p in range(PARTITIONS)], 30)
        finally:
            consumer.close()
        assert sum(max(tp.offset, 0) for tp in committed_offsets) > 0
        # Healed: every partition of every topic, internal ones included, has all its replicas
        # in sync again and their logs end where their leaders' do.
        wait_fully_replicated(cluster, 60)
        if topic_configs.get("remote.storage.enable") == "true":  # the reads above were remote ones
            consumer = Consumer({"bootstrap.servers": cluster.bootstrap, "group.id": unique_name("local")})
            try:
                local = consumer.offsets_for_times([TopicPartition(topic, p, -4) for p in range(PARTITIONS)], 30)
            finally:
                consumer.close()
            assert all(tp.offset > 0 for tp in local), local
        total = sum(len(v) for v in work.acked.values())
        print(f"nemesis: {'; '.join(log)}")
        print(f"nemesis: {total} acknowledged records, all read back in order, {again} again under a later "
              "producer epoch; "
              f"{len(work.committed_txns)} transactions committed, {len(work.aborted_txns)} aborted; "
              f"group consumed {work.consumed} and committed {sum(max(t.offset, 0) for t in committed_offsets)}")


def _read_all(cluster: Cluster, topic: str, isolation: str) -> dict[int, list[tuple[int, bytes]]]:
    """Every partition read to its high watermark (under read_committed too: every transaction
    has ended, so the last stable offset reaches it, at the latest when the coordinator aborts
    one left open)."""
    out: dict[int, list[tuple[int, bytes]]] = defaultdict(list)
    for msg in consume_all(cluster.bootstrap, topic, timeout=180, allow_empty=isolation == "read_committed",
                           **{"isolation.level": isolation}):
        out[msg.partition()].append((msg.offset(), msg.value()))
    return out
