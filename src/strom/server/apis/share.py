"""KIP-932 share groups: ShareGroupHeartbeat and ShareGroupDescribe (the group coordinator's
share groups), ShareFetch and ShareAcknowledge (share sessions and share partitions, in
`share/partition_manager.py`).

ShareGroupHeartbeat and ShareGroupDescribe at v1, Kafka 4.1's first stable version (v0 was
4.0's early access); ShareFetch and ShareAcknowledge at v1 and v2, Kafka 4.2's: the RENEW
acknowledgement (KIP-1222: a member extends the locks of records it holds; a ShareFetch
saying IsRenewAck only acknowledges, its fetch fields all 0) and ShareFetch's
ShareAcquireMode (KIP-1206: record_limit acquires at most MaxRecords records, batches cut).
The APIs are advertised always and answer UNSUPPORTED_VERSION while `share.version` is not
finalized at 1 or more, as a Kafka broker with share groups off does.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

from strom.controller.features import SHARE_VERSION
from strom.coordinator import GROUP_METADATA_TOPIC
from strom.coordinator.group.share_group import ShareHeartbeat
from strom.coordinator.share.share_partition import (
    ACKNOWLEDGE_TYPES,
    ACKNOWLEDGE_TYPES_V2,
    RELEASE,
    AckBatch,
    valid_acknowledgements,
)
from strom.coordinator.share.state_store import SharePartitionKey
from strom.protocol.errors import ErrorCode, KafkaError
from strom.security.authorizer import DESCRIBE, GROUP, READ, TOPIC, allowed, as_int32
from strom.server.apis import RequestContext, api
from strom.server.apis.groups import GROUP_DENIED, _operations, client_host
from strom.share.partition_manager import FINAL_EPOCH, INITIAL_EPOCH, FetchedPartition, ShareSession

SHARE_GROUP_HEARTBEAT, SHARE_GROUP_DESCRIBE, SHARE_FETCH, SHARE_ACKNOWLEDGE = 76, 77, 78, 79
BATCH_OPTIMIZED, RECORD_LIMIT = 0, 1  # ShareFetch v2's ShareAcquireMode
_NOT_ENABLED = "Share groups are not enabled: share.version is not finalized at 1 or more."
_NO_LEADER = {"leader_id": -1, "leader_epoch": -1}


def _enabled(broker) -> bool:
    return broker.finalized_features.level(SHARE_VERSION) >= 1


@api(SHARE_GROUP_HEARTBEAT, 1, 1)
async def handle_share_group_heartbeat(broker, ctx: RequestContext, request) -> dict:
    def error(code: ErrorCode, message: str | None) -> dict:
        return {"throttle_time_ms": 0, "error_code": code, "error_message": message, "member_id": None,
                "member_epoch": 0, "heartbeat_interval_ms": 0, "assignment": None}

    if not allowed(broker, ctx, READ, GROUP, request.group_id):
        return GROUP_DENIED
    if not _enabled(broker):
        return error(ErrorCode.UNSUPPORTED_VERSION, _NOT_ENABLED)
    share_groups = broker.group_coordinator.share_groups
    try:
        result = share_groups.heartbeat(ShareHeartbeat(
            group_id=request.group_id, member_id=request.member_id, member_epoch=request.member_epoch,
            rack_id=request.rack_id,
            subscribed_topic_names=None if request.subscribed_topic_names is None
            else list(request.subscribed_topic_names),
            client_id=ctx.header.client_id or "", client_host=client_host(ctx)))
        # What the heartbeat changed is in `__consumer_offsets` (acks=all) before the answer:
        # a failed-over coordinator knows the member, its epoch and its assignment.
        if share_groups.store(request.group_id):
            code = await broker.coordinators.await_internal_replication(GROUP_METADATA_TOPIC, request.group_id)
            if code != ErrorCode.NONE:
                return error(code, "The share group's records were not replicated in time.")
    except KafkaError as e:
        return error(e.code, str(e) or None)
    assignment = None if result.assignment is None else {"topic_partitions": [
        {"topic_id": topic_id, "partitions": sorted(ps)} for topic_id, ps in result.assignment.items()]}
    return {"throttle_time_ms": 0, "error_code": ErrorCode.NONE, "error_message": None,
            "member_id": result.member_id, "member_epoch": result.member_epoch,
            "heartbeat_interval_ms": result.heartbeat_interval_ms, "assignment": assignment}


@api(SHARE_GROUP_DESCRIBE, 1, 1)
async def handle_share_group_describe(broker, ctx: RequestContext, request) -> dict:
    share_groups = broker.group_coordinator.share_groups
    known = broker.share_partitions.group_ids()
    out = []
    for group_id in request.group_ids:
        if not allowed(broker, ctx, DESCRIBE, GROUP, group_id):
            out.append({"group_id": group_id, "error_code": ErrorCode.GROUP_AUTHORIZATION_FAILED,
                        "group_state": "", "group_epoch": -1, "assignment_epoch": -1, "assignor_name": "",
                        "members": []})
            continue
        described = share_groups.describe(group_id)
        if described["error_code"] == ErrorCode.GROUP_ID_NOT_FOUND and group_id in known \
                and group_id not in broker.group_coordinator.groups:
            # A share group with state but no member since the broker started.
            described |= {"error_code": ErrorCode.NONE, "error_message": None, "group_state": "Empty",
                          "group_epoch": 0, "assignment_epoch": 0, "assignor_name": "simple"}
        described["authorized_operations"] = as_int32(_operations(broker, ctx, request, group_id))
        out.append(described)
    return {"throttle_time_ms": 0, "groups": out}


# --- ShareFetch / ShareAcknowledge ---------------------------------------------------------------
def _top_error(code: ErrorCode, message: str | None, fetch: bool) -> dict:
    response = {"throttle_time_ms": 0, "error_code": code, "error_message": message, "responses": [],
                "node_endpoints": []}
    if fetch:
        response["acquisition_lock_timeout_ms"] = 0
    return response


def _acknowledgements(request) -> dict[tuple[uuid.UUID, int], list[AckBatch]]:
    """Per partition, the request's acknowledgement batches (a topic may come twice)."""
    out: dict[tuple[uuid.UUID, int], list[AckBatch]] = {}
    for topic in request.topics:
        for p in topic.partitions:
            out.setdefault((topic.topic_id, p.partition_index), []).extend(
                (b.first_offset, b.last_offset, list(b.acknowledge_types)) for b in p.acknowledgement_batches)
    return out


