"""Direct reads of tiered offset ranges (KIP-405): the part of a task's range that lies in
remote storage is read from the object store by the task itself, and only the rest (the
local tail, or what cannot be read directly) through the broker.

Options (the store's keys are the broker's own `rsm.config.*` keys, as Aiven's plugin names
them, so the broker's config carries over; Spark lower-cases option names, and these are):

    rsm.config.storage.s3.bucket.name            an S3 bucket (SeaweedFS, MinIO, AWS S3, ...)
    rsm.config.storage.s3.endpoint.url           e.g. http://127.0.0.1:8333
    rsm.config.storage.s3.region                 e.g. us-east-1
    rsm.config.storage.s3.path.style.access.enabled   true / false
    rsm.config.storage.aws.access.key.id, rsm.config.storage.aws.secret.access.key
    rsm.config.storage.s3.api.call.timeout, ...api.call.attempt.timeout   (ms)
    rsm.config.storage.root                      the directory store's root (instead of S3)
    rsm.config.storage.backend.class             as the broker's (optional)
    rsm.config.key.prefix                        put before every object key
    directRemoteReads      true (the default once a store is configured) / false: read
                           everything through the broker
    remoteReadChunkBytes   bytes of one ranged GET of a segment (default 4 MiB): what a task
                           holds of a segment at a time

Planning (driver): the topic's ids and leaders (Metadata v12), then every partition of
`__remote_log_metadata` read from its start (Fetch, records applied in order: a segment
counts once it is COPY_SEGMENT_FINISHED and until its deletion starts; a partition whose
deletion was marked has none). A segment is used only when each of its leader epochs lies in
the leader's lineage (OffsetForLeaderEpoch, the consumer's request): the leader has the epoch,
it starts no later than in the segment, each epoch but the last ends where the segment's next
one starts, and the last reaches past the segment's end. A segment an unclean election cut
off, or that the leader's epoch cache no longer knows, is read through the broker instead. For
read_committed the aborted transactions come from the segments' `.txnindex` objects (from the
range's start up to the highest tiered offset) plus what the broker lists at that offset
(transactions whose abort marker is still local), as Kafka's consumer gets them in a Fetch.

Reading (task): per segment, the `.index` object once (cached by the task) gives the byte
position of the range's start; the `.log` object is read in ranged GETs of
remoteReadChunkBytes, whole batches walked and their CRC-32C checked, then decoded by the
same decoder and column builder as a Fetch response (fetch.Rows). A segment missing from the
store (deleted after planning) or one that does not check out is read through the broker
instead, which answers OFFSET_OUT_OF_RANGE when the offsets are really gone: the usual
failOnDataLoss handling. Direct reads need the plain-TCP client (security.protocol
PLAINTEXT); with TLS or SASL the whole range is read through the broker.

The stores themselves are strom.remote's (imported only where a store is used); the metadata
records are read with the protocol codec (strom.protocol.remote_log_metadata), not the log's
metadata cache: the connector imports nothing of the broker's log.
"""

from __future__ import annotations

import bisect
import logging
import struct
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from strom.protocol import remote_log_metadata as wire
from strom.spark.ranges import Range

if TYPE_CHECKING:
    import pyarrow as pa

    from strom.spark.options import SourceOptions

log = logging.getLogger("strom.spark")

METADATA_TOPIC = "__remote_log_metadata"
STORE_PREFIX = "rsm.config."
DEFAULT_CHUNK_BYTES = 4 << 20
METADATA_V12 = 12
OFFSET_FOR_LEADER_EPOCH, OFFSET_FOR_LEADER_EPOCH_V = 23, 3
TXN_INDEX_GETS = 16  # .txnindex objects fetched at once while planning read_committed
COPY_SEGMENT_FINISHED, DELETE_SEGMENT_STARTED, DELETE_SEGMENT_FINISHED = 1, 2, 3
_OFFSET_ENTRY = struct.Struct(">ii")  # .index: relative offset, position
_TXN_ENTRY = struct.Struct(">hqqqq")  # .txnindex: version, producer id, first, last, last stable offset
NO_LAST = 1 << 62  # an aborted transaction the broker listed: its marker is past every tiered offset


