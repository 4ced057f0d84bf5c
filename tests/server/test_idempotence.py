"""Idempotent produce over the wire: retries de-duplicated, gaps and stale epochs rejected,
and the de-duplication state survives kill -9."""

import pytest

from strom.protocol.records import build_batch
from strom.testing import BrokerProcess, RawClient

PRODUCE, FIND_COORDINATOR, INIT_PRODUCER_ID, CREATE_TOPICS = 0, 10, 22, 19

pytestmark = pytest.mark.timeout(120)


def _produce(client: RawClient, batch: bytes) -> tuple[int, int]:
    body = client.call(PRODUCE, 9, {"transactional_id": None, "acks": -1, "timeout_ms": 5000,
                                     "topic_data": [{"name": "idem", "partition_data": [
                                         {"index": 0, "records": batch}]}]})
    p = body.responses[0].partition_responses[0]
    return p.error_code, p.base_offset


def _batch(pid: int, epoch: int, seq: int, n: int = 3) -> bytes:
    return build_batch([(b"k", b"v%d" % i) for i in range(n)], producer_id=pid,
                       producer_epoch=epoch, base_sequence=seq)


def test_idempotent_produce_semantics_survive_kill(tmp_path):
    broker = BrokerProcess(data_dir=tmp_path)
    try:
        broker.start()
        client = RawClient(broker)
        assert client.call(CREATE_TOPICS, 5, {"topics": [{"name": "idem", "num_partitions": 1,
                           "replication_factor": 1, "assignments": [], "configs": []}],
                           "timeout_ms": 5000}).topics[0].error_code == 0
        init = client.call(INIT_PRODUCER_ID, 4, {"transactional_id": None,
                                                 "transaction_timeout_ms": 60000,
                                                 "producer_id": -1, "producer_epoch": -1})
        pid = init.producer_id
        assert init.error_code == 0 and pid >= 0 and init.producer_epoch == 0
        second = client.call(INIT_PRODUCER_ID, 4, {"transactional_id": None,
                                                   "transaction_timeout_ms": 60000,
                                                   "producer_id": -1, "producer_epoch": -1})
        assert second.producer_id != pid

        assert _produce(client, _batch(pid, 0, 0)) == (0, 0)
        assert _produce(client, _batch(pid, 0, 3)) == (0, 3)
        assert _produce(client, _batch(pid, 0, 0)) == (0, 0)  # a retry: same answer, not rewritten
        assert _produce(client, _batch(pid, 0, 9))[0] == 45  # OUT_OF_ORDER_SEQUENCE_NUMBER
        assert _produce(client, _batch(pid, 0, 6)) == (0, 6)
        client.close()

        broker.kill()  # no snapshot at shutdown: state must come back from the log itself
        broker.start()
        client = RawClient(broker)
        assert _produce(client, _batch(pid, 0, 6)) == (0, 6)
        assert _produce(client, _batch(pid, 0, 9)) == (0, 9)
        assert _produce(client, _batch(pid, 1, 0)) == (0, 12)  # a new epoch restarts at 0
        assert _produce(client, _batch(pid, 0, 12))[0] == 47  # INVALID_PRODUCER_EPOCH
        client.close()

        assert broker.stop() == 0  # clean stop writes a snapshot next to the segments
        assert list((tmp_path / "logs" / "idem-0").glob("*.snapshot"))
        broker.start()
        client = RawClient(broker)
        assert _produce(client, _batch(pid, 1, 0)) == (0, 12)
        client.close()
    finally:
        broker.close()


def test_transactional_init_asks_the_coordinator_and_bumps_the_epoch(tmp_path):
    with BrokerProcess(data_dir=tmp_path) as broker:
        client = RawClient(broker)

        def init(timeout_ms: int = 60000):
            return client.call(INIT_PRODUCER_ID, 4, {"transactional_id": "tx-1",
                                                     "transaction_timeout_ms": timeout_ms,
                                                     "producer_id": -1, "producer_epoch": -1})

        # Before FindCoordinator creates __transaction_state, no broker coordinates the id.
        assert init().error_code == 16  # NOT_COORDINATOR
        found = client.call(FIND_COORDINATOR, 3, {"key": "tx-1", "key_type": 1})
        assert found.error_code == 0 and found.node_id == 0
        first, second = init(), init()
        assert (first.error_code, first.producer_epoch) == (0, 0)
        assert (second.error_code, second.producer_id, second.producer_epoch) == (
            0, first.producer_id, 1)
        assert init(timeout_ms=900_001).error_code == 50  # INVALID_TRANSACTION_TIMEOUT
