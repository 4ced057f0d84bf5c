"""What a broker owes an idempotent producer, checked on a partition's log as its leader
serves it: the batches' producer ids, epochs and sequences, not only the values a consumer
reads."""

from __future__ import annotations

from strom.client import Connection
from strom.protocol.records import HEADER_SIZE, iter_values, read_header
from strom.testing import Cluster

FETCH = 1


def log_batches(cluster: Cluster, topic: str, partition: int, leader: int) -> list[tuple[tuple[int, int], int, list]]:
    """((producer id, epoch), base sequence, values) of each batch of the partition, read from
    its leader up to the high watermark."""
    out, offset, end = [], 0, 1
    with Connection("127.0.0.1", cluster.brokers[leader].port) as client:
        while offset < end:
            body = client.call(FETCH, 12, {
                "replica_id": -1, "max_wait_ms": 0, "min_bytes": 0, "max_bytes": 8 << 20, "isolation_level": 0,
                "session_id": 0, "session_epoch": -1, "topics": [{"topic": topic, "partitions": [
                    {"partition": partition, "current_leader_epoch": -1, "fetch_offset": offset,
                     "last_fetched_epoch": -1, "log_start_offset": -1, "partition_max_bytes": 8 << 20}]}],
                "forgotten_topics_data": [], "rack_id": ""})
            answer = body.responses[0].partitions[0]
            assert answer.error_code == 0, answer
            data, pos, end = answer.records or b"", 0, answer.high_watermark
            while len(data) - pos >= HEADER_SIZE and pos + read_header(data, pos).size <= len(data):
                h = read_header(data, pos)
                out.append(((h.producer_id, h.producer_epoch), h.base_sequence, iter_values(data, pos)))
                offset, pos = h.last_offset + 1, pos + h.size
    return out


def values_of(log: list[tuple[tuple[int, int], int, list]]) -> list:
    """The log's values in offset order (what a consumer reading it whole must get)."""
    return [value for _, _, values in log for value in values]


def written_once(partition: int, acknowledged: list[bytes], log: list[tuple[tuple[int, int], int, list]]) -> int:
    """What the broker owes an idempotent producer: under one producer epoch, each batch's
    sequence follows the last with no gap and no repeat (a retry is answered, not written), and
    what was acknowledged is in the log in order. A record may appear again only under a later
    epoch: librdkafka bumps its epoch when a request behind a failed one is refused
    OUT_OF_ORDER_SEQUENCE_NUMBER and resends under the new epoch what other partitions had in
    flight, some of which a leader that has since stepped down had written (its open issue
    #4953, seen with Kafka's brokers too); no broker can know those records. Returns how many
    such records the log holds."""
    epochs: list[tuple[int, int]] = []  # in the order they appear in the log
    next_seq: dict[tuple[int, int], int] = {}
    first_in: dict[bytes, tuple[int, int]] = {}
    kept, again = [], 0
    for epoch, seq, values in log:
        if not epochs or epochs[-1] != epoch:
            assert epoch not in epochs, f"partition {partition}: producer epoch {epoch} again after {epochs[-1]}"
            epochs.append(epoch)
        assert seq == next_seq.get(epoch, 0), \
            f"partition {partition}: epoch {epoch}: sequence {seq} where {next_seq.get(epoch, 0)} was next"
        next_seq[epoch] = seq + len(values)
        for value in values:
            if value in first_in:
                assert first_in[value] != epoch, f"partition {partition}: {value!r} written twice in epoch {epoch}"
                again += 1
            else:
                first_in[value] = epoch
                kept.append(value)
    assert kept == acknowledged, f"partition {partition}: {len(kept)} distinct records, {len(acknowledged)} acknowledged"
    return again
