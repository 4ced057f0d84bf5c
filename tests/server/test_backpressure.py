"""Bounded memory against careless clients: a frame header that announces far more than it
sends, and a client that pipelines Fetch requests without reading the answers."""

from __future__ import annotations

import socket
import struct
import time

from confluent_kafka import Producer

from strom.protocol import messages
from strom.testing import BrokerProcess, RawClient, memory_mb


def closed_by_peer(sock: socket.socket) -> bool:
    sock.settimeout(5)
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True
    finally:
        sock.close()


def still_serving(broker: BrokerProcess) -> None:
    with RawClient(broker) as client:
        body = client.call(18, 3, {"client_software_name": "t", "client_software_version": "1"})
        assert body.error_code == 0


def test_announced_but_unsent_frames_do_not_reserve_memory():
    with BrokerProcess(overrides={"socket.request.max.bytes": str(100 << 20)}) as broker:
        before = memory_mb(broker.proc.pid)
        socks = []
        for _ in range(20):
            s = socket.create_connection(("127.0.0.1", broker.port))
            s.sendall(struct.pack(">i", 100 << 20) + b"\x00" * 14)  # 100 MB announced, 14 sent
            socks.append(s)
        time.sleep(1)
        grown = memory_mb(broker.proc.pid) - before
        still_serving(broker)
        for s in socks:
            s.close()
        assert grown < 200, f"RSS grew by {grown:.0f} MB for 20 x 14 bytes"


def test_a_client_that_never_reads_its_answers_is_not_buffered_without_bound():
    # Many small partitions: their regions are read and written with the response (no
    # sendfile, which waits for the socket by itself), as in the reported case.
    with BrokerProcess(overrides={"num.partitions": "100"}) as broker:
        producer = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 20})
        for i in range(2000):
            producer.produce("unread", b"%05d" % i + b"x" * 1000, partition=i % 100)
        assert producer.flush(30) == 0
        fetch = messages.encode_request(1, 11, {
            "replica_id": -1, "max_wait_ms": 0, "min_bytes": 0, "max_bytes": 4 << 20,
            "isolation_level": 0, "session_id": 0, "session_epoch": -1, "rack_id": "",
            "forgotten_topics_data": [], "topics": [{"topic": "unread", "partitions": [
                {"partition": p, "current_leader_epoch": -1, "fetch_offset": 0, "log_start_offset": -1,
                 "partition_max_bytes": 1 << 20} for p in range(100)]}]})
        before = memory_mb(broker.proc.pid)
        s = socket.create_connection(("127.0.0.1", broker.port))
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        s.settimeout(0.5)
        sent = 0
        try:
            for _ in range(3000):  # 3,000 answers of ~2 MB each would be 6 GB
                s.sendall(fetch)
                sent += 1
        except TimeoutError:
            pass  # the broker stopped reading: what this test wants
        time.sleep(2)
        grown = memory_mb(broker.proc.pid) - before
        still_serving(broker)
        s.close()
        assert grown < 300, f"RSS grew by {grown:.0f} MB after {sent} unread Fetch requests"


def test_connection_limits_and_idle_connections():
    with BrokerProcess(overrides={"max.connections.per.ip": "5", "connections.max.idle.ms": "1500"}) as broker:
        socks = [socket.create_connection(("127.0.0.1", broker.port)) for _ in range(5)]
        extra = socket.create_connection(("127.0.0.1", broker.port))
        assert closed_by_peer(extra), "the sixth connection from one IP is closed"
        time.sleep(4)  # past connections.max.idle.ms: the idle ones are closed by the broker
        assert all(closed_by_peer(s) for s in socks)
        still_serving(broker)  # and new connections are welcome again
        assert "max.connections.per.ip=5 reached" in broker.log_text()
