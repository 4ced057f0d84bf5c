"""Produce: append each partition's record set to its leader log; answer per acks.

Record sets stay opaque: the log validates batch headers and CRCs and assigns offsets in
place. acks=0 gets no response, as in Kafka. From v13 topics are named by id (KIP-516): each
is read under the name the metadata has for its id and answered under its id; an unknown id
gets UNKNOWN_TOPIC_ID.
"""

from __future__ import annotations

from strom.controller.admin import validate_topic_name
from strom.controller.znodes import is_internal
from strom.network.request import CloseConnection, RawResponse
from strom.protocol.errors import ErrorCode, KafkaError
from strom.protocol.produce import TOPIC_IDS_FROM, PartitionProduceResponse, encode_produce_response
from strom.protocol.records import HEADER_SIZE, TRANSACTIONAL_MASK, read_header
from strom.replication.replica_manager import ProduceResult
from strom.security.authorizer import (
    CLUSTER,
    IDEMPOTENT_WRITE,
    TOPIC,
    TRANSACTIONAL_ID,
    WRITE,
    allowed,
    allowed_any,
)
from strom.server.apis import RequestContext, api
from strom.server.apis.transactions import check_answer
from strom.server.schema_validation import refused_by_schemas, validating

PRODUCE = 0
ATTRIBUTES_LOW_BYTE = 22  # baseOffset 8, batchLength 4, partitionLeaderEpoch 4, magic 1, crc 4, attributes 2


def _topic_error(broker, tp) -> ErrorCode:
    try:
        validate_topic_name(tp[0])
    except KafkaError as e:
        return e.code
    return broker.replica_manager.missing_partition_error(tp)


TRANSACTION_ABORTABLE_FROM = 11
IMPLICIT_ADD_FROM = 12  # transactions version 2: the leader adds the partition itself


async def _check_transaction(broker, transactional_id: str | None, entries: list, version: int
                             ) -> dict[tuple[str, int], ErrorCode]:
    """KIP-890: the first transactional batch of a producer in a partition must belong to a
    partition its coordinator added to the transaction; otherwise it would open a transaction
    no coordinator ever ends, holding the last stable offset back for good. From v12 the
    leader adds the partitions to the transaction instead of checking. One question to the
    coordinator per request (per producer epoch in it); returns the partitions refused."""
    if not transactional_id:
        return {}
    asks: dict[tuple[int, int], list[tuple[str, int]]] = {}
    for tp, records in entries:
        if len(records) < HEADER_SIZE:
            continue
        header = read_header(records)
        if not header.is_transactional or header.is_control:
            continue
        state = broker.replica_manager.get_partition(*tp).producer_state
        entry = state.producers.get(header.producer_id)
        if header.producer_id in state.ongoing and entry is not None and entry.producer_epoch == header.producer_epoch:
            # Checked when its transaction began here. Only at the same epoch: under
            # transactions version 2 the next transaction's epoch is one higher, and its first
            # batch may come before the marker ending the previous one, which must not take it.
            continue
        asks.setdefault((header.producer_id, header.producer_epoch), []).append(tp)
    refused = {}
    for (producer_id, epoch), tps in asks.items():
        answers = await broker.add_partitions_to_txn.verify(transactional_id, producer_id, epoch, tps,
                                                      add=version >= IMPLICIT_ADD_FROM)
        for tp, answer in answers.items():
            # "Not now" becomes a retriable produce error, as in Kafka.
            error = check_answer(answer, version, ErrorCode.NOT_ENOUGH_REPLICAS, TRANSACTION_ABORTABLE_FROM)
            if error != ErrorCode.NONE:
                refused[tp] = error
    return refused


def _name_topics(broker, request) -> set[str]:
    """v13: give each topic the name its id has here; an id the metadata does not know is
    named by its own text. Returns those names."""
    names = broker.metadata_cache.names_by_id
    unknown = set()
    for t in request.topic_data:
        name = names.get(t.topic_id)
        if name is None:
            name = str(t.topic_id)
            unknown.add(name)
        t.name = name
    return unknown