@dataclass(frozen=True, slots=True)
class SegmentId:
    """A remote segment's identity, with the attributes strom.remote's object keys are made of."""
    topic_id: uuid.UUID
    topic: str
    partition: int
    id: uuid.UUID


@dataclass(frozen=True, slots=True)
class Segment:
    segment_id: SegmentId
    start_offset: int
    end_offset: int  # the last offset, inclusive
    size_bytes: int
    epochs: tuple[tuple[int, int], ...]  # (leader epoch, start offset), ascending


@dataclass(frozen=True)
class TieredRange:
    """A task's range and the remote segments that hold some of it (offset order, possibly
    overlapping: any of them serves an offset they share, as all lie in the leader's lineage)."""
    range: Range
    segments: tuple[Segment, ...]
    # read_committed: (producer id, first offset, last offset) of aborted transactions that
    # overlap the tiered part of the range; None for read_uncommitted
    aborted: tuple[tuple[int, int, int], ...] | None = None

    @property
    def topic(self) -> str:
        return self.range.topic

    @property
    def partition(self) -> int:
        return self.range.partition


# --- options --------------------------------------------------------------------------------

def store_config(options: Mapping[str, str]) -> dict[str, str]:
    """The rsm.config.* options, as the broker's keys."""
    return {k: v for k, v in options.items() if k.startswith(STORE_PREFIX)}


def open_store(config: Mapping[str, str]) -> Any:
    """strom.remote's store for the rsm.config.* keys (imported here: only reads that use one
    load the stores)."""
    from strom.remote.config import storage_from_config

    return storage_from_config(config)


# --- remote log metadata --------------------------------------------------------------------

@dataclass
class PartitionSegments:
    """One partition's segments as the metadata records, applied in order, leave them."""
    segments: dict[uuid.UUID, Segment] = field(default_factory=dict)
    states: dict[uuid.UUID, int] = field(default_factory=dict)
    deleted: bool = False  # the partition's remote data is being (or was) deleted

    def apply(self, record: wire.RemoteLogMetadataRecord) -> None:
        if isinstance(record, wire.RemoteLogSegmentMetadataRecord):
            sid = _segment_id(record.segment_id)
            self.segments[sid.id] = Segment(sid, record.start_offset, record.end_offset,
                                            record.segment_size_in_bytes,
                                            tuple(sorted(dict(record.segment_leader_epochs).items())))
            self.states[sid.id] = record.state
        elif isinstance(record, wire.RemoteLogSegmentMetadataUpdateRecord):
            sid = record.segment_id.id
            if sid not in self.segments:
                return  # an update of a segment whose start this reader did not see: never used
            if record.state == DELETE_SEGMENT_FINISHED:
                del self.segments[sid], self.states[sid]
            else:
                self.states[sid] = record.state
        elif isinstance(record, wire.RemotePartitionDeleteMetadataRecord):
            self.deleted = True

    def finished(self) -> list[Segment]:
        if self.deleted:
            return []
        return sorted((s for i, s in self.segments.items() if self.states[i] == COPY_SEGMENT_FINISHED),
                      key=lambda s: (s.start_offset, s.end_offset))


def _segment_id(entry: wire.RemoteLogSegmentIdEntry) -> SegmentId:
    tp = entry.topic_id_partition
    return SegmentId(tp.topic_id, tp.name, tp.partition, entry.id)


def apply_values(values: Iterator[bytes | None]) -> dict[tuple[uuid.UUID, int], PartitionSegments]:
    """Metadata record values in the topic's order -> each (topic id, partition)'s segments.
    A value this reader cannot decode is skipped with a warning (its segment is then not used)."""
    out: dict[tuple[uuid.UUID, int], PartitionSegments] = {}
    for value in values:
        if value is None:
            continue
        try:
            record = wire.decode(value)
        except wire.RemoteLogMetadataError as e:
            log.warning("skipping a %s record: %s", METADATA_TOPIC, e)
            continue
        if isinstance(record, wire.RemotePartitionDeleteMetadataRecord):
            tp = record.topic_id_partition
        elif isinstance(record, (wire.RemoteLogSegmentMetadataRecord, wire.RemoteLogSegmentMetadataUpdateRecord)):
            tp = record.segment_id.topic_id_partition
        else:
            continue
        out.setdefault((tp.topic_id, tp.partition), PartitionSegments()).apply(record)
    return out


