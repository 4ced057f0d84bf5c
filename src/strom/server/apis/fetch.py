"""Fetch: read from leader logs up to the high watermark (read_committed: the last stable
offset, with the aborted transactions in range), long-polling through the purgatory.

The first read happens at once; if it brings fewer than `min_bytes` and `max_wait_ms` allows,
the request waits until an append to one of its partitions or the deadline, then reads again.
A follower's v18 fetch (KIP-1166) tells the high watermark it knows of each partition: where the
leader's is further on, the answer goes at once, so that the follower learns it without waiting
for new records. Record bytes are never copied into Python: the response carries file regions.

Fetch from follower (KIP-392): a consumer's v11+ fetch may be served by a follower, up to the
follower's high watermark; with `replica.selector.class` set, a leader asked by such a consumer
answers at once, with no records, naming the replica it should read from
(preferred_read_replica) when the selector picks a follower.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
import uuid
from dataclasses import dataclass
from typing import Any

from strom.log import FetchSlice
from strom.log.remote import RemoteStorageError
from strom.metrics.stats import BYTES_OUT, FAILED_FETCH_REQUESTS, FETCH_REQUESTS, BrokerTopicStats
from strom.network.request import RawResponse
from strom.protocol.errors import ErrorCode
from strom.protocol.fetch import (
    LEADER_DISCOVERY_FROM,
    MAX_VERSION,
    TOPIC_IDS_FROM,
    PartitionData,
    encode_fetch_response,
    fetch_replica_id,
)
from strom.remote.manager import RemoteFetchRefused
from strom.replication.fetch_session import new_context
from strom.replication.replica_selector import ClientMetadata, ReadPreference, replica_selector
from strom.security.authorizer import CLUSTER, CLUSTER_ACTION, READ, TOPIC, allowed
from strom.server.apis import RequestContext, api

log = logging.getLogger(__name__)

FETCH = 1
READ_COMMITTED = 1  # isolation_level: read up to the last stable offset, skip aborted data
HIGH_WATERMARK_FROM = 18  # KIP-1166
HIGH_WATERMARK_NOT_SENT = (1 << 63) - 1  # the field's default: a follower that does not say
CLIENT_METADATA_FROM = 11  # KIP-392: rack_id, and consumers may read from followers
_UNKNOWN = (ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, ErrorCode.UNKNOWN_TOPIC_ID)
_MOVED = (ErrorCode.NOT_LEADER_OR_FOLLOWER, ErrorCode.FENCED_LEADER_EPOCH)


class TopicNames:
    """v13+ names topics by id (KIP-516): ids to names for reading, and back for the response.
    An id the broker does not know keeps its own text as its name and UNKNOWN_TOPIC_ID."""

    def __init__(self, broker, version: int) -> None:
        self.broker = broker
        self.by_id: dict[uuid.UUID, str] | None = None
        if version >= TOPIC_IDS_FROM:
            self.by_id = broker.metadata_cache.names_by_id
        self.ids: dict[str, uuid.UUID] = {}
        self.unknown: dict[str, ErrorCode] = {}

    def id_of(self, name: str) -> uuid.UUID:
        topic = self.broker.metadata_cache.topics.get(name)
        if topic is not None:
            return topic.topic_id
        try:  # an id no topic had, kept in a session under its own text
            return uuid.UUID(name)
        except ValueError:  # a topic deleted since the session named it
            return uuid.UUID(int=0)

    def name(self, entry: Any, field: str = "topic") -> str:
        if self.by_id is None:
            return getattr(entry, field)
        topic_id = entry.topic_id if entry.topic_id is not None else uuid.UUID(int=0)
        name = self.by_id.get(topic_id)
        if name is None:
            name = str(topic_id)
            self.unknown[name] = ErrorCode.UNKNOWN_TOPIC_ID
        self.ids[name] = topic_id
        return name


@dataclass(slots=True)
class RemoteRead:
    """The first partition of a fetch whose offset is in remote storage (one per request, as
    Kafka reads it): read after the local ones, with what is left of the request's bytes."""

    answer: PartitionData
    tp: tuple[str, int]
    offset: int
    upper_bound: int | None
    max_bytes: int
    min_one_message: bool


def read_preference(broker, ctx: RequestContext, request, follower_id: int) -> ReadPreference | None:
    """A consumer's v11+ fetch to a broker with a replica selector: what the leader needs to
    name a preferred read replica (Kafka's ClientMetadata, with the reachable brokers' racks)."""
    if ctx.header.api_version < CLIENT_METADATA_FROM or follower_id >= 0:
        return None
    config = getattr(broker, "config", None)  # a stand-in broker of a unit test may have none
    selector = None if config is None else replica_selector(config["replica.selector.class"])
    if selector is None:
        return None
    client = ClientMetadata(getattr(request, "rack_id", None) or "", ctx.header.client_id or "",
                            ctx.client, ctx.listener)
    racks = {b["node_id"]: b["rack"] for b in broker.endpoints(ctx.listener)}
    return ReadPreference(client, selector, racks)


