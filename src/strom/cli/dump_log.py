"""`strom dump-log`: what a partition directory's files hold, read straight from disk, in the
manner of Kafka's kafka-dump-log.sh, with a consistency check of each file.

It reads segment logs (`.log`: batches, and with --deep-iteration their records), offset and
time indexes (`.index`, `.timeindex`: entries checked against their log), transaction indexes
(`.txnindex`), producer state snapshots (`.snapshot`), `leader-epoch-checkpoint` and the offset
checkpoint files of a log dir, the same files Kafka writes, so it works on Kafka's data as well
as Strom's. It never writes.

A tiered partition's remote segments (KIP-405) are dumped the same way: a directory store's
objects are files named `<base offset>-<segment id>.log` (and `.index`, ...), given as paths;
an object in any store is read through the store the broker's `rsm.config.*` keys name, with
--remote-config (a properties file holding them, the broker's own say) and --override:
`strom dump-log --remote-config server.properties <object key>`, or `s3://<bucket>/<key>`.

A KRaft node's metadata log (`__cluster_metadata-0`) is decoded record by record: the segments'
metadata records (TopicRecord, PartitionRecord, RegisterBrokerRecord, ...) with their fields,
its control records (LeaderChange, the KIP-853 voter set), and its snapshots
(`<offset>-<epoch>.checkpoint`, and a formatted directory's `bootstrap.checkpoint`), as
kafka-dump-log's --cluster-metadata-decoder shows them; and the replica's `quorum-state`.

Checks, each a problem when it fails (exit code 1):
- log: every batch is magic 2 with a valid CRC32C, offsets grow from batch to batch and start
  at or after the segment's base offset, the record count fits the offset range, the file ends
  with a whole batch; with --deep-iteration, records decode and their offsets grow inside the
  batch's range;
- offset index: whole entries, offsets and positions strictly growing, every position the start
  of a batch of the log holding the entry's offset;
- time index: whole entries, timestamps strictly growing, offsets never going back, every offset
  inside a batch whose max timestamp is the entry's;
- transaction index: whole version-0 entries, first offset <= last offset, and (when the log
  is there) each last offset an abort marker of the log;
- producer snapshot: version 1, its CRC32C, whole entries;
- leader-epoch-checkpoint: epochs and start offsets growing;
- metadata log and snapshots: every record decodes as a metadata or control record; a snapshot
  begins with a SnapshotHeader and ends with a SnapshotFooter; `quorum-state` is a JSON object
  with a leader epoch.
"""

from __future__ import annotations

import base64
import bisect
import dataclasses
import json
import mmap
import os
import re
import struct
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import click

from strom.cli.common import Command, CommandError
from strom.log.checkpoint import read_checkpoint
from strom.log.cleaner import DELETE_HORIZON_MASK
from strom.log.index import OffsetIndex, TimeIndex
from strom.log.leader_epoch import LeaderEpochCache
from strom.log.leader_epoch import _read as read_epoch_checkpoint
from strom.log.producer_state import SNAPSHOT_SUFFIX, read_snapshot
from strom.log.segment import INDEX_SUFFIX, LOG_SUFFIX, TIME_INDEX_SUFFIX, TXN_INDEX_SUFFIX
from strom.log.txn_index import ENTRY_SIZE as TXN_ENTRY_SIZE
from strom.log.txn_index import TransactionIndex
from strom.metadata import records as metadata_records
from strom.metadata.storage import BOOTSTRAP_CHECKPOINT, kafka_uuid
from strom.protocol import compression
from strom.protocol.errors import CorruptRecordError
from strom.protocol.raft_records import (
    KRAFT_VERSION,
    KRAFT_VOTERS,
    LEADER_CHANGE,
    SNAPSHOT_FOOTER,
    SNAPSHOT_HEADER,
    parse_control,
)
from strom.protocol.records import (
    CONTROL_ABORT,
    CONTROL_COMMIT,
    CURRENT_MAGIC,
    HEADER_SIZE,
    LOG_OVERHEAD,
    BatchHeader,
    Record,
    crc_ok,
    iter_records,
    read_header,
)
from strom.raft.config import METADATA_TOPIC
from strom.raft.file_log import QUORUM_STATE
from strom.raft.snapshots import parse_filename as parse_raft_snapshot_name

CHECKPOINTS = ("recovery-point-offset-checkpoint", "log-start-offset-checkpoint",
               "replication-offset-checkpoint", "cleaner-offset-checkpoint")