def read_metadata_topic(bootstrap: str, timeout_s: float, client_id: str) -> Iterator[bytes | None]:
    """Every record value of every partition of `__remote_log_metadata` (records of one user
    partition all go to one of its partitions, in order)."""
    from aiokafka.record.memory_records import MemoryRecords

    from strom.spark.wire import PartitionClient

    conn = _any_broker(bootstrap, timeout_s, client_id)
    try:
        body = _metadata(conn, [METADATA_TOPIC])
    finally:
        conn.close()
    topic = body.topics[0]
    if topic.error_code:
        return  # no such topic: nothing is tiered
    for p in sorted(x.partition_index for x in topic.partitions):
        client = PartitionClient(bootstrap, METADATA_TOPIC, p, timeout_s, client_id)
        try:
            position, end = client.watermarks(0)
            while position < end:
                got = client.fetch(position, 0, 0, 32 << 20)
                if got.error_code:
                    raise RuntimeError(f"Cannot read {METADATA_TOPIC}-{p}: Kafka error code {got.error_code}")
                records = MemoryRecords(got.records)
                moved = position
                while (batch := records.next_batch()) is not None:
                    moved = max(moved, batch.next_offset)
                    if getattr(batch, "is_control_batch", False):
                        continue
                    for rec in batch:
                        if rec.offset >= position:
                            yield rec.value
                if moved == position:
                    break
                position = moved
        finally:
            client.close()


def _any_broker(bootstrap: str, timeout_s: float, client_id: str):
    from strom.client import Connection
    from strom.spark.options import parse_bootstrap

    error: Exception | None = None
    for host, port in parse_bootstrap(bootstrap):
        try:
            return Connection(host, port, timeout_s, client_id)
        except OSError as e:
            error = e
    raise ConnectionError(f"no broker of {bootstrap} answered: {error}")


def _metadata(conn, topics: Sequence[str]) -> Any:
    return conn.call(3, METADATA_V12, {
        "topics": [{"topic_id": uuid.UUID(int=0), "name": t} for t in topics],
        "allow_auto_topic_creation": False, "include_topic_authorized_operations": False})


# --- the leader's lineage -------------------------------------------------------------------

def _with_data(epochs: Sequence[tuple[int, int]]) -> list[tuple[int, int]]:
    """Epochs that hold records: an epoch starting where the next one starts holds none."""
    entries = list(epochs)
    return [e for e, nxt in zip(entries, [*entries[1:], None], strict=True) if nxt is None or nxt[1] != e[1]]


def within_lineage(segment: Segment, end_for: Callable[[int], tuple[int, int]]) -> bool:
    """Whether the leader's log holds the segment's records as the segment has them, judged from
    OffsetForLeaderEpoch answers: `end_for(epoch)` is (the largest epoch <= it the leader has,
    where that epoch ends: the next epoch's start, or the log end)."""
    epochs = _with_data(segment.epochs)
    if not epochs:
        return False
    for i, (epoch, _) in enumerate(epochs):
        leader_epoch, end = end_for(epoch)
        if leader_epoch != epoch:
            return False  # the leader has no such epoch (truncated away, or older than its cache)
        if i + 1 < len(epochs):
            if end != epochs[i + 1][1]:
                return False
        elif end <= segment.end_offset:
            return False  # the leader's epoch ends before the segment does
    first, first_start = epochs[0]
    if first > 0:
        previous, end = end_for(first - 1)  # the leader's start of `first`: the end of the one before
        if previous >= 0 and end > first_start:
            return False
    return True


