"""KIP-630 snapshots: the `<offset>-<epoch>.checkpoint` file, a run of record batches that
begins with a control batch (SnapshotHeader, then KRaftVersion and Voters with KIP-853) and
ends with one holding SnapshotFooter, as Kafka's RecordsSnapshotWriter lays them out."""

from __future__ import annotations

import re
from dataclasses import dataclass

from strom.protocol.raft_records import (
    KRAFT_VERSION,
    KRAFT_VOTERS,
    SNAPSHOT_FOOTER,
    SNAPSHOT_HEADER,
    VoterEntry,
    control_batch,
    control_records,
    data_batch,
    data_values,
    decode_voters,
    iter_batches,
    kraft_version_value,
    snapshot_footer_value,
    snapshot_header_value,
    voters_value,
)
from strom.raft.log import OffsetAndEpoch

SUFFIX = ".checkpoint"
_NAME = re.compile(r"^(\d{20})-(\d{10})\.checkpoint$")
_RECORDS_PER_BATCH = 1000


def filename(snapshot_id: OffsetAndEpoch) -> str:
    return f"{snapshot_id.offset:020d}-{snapshot_id.epoch:010d}{SUFFIX}"


def parse_filename(name: str) -> OffsetAndEpoch | None:
    m = _NAME.match(name)
    return OffsetAndEpoch(int(m.group(1)), int(m.group(2))) if m else None


def build_snapshot(snapshot_id: OffsetAndEpoch, values: list[bytes], *, kraft_version: int,
                   voters: list[VoterEntry] | None, last_contained_timestamp: int) -> bytes:
    """The snapshot's bytes: header batch, `values` in batches of up to 1000 records, footer."""
    header = [(SNAPSHOT_HEADER, snapshot_header_value(last_contained_timestamp))]
    if kraft_version >= 1 and voters is not None:
        header += [(KRAFT_VERSION, kraft_version_value(kraft_version)), (KRAFT_VOTERS, voters_value(voters))]
    epoch, ts = snapshot_id.epoch, last_contained_timestamp
    out = bytearray(control_batch(header, 0, epoch, ts))
    offset = len(header)
    for i in range(0, len(values), _RECORDS_PER_BATCH):
        chunk = values[i:i + _RECORDS_PER_BATCH]
        out += data_batch(chunk, offset, epoch, ts)
        offset += len(chunk)
    out += control_batch([(SNAPSHOT_FOOTER, snapshot_footer_value())], offset, epoch, ts)
    return bytes(out)


@dataclass(frozen=True)
class SnapshotContents:
    values: list[bytes]
    kraft_version: int
    voters: list[VoterEntry] | None


def read_snapshot(data: bytes) -> SnapshotContents:
    """Decode a whole snapshot; raises ValueError when it lacks its header or footer."""
    values: list[bytes] = []
    kraft_version, voters = 0, None
    saw_header = saw_footer = False
    for info in iter_batches(data):
        if info.is_control:
            for rec in control_records(data, info.pos):
                if rec.kind == SNAPSHOT_HEADER:
                    saw_header = True
                elif rec.kind == SNAPSHOT_FOOTER:
                    saw_footer = True
                elif rec.kind == KRAFT_VERSION:
                    kraft_version = rec.value.k_raft_version
                elif rec.kind == KRAFT_VOTERS:
                    voters = decode_voters(rec.value)
        else:
            values.extend(data_values(data, info.pos))
    if not (saw_header and saw_footer):
        raise ValueError("snapshot lacks its header or footer")
    return SnapshotContents(values, kraft_version, voters)