INT_MAX = 2**31 - 1
METADATA = "metadata"  # the decoder of __cluster_metadata records
# The metadata log's control records, under the names Kafka gives their types.
CONTROL_NAMES = {LEADER_CHANGE: "LeaderChange", SNAPSHOT_HEADER: "SnapshotHeader",
                 SNAPSHOT_FOOTER: "SnapshotFooter", KRAFT_VERSION: "KRaftVersion",
                 KRAFT_VOTERS: "KRaftVoters"}


@dataclass
class Batch:
    position: int
    header: BatchHeader
    valid: bool  # CRC32C matches


@dataclass
class LogScan:
    """The batches of a segment log, where they stop, and why (None: at the end of the file)."""

    batches: list[Batch]
    end: int
    size: int
    stop_reason: str | None

    def batch_at(self, position: int) -> Batch | None:
        i = bisect.bisect_left(self._positions, position)
        return self.batches[i] if i < len(self.batches) and self.batches[i].position == position else None

    def batch_holding(self, offset: int) -> Batch | None:
        i = bisect.bisect_right(self._bases, offset) - 1
        return self.batches[i] if i >= 0 and offset <= self.batches[i].header.last_offset else None

    def __post_init__(self) -> None:
        self._positions = [b.position for b in self.batches]
        self._bases = [b.header.base_offset for b in self.batches]


def scan_log(data: Any, limit: int | None = None) -> LogScan:
    """Walk the batch headers of `data` (a segment log's bytes), checking each CRC. A batch with
    a bad CRC is still stepped over by its length; a header that cannot be a batch stops the
    walk, as it leaves no way to find the next one."""
    end = len(data) if limit is None else min(limit, len(data))
    batches, pos, reason = [], 0, None
    while pos < end:
        if end - pos < HEADER_SIZE:
            reason = f"{end - pos} bytes, too few for a batch header"
            break
        header = read_header(data, pos)
        if header.magic != CURRENT_MAGIC:
            reason = f"magic byte {header.magic}, not {CURRENT_MAGIC}"
            break
        if header.batch_length < HEADER_SIZE - LOG_OVERHEAD:
            reason = f"batch length {header.batch_length}, below a header's"
            break
        if pos + header.size > end:
            reason = f"a batch of {header.size} bytes runs past the end"
            break
        batches.append(Batch(pos, header, crc_ok(data, pos, header)))
        pos += header.size
    return LogScan(batches, pos, end, reason)


@dataclass
class Options:
    deep: bool
    print_data: bool
    verify_only: bool
    sanity_only: bool
    max_bytes: int | None
    decoder: str | None