@api(PRODUCE, 3, 13)
async def handle_produce(broker, ctx: RequestContext, request) -> RawResponse | None:
    acks = request.acks
    version = ctx.header.api_version
    unknown = _name_topics(broker, request) if version >= TOPIC_IDS_FROM else set()
    refused = _refusal(broker, ctx, request)
    if refused is not None:
        results = {(t.name, p.index): ProduceResult(refused) for t in request.topic_data for p in t.partition_data}
    else:
        entries, results, schemas, fresh = _admitted(broker, ctx, request, unknown)
        if request.transactional_id or schemas or fresh or broker.replica_manager.lazy_logs_left:
            entries = await _prepare(broker, request, version, entries, results, schemas, fresh)
        results = _append(broker, request, entries, results)  # a single-record request's usual way: no wait
    if acks == 0:
        failed = [f"{t}-{p}: {r.error.name}" for (t, p), r in results.items() if r.error]
        if failed:
            raise CloseConnection(f"acks=0 produce failed ({', '.join(failed)})")
        return None
    # Each wait is entered only when there is something to wait for: a single-record request
    # would otherwise make a coroutine per step for nothing.
    rm = broker.replica_manager
    for r in results.values():  # a loop, not any(): no generator per request
        if r.durable_at >= 0:
            await rm.await_flushes(results)
            break
    waiting = rm.unreplicated(results, acks)  # acks=all with one replica: settled at once
    if waiting:
        await rm.wait_replicated(waiting, request.timeout_ms / 1000)
    ids = {t.name: t.topic_id for t in request.topic_data} if version >= TOPIC_IDS_FROM else None
    return _response(results, version, ids)


def _refusal(broker, ctx: RequestContext, request) -> ErrorCode | None:
    """What refuses the whole request, as Kafka checks it before any partition: transactional
    data without (or without WRITE on) its transactional id, idempotent data without
    IDEMPOTENT_WRITE on the cluster or WRITE on some topic."""
    if request.transactional_id is not None:
        if not allowed(broker, ctx, WRITE, TRANSACTIONAL_ID, request.transactional_id):
            return ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
    elif _has_transactional_batch(request):
        return ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
    if broker.authorizer is not None and _has_idempotent_batch(request) and not (
            allowed(broker, ctx, IDEMPOTENT_WRITE, CLUSTER) or allowed_any(broker, ctx, WRITE, TOPIC)):
        return ErrorCode.CLUSTER_AUTHORIZATION_FAILED
    return None


async def _prepare(broker, request, version: int, entries: list, results: dict, schemas: bool,
                   fresh: list) -> list:
    """What may wait before the append: the transaction check, reading logs not loaded since
    start-up, schema validation, making new logs' files. Returns the entries still to append
    (the refused ones' results added to `results`)."""
    rm = broker.replica_manager
    if request.transactional_id:
        refused = await _check_transaction(broker, request.transactional_id, entries, version)
        if refused:
            results.update({tp: ProduceResult(error, message="the partition is not part of the transaction")
                            for tp, error in refused.items()})
            entries = [(tp, records) for tp, records in entries if tp not in refused]
    if rm.lazy_logs_left:
        await rm.load_logs(tp for tp, _ in entries)
    if schemas:  # topics with schema validation only
        refused = await refused_by_schemas(broker, entries)
        if refused:
            results.update(refused)
            entries = [(tp, records) for tp, records in entries if tp not in refused]
    if fresh:  # those still to append that are still without files (not refused, not made meanwhile)
        await rm.make_files(tp for tp, _ in entries)
    return entries


def _append(broker, request, entries: list, results: dict) -> dict:
    results.update(broker.replica_manager.append_records(request.acks, entries))
    if len(results) == 1:
        return results
    # answered in the order asked, as Kafka does
    return {tp: results[tp] for tp in ((t.name, p.index) for t in request.topic_data for p in t.partition_data)}