class _Exchange:
    """One ShareFetch or ShareAcknowledge: what it acknowledged and acquired, per partition."""

    def __init__(self, broker, ctx: RequestContext, session: ShareSession, is_renew_ack: bool = False) -> None:
        self.broker = broker
        self.ctx = ctx
        # RENEW only in a v2 request saying IsRenewAck: a RENEW batch of one that does not (or of
        # v1) makes its partition INVALID_REQUEST, as Kafka 4.2's acknowledgement checks do.
        self.types = ACKNOWLEDGE_TYPES_V2 if ctx.header.api_version >= 2 and is_renew_ack else ACKNOWLEDGE_TYPES
        self.session = session
        self.manager = broker.share_partitions
        self.names: dict[uuid.UUID, str] = broker.metadata_cache.names_by_id
        self.ack_errors: dict[tuple[uuid.UUID, int], ErrorCode] = {}
        self.fetched: dict[tuple[uuid.UUID, int], FetchedPartition] = {}
        self.touched: set[SharePartitionKey] = set()  # acknowledged here: written before the answer
        self.writing: asyncio.Future | None = None

    def _check_topic(self, topic_id: uuid.UUID) -> tuple[str | None, ErrorCode]:
        name = self.names.get(topic_id)
        if name is None:
            return None, ErrorCode.UNKNOWN_TOPIC_ID
        if not allowed(self.broker, self.ctx, READ, TOPIC, name):
            return None, ErrorCode.TOPIC_AUTHORIZATION_FAILED
        return name, ErrorCode.NONE

    def acknowledge(self, acks: dict[tuple[uuid.UUID, int], list[AckBatch]]) -> None:
        group, member = self.session.group_id, self.session.member_id
        for (topic_id, p), batches in acks.items():
            if not batches:
                continue
            if not valid_acknowledgements(batches, self.types):  # first, as Kafka: whatever the partition
                self.ack_errors[(topic_id, p)] = ErrorCode.INVALID_REQUEST
                continue
            name, error = self._check_topic(topic_id)
            if name is None:
                self.ack_errors[(topic_id, p)] = error
                continue
            key = SharePartitionKey(group, topic_id, p)
            sp = self.manager.partitions.get(key)
            if sp is None:  # nothing was acquired here since this broker loaded the group
                self.ack_errors[(topic_id, p)] = ErrorCode.INVALID_RECORD_STATE
                continue
            start = sp.start_offset
            error = self.manager.acknowledge(key, sp, member, batches, self.types)
            self.ack_errors[(topic_id, p)] = error
            if error == ErrorCode.NONE:
                self.touched.add(key)
                # Released records may be taken by others, and a start offset moved on leaves
                # room in a window that was full (group.share.partition.max.record.locks): the
                # long polls waiting on the partition look again.
                if sp.start_offset != start or any(t == RELEASE for _, _, types in batches for t in types):
                    self.manager.wake(key)

    async def fetch(self, max_records: int, max_bytes: int, max_wait_ms: int, record_limit: bool = False) -> None:
        group, member = self.session.group_id, self.session.member_id
        deadline = time.monotonic() + max(max_wait_ms, 0) / 1000
        parts = sorted(self.session.partitions, key=lambda tp: (str(tp[0]), tp[1]))
        loaded = await self._load_all(parts)
        while True:
            remaining_records, remaining_bytes = max_records, max_bytes
            wait_on = []
            for topic_id, p in parts:
                name, error = self._check_topic(topic_id)
                if name is None:
                    self.fetched[(topic_id, p)] = FetchedPartition(error)
                    continue
                key = SharePartitionKey(group, topic_id, p)
                sp, error = loaded.pop(key) if key in loaded else await self.manager.share_partition(key, name)
                if sp is None:
                    self.fetched[(topic_id, p)] = FetchedPartition(error)
                    continue
                wait_on.append((name, topic_id, p))
                # MaxBytes is a soft limit, as Fetch's: the first batch found goes out whatever
                # its size (MaxBytes 0 asks for one batch), the partitions after it get the rest.
                if remaining_records <= 0 or (remaining_bytes <= 0 and remaining_bytes < max_bytes):
                    continue
                got = self.manager.acquire(key, sp, name, member, remaining_records, remaining_bytes, record_limit)
                if got.acquired or got.error != ErrorCode.NONE:
                    self.fetched[(topic_id, p)] = got
                    remaining_records -= sum(a.last_offset - a.first_offset + 1 for a in got.acquired)
                    remaining_bytes -= len(got.records or b"")
            left = deadline - time.monotonic()
            if self.fetched or left <= 0:
                return
            await self.broker.replica_manager.fetch_purgatory.wait_any(self.manager.wait_keys(group, wait_on), left)
            if self.broker.stopping:
                return

    async def _load_all(self, parts: list[tuple[uuid.UUID, int]]) -> dict[SharePartitionKey, tuple[Any, ErrorCode]]:
        """The session's share partitions not loaded here yet, loaded at once rather than one
        after another (each is a read of its state, and maybe an initialization, at its share
        coordinator): the first fetch of a member over many partitions waits for one round."""
        wanted = {}
        for topic_id, p in parts:
            key = SharePartitionKey(self.session.group_id, topic_id, p)
            name, _ = self._check_topic(topic_id)  # only topics the member may read
            if name is not None and key not in self.manager.partitions:
                wanted[key] = name
        if len(wanted) < 2:
            return {}
        answers = await asyncio.gather(*(self.manager.share_partition(k, n) for k, n in wanted.items()))
        return dict(zip(wanted, answers, strict=True))

    def start_persist(self) -> None:
        """Start writing what the acknowledgements changed; the fetch goes on meanwhile (what
        it acquires is not written, as in Kafka) and the answer waits for the write."""
        if self.touched and self.writing is None:
            self.writing = asyncio.ensure_future(self.manager.persist(self.touched))

    async def persist(self) -> None:
        """Acknowledgements are answered once durable: a write that failed is their error."""
        if self.writing is None:
            return
        errors = await self.writing
        for key, error in errors.items():
            tp = (key.topic_id, key.partition)
            if error != ErrorCode.NONE and self.ack_errors.get(tp) == ErrorCode.NONE:
                self.ack_errors[tp] = error

    def responses(self, requested: set[tuple[uuid.UUID, int]], fetch: bool) -> list[dict]:
        by_topic: dict[uuid.UUID, list[dict]] = {}
        keys = sorted(requested | set(self.ack_errors) | set(self.fetched), key=lambda tp: (str(tp[0]), tp[1]))
        for tp in keys:
            entry: dict[str, Any] = {"partition_index": tp[1], "current_leader": _NO_LEADER}
            ack_error = self.ack_errors.get(tp, ErrorCode.NONE)
            if fetch:
                got = self.fetched.get(tp, FetchedPartition())
                entry |= {"error_code": got.error, "acknowledge_error_code": ack_error,
                          "records": got.records or b"",
                          "acquired_records": [{"first_offset": a.first_offset, "last_offset": a.last_offset,
                                                "delivery_count": a.delivery_count} for a in got.acquired]}
            else:
                entry["error_code"] = ack_error
            by_topic.setdefault(tp[0], []).append(entry)
        return [{"topic_id": tid, "partitions": ps} for tid, ps in by_topic.items()]