@dataclass
class Dumper:
    """Dumps files to stdout and collects their problems."""

    opts: Options
    problems: dict[Path | str, list[str]] = field(default_factory=dict)  # str: a remote object
    decoder: str | None = None  # the file's: the one asked for, or the metadata log's own

    @property
    def deep(self) -> bool:
        return self.opts.deep or self.decoder is not None

    @property
    def print_data(self) -> bool:
        return self.opts.print_data or self.decoder is not None

    def problem(self, path: Path | str, text: str) -> None:
        self.problems.setdefault(path, []).append(text)

    def out(self, text: str) -> None:
        if not self.opts.verify_only:
            click.echo(text)

    # -- files -------------------------------------------------------------------------------
    def dump(self, path: Path) -> bool:
        """Dump one file; False when its kind is unknown."""
        name = path.name
        handlers = {LOG_SUFFIX: self.log, INDEX_SUFFIX: self.offset_index,
                    TIME_INDEX_SUFFIX: self.time_index, TXN_INDEX_SUFFIX: self.txn_index,
                    SNAPSHOT_SUFFIX: self.producer_snapshot}
        handler = handlers.get(path.suffix) if _base_offset(path) is not None else None
        if name == LeaderEpochCache.FILE:
            handler = self.epochs
        elif name in CHECKPOINTS:
            handler = self.checkpoint
        elif name == BOOTSTRAP_CHECKPOINT or parse_raft_snapshot_name(name) is not None:
            handler = self.metadata_snapshot
        elif name == QUORUM_STATE:
            handler = self.quorum_state
        if handler is None:
            return False
        self.decoder = self.opts.decoder
        if self.decoder is None and _in_metadata_log(path):
            self.decoder = METADATA
        click.echo(f"Dumping {path}")
        handler(path)
        return True

    def log(self, path: Path) -> None:
        with _mapped(path) as data:
            self.log_data(path, data)

    def log_data(self, path: Path | str, data: Any) -> None:
        """A segment log's bytes (a file's, or a remote object's), named after its base offset."""
        base = _base_offset(Path(path))
        click.echo(f"Log starting offset: {base}")
        self._batches(path, data, scan_log(data, self.opts.max_bytes), base)

    def remote_log(self, name: str, data: bytes) -> None:
        """A segment log object fetched from a remote store, dumped as a local one is."""
        self.decoder = self.opts.decoder
        click.echo(f"Dumping {name}")
        self.log_data(name, data)

    def metadata_snapshot(self, path: Path) -> None:
        """A KRaft snapshot: batches like a segment's, from offset 0, between a SnapshotHeader
        and a SnapshotFooter; its records are always decoded."""
        snapshot_id = parse_raft_snapshot_name(path.name)
        if snapshot_id is not None:
            click.echo(f"Snapshot end offset: {snapshot_id.offset}, epoch: {snapshot_id.epoch}")
        else:
            click.echo("Bootstrap snapshot: the records a new cluster's metadata log starts with")
        self.decoder = METADATA
        with _mapped(path) as data:
            scan = scan_log(data)
            self._batches(path, data, scan, 0)
            if not scan.batches:
                self.problem(path, "no batches: a snapshot holds at least its header and footer")
                return
            for batch, kind, where in ((scan.batches[0], SNAPSHOT_HEADER, "begin"),
                                       (scan.batches[-1], SNAPSHOT_FOOTER, "end")):
                if kind not in _control_kinds(data, batch):
                    self.problem(path, f"does not {where} with a {CONTROL_NAMES[kind]} control record")

    def quorum_state(self, path: Path) -> None:
        """A Raft replica's election state (leader, epoch, vote), a JSON object."""
        try:
            state = json.loads(path.read_text())
        except (ValueError, UnicodeDecodeError) as e:
            self.problem(path, f"not a JSON object: {e}")
            return
        if not isinstance(state, dict) or "leaderEpoch" not in state:
            self.problem(path, "not a quorum-state: no leaderEpoch")
            return
        self.out(_compact_json(state))

    def _batches(self, path: Path | str, data: Any, scan: LogScan, base: int) -> None:
        """Print and check the batches of a log or snapshot that start at offset `base`."""
        last = None
        for batch in scan.batches:
            h = batch.header
            self.out(_batch_line(batch))
            where = f"batch at position {batch.position} (offsets {h.base_offset}-{h.last_offset})"
            if not batch.valid:
                self.problem(path, f"{where}: CRC mismatch")
            if h.base_offset < base:
                self.problem(path, f"{where}: starts before the segment's base offset {base}")
            if last is not None and h.base_offset <= last:
                self.problem(path, f"{where}: offsets go back (the batch before ends at {last})")
            if h.last_offset_delta < 0 or h.record_count > h.last_offset_delta + 1:
                self.problem(path, f"{where}: {h.record_count} records in an offset range of "
                                   f"{h.last_offset_delta + 1}")
            last = max(h.last_offset, last if last is not None else h.last_offset)
            if self.deep and batch.valid:
                self.records(path, data, batch, where)
        if scan.stop_reason is not None and self.opts.max_bytes is None:
            self.problem(path, f"{scan.size - scan.end} bytes at position {scan.end} are not a "
                               f"whole batch ({scan.stop_reason})")

    def records(self, path: Path, data: Any, batch: Batch, where: str) -> None:
        h = batch.header
        try:
            records = list(iter_records(bytes(data[batch.position: batch.position + h.size])))
        except CorruptRecordError as e:
            self.problem(path, f"{where}: records do not decode: {e}")
            return
        except Exception as e:  # noqa: BLE001 - each decompressor raises errors of its own
            self.problem(path, f"{where}: records do not decode: {type(e).__name__}: {e}")
            return
        previous = h.base_offset - 1
        for r in records:
            if not previous < r.offset <= h.last_offset:
                self.problem(path, f"{where}: record offset {r.offset} out of order or outside the batch")
            previous = r.offset
            try:
                self.out(self._record_line(h, r))
            except ValueError as e:  # a metadata log record that is not one
                self.problem(path, f"{where}: record at offset {r.offset} does not decode: {e}")

    def _record_line(self, h: BatchHeader, r: Record) -> str:
        kind = "LogAppendTime" if h.log_append_time else "CreateTime"
        sequence = -1 if h.base_sequence < 0 else (h.base_sequence + r.offset - h.base_offset) % (INT_MAX + 1)
        line = (f"| offset: {r.offset} {kind}: {r.timestamp} keySize: {_size(r.key)} "
                f"valueSize: {_size(r.value)} sequence: {sequence} "
                f"headerKeys: [{','.join(k for k, _ in r.headers)}]")
        if h.is_control and self.decoder == METADATA:
            line += " " + _metadata_control(r)
        elif h.is_control:
            if r.key is not None and len(r.key) >= 4 and r.value is not None and len(r.value) >= 6:
                kind_id = int.from_bytes(r.key[2:4], "big", signed=True)
                epoch = int.from_bytes(r.value[2:6], "big", signed=True)
                marker = {CONTROL_ABORT: "ABORT", CONTROL_COMMIT: "COMMIT"}.get(kind_id, f"type {kind_id}")
                line += f" endTxnMarker: {marker} coordinatorEpoch: {epoch}"
        elif self.decoder == METADATA:
            line += f" payload: {_metadata_payload(r.value)}"
        elif self.print_data:
            key, value = self._decoded(r)
            if key is not None:
                line += f" key: {key}"
            if value is not None:
                line += f" payload: {value}"
        return line

    def _decoded(self, r: Record) -> tuple[str | None, str | None]:
        """Key and value as text, or decoded as an internal topic's records."""
        if self.decoder is None:
            return _text(r.key), _text(r.value)
        try:
            return _decode_internal(self.decoder, r.key, r.value)
        except Exception as e:  # noqa: BLE001 - a record this decoder cannot read: say so, go on
            return f"(not decodable: {type(e).__name__}: {e})", None

    def _log_scan_for(self, path: Path) -> LogScan | None:
        log_path = path.with_suffix(LOG_SUFFIX)
        if not log_path.is_file():
            self.problem(path, f"its log {log_path.name} is missing: entries cannot be checked")
            return None
        with _mapped(log_path) as data:
            return scan_log(data)

    def _index(self, path: Path, kind: type, empty: Callable[[int], tuple[int, int]], names: tuple[str, str],
               in_order: Callable[[tuple[int, int], tuple[int, int]], bool], out_of_order: str,
               check: Callable[[Any, int, int], str | None]) -> None:
        """An index file's entries (`names` say what the two numbers of one are), each after
        the one before it by `in_order` and, where the log is there, `check`ed against it (the
        problem found, or None); a torn tail and empty trailing entries are reported. With
        the sanity check only, that check alone."""
        index = kind(path, _base_offset(path))
        entries, zeros = _trim_zero_entries(index.entries(), empty(index.base_offset))
        torn = path.stat().st_size % kind.entry_size
        if self.opts.sanity_only:
            self._sanity(path, torn, index.sanity_check(self._log_size(path)))
            return
        if torn:
            self.problem(path, f"ends with {torn} bytes of a torn entry")
        scan = self._log_scan_for(path)
        first, second = names
        previous = None
        for a, b in entries:
            self.out(f"{first}: {a} {second}: {b}")
            entry = f"entry ({first} {a}, {second} {b})"
            if previous is not None and not in_order(previous, (a, b)):
                self.problem(path, f"{entry} {out_of_order} {previous}")
            previous = (a, b)
            if scan is not None and (problem := check(scan, a, b)) is not None:
                self.problem(path, f"{entry}: {problem}")
        if zeros:
            self.out(f"({zeros} empty entries at the end: preallocated space)")

    def offset_index(self, path: Path) -> None:
        def check(scan: Any, offset: int, position: int) -> str | None:
            batch = scan.batch_at(position)
            if batch is None:
                return "no batch starts at that position of the log"
            if not batch.header.base_offset <= offset <= batch.header.last_offset:
                return f"the batch there holds offsets {batch.header.base_offset}-{batch.header.last_offset}"
            return None

        self._index(path, OffsetIndex, lambda base: (base, 0), ("offset", "position"),
                    lambda prev, cur: cur[0] > prev[0] and cur[1] > prev[1], "is not after the entry before it", check)

    def time_index(self, path: Path) -> None:
        def check(scan: Any, timestamp: int, offset: int) -> str | None:
            batch = scan.batch_holding(offset)
            if batch is None:
                return "no batch of the log holds that offset"
            if batch.header.max_timestamp != timestamp:
                return f"the batch holding it has max timestamp {batch.header.max_timestamp}"
            return None

        # Timestamps grow strictly; offsets never go back.
        self._index(path, TimeIndex, lambda base: (0, base), ("timestamp", "offset"),
                    lambda prev, cur: cur[0] > prev[0] and cur[1] >= prev[1], "is out of order after", check)

    def _log_size(self, path: Path) -> int:
        log_path = path.with_suffix(LOG_SUFFIX)
        return log_path.stat().st_size if log_path.is_file() else 0

    def _sanity(self, path: Path, torn: int, passed: bool) -> None:
        if passed and not torn:
            click.echo(f"{path} passed sanity check.")
        else:
            self.problem(path, "failed the sanity check a broker makes before trusting an index "
                               "(torn entry, entries out of order, or pointing past the log)")

    def txn_index(self, path: Path) -> None:
        entries = TransactionIndex(path).entries
        readable = len(entries) * TXN_ENTRY_SIZE
        size = path.stat().st_size
        if size != readable:
            self.problem(path, f"{size - readable} bytes after the last readable entry (torn, or "
                               "not version 0)")
        log_path = path.with_suffix(LOG_SUFFIX)
        scan = None
        if log_path.is_file():
            with _mapped(log_path) as data:
                scan = scan_log(data)
        for t in entries:
            self.out(f"version: 0 producerId: {t.producer_id} firstOffset: {t.first_offset} "
                     f"lastOffset: {t.last_offset} lastStableOffset: {t.last_stable_offset}")
            entry = f"aborted transaction of producer {t.producer_id} ({t.first_offset}-{t.last_offset})"
            if t.first_offset > t.last_offset:
                self.problem(path, f"{entry}: its first offset is after its last")
            if scan is not None:
                batch = scan.batch_holding(t.last_offset)
                if batch is None or not (batch.header.is_control and batch.header.producer_id == t.producer_id):
                    self.problem(path, f"{entry}: offset {t.last_offset} of the log is not that "
                                       "producer's transaction marker")

    def producer_snapshot(self, path: Path) -> None:
        try:
            producers = read_snapshot(path)
        except (ValueError, struct.error) as e:
            self.problem(path, f"unreadable: {e}")
            return
        for p in producers.values():
            last = p.batches[-1] if p.batches else None
            batch = ("" if last is None else f" firstSequence: {last.first_seq} lastSequence: {last.last_seq} "
                     f"lastOffset: {last.last_offset} offsetDelta: {last.last_offset - last.first_offset}")
            txn = p.current_txn_first_offset if p.current_txn_first_offset >= 0 else "None"
            self.out(f"producerId: {p.producer_id} producerEpoch: {p.producer_epoch} coordinatorEpoch: "
                     f"{p.coordinator_epoch} currentTxnFirstOffset: {txn} lastTimestamp: {p.last_timestamp}{batch}")

    def epochs(self, path: Path) -> None:
        try:
            entries = read_epoch_checkpoint(path)
        except (ValueError, UnicodeDecodeError) as e:
            self.problem(path, f"unreadable: {e}")
            return
        for e in entries:
            self.out(f"epoch: {e.epoch} startOffset: {e.start_offset}")

    def checkpoint(self, path: Path) -> None:
        try:
            entries = read_checkpoint(path)
        except ValueError as e:
            self.problem(path, str(e))
            return
        for (topic, partition), offset in sorted(entries.items()):
            self.out(f"topic: {topic} partition: {partition} offset: {offset}")