class EpochEnds:
    """OffsetForLeaderEpoch answers of one partition's leader, asked once per epoch."""

    def __init__(self, conn, topic: str, partition: int, leader_epoch: int) -> None:
        self.conn, self.topic, self.partition, self.leader_epoch = conn, topic, partition, leader_epoch
        self.known: dict[int, tuple[int, int]] = {}

    def __call__(self, epoch: int) -> tuple[int, int]:
        if epoch not in self.known:
            body = self.conn.call(OFFSET_FOR_LEADER_EPOCH, OFFSET_FOR_LEADER_EPOCH_V, {
                "replica_id": -1, "topics": [{"topic": self.topic, "partitions": [{
                    "partition": self.partition, "current_leader_epoch": self.leader_epoch,
                    "leader_epoch": epoch}]}]})
            p = body.topics[0].partitions[0]
            self.known[epoch] = (-1, -1) if p.error_code else (p.leader_epoch, p.end_offset)
        return self.known[epoch]


# --- planning -------------------------------------------------------------------------------

def enabled(opts: SourceOptions) -> bool:
    return bool(opts.remote_storage) and opts.direct_remote_reads


def plan(opts: SourceOptions, ranges: list[Range]) -> list[Range | TieredRange]:
    """The ranges, those with tiered offsets as TieredRanges. Any failure to find out what is
    tiered leaves the ranges as they are (read through the broker) with a warning."""
    wanted = [r for r in ranges if r.size > 0]
    if not wanted:
        return list(ranges)
    try:
        found = _tiered_segments(opts, {(r.topic, r.partition) for r in wanted})
    except Exception as e:  # noqa: BLE001 - planning direct reads must never fail a read the broker serves
        log.warning("strom source: cannot plan direct reads of remote storage (%s); reading through the broker", e)
        return list(ranges)
    out: list[Range | TieredRange] = []
    store = None
    for r in ranges:
        segments = [s for s in found.get((r.topic, r.partition), ()) if s.end_offset >= r.start and
                    s.start_offset < r.end]
        if not segments:
            out.append(r)
            continue
        aborted = None
        if opts.isolation_level == "read_committed":
            store = store or open_store(opts.remote_storage)
            aborted = _aborted(opts, store, r, found[(r.topic, r.partition)])
        out.append(TieredRange(r, tuple(segments), aborted))
    if store is not None:
        store.close()
    return out


def _tiered_segments(opts: SourceOptions, parts: set[tuple[str, int]]) -> dict[tuple[str, int], list[Segment]]:
    """Per wanted partition, its COPY_SEGMENT_FINISHED segments that lie in its leader's lineage."""
    timeout_s = (opts.client.request_timeout_ms or 30_000) / 1000
    conn = _any_broker(opts.client.bootstrap, timeout_s, opts.client_id)
    try:
        body = _metadata(conn, sorted({t for t, _ in parts}))
    finally:
        conn.close()
    brokers = {b.node_id: (b.host, b.port) for b in body.brokers}
    where: dict[tuple[str, int], tuple[uuid.UUID, int, int]] = {}  # topic id, leader, leader epoch
    for t in body.topics:
        if t.error_code:
            continue
        for p in t.partitions:
            if (t.name, p.partition_index) in parts and not p.error_code:
                where[t.name, p.partition_index] = (t.topic_id, p.leader_id, p.leader_epoch)
    state = apply_values(read_metadata_topic(opts.client.bootstrap, timeout_s, opts.client_id))
    from strom.client import Connection

    out: dict[tuple[str, int], list[Segment]] = {}
    for (topic, partition), (topic_id, leader, leader_epoch) in sorted(where.items()):
        segments = state.get((topic_id, partition))
        finished = segments.finished() if segments else []
        if not finished or leader not in brokers:
            continue
        leader_conn = Connection(*brokers[leader], timeout_s, opts.client_id)
        try:
            ends = EpochEnds(leader_conn, topic, partition, leader_epoch)
            kept = [s for s in finished if within_lineage(s, ends)]
        finally:
            leader_conn.close()
        if len(kept) < len(finished):
            log.info("strom source: %d remote segment(s) of %s-%d are outside the leader's epoch lineage; "
                     "their offsets are read through the broker", len(finished) - len(kept), topic, partition)
        if kept:
            out[topic, partition] = kept
    return out