def _admitted(broker, ctx: RequestContext, request, unknown: set[str]) -> tuple[list, dict, bool, list]:
    """The partitions a produce may append to, as (tp, records), the results of those refused
    before any append (acks, topic id, internal topic, authorization, hosting), whether some
    topic validates schemas, and the logs without files yet: one look at each partition."""
    acks = request.acks
    rm = broker.replica_manager
    entries, results, schemas, fresh = [], {}, False, []
    for topic in request.topic_data:
        for p in topic.partition_data:
            tp = (topic.name, p.index)
            if acks not in (0, 1, -1):
                results[tp] = ProduceResult(ErrorCode.INVALID_REQUIRED_ACKS)
            elif topic.name in unknown:
                results[tp] = ProduceResult(ErrorCode.UNKNOWN_TOPIC_ID)
            elif is_internal(topic.name):
                # Only the coordinators write there (Kafka's internalTopicsAllowed): a client
                # could otherwise forge committed offsets or transaction states.
                results[tp] = ProduceResult(ErrorCode.INVALID_TOPIC_EXCEPTION,
                                            message=f"Cannot append to internal topic {topic.name}")
            elif not allowed(broker, ctx, WRITE, TOPIC, topic.name):
                results[tp] = ProduceResult(ErrorCode.TOPIC_AUTHORIZATION_FAILED)
            elif (partition := rm.partitions.get(tp)) is None:
                results[tp] = ProduceResult(_topic_error(broker, tp))
            elif p.records is None:
                results[tp] = ProduceResult(ErrorCode.CORRUPT_MESSAGE, message="no records")
            else:
                entries.append((tp, p.records))
                log_ = partition.log
                if not schemas and validating(log_.config):
                    schemas = True
                if not log_.dir_made:
                    fresh.append(log_)
    return entries, results, schemas, fresh


def _has_idempotent_batch(request) -> bool:
    return any(p.records is not None and len(p.records) >= HEADER_SIZE and read_header(p.records).producer_id >= 0
               for t in request.topic_data for p in t.partition_data)


def _has_transactional_batch(request) -> bool:
    # The attributes' low byte alone (asked of every request): decoding the whole header
    # showed in profiles of single-record requests.
    for t in request.topic_data:
        for p in t.partition_data:
            records = p.records
            if records is not None and len(records) >= HEADER_SIZE and records[ATTRIBUTES_LOW_BYTE] & TRANSACTIONAL_MASK:
                return True
    return False


def _response(results: dict, version: int, ids: dict | None) -> RawResponse:
    """The answer, encoded here (protocol/produce.py) rather than by the generic codec: per
    request it cost more than the append. Topics are answered by id from v13."""
    if len(results) == 1:  # a single-record request's one partition: no grouping by topic
        ((topic, index), r), = results.items()
        named = [(ids[topic] if ids is not None else topic, [_partition_response(index, r, version)])]
    else:
        topics: dict[str, list[PartitionProduceResponse]] = {}
        for (topic, index), r in results.items():
            topics.setdefault(topic, []).append(_partition_response(index, r, version))
        named = [(ids[name] if ids is not None else name, partitions) for name, partitions in topics.items()]
    body, throttle_at = encode_produce_response(named, version)
    return RawResponse([body], throttle_at)


def _partition_response(index: int, r: ProduceResult, version: int) -> PartitionProduceResponse:
    error = r.error
    if error == ErrorCode.INVALID_RECORD and version < 8:
        # INVALID_RECORD came with Produce v8 (KIP-467); older clients know the batch as corrupt.
        error = ErrorCode.CORRUPT_MESSAGE
    return PartitionProduceResponse(index, error, r.base_offset, r.log_append_time, r.log_start_offset,
                                    r.record_errors, r.message)
