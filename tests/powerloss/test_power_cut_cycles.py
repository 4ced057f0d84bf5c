"""Power cut after power cut: what one recovery leaves must survive the next cut as well.

Kafka's defaults row of the durability table, repeated: every start-up recovers from a torn
log, and the next cut comes while that recovery's own changes (the truncated tail, the
rebuilt indexes, the reused offsets) are still unsynced. And the producer-state side of it:
an idempotent producer that lives through a cut finds the broker knowing its sequence
numbers, so its retries are not written twice.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from strom.protocol.records import build_batch
from strom.testing import RawClient, unique_name

from .crash_harness import Power, powered
from .test_power_cut import (
    active_base,
    assert_clean_prefix,
    checkpoint,
    create_topic,
    produce_numbers,
    read_partition,
    wait_for,
)

pytestmark = pytest.mark.timeout(180)

PRODUCE, INIT_PRODUCER_ID = 0, 22
OUT_OF_ORDER_SEQUENCE_NUMBER = 45


@pytest.fixture
def power(tmp_path: Path) -> Iterator[Power]:
    yield from powered(tmp_path)


def test_repeated_torn_power_cuts_each_leave_a_clean_prefix(power: Power) -> None:
    """Kafka's defaults row, four cuts in a row, each torn (write-back part way through): after
    every restart the partition holds a prefix of everything written to it since it was
    created, with no gap and no record twice, and never less than what was flushed (the
    recovery point checkpointed before the cut)."""
    broker = power.broker(**{"log.flush.offset.checkpoint.interval.ms": "200"})
    topic = unique_name("repeated-cuts")
    create_topic(broker.bootstrap, topic, **{"segment.bytes": "16384"})
    held: list[int] = []  # the numbers partition 0 holds, by offset
    for seed in range(1, 5):
        acked = produce_numbers(broker.bootstrap, topic, range(seed * 1000, seed * 1000 + 250))
        assert sorted(acked.values()) == list(range(len(held), len(held) + 250)), \
            "appends go right after what the last recovery kept"
        written = held + sorted(acked, key=acked.__getitem__)
        flushed = active_base(broker, topic)
        assert flushed > len(held), "the records did not roll a segment"
        wait_for(lambda: checkpoint(broker, "recovery-point-offset-checkpoint").get((topic, 0)) == flushed,  # noqa: B023
                 what=f"the recovery point checkpoint to reach {flushed}")
        power.cut(torn_seed=seed)
        broker.restart()
        _, read = read_partition(broker.bootstrap, topic)
        assert_clean_prefix(read)
        held = [n for _, n in read]
        assert held == written[:len(held)], f"cut {seed}: not a prefix of what was written"
        assert len(held) >= flushed, f"cut {seed}: flushed records lost\n{power.logs()}"


def produce_batch(client: RawClient, topic: str, pid: int, epoch: int, seq: int) -> tuple[int, int]:
    """Produce (acks=all) a batch of three records numbered seq.. from producer `pid`; the
    (error code, base offset) answered."""
    batch = build_batch([(None, b"%d" % (seq + i)) for i in range(3)], producer_id=pid,
                        producer_epoch=epoch, base_sequence=seq)
    body = client.call(PRODUCE, 9, {"transactional_id": None, "acks": -1, "timeout_ms": 10000,
                                     "topic_data": [{"name": topic, "partition_data": [
                                         {"index": 0, "records": batch}]}]})
    answer = body.responses[0].partition_responses[0]
    return answer.error_code, answer.base_offset


def test_idempotent_producer_state_survives_a_power_cut(power: Power) -> None:
    """With flush.messages=1 every acknowledged record survives the cut, and so must what the
    broker knows of each idempotent producer (its snapshot, then the log after it): a retried
    batch gets its first answer instead of being written again, a gap in the sequence is
    refused, and the next batch in sequence lands right after the acknowledged ones."""
    broker = power.broker(**{"log.flush.interval.messages": "1",
                             "log.flush.offset.checkpoint.interval.ms": "200"})
    topic = unique_name("idempotent-cut")
    create_topic(broker.bootstrap, topic)
    client = RawClient(broker)
    init = client.call(INIT_PRODUCER_ID, 4, {"transactional_id": None, "transaction_timeout_ms": 60000,
                                             "producer_id": -1, "producer_epoch": -1})
    assert init.error_code == 0
    pid = init.producer_id
    for seq in range(0, 18, 3):
        assert produce_batch(client, topic, pid, 0, seq) == (0, seq)
    pdir = broker.data_dir / "logs" / f"{topic}-0"
    wait_for(lambda: list(pdir.glob("*.snapshot")), what="a producer snapshot")
    for seq in range(18, 30, 3):  # after the snapshot: these come back from the log
        assert produce_batch(client, topic, pid, 0, seq) == (0, seq)
    client.close()
    power.cut()
    broker.restart()
    client = RawClient(broker)
    try:
        assert produce_batch(client, topic, pid, 0, 27) == (0, 27), "a retry of the last batch"
        assert produce_batch(client, topic, pid, 0, 18) == (0, 18), "a retry among the last five"
        assert produce_batch(client, topic, pid, 0, 33)[0] == OUT_OF_ORDER_SEQUENCE_NUMBER
        assert produce_batch(client, topic, pid, 0, 30) == (0, 30)
    finally:
        client.close()
    _, read = read_partition(broker.bootstrap, topic)
    assert read == [(n, n) for n in range(33)], "each record once, at the offset it was given"