def _aborted(opts: SourceOptions, store: Any, r: Range, segments: list[Segment]) -> tuple[tuple[int, int, int], ...]:
    """Aborted transactions overlapping the tiered part of `r`: from the .txnindex objects of the
    segments from the range's start on (a marker may lie past the range), and those the broker
    lists at the first offset past remote storage (still open there, aborted later)."""
    later = [s for s in segments if s.end_offset >= r.start]
    top = max(s.end_offset for s in segments) + 1
    upper = min(r.end, top)

    def entries(s: Segment) -> list[tuple[int, int, int]]:
        from strom.remote.objects import RemoteResourceNotFound

        try:
            data = store.get(store.key(s, ".txnindex"))
        except RemoteResourceNotFound:
            return []  # a segment without aborted transactions has no transaction index
        return [(pid, first, last) for _, pid, first, last, _ in
                _TXN_ENTRY.iter_unpack(data[:len(data) - len(data) % _TXN_ENTRY.size])]

    with ThreadPoolExecutor(TXN_INDEX_GETS) as pool:
        found = {e for got in pool.map(entries, later) for e in got
                 if e[2] >= r.start and e[1] < upper}
    from strom.spark.wire import PartitionClient

    client = PartitionClient(opts.client.bootstrap, r.topic, r.partition,
                             (opts.client.request_timeout_ms or 30_000) / 1000, opts.client_id)
    try:
        got = client.fetch(top, 1, 0, 1, 1)  # the aborted transactions listed at `top`
        if not got.error_code:
            found |= {(pid, first, NO_LAST) for pid, first in got.aborted if first < upper}
    finally:
        client.close()
    return tuple(sorted(found, key=lambda e: e[1]))


# --- reading --------------------------------------------------------------------------------

class Unreadable(Exception):
    """A segment's objects are not what its metadata says (missing, short, corrupt)."""


class SegmentReader:
    """One task's reads of remote segments: the store, and the offset indexes it has fetched."""

    def __init__(self, config: Mapping[str, str], chunk_bytes: int) -> None:
        self.store = open_store(config)
        self.chunk_bytes = chunk_bytes
        self.indexes: dict[uuid.UUID, tuple[list[int], list[int]]] = {}

    def close(self) -> None:
        self.store.close()

    def _get(self, segment: Segment, suffix: str, start: int = 0, end: int | None = None) -> bytes:
        from strom.remote.objects import RemoteResourceNotFound

        try:
            return self.store.get(self.store.key(segment, suffix), start, end)
        except RemoteResourceNotFound as e:
            raise Unreadable(f"not in remote storage ({e})") from None
        except Exception as e:  # noqa: BLE001 - a store that fails (RemoteStorageError): the broker reads it
            raise Unreadable(str(e)) from None

    def position(self, segment: Segment, offset: int) -> int:
        """Byte position of the last indexed batch at or before `offset` (0 without one)."""
        if segment.segment_id.id not in self.indexes:
            try:
                data = self._get(segment, ".index")
            except Unreadable:
                data = b""  # no index: walk from the segment's start
            offsets, positions = [], []
            for rel, pos in _OFFSET_ENTRY.iter_unpack(data[:len(data) - len(data) % _OFFSET_ENTRY.size]):
                if offsets and (rel + segment.start_offset <= offsets[-1] or pos <= positions[-1]):
                    break  # a preallocated file's zeros past its entries
                offsets.append(rel + segment.start_offset)
                positions.append(pos)
            self.indexes[segment.segment_id.id] = (offsets, positions)
        offsets, positions = self.indexes[segment.segment_id.id]
        i = bisect.bisect_right(offsets, offset)
        return positions[i - 1] if i else 0

    def batches(self, segment: Segment, start: int, stop: int) -> Iterator[tuple[int, bytes]]:
        """The segment's whole record batches that may hold offsets in [start, stop), as
        (first offset, bytes of consecutive batches) in chunks of about chunk_bytes, CRC-checked."""
        from strom.protocol.records import CURRENT_MAGIC, crc_ok, peek_offset_and_size, read_header

        at = self.position(segment, start)
        size = segment.size_bytes
        pending = b""
        while at < size:
            want = max(self.chunk_bytes, _missing(pending))
            data = self._get(segment, ".log", at, min(size, at + want))
            if not data:
                raise Unreadable(f"the .log object ends at byte {at}, before {size}")
            at += len(data)
            buf = pending + data if pending else data
            pos, first, begin = 0, None, 0
            done = False
            view = memoryview(buf)
            while pos + 17 <= len(buf):
                base, length = peek_offset_and_size(buf, pos)
                if pos + length > len(buf):
                    break
                if buf[pos + 16] == CURRENT_MAGIC:
                    header = read_header(buf, pos)
                    if not crc_ok(view, pos, header):
                        raise Unreadable(f"a record batch at offset {base} fails its CRC check")
                    last = header.last_offset
                else:
                    last = base  # v0/v1: a wrapper's offset is its last record's
                if base >= stop:
                    done = True
                    break
                if last < start:  # wholly before the range: not decoded
                    begin = pos + length
                elif first is None:
                    first = base
                pos += length
            view.release()
            if first is not None and pos > begin:
                yield first, buf[begin:pos]
            if done:
                return
            pending = buf[pos:]
        if pending:
            raise Unreadable(f"the .log object ends inside a record batch ({len(pending)} bytes)")