def _batch_line(batch: Batch) -> str:
    h = batch.header
    last_sequence = -1 if h.base_sequence < 0 else (h.base_sequence + h.last_offset_delta) % (INT_MAX + 1)
    horizon = h.base_timestamp if h.attributes & DELETE_HORIZON_MASK else "none"
    kind = "LogAppendTime" if h.log_append_time else "CreateTime"
    return (f"baseOffset: {h.base_offset} lastOffset: {h.last_offset} count: {h.record_count} "
            f"baseSequence: {h.base_sequence} lastSequence: {last_sequence} producerId: {h.producer_id} "
            f"producerEpoch: {h.producer_epoch} partitionLeaderEpoch: {h.partition_leader_epoch} "
            f"isTransactional: {str(h.is_transactional).lower()} isControl: {str(h.is_control).lower()} "
            f"deleteHorizonMs: {horizon} position: {batch.position} {kind}: {h.max_timestamp} "
            f"size: {h.size} magic: {h.magic} "
            f"compresscodec: {compression.NAMES.get(h.compression, h.compression)} crc: {h.crc} "
            f"isvalid: {str(batch.valid).lower()}")


def _size(data: bytes | None) -> int:
    return -1 if data is None else len(data)


def _text(data: bytes | None) -> str | None:
    return None if data is None else data.decode("utf-8", "backslashreplace")