def _begin(broker, ctx: RequestContext, request, fetch: bool) -> ShareSession | dict:
    if not _enabled(broker):
        return _top_error(ErrorCode.UNSUPPORTED_VERSION, _NOT_ENABLED, fetch)
    if not request.group_id:
        return _top_error(ErrorCode.INVALID_REQUEST, "GroupId can't be empty.", fetch)
    if not request.member_id:
        return _top_error(ErrorCode.INVALID_REQUEST, "MemberId can't be empty.", fetch)
    if not allowed(broker, ctx, READ, GROUP, request.group_id):
        return _top_error(ErrorCode.GROUP_AUTHORIZATION_FAILED, None, fetch)
    epoch = request.share_session_epoch
    if not fetch and epoch == INITIAL_EPOCH:
        return _top_error(ErrorCode.INVALID_SHARE_SESSION_EPOCH,
                          "ShareAcknowledge cannot open a share session.", fetch)
    if epoch == INITIAL_EPOCH and not broker.share_partitions.member_alive(request.group_id, request.member_id):
        # Only members open sessions: what a share session makes the broker hold (share
        # partitions, their state records) stays bounded by the share groups and their members.
        return _top_error(ErrorCode.UNKNOWN_MEMBER_ID,
                          f"Member {request.member_id} is not a member of share group {request.group_id}.", fetch)
    try:
        return broker.share_partitions.sessions.begin(request.group_id, request.member_id, epoch, ctx.client)
    except KafkaError as e:
        return _top_error(e.code, str(e), fetch)


