"""A minimal blocking Kafka client for one partition: find its leader, Fetch from it, list its
offsets. Requests and responses go through Strom's sans-I/O codec (`strom.protocol`); the
record bytes are left to the caller. Used by the task side of reads (fetch.py) when the
connection is plain TCP: it hands over whole record batches, which decode several times faster
than librdkafka's per-message objects."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from strom.client import Connection
from strom.spark.options import parse_bootstrap

METADATA, FETCH, LIST_OFFSETS = 3, 1, 2
# Non-flexible versions every broker since Kafka 2.3 serves (and 4.x still does).
METADATA_V, FETCH_V, LIST_OFFSETS_V = 8, 11, 4
EARLIEST, LATEST = -2, -1
# Errors after which the partition's leader is looked up again and the request retried.
RETRIABLE = {3, 5, 6, 7, 56, 74, 75}  # unknown partition, no leader, not leader, timeout, storage, epochs
UNKNOWN_TOPIC_OR_PARTITION = 3


class KafkaProtocolError(RuntimeError):
    """A broker answered with an error code."""

    def __init__(self, what: str, code: int) -> None:
        super().__init__(f"{what}: Kafka error code {code}")
        self.code = code


class PartitionGone(RuntimeError):
    """Metadata says the topic or partition does not exist."""


@dataclass
class FetchedPartition:
    error_code: int
    high_watermark: int
    last_stable_offset: int
    log_start_offset: int
    aborted: list[tuple[int, int]]  # (producer id, first offset) of aborted transactions
    records: bytes


class PartitionClient:
    """Fetch and ListOffsets for one topic-partition, at its current leader."""

    def __init__(self, bootstrap: str, topic: str, partition: int, timeout_s: float,
                 client_id: str = "strom-spark") -> None:
        self.hosts = parse_bootstrap(bootstrap)
        self.topic, self.partition, self.timeout_s, self.client_id = topic, partition, timeout_s, client_id
        self.conn: Connection | None = None

    def fetch(self, offset: int, isolation_level: int, max_wait_ms: int, max_bytes: int,
              partition_max_bytes: int | None = None, min_bytes: int = 1) -> FetchedPartition:
        """Records from `offset`: at most `max_bytes` in all and `partition_max_bytes` of the
        partition (the broker still sends a first batch that is larger, as Kafka does)."""
        body = self._leader().call(FETCH, FETCH_V, {
            "replica_id": -1, "max_wait_ms": max_wait_ms, "min_bytes": min_bytes, "max_bytes": max_bytes,
            "isolation_level": isolation_level, "session_id": 0, "session_epoch": -1,
            "topics": [{"topic": self.topic, "partitions": [{
                "partition": self.partition, "current_leader_epoch": -1, "fetch_offset": offset,
                "log_start_offset": -1,
                "partition_max_bytes": max_bytes if partition_max_bytes is None else partition_max_bytes}]}],
            "forgotten_topics_data": [], "rack_id": ""})
        if body.error_code:
            raise KafkaProtocolError("Fetch", body.error_code)
        p = body.responses[0].partitions[0]
        aborted = [(a.producer_id, a.first_offset) for a in p.aborted_transactions or ()]
        return FetchedPartition(p.error_code, p.high_watermark, p.last_stable_offset, p.log_start_offset,
                                aborted, p.records or b"")

    def watermarks(self, isolation_level: int) -> tuple[int, int]:
        """(log start offset, end offset: high watermark or, read_committed, last stable offset)."""
        return self._list_offset(EARLIEST, isolation_level), self._list_offset(LATEST, isolation_level)

    def _list_offset(self, timestamp: int, isolation_level: int) -> int:
        # One request per timestamp: a partition may appear only once in a ListOffsets request.
        body = self._leader().call(LIST_OFFSETS, LIST_OFFSETS_V, {
            "replica_id": -1, "isolation_level": isolation_level, "topics": [{"name": self.topic, "partitions": [
                {"partition_index": self.partition, "current_leader_epoch": -1, "timestamp": timestamp}]}]})
        p = body.topics[0].partitions[0]
        if p.error_code:
            raise KafkaProtocolError("ListOffsets", p.error_code)
        return p.offset

    def reset(self) -> None:
        """Forget the connection: the next request looks the leader up again."""
        if self.conn is not None:
            self.conn.close()
            self.conn = None

    close = reset

    def _leader(self) -> Connection:
        if self.conn is None:
            host, port = self._find_leader()
            self.conn = Connection(host, port, self.timeout_s, self.client_id)
        return self.conn

    def _find_leader(self) -> tuple[str, int]:
        error: Exception | None = None
        for host, port in self.hosts:
            try:
                conn = Connection(host, port, self.timeout_s, self.client_id)
            except OSError as e:
                error = e
                continue
            try:
                body = conn.call(METADATA, METADATA_V, {
                    "topics": [{"name": self.topic}], "allow_auto_topic_creation": False,
                    "include_cluster_authorized_operations": False,
                    "include_topic_authorized_operations": False})
            except OSError as e:
                error = e
                continue
            finally:
                conn.close()
            return self._leader_address(body)
        raise ConnectionError(f"no broker of {','.join(f'{h}:{p}' for h, p in self.hosts)} answered: {error}")

    def _leader_address(self, body: Any) -> tuple[str, int]:
        topic = body.topics[0]
        if topic.error_code == UNKNOWN_TOPIC_OR_PARTITION:
            raise PartitionGone(f"{self.topic} does not exist")
        if topic.error_code:
            raise KafkaProtocolError("Metadata", topic.error_code)
        leaders = {p.partition_index: p.leader_id for p in topic.partitions}
        if self.partition not in leaders:
            raise PartitionGone(f"{self.topic}-{self.partition} does not exist")
        brokers = {b.node_id: (b.host, b.port) for b in body.brokers}
        if leaders[self.partition] not in brokers:
            raise ConnectionError(f"{self.topic}-{self.partition} has no leader now")
        return brokers[leaders[self.partition]]