def _read_all(broker, request, wanted, denied: dict[str, ErrorCode], version: int, follower_id: int,
              preference: ReadPreference | None
              ) -> tuple[list[tuple[str, list[PartitionData]]], int, bool, RemoteRead | None]:
    """The partitions' answers, the bytes they carry, whether to answer at once (an error, or
    a preferred read replica named: Kafka does not wait then) and the remote read, if any."""
    rm = broker.replica_manager
    remaining = request.max_bytes
    topics, total, at_once, remote = [], 0, False, None
    read_committed = request.isolation_level == READ_COMMITTED
    fetch_only_leader = follower_id >= 0 or version < CLIENT_METADATA_FROM
    for topic, partitions in wanted:
        out = []
        for p in partitions:
            if topic in denied:
                out.append(PartitionData(p.partition, denied[topic], -1, -1, -1))
                continue
            tp = (topic, p.partition)
            limit = max(0, min(p.partition_max_bytes, remaining))
            # Kafka returns at least one whole batch, once per response, so that a batch larger
            # than the limits cannot stall a consumer.
            result = rm.read(tp, p.fetch_offset, limit, min_one_message=total == 0,
                             read_committed=read_committed,
                             current_leader_epoch=getattr(p, "current_leader_epoch", -1),
                             replica_id=follower_id,
                             last_fetched_epoch=getattr(p, "last_fetched_epoch", -1),
                             fetch_only_leader=fetch_only_leader, preference=preference)
            records = result.records if result.records is not None and result.records.size else None
            size = records.size if records is not None else 0
            total += size
            remaining -= size
            at_once |= result.error != ErrorCode.NONE or result.preferred_read_replica >= 0
            aborted = None if result.aborted is None else [
                (t.producer_id, t.first_offset) for t in result.aborted]
            out.append(PartitionData(p.partition, result.error, result.high_watermark,
                                     result.last_stable_offset, result.log_start_offset, records,
                                     aborted, result.diverging_epoch))
            if result.preferred_read_replica >= 0:
                out[-1].preferred_read_replica = result.preferred_read_replica
            if result.remote is not None and remote is None and broker.remote_log_manager is not None:
                remote = RemoteRead(out[-1], tp, result.remote[0], result.remote[1], limit, total == 0)
        topics.append((topic, out))
    return topics, total, at_once, remote


@api(FETCH, 4, MAX_VERSION)
async def handle_fetch(broker, ctx: RequestContext, request) -> RawResponse:
    version = ctx.header.api_version
    follower_id = fetch_replica_id(request)
    follower = follower_id >= 0
    names = TopicNames(broker, version)
    requested = [((names.name(t), p.partition), p) for t in request.topics for p in t.partitions]
    forgotten = [(names.name(f), index) for f in getattr(request, "forgotten_topics_data", None) or ()
                 for index in f.partitions]
    context = new_context(broker.fetch_sessions, requested, forgotten, version, request, follower)
    if context.error:
        parts, _ = encode_fetch_response(version, [], error_code=context.error)
        return RawResponse(parts)
    rm = broker.replica_manager
    # A follower's session reads only what changed: the partitions its request named, and
    # those of the others that have something new (records, high watermark, log start).
    news = functools.partial(rm.follower_news, replica_id=follower_id) \
        if follower and context.incremental else None
    wanted = context.to_read(news)
    denied = {**_denied(broker, ctx, follower, wanted), **names.unknown}
    await rm.load_logs((topic, p.partition) for topic, ps in wanted for p in ps)
    deadline = time.monotonic() + max(0, request.max_wait_ms) / 1000
    keys = [(topic, p.partition) for topic, ps in wanted for p in ps if topic not in denied] if news is None else ()
    known = _follower_high_watermarks(requested) if follower and version >= HIGH_WATERMARK_FROM else None
    preference = read_preference(broker, ctx, request, follower_id)
    while True:
        topics, total, at_once, remote = _read_all(broker, request, wanted, denied, version, follower_id,
                                                   preference)
        if remote is not None:  # answered once it is read (or remote.fetch.max.wait.ms passed)
            await read_remote(broker, remote)
            break
        remaining = deadline - time.monotonic()
        if total >= request.min_bytes or at_once or remaining <= 0 or broker.stopping:
            break
        if known and _behind(known, topics):
            break
        if news is not None and context.session.partitions:
            woken = await rm.fetch_purgatory.wait_any_in(context.session.partitions, remaining)
        elif keys:
            woken = await rm.fetch_purgatory.wait_any(keys, remaining)
        else:
            break
        if not woken:  # the deadline passed and nothing changed since the last read
            break
        if news is not None:
            wanted = context.to_read(news)
    _count(broker.replica_manager.topic_stats, topics, follower)
    answer = context.respond(topics)
    endpoints = _current_leaders(broker, ctx, answer) if version >= LEADER_DISCOVERY_FROM else ()
    if names.by_id is not None:
        for name, _ in answer:  # session partitions named by earlier requests
            names.ids.setdefault(name, names.id_of(name))
    parts, _ = encode_fetch_response(version, answer, session_id=context.session_id, topic_ids=names.ids,
                                     node_endpoints=endpoints)
    return RawResponse(parts)