def _missing(pending: bytes) -> int:
    """Bytes still to fetch for the batch `pending` starts."""
    if len(pending) < 12:
        return 0
    _, length = struct.unpack_from(">qi", pending)
    return length + 12 - len(pending)


def read_tiered(opts: SourceOptions, t: TieredRange, through_broker: Callable[[Range], Iterator[pa.RecordBatch]],
                rows_of: Callable[[str, int, bool], Any], limit: int) -> Iterator[pa.RecordBatch]:
    """[start, end) of the range: each offset a remote segment holds from the store, the rest
    (and what the store cannot give) through the broker. `rows_of` makes the column builder a
    Fetch response's records go through (fetch.Rows), so both paths decode alike."""
    r = t.range
    segments = sorted(t.segments, key=lambda s: s.start_offset)
    starts = [s.start_offset for s in segments]
    reader = SegmentReader(opts.remote_storage, opts.remote_chunk_bytes)
    rows = rows_of(r.topic, r.partition, opts.include_headers)
    position = r.start
    try:
        while position < r.end:
            covering = [s for s in segments[:bisect.bisect_right(starts, position)] if s.end_offset >= position]
            if not covering:
                nxt = bisect.bisect_right(starts, position)
                upto = min(r.end, starts[nxt]) if nxt < len(segments) else r.end
                if len(rows):
                    yield rows.flush()
                yield from through_broker(Range(r.topic, r.partition, position, upto))
                position = upto
                continue
            segment = max(covering, key=lambda s: s.end_offset)
            stop = min(r.end, segment.end_offset + 1)
            done = position  # past the last whole batch decoded
            try:
                for first, data in reader.batches(segment, position, stop):
                    aborted = None
                    if t.aborted is not None:
                        aborted = [(pid, f) for pid, f, last in t.aborted if last >= first and f < stop]
                    done = max(done, rows.add_records(data, position, stop, aborted))
                    if len(rows) >= limit:
                        yield rows.flush()
            except Unreadable as e:
                # What was decoded stays: the broker reads from where it ends.
                log.warning("reading %s-%s offsets %d-%d from remote storage: %s; reading them through the broker",
                            r.topic, r.partition, done, stop - 1, e)
                if len(rows):
                    yield rows.flush()
                if done < stop:
                    yield from through_broker(Range(r.topic, r.partition, done, stop))
            position = stop
        if len(rows):
            yield rows.flush()
    finally:
        reader.close()