def _jsonable(value: Any) -> Any:
    if dataclasses.is_dataclass(value):
        return {k: _jsonable(v) for k, v in dataclasses.asdict(value).items()}
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set):
        return [_jsonable(v) for v in sorted(value)] if isinstance(value, set) else [_jsonable(v) for v in value]
    if isinstance(value, bytes):
        return value.hex()
    return value


def _decode_internal(decoder: str, key: bytes | None, value: bytes | None) -> tuple[str, str]:
    """`__consumer_offsets` (offsets) or `__transaction_state` (transactions) records as JSON;
    a null value is a tombstone, shown as <DELETE>."""
    if decoder == "offsets":
        from strom.coordinator.group import records as group_records

        k = group_records.read_key(key or b"")
        if value is None:
            v: Any = "<DELETE>"
        elif isinstance(k, group_records.OffsetCommitKey):
            v = _jsonable(group_records.read_offset_commit_value(value))
        elif isinstance(k, group_records.GroupMetadataKey):
            v = _jsonable(group_records.read_group_metadata_value(value))
        else:
            v = f"({len(value)} bytes of a record type this tool does not decode)"
        key_json = {"type": type(k).__name__, **_jsonable(k)}
    else:
        from strom.coordinator.transaction import records as txn_records

        key_json = {"transactional_id": txn_records.read_key(key or b"")}
        v = "<DELETE>" if value is None else _jsonable(txn_records.read_value(value))
        if isinstance(v, dict) and "state" in v:
            v["state"] = txn_records.TxnState(v["state"]).name
    return json.dumps(key_json), v if isinstance(v, str) else json.dumps(v)