def _follower_high_watermarks(requested) -> dict[tuple[str, int], int]:
    """The high watermark a v18 follower says it knows, per partition it says it for."""
    return {tp: p.high_watermark for tp, p in requested
            if getattr(p, "high_watermark", HIGH_WATERMARK_NOT_SENT) != HIGH_WATERMARK_NOT_SENT}


def _behind(known: dict[tuple[str, int], int], topics: list[tuple[str, list[PartitionData]]]) -> bool:
    """Whether the leader's high watermark of some partition is past the follower's (-1, one
    the follower does not know, is behind any)."""
    return any(p.error_code == ErrorCode.NONE and p.high_watermark > known.get((topic, p.index), p.high_watermark)
               for topic, partitions in topics for p in partitions)


async def read_remote(broker, remote: RemoteRead) -> None:
    """Fill the partition's answer from remote storage: its batches, or the error Kafka gives
    (an offset in no remote segment: OFFSET_OUT_OF_RANGE; a failing store:
    KAFKA_STORAGE_ERROR, which consumers retry). Too slow, too many reads waiting or the fetch
    quota spent: nothing this time, the consumer asks again."""
    rlm, answer = broker.remote_log_manager, remote.answer
    partition = broker.replica_manager.get_partition(*remote.tp)
    if partition is None or rlm.fetch_throttled():
        return
    wait_s = broker.config["remote.fetch.max.wait.ms"] / 1000
    try:
        data, aborted = await asyncio.wait_for(
            rlm.read(partition, remote.offset, remote.max_bytes, remote.min_one_message, remote.upper_bound), wait_s)
    except LookupError:
        answer.error_code = ErrorCode.OFFSET_OUT_OF_RANGE
        return
    except (TimeoutError, RemoteFetchRefused):
        return
    except RemoteStorageError as e:
        log.warning("remote fetch of %s-%d at %d failed: %s", *remote.tp, remote.offset, e)
        answer.error_code = ErrorCode.KAFKA_STORAGE_ERROR
        return
    if data:
        answer.records = FetchSlice(-1, 0, len(data), data=data)
        if remote.upper_bound is not None:
            answer.aborted_transactions = [(t.producer_id, t.first_offset) for t in aborted or ()]


def _current_leaders(broker, ctx: RequestContext, topics) -> list[tuple[int, str, int, str | None]]:
    """KIP-951: partitions answered NOT_LEADER_OR_FOLLOWER or FENCED_LEADER_EPOCH carry the
    leader the broker knows of, and the response those leaders' endpoints, sparing the client
    a metadata round trip."""
    leaders = set()
    for topic, partitions in topics:
        for p in partitions:
            if p.error_code in _MOVED:
                state = broker.metadata_cache.partition(topic, p.index)
                if state is not None and state.leader >= 0:
                    p.current_leader = (state.leader, state.leader_epoch)
                    leaders.add(state.leader)
    if not leaders:
        return []
    return [(b["node_id"], b["host"], b["port"], b["rack"]) for b in broker.endpoints(ctx.listener)
            if b["node_id"] in leaders]


def _denied(broker, ctx: RequestContext, follower: bool, wanted) -> dict[str, ErrorCode]:
    """Topics this fetch may not read: consumers need READ on each topic, followers
    CLUSTER_ACTION on the cluster (Kafka's checks)."""
    if broker.authorizer is None:
        return {}
    if follower:
        if allowed(broker, ctx, CLUSTER_ACTION, CLUSTER):
            return {}
        return {topic: ErrorCode.CLUSTER_AUTHORIZATION_FAILED for topic, _ in wanted}
    return {topic: ErrorCode.TOPIC_AUTHORIZATION_FAILED for topic, _ in wanted
            if not allowed(broker, ctx, READ, TOPIC, topic)}


def _count(stats: BrokerTopicStats, topics: list[tuple[str, list[PartitionData]]], follower: bool) -> None:
    """BytesOutPerSec and the fetch request rates per topic; followers' bytes count as
    replication traffic instead. Topics the broker does not have get no series, so a client
    cannot grow the metrics by naming made-up topics."""
    for topic, partitions in topics:
        sent = sum(p.records.size for p in partitions if p.records is not None)
        if follower:
            stats.replication_bytes_out += sent
            continue
        known = [p for p in partitions if p.error_code not in _UNKNOWN]
        if known:
            counts = stats.topics[topic]
            counts[BYTES_OUT] += sent
            counts[FETCH_REQUESTS] += len(known)
            counts[FAILED_FETCH_REQUESTS] += sum(p.error_code != ErrorCode.NONE for p in known)
