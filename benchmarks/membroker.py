"""The baseline broker: a minimal in-memory Kafka endpoint that does almost no work.

It answers just what librdkafka needs (ApiVersions, Metadata, CreateTopics, ListOffsets,
Produce, Fetch) on 127.0.0.1, so that the same client processes can be pointed at it and at
Strom: what they reach against it is the ceiling set by the clients, the load generator and
loopback TCP on this machine. Each topic works in one of three ways, chosen by a topic config
at creation (`membroker.mode`):

- `discard` (default): a null sink. Produce counts the records of each batch (its header only)
  and keeps nothing; the end offset advances as if they were stored.
- `store`: produce keeps each record set in memory, base offsets patched; fetch returns it.
  For the latency runs, where the data must really flow from producer to consumer.
- `synthetic`: a partition that already holds `membroker.synthetic.records` records of
  `membroker.synthetic.size` bytes in batches of `membroker.synthetic.batch.records`, all
  served from one template batch with only the 8-byte base offset written per batch. For the
  consume runs: the client decodes the same records as from Strom, and the baseline neither
  copies them nor grows its memory.

It reuses only Strom's codec adapter (`strom.protocol.messages`, a thin layer over
kafka-python's generated tables) and `crc32c`; none of Strom's server, log or fetch code.

Run: python benchmarks/membroker.py [--port 0] [--event-loop asyncio|uvloop]
It prints `membroker ready on 127.0.0.1:PORT` once listening and stops on SIGTERM/SIGINT.
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import signal
import struct
import sys
import time
import uuid
from collections import deque

from crc32c import crc32c

from strom.protocol import messages
from strom.protocol.varint import write_uvarint, write_varint

PRODUCE, FETCH, LIST_OFFSETS, METADATA, API_VERSIONS, CREATE_TOPICS = 0, 1, 2, 3, 18, 19
# The same version ranges Strom advertises, so clients speak the same wire versions to both.
VERSIONS = {PRODUCE: (3, 11), FETCH: (4, 12), LIST_OFFSETS: (1, 8), METADATA: (0, 12),
            API_VERSIONS: (0, 3), CREATE_TOPICS: (2, 7)}
UNKNOWN_TOPIC_OR_PARTITION, UNSUPPORTED_VERSION, TOPIC_ALREADY_EXISTS = 3, 35, 36
INVALID_CONFIG = 40
_SIZE = struct.Struct(">i")
_BATCH = struct.Struct(">qi")  # baseOffset, batchLength
_OFFSET = struct.Struct(">q")
_LAST_DELTA_AT = 23  # lastOffsetDelta's position inside a v2 batch
_I32 = struct.Struct(">i")
_HEADER = struct.Struct(">qiibIhiqqqhii")  # RecordBatch v2 header, 61 bytes


class PartitionLog:
    """A partition in `discard` or `store` mode."""

    __slots__ = ("chunks", "lasts", "end", "waiters", "store")

    def __init__(self, store: bool) -> None:
        self.chunks: list[tuple[int, bytearray]] = []  # (base offset, record set)
        self.lasts: list[int] = []  # last offset of each chunk, for bisect
        self.end = 0
        self.waiters: set[asyncio.Future] = set()
        self.store = store

    @property
    def start(self) -> int:
        return self.chunks[0][0] if self.chunks else self.end

    def append(self, records: bytes) -> int:
        base = self.end
        buf = bytearray(records) if self.store else None
        pos, offset, size = 0, base, len(records)
        while pos + 61 <= size:
            length = _BATCH.unpack_from(records, pos)[1]
            (delta,) = _I32.unpack_from(records, pos + _LAST_DELTA_AT)
            if buf is not None:
                _OFFSET.pack_into(buf, pos, offset)
            offset += delta + 1
            pos += length + 12
        self.end = offset
        if buf is not None and offset > base:
            self.chunks.append((base, buf))
            self.lasts.append(offset - 1)
        for waiter in self.waiters:
            if not waiter.done():
                waiter.set_result(None)
        return base

    def read(self, offset: int, max_bytes: int, first: bool) -> list:
        """Whole stored chunks from the one holding `offset`, within `max_bytes` (but at least
        one when `first`), returned as they are: nothing is copied."""
        i = bisect.bisect_left(self.lasts, offset)
        out: list[bytearray] = []
        total = 0
        while i < len(self.chunks):
            chunk = self.chunks[i][1]
            if total + len(chunk) > max_bytes and (out or not first):
                break
            out.append(chunk)
            total += len(chunk)
            i += 1
        return out



def template_batch(records: int, size: int, timestamp_ms: int) -> bytes:
    """A valid RecordBatch v2 (CRC included) of `records` records of `size` bytes each."""
    value = b"x" * size
    body = bytearray()
    for i in range(records):
        record = (b"\x00" + write_varint(0) + write_varint(i) + write_varint(-1)
                  + write_varint(size) + value + write_varint(0))
        body += write_varint(len(record)) + record
    length = _HEADER.size - 12 + len(body)
    head = bytearray(_HEADER.pack(0, length, 0, 2, 0, 0, records - 1, timestamp_ms,
                                  timestamp_ms, -1, -1, -1, records))
    batch = head + body
    struct.pack_into(">I", batch, 17, crc32c(bytes(batch[21:])))
    return bytes(batch)


class SyntheticLog:
    """A partition in `synthetic` mode: `count` records in whole batches of one template."""

    __slots__ = ("per_batch", "end", "template", "waiters")

    def __init__(self, count: int, size: int, per_batch: int) -> None:
        self.per_batch = max(1, per_batch)
        self.end = max(self.per_batch, count - count % self.per_batch)
        self.template = memoryview(template_batch(self.per_batch, size, int(time.time() * 1000)))
        self.waiters: set[asyncio.Future] = set()

    start = 0

    def append(self, records: bytes) -> int:
        raise ValueError("a synthetic partition takes no produce")

    def read(self, offset: int, max_bytes: int, first: bool) -> list:
        batch = offset // self.per_batch
        out: list = []
        total, size = 0, len(self.template)
        while batch * self.per_batch < self.end:
            if total + size > max_bytes and (out or not first):
                break
            out += [_OFFSET.pack(batch * self.per_batch), self.template[8:]]
            total += size
            batch += 1
        return out


class MemBroker:
    def __init__(self) -> None:
        self.topics: dict[str, tuple[uuid.UUID, list]] = {}
        self.port = 0
        self.requests = 0

    def create(self, name: str, partitions: int, configs: dict[str, str] | None = None) -> None:
        configs = configs or {}
        mode = configs.get("membroker.mode", "discard")
        if mode == "synthetic":
            counts = [int(c) for c in configs["membroker.synthetic.records"].split(",")]
            size = int(configs.get("membroker.synthetic.size", "100"))
            per_batch = int(configs.get("membroker.synthetic.batch.records", "1000"))
            logs = [SyntheticLog(counts[i % len(counts)], size, per_batch)
                    for i in range(partitions)]
        elif mode in ("store", "discard"):
            logs = [PartitionLog(mode == "store") for _ in range(partitions)]
        else:
            raise ValueError(f"membroker.mode must be discard, store or synthetic, not {mode!r}")
        self.topics[name] = (uuid.uuid4(), logs)

    def partition(self, name: str, index: int):
        topic = self.topics.get(name)
        if topic is None or not 0 <= index < len(topic[1]):
            return None
        return topic[1][index]

    # --- handlers: (header, body) -> response fields -------------------------------------
    async def handle(self, header, body) -> dict | None:
        key = header.api_key
        if key == API_VERSIONS:
            return {"error_code": 0, "throttle_time_ms": 0, "api_keys": [
                {"api_key": k, "min_version": lo, "max_version": hi}
                for k, (lo, hi) in sorted(VERSIONS.items())]}
        if key == METADATA:
            names = None if body.topics is None else [t.name for t in body.topics]
            if header.api_version == 0 and not names:
                names = None
            for name in names or ():
                if name not in self.topics:
                    self.create(name, 1)
            topics = []
            for name in sorted(self.topics) if names is None else names:
                topic_id, parts = self.topics[name]
                topics.append({"error_code": 0, "name": name, "topic_id": topic_id,
                               "is_internal": False, "partitions": [
                                   {"error_code": 0, "partition_index": i, "leader_id": 0,
                                    "leader_epoch": 0, "replica_nodes": [0], "isr_nodes": [0],
                                    "offline_replicas": []} for i in range(len(parts))]})
            return {"throttle_time_ms": 0, "cluster_id": "membroker", "controller_id": 0,
                    "brokers": [{"node_id": 0, "host": "127.0.0.1", "port": self.port,
                                 "rack": None}],
                    "topics": topics}
        if key == CREATE_TOPICS:
            results = []
            for t in body.topics:
                error = TOPIC_ALREADY_EXISTS if t.name in self.topics else 0
                message = None
                n = t.num_partitions if t.num_partitions > 0 else 1
                if not error and not body.validate_only:
                    try:
                        self.create(t.name, n, {c.name: c.value for c in t.configs})
                    except (ValueError, KeyError) as e:
                        error, message = INVALID_CONFIG, str(e)
                results.append({"name": t.name, "error_code": error, "error_message": message,
                                "topic_id": self.topics[t.name][0] if t.name in self.topics
                                else uuid.UUID(int=0),
                                "num_partitions": n, "replication_factor": 1, "configs": []})
            return {"throttle_time_ms": 0, "topics": results}
        if key == LIST_OFFSETS:
            topics = []
            for t in body.topics:
                parts = []
                for p in t.partitions:
                    log = self.partition(t.name, p.partition_index)
                    entry = {"partition_index": p.partition_index, "error_code": 0,
                             "timestamp": -1, "offset": -1, "leader_epoch": 0}
                    if log is None:
                        entry["error_code"] = UNKNOWN_TOPIC_OR_PARTITION
                    elif p.timestamp == -1:
                        entry["offset"] = log.end
                    elif p.timestamp in (-2, -4):
                        entry["offset"] = log.start
                    parts.append(entry)
                topics.append({"name": t.name, "partitions": parts})
            return {"throttle_time_ms": 0, "topics": topics}
        if key == PRODUCE:
            responses = []
            for t in body.topic_data:
                parts = []
                for p in t.partition_data:
                    log = self.partition(t.name, p.index)
                    if log is None or p.records is None or isinstance(log, SyntheticLog):
                        parts.append({"index": p.index, "error_code": UNKNOWN_TOPIC_OR_PARTITION,
                                      "base_offset": -1, "log_append_time_ms": -1,
                                      "log_start_offset": -1, "record_errors": []})
                        continue
                    base = log.append(p.records)
                    parts.append({"index": p.index, "error_code": 0, "base_offset": base,
                                  "log_append_time_ms": -1, "log_start_offset": 0,
                                  "record_errors": []})
                responses.append({"name": t.name, "partition_responses": parts})
            if body.acks == 0:
                return None
            return {"throttle_time_ms": 0, "responses": responses}
        return None

    async def fetch(self, header, body) -> list:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + max(0, body.max_wait_ms) / 1000
        while True:
            remaining, total, topics, logs = body.max_bytes, 0, [], []
            for t in body.topics:
                parts = []
                for p in t.partitions:
                    log = self.partition(t.topic, p.partition)
                    if log is None:
                        parts.append((p.partition, UNKNOWN_TOPIC_OR_PARTITION, -1, []))
                        continue
                    logs.append(log)
                    chunks = log.read(p.fetch_offset, min(p.partition_max_bytes, remaining),
                                      total == 0)
                    size = sum(len(c) for c in chunks)
                    total += size
                    remaining -= size
                    parts.append((p.partition, 0, log.end, chunks))
                topics.append((t.topic, parts))
            wait = deadline - loop.time()
            if total >= max(1, body.min_bytes) or wait <= 0 or not logs:
                return encode_fetch(header, topics)
            future = loop.create_future()
            for log in logs:
                log.waiters.add(future)
            try:
                await asyncio.wait_for(future, wait)
            except TimeoutError:
                pass
            finally:
                for log in logs:
                    log.waiters.discard(future)



def encode_fetch(header, topics) -> list:
    """A framed FetchResponse v4-v12 as a list of buffers; stored chunks are not copied."""
    version = header.api_version
    flexible = version >= 12
    tags = b"\x00" if flexible else b""

    def array(n: int) -> bytes:
        return write_uvarint(n + 1) if flexible else struct.pack(">i", n)

    out: list = []
    head = bytearray(struct.pack(">i", header.correlation_id) + tags)
    head += struct.pack(">i", 0)  # throttle_time_ms
    if version >= 7:
        head += struct.pack(">hi", 0, 0)  # error_code, session_id
    head += array(len(topics))
    for name, parts in topics:
        raw = name.encode()
        head += (write_uvarint(len(raw) + 1) if flexible else struct.pack(">h", len(raw))) + raw
        head += array(len(parts))
        for index, error, hw, chunks in parts:
            head += struct.pack(">ihqq", index, error, hw, hw)
            if version >= 5:
                head += struct.pack(">q", 0 if hw >= 0 else -1)  # log_start_offset
            head += b"\x00" if flexible else struct.pack(">i", -1)  # aborted: null
            if version >= 11:
                head += struct.pack(">i", -1)  # preferred_read_replica
            size = sum(len(c) for c in chunks)
            head += write_uvarint(size + 1) if flexible else struct.pack(">i", size)
            if chunks:
                out.append(bytes(head))
                out.extend(chunks)
                head = bytearray()
            head += tags
        head += tags
    head += tags
    out.append(bytes(head))
    out.insert(0, struct.pack(">i", sum(len(b) for b in out)))
    return out


class Connection(asyncio.BufferedProtocol):
    """Frames are read into a scratch buffer, or straight into a buffer of their own when
    larger than it, and answered in order by one worker task per connection."""

    SCRATCH = 256 * 1024

    def __init__(self, broker: MemBroker) -> None:
        self.broker = broker
        self.scratch = bytearray(self.SCRATCH)
        self.pending = 0
        self.big: bytearray | None = None
        self.filled = 0
        self.frames: deque[bytearray] = deque()
        self.ready = asyncio.Event()
        self.transport = None
        self.worker = None

    def connection_made(self, transport) -> None:
        self.transport = transport
        self.worker = asyncio.get_running_loop().create_task(self.work())

    def get_buffer(self, sizehint: int) -> memoryview:
        if self.big is not None:
            return memoryview(self.big)[self.filled :]
        return memoryview(self.scratch)[self.pending :]

    def buffer_updated(self, nbytes: int) -> None:
        if self.big is not None:
            self.filled += nbytes
            if self.filled == len(self.big):
                self.frames.append(self.big)
                self.big = None
                self.ready.set()
            return
        self.pending += nbytes
        buf, pos, end = self.scratch, 0, self.pending
        while end - pos >= 4:
            (size,) = _SIZE.unpack_from(buf, pos)
            if end - pos - 4 >= size:
                self.frames.append(buf[pos + 4 : pos + 4 + size])
                pos += 4 + size
                continue
            if size + 4 > self.SCRATCH:
                self.big = bytearray(size)
                self.filled = end - pos - 4
                self.big[: self.filled] = buf[pos + 4 : end]
                pos = end
            break
        if pos:
            buf[: end - pos] = buf[pos:end]
            self.pending = end - pos
            self.ready.set()

    def connection_lost(self, exc) -> None:
        if self.worker is not None:
            self.worker.cancel()

    async def work(self) -> None:
        try:
            while True:
                while not self.frames:
                    self.ready.clear()
                    await self.ready.wait()
                frame = self.frames.popleft()
                self.broker.requests += 1
                try:
                    request = messages.parse_request(frame)
                except (messages.UnsupportedRequest, messages.InvalidRequest):
                    header, _ = messages.parse_header(frame)
                    if header.api_key == API_VERSIONS:
                        body = {"error_code": UNSUPPORTED_VERSION, "api_keys": [
                            {"api_key": k, "min_version": lo, "max_version": hi}
                            for k, (lo, hi) in sorted(VERSIONS.items())]}
                        self.transport.write(messages.encode_response(header, body, version=0))
                        continue
                    self.transport.close()
                    return
                if request.header.api_key == FETCH:
                    buffers = await self.broker.fetch(request.header, request.body)
                    if not self.transport.is_closing():
                        self.transport.writelines(buffers)
                    continue
                response = await self.broker.handle(request.header, request.body)
                if response is not None and not self.transport.is_closing():
                    self.transport.write(messages.encode_response(request.header, response))
        except asyncio.CancelledError:
            pass


async def serve(port: int) -> None:
    broker = MemBroker()
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: Connection(broker), "127.0.0.1", port,
                                      reuse_address=True)
    broker.port = server.sockets[0].getsockname()[1]
    print(f"membroker ready on 127.0.0.1:{broker.port}", flush=True)
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    server.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--event-loop", choices=("asyncio", "uvloop"), default="uvloop")
    args = parser.parse_args()
    factory = None
    if args.event_loop == "uvloop":
        try:
            import uvloop

            factory = uvloop.new_event_loop
        except ImportError:
            pass
    with asyncio.Runner(loop_factory=factory) as runner:
        runner.run(serve(args.port))
    sys.exit(0)


if __name__ == "__main__":
    main()
