"""Large fetch responses to a slow reader: the zero-copy send path must deliver every byte in
order when the socket fills up, under both event loops."""

import socket
import time

import pytest

from strom.protocol import messages
from strom.protocol.frames import FrameDecoder
from strom.protocol.records import build_batch, iter_records, scan_valid_prefix
from strom.testing import BrokerProcess, RawClient

PRODUCE, FETCH, CREATE_TOPICS = 0, 1, 19

pytestmark = pytest.mark.timeout(120)


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_slow_reader_gets_every_byte(loop):
    with BrokerProcess(env={"STROM_EVENT_LOOP": loop}) as broker:
        client = RawClient(broker)
        client.call(CREATE_TOPICS, 5, {"topics": [{"name": "big", "num_partitions": 1,
                    "replication_factor": 1, "assignments": [], "configs": []}], "timeout_ms": 5000})
        values = []
        for b in range(8):  # 8 batches of ~1 MB
            batch_values = [b"%d-%d-" % (b, i) + bytes([i % 251]) * 1000 for i in range(1000)]
            values += batch_values
            body = client.call(PRODUCE, 9, {"transactional_id": None, "acks": 1, "timeout_ms": 5000,
                               "topic_data": [{"name": "big", "partition_data": [
                                   {"index": 0, "records": build_batch([(None, v) for v in batch_values])}]}]})
            assert body.responses[0].partition_responses[0].error_code == 0
        client.close()

        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8192)
        sock.connect(("127.0.0.1", broker.port))
        sock.sendall(messages.encode_request(FETCH, 12, {
            "replica_id": -1, "max_wait_ms": 100, "min_bytes": 1, "max_bytes": 64 << 20,
            "isolation_level": 0, "session_id": 0, "session_epoch": -1,
            "topics": [{"topic": "big", "partitions": [{"partition": 0, "fetch_offset": 0,
                                                        "partition_max_bytes": 32 << 20}]}],
            "forgotten_topics_data": [], "rack_id": ""}, correlation_id=42))
        decoder, frames = FrameDecoder(1 << 30), []
        deadline = time.monotonic() + 60
        while not frames and time.monotonic() < deadline:
            chunk = sock.recv(4096)
            assert chunk, "broker closed the connection mid-response"
            frames = decoder.feed(chunk)
            time.sleep(0.0005)  # a slow consumer: the broker's socket fills up
        sock.close()
        correlation, response = messages.decode_response(FETCH, 12, bytes(frames[0]))
        assert correlation == 42
        records = bytes(response.responses[0].partitions[0].records)
        batches, valid = scan_valid_prefix(records)
        assert valid == len(records) and len(batches) == 8
        got = [r.value for pos, _ in batches for r in iter_records(records, pos)]
        assert got == values
        assert [r.offset for r in iter_records(records, batches[-1][0])][-1] == 7999