def _in_metadata_log(path: Path) -> bool:
    """Whether `path` is a file of a KRaft metadata log (`__cluster_metadata-0/`)."""
    topic, _, partition = path.parent.name.rpartition("-")
    return topic == METADATA_TOPIC and partition.isdigit()


def _lower_camel(name: str) -> str:
    """A field as Kafka's JSON names it: topic_id -> topicId."""
    first, *rest = name.split("_")
    return first + "".join(part[:1].upper() + part[1:] for part in rest)


def _metadata_json(value: Any) -> Any:
    """A decoded metadata or control record as JSON values: fields in Kafka's camelCase, uuids
    in Kafka's text form, bytes in base64."""
    if isinstance(value, uuid.UUID):
        return kafka_uuid(value)
    if isinstance(value, bytes | bytearray):
        return base64.b64encode(value).decode()
    if isinstance(value, list | tuple):
        return [_metadata_json(v) for v in value]
    if isinstance(value, dict):
        return {_lower_camel(k): _metadata_json(v) for k, v in value.items()}
    slots = getattr(type(value), "__slots__", None)  # the generated record classes
    if slots is not None:
        return {_lower_camel(a): _metadata_json(getattr(value, a)) for a in slots}
    return value


def _compact_json(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"))  # as Kafka's tools print JSON: no spaces


def _metadata_payload(value: bytes | None) -> str:
    """A metadata record as kafka-dump-log's --cluster-metadata-decoder shows it: its type
    (TOPIC_RECORD), its version and its fields. ValueError when it is not one."""
    if value is None:
        raise ValueError("a metadata record has a value")
    api_key, version, record = metadata_records.decode_framed(value)
    name = metadata_records.RECORD_TYPES[api_key].name
    kind = re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", name).upper()
    return _compact_json({"type": kind, "version": version, "data": _metadata_json(record)})


def _metadata_control(r: Record) -> str:
    """A control record of the metadata log: `LeaderChange: {...}`, `SnapshotHeader: {...}`."""
    control = parse_control(r)
    if control is None:
        kind = int.from_bytes((r.key or b"\0\0\0\0")[2:4], "big", signed=True)
        return f"controlType: {kind}"
    fields = _metadata_json(control.value.to_dict(json=False))
    fields = {"version": fields.pop("recordVersion", 0), **fields}
    return f"{CONTROL_NAMES[control.kind]}: {_compact_json(fields)}"


def _control_kinds(data: Any, batch: Batch) -> list[int]:
    """The control record types of a batch (none for a data batch or one that does not decode)."""
    if not (batch.header.is_control and batch.valid):
        return []
    try:
        records = iter_records(bytes(data[batch.position: batch.position + batch.header.size]))
        return [c.kind for r in records if (c := parse_control(r)) is not None]
    except (CorruptRecordError, ValueError):
        return []


# A segment's file name stem: its base offset, and in remote storage then its segment id
# (`<base offset>-<Kafka uuid>`, strom.remote.objects).
_SEGMENT_STEM = re.compile(r"(\d{20})(?:-[A-Za-z0-9_-]{22})?")


def _base_offset(path: Path) -> int | None:
    """The base offset a segment file is named after (20 digits), or None."""
    stem = path.name.split(".")[0]
    if stem.isdigit():
        return int(stem)
    match = _SEGMENT_STEM.fullmatch(stem)
    return int(match[1]) if match else None


def _trim_zero_entries(entries: list[tuple[int, int]], zero: tuple[int, int]) -> tuple[list, int]:
    """Kafka preallocates index files: after a crash the space past the last entry reads as
    entries equal to `zero`. They are left out (and counted) after the first entry."""
    end = len(entries)
    while end > 1 and entries[end - 1] == zero:
        end -= 1
    return entries[:end], len(entries) - end


class _mapped:
    """A read-only view of a whole file (an empty file is b"")."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __enter__(self) -> Any:
        self.fd = os.open(self.path, os.O_RDONLY)
        size = os.fstat(self.fd).st_size
        self.map = mmap.mmap(self.fd, size, access=mmap.ACCESS_READ) if size else None
        return self.map if self.map is not None else b""

    def __exit__(self, *exc: object) -> None:
        if self.map is not None:
            self.map.close()
        os.close(self.fd)


def _files(paths: tuple[Path, ...], listed: str | None) -> Iterator[Path]:
    """The files named, with --files' comma-separated ones; a directory stands for its segment
    and checkpoint files in order."""
    for path in [*paths, *(Path(p) for p in (listed or "").split(",") if p.strip())]:
        if path.is_dir():
            yield from sorted(p for p in path.iterdir() if p.is_file())
        else:
            yield path


@click.command("dump-log", cls=Command)
@click.argument("paths", metavar="FILE|DIR|OBJECT...", nargs=-1)
@click.option("--files", "listed", metavar="FILE,FILE", help="Files to dump, comma-separated "
              "(as kafka-dump-log; the arguments do the same).")
@click.option("--deep-iteration", "deep", is_flag=True, help="Decode and check every record, "
              "not only the batch headers.")
@click.option("--print-data-log", "print_data", is_flag=True,
              help="Show records' keys and values (implies --deep-iteration).")
@click.option("--verify-index-only", is_flag=True, help="Check without printing entries: only "
              "problems are shown.")
@click.option("--index-sanity-check", "sanity_only", is_flag=True,
              help="For indexes: only the quick check a broker makes at start-up.")
@click.option("--max-bytes", type=click.IntRange(min=1), help="Read only this many bytes of a log.")
@click.option("--offsets-decoder", "decoder", flag_value="offsets",
              help="Decode records as __consumer_offsets ones (implies --print-data-log).")
@click.option("--transaction-log-decoder", "decoder", flag_value="transactions",
              help="Decode records as __transaction_state ones (implies --print-data-log).")
@click.option("--cluster-metadata-decoder", "decoder", flag_value=METADATA,
              help="Decode records as a KRaft metadata log's (implies --print-data-log; the "
                   "default for files of __cluster_metadata-0 and KRaft snapshots).")
@click.option("--remote-config", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="A properties file with the remote store's rsm.config.* keys (the broker's "
                   "server.properties will do): the arguments are then segment log objects of "
                   "that store, by key or as s3://BUCKET/KEY.")
@click.option("--override", "overrides", multiple=True, metavar="KEY=VALUE",
              help="A remote store key (rsm.config.*), over --remote-config's (repeatable); "
                   "the arguments are then objects too.")
def dump_log(paths: tuple[str, ...], listed: str | None, deep: bool, print_data: bool,
             verify_index_only: bool, sanity_only: bool, max_bytes: int | None,
             decoder: str | None, remote_config: Path | None, overrides: tuple[str, ...]) -> None:
    """Print and check a partition's files: segment logs, indexes, transaction indexes and
    checkpoints, and a KRaft metadata log's records and snapshots, read from disk (like
    kafka-dump-log, plus a consistency check). Problems go to stderr, and the exit code is 1
    when there is any.

    \b
    Example:
      strom dump-log strom-data/orders-0/00000000000000000000.log
      strom dump-log strom-data/orders-0/00000000000000000000.log --print-data-log
      strom dump-log strom-data/orders-0/00000000000000000000.index --verify-index-only
      strom dump-log strom-data/orders-0 --deep-iteration --verify-index-only
      strom dump-log strom-data/__consumer_offsets-7/00000000000000000000.log --offsets-decoder
      strom dump-log strom-cluster/node-1/logs/__cluster_metadata-0
      strom dump-log --remote-config server.properties \\
        'orders-<topic id>/0/00000000000000000000-<segment id>.log'
      strom dump-log s3://tiered/orders-<topic id>/0/00000000000000000000-<segment id>.log \\
        --override rsm.config.storage.s3.endpoint.url=http://127.0.0.1:8333
    """
    print_data = print_data or decoder is not None
    dumper = Dumper(Options(deep or print_data, print_data, verify_index_only, sanity_only,
                            max_bytes, decoder))
    if remote_config is not None or overrides:
        _dump_remote(dumper, [*paths, *(p for p in (listed or "").split(",") if p.strip())],
                     remote_config, overrides)
    else:
        _dump_files(dumper, _local_paths(paths), listed)
    for path, problems in dumper.problems.items():
        click.echo(f"Problems in {path}:", err=True)
        for text in problems:
            click.echo(f"  {text}", err=True)
    if dumper.problems:
        count = sum(map(len, dumper.problems.values()))
        raise CommandError(f"{count} problem(s) found in {len(dumper.problems)} file(s)")


def _local_paths(paths: tuple[str, ...]) -> tuple[Path, ...]:
    """The arguments as files that exist, refused as click refuses a click.Path."""
    ctx = click.get_current_context()
    param = next(p for p in ctx.command.params if p.name == "paths")
    kind = click.Path(exists=True, path_type=Path)
    return tuple(kind.convert(p, param, ctx) for p in paths)


def _dump_files(dumper: Dumper, paths: tuple[Path, ...], listed: str | None) -> None:
    files = list(_files(paths, listed))
    if not files:
        raise click.UsageError("name at least one file or directory")
    missing = [f for f in files if not f.is_file()]
    if missing:
        raise click.BadParameter(f"no such file: {missing[0]}", param_hint="'--files'")
    for path in files:
        if not dumper.dump(path):
            click.echo(f"Ignoring {path}: not a file this tool reads", err=True)


def remote_store_config(remote_config: Path | None, overrides: tuple[str, ...]) -> tuple[dict[str, str], str]:
    """The keys a store is made from (the properties file's, then the overrides) and their
    prefix (remote.log.storage.manager.impl.prefix, rsm.config. by default)."""
    from strom.cli.common import parse_key_values, read_properties
    from strom.remote.config import DEFAULT_PREFIX

    try:
        keys = read_properties(remote_config) if remote_config is not None else {}
    except click.BadParameter as e:
        e.param_hint = "'--remote-config'"
        raise
    keys.update(parse_key_values(overrides, "--override"))
    return keys, keys.get("remote.log.storage.manager.impl.prefix", DEFAULT_PREFIX)


def _dump_remote(dumper: Dumper, objects: list[str], remote_config: Path | None,
                 overrides: tuple[str, ...]) -> None:
    """Segment log objects of a remote store, fetched whole and dumped as a local log is."""
    from strom.log.remote import RemoteResourceNotFound, RemoteStorageError
    from strom.remote.config import RemoteStorageConfigError, storage_from_config

    if not objects:
        raise click.UsageError("name at least one object")
    keys, prefix = remote_store_config(remote_config, overrides)
    by_bucket: dict[str | None, list[tuple[str, str]]] = {}
    for name in objects:
        bucket, key = None, name
        if name.startswith("s3://"):
            bucket, _, key = name.removeprefix("s3://").partition("/")
            if not bucket or not key:
                raise click.BadParameter(f"expected s3://BUCKET/KEY, got {name!r}")
        if not key.endswith(LOG_SUFFIX) or _base_offset(Path(key)) is None:
            raise click.BadParameter(f"{name}: not a segment log object (<base offset>-<segment id>.log)")
        by_bucket.setdefault(bucket, []).append((name, key))
    for bucket, wanted in by_bucket.items():
        config = dict(keys)
        if bucket is not None:
            config[f"{prefix}storage.s3.bucket.name"] = bucket
        try:
            store = storage_from_config(config, prefix)
        except (RemoteStorageConfigError, ImportError) as e:
            raise CommandError(f"cannot make the remote store: {e}") from None
        try:
            for name, key in wanted:
                try:
                    data = store.get(key)
                except RemoteResourceNotFound:
                    raise CommandError(f"no object {key} in the remote store") from None
                except RemoteStorageError as e:
                    raise CommandError(f"cannot read {key} from the remote store: {e}") from None
                dumper.remote_log(name, data)
        finally:
            store.close()