def _finish(broker, session: ShareSession, epoch: int) -> None:
    manager = broker.share_partitions
    if epoch == FINAL_EPOCH:  # the member is done: what it still holds goes back now
        manager.release_session(session)
    manager.sessions.end(session, epoch)


async def _exchange(broker, ctx: RequestContext, request, fetch: bool) -> dict:
    """ShareFetch (fetch) or ShareAcknowledge: the session's acknowledgements applied, then a
    ShareFetch not ending its session fetches, its acknowledged partitions joined to the
    session and its forgotten ones left; what the acknowledgements changed is persisted (while
    the fetch runs) before the answer."""
    version = ctx.header.api_version
    renew_only = version >= 2 and fetch and request.is_renew_ack
    if fetch and version >= 2:
        if request.share_acquire_mode not in (BATCH_OPTIMIZED, RECORD_LIMIT):
            return _top_error(ErrorCode.INVALID_REQUEST, f"Unknown ShareAcquireMode {request.share_acquire_mode}.",
                              fetch)
        if renew_only and (request.max_bytes, request.min_bytes, request.max_records, request.max_wait_ms) != (
                0, 0, 0, 0):
            return _top_error(ErrorCode.INVALID_REQUEST, "A ShareFetch with IsRenewAck must have MaxBytes, "
                              "MinBytes, MaxRecords and MaxWaitMs 0.", fetch)
    session = _begin(broker, ctx, request, fetch=fetch)
    if isinstance(session, dict):
        return session
    epoch = request.share_session_epoch
    acks = _acknowledgements(request)
    fetching = fetch and epoch != FINAL_EPOCH
    exchange = _Exchange(broker, ctx, session, version >= 2 and request.is_renew_ack)
    if fetching:
        # Only partitions that exist join the session: what a session holds, and what each of
        # its fetches walks, stays bounded by the cluster's partitions whatever clients name.
        topics = broker.metadata_cache.topics
        for tp in acks:
            name = exchange.names.get(tp[0])
            if name is None:
                exchange.fetched[tp] = FetchedPartition(ErrorCode.UNKNOWN_TOPIC_ID)
            elif not 0 <= tp[1] < len(topics[name].partitions):
                exchange.fetched[tp] = FetchedPartition(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION)
            else:
                session.partitions.add(tp)
        for topic in request.forgotten_topics_data:
            for p in topic.partitions:
                session.partitions.discard((topic.topic_id, p))
    exchange.acknowledge(acks)
    exchange.start_persist()
    if fetching and not renew_only:  # a renewal only acknowledges (KIP-1222)
        await exchange.fetch(request.max_records if request.max_records > 0 else 500, max(request.max_bytes, 0),
                             request.max_wait_ms, record_limit=version >= 2 and request.share_acquire_mode == RECORD_LIMIT)
    await exchange.persist()
    _finish(broker, session, epoch)
    answer = {"throttle_time_ms": 0, "error_code": ErrorCode.NONE, "error_message": None, "node_endpoints": [],
              "responses": exchange.responses(set(acks), fetch=fetch)}
    if fetch or version >= 2:
        answer["acquisition_lock_timeout_ms"] = broker.share_partitions.lock_duration_ms(session.group_id)
    return answer


@api(SHARE_FETCH, 1, 2)
async def handle_share_fetch(broker, ctx: RequestContext, request) -> dict:
    return await _exchange(broker, ctx, request, fetch=True)


@api(SHARE_ACKNOWLEDGE, 1, 2)
async def handle_share_acknowledge(broker, ctx: RequestContext, request) -> dict:
    return await _exchange(broker, ctx, request, fetch=False)
