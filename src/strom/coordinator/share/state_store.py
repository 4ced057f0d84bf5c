"""ShareStateStore: the share coordinator's storage, durable share-partition state in the
compacted internal topic `__share_group_state`.

The key of a share partition ("group:topicId:partition", Java's String hash, as Kafka picks
the partition) names the state-topic partition that holds it, and the leader of that
partition is the share partition's ShareCoordinator (`coordinator.py`). A write appends one
full snapshot per share partition (one batch per state-topic partition per request, never a
record per delivered record), a tombstone deletes it, and the partitions this broker leads are
replayed into memory when it is elected their leader.

Record layout (Strom's own, versioned): key = int16 version 0, string group, 16-byte topic
id, int32 partition; value = int16 version (0; 1 with the leader epoch; 2 with a not-before
per batch, written only when a batch has one), int32 state epoch, [v1+: int32 leader epoch,]
int64 start offset, int32 count, then per batch int64 first, int64 last, int8 state, int16
delivery count[, v2: int64 not-before (epoch ms, 0: none)]. States are Kafka's RecordState
ids, and Strom's own 16 and 17 for dead letters not yet written (share_partition.py).
"""

from __future__ import annotations

import base64
import binascii
import logging
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from strom.coordinator import SHARE_GROUP_STATE_TOPIC, log_store
from strom.coordinator.share.share_partition import ShareState, StateBatch
from strom.protocol.errors import ErrorCode
from strom.protocol.record_schema import Reader, RecordFormatError, Writer

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class SharePartitionKey:
    group_id: str
    topic_id: uuid.UUID
    partition: int

    @property
    def coordinator_key(self) -> str:
        """Kafka's SharePartitionKey string, which picks the state-topic partition: the topic
        id as Kafka's Uuid.toString writes it (URL-safe base64, unpadded)."""
        topic_id = base64.urlsafe_b64encode(self.topic_id.bytes).rstrip(b"=").decode()
        return f"{self.group_id}:{topic_id}:{self.partition}"

    @classmethod
    def parse(cls, key: str) -> SharePartitionKey | None:
        """A "groupId:topicId:partition" key (topic id in Kafka's base64 or as a UUID), or None."""
        head, _, partition = (key or "").rpartition(":")
        group, _, topic = head.rpartition(":")
        if not group or not topic or not partition.isdigit():
            return None
        try:
            topic_id = uuid.UUID(topic)
        except ValueError:
            try:
                raw = base64.urlsafe_b64decode(topic + "=" * (-len(topic) % 4))
            except (ValueError, binascii.Error):
                return None
            if len(raw) != 16:
                return None
            topic_id = uuid.UUID(bytes=raw)
        return cls(group, topic_id, int(partition))


def encode_key(key: SharePartitionKey) -> bytes:
    w = Writer().int16(0).string(key.group_id)
    w.buf += key.topic_id.bytes
    return bytes(w.int32(key.partition).buf)


def decode_key(data: bytes) -> SharePartitionKey:
    r = Reader(data)
    if r.int16() != 0:
        raise RecordFormatError("unknown share state key version")
    group = r.string() or ""
    topic_id = uuid.UUID(bytes=bytes(r._take(16)))
    return SharePartitionKey(group, topic_id, r.int32())


def encode_value(state: ShareState) -> bytes:
    delayed = any(b.not_before for b in state.batches)
    w = Writer().int16(2 if delayed else 1).int32(state.state_epoch).int32(state.leader_epoch)
    w.int64(state.start_offset).int32(len(state.batches))
    for b in state.batches:
        w.int64(b.first_offset).int64(b.last_offset).int8(b.state).int16(b.delivery_count)
        if delayed:
            w.int64(b.not_before)
    return bytes(w.buf)


def decode_value(data: bytes) -> ShareState:
    r = Reader(data)
    version = r.int16()
    if version not in (0, 1, 2):
        raise RecordFormatError("unknown share state value version")
    epoch = r.int32()
    leader_epoch = r.int32() if version >= 1 else -1
    start, count = r.int64(), r.int32()
    batches = [StateBatch(r.int64(), r.int64(), r.int8(), r.int16(), r.int64() if version >= 2 else 0)
               for _ in range(count)]
    return ShareState(start, batches, epoch, leader_epoch)


# A replay of state partitions: partition -> the latest state of each key (None: deleted).
ShareReplay = dict[int, dict[SharePartitionKey, "ShareState | None"]]


class ShareStateStore(log_store.InternalTopic):
    topic = SHARE_GROUP_STATE_TOPIC

    def __init__(self, replica_manager, num_partitions: Callable[[], int]) -> None:
        super().__init__(replica_manager, num_partitions)
        # The latest state of every share partition whose state-topic partition is led here.
        self.states: dict[SharePartitionKey, ShareState] = {}
        self.loaded: set[int] = set()

    def new_state(self) -> ShareReplay:
        return {}

    def replay_into(self, log_, state: ShareReplay, start: int | None = None, end: int | None = None) -> None:
        """The latest state of each key in [start, end) of `log_` (None: a tombstone), under
        the log's partition."""
        latest = state.setdefault(log_.partition, {})
        for item in log_store.replay(log_, start, end):
            try:
                latest[decode_key(item.key)] = None if item.value is None else decode_value(item.value)
            except RecordFormatError as e:
                log.warning("%s: skipping a record that does not parse: %s", self.topic, e)

    def apply(self, replay: ShareReplay) -> int:
        """Serve the states of a replay's partitions; returns the keys it held."""
        for index, latest in replay.items():
            for key, state in latest.items():
                if state is None:
                    self.states.pop(key, None)
                else:
                    self.states[key] = state
            self.loaded.add(index)
        return sum(map(len, replay.values()))

    def unload(self, index: int) -> None:
        self.loaded.discard(index)
        n = self.num_partitions()
        for key in [k for k in self.states if log_store.partition_for(k.coordinator_key, n) == index]:
            del self.states[key]

    def get(self, key: SharePartitionKey) -> ShareState | None:
        return self.states.get(key)

    def available(self, key: SharePartitionKey) -> bool:
        """This broker leads the state partition of `key` and has loaded it."""
        return self.is_local(key.coordinator_key) and self.partition_for(key.coordinator_key) in self.loaded

    def write(self, entries: Iterable[tuple[SharePartitionKey, ShareState | None]]
              ) -> tuple[dict[SharePartitionKey, ErrorCode], set[int]]:
        """Append the given states (None: a tombstone), one batch per state-topic partition.
        Returns each key's error and the state-topic partitions written, for the caller to
        wait on their replication."""
        by_partition: dict[int, list[tuple[SharePartitionKey, ShareState | None]]] = {}
        for key, state in entries:
            by_partition.setdefault(self.partition_for(key.coordinator_key), []).append((key, state))
        errors: dict[SharePartitionKey, ErrorCode] = {}
        written: set[int] = set()
        for index, items in by_partition.items():
            records = [(encode_key(k), None if s is None else encode_value(s)) for k, s in items]
            error = log_store.append(self.replica_manager, (self.topic, index), records)
            error = log_store.STORE_ERRORS.get(error, error)
            for key, state in items:
                errors[key] = error
                if error == ErrorCode.NONE:
                    if state is None:
                        self.states.pop(key, None)
                    else:
                        self.states[key] = state
            if error == ErrorCode.NONE:
                written.add(index)
            else:
                log.warning("writing share state to %s-%d failed: %s", self.topic, index, error.name)
        return errors, written

    def group_ids(self) -> set[str]:
        return {k.group_id for k in self.states}

    def keys_of(self, group_id: str) -> list[SharePartitionKey]:
        return [k for k in self.states if k.group_id == group_id]
