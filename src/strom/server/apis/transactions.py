"""The transactional producer's APIs (AddPartitionsToTxn, AddOffsetsToTxn, EndTxn), the
coordinator-to-broker WriteTxnMarkers, and the admin's DescribeTransactions, ListTransactions
and DescribeProducers. Each hands its request to the transaction coordinator, which owns the state.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from strom.coordinator import GROUP_METADATA_TOPIC, TRANSACTION_STATE_TOPIC
from strom.protocol.errors import ErrorCode, KafkaError
from strom.security.authorizer import (
    CLUSTER,
    CLUSTER_ACTION,
    DESCRIBE,
    GROUP,
    READ,
    TOPIC,
    TRANSACTIONAL_ID,
    WRITE,
    allowed,
)
from strom.server.apis import RequestContext, api, by_topic
from strom.server.apis.producer_id import fenced_code

ADD_PARTITIONS_TO_TXN, ADD_OFFSETS_TO_TXN, END_TXN, WRITE_TXN_MARKERS = 24, 25, 26, 27
DESCRIBE_PRODUCERS, DESCRIBE_TRANSACTIONS, LIST_TRANSACTIONS = 61, 65, 66
PRODUCER_FENCED_FROM = 2  # these APIs report PRODUCER_FENCED from v2 on
TRANSACTIONS_V2 = 2  # WriteTxnMarkers v2's TransactionVersion of a KIP-890 part 2 transaction

TopicPartition = tuple[str, int]

# Coordinator answers to a partition check that mean "not now".
_RETRY_LATER = {ErrorCode.CONCURRENT_TRANSACTIONS, ErrorCode.COORDINATOR_LOAD_IN_PROGRESS,
                ErrorCode.COORDINATOR_NOT_AVAILABLE, ErrorCode.NOT_COORDINATOR}


def check_answer(error: ErrorCode, version: int, retry_as: ErrorCode, abortable_from: int) -> ErrorCode:
    """The coordinator's answer about a transaction's partition (KIP-890) as the asking API
    (Produce, TxnOffsetCommit) reports it: "not now" as that API's retriable error, a fenced
    producer as INVALID_PRODUCER_EPOCH, TRANSACTION_ABORTABLE as INVALID_TXN_STATE to versions
    older than `abortable_from`."""
    if error in _RETRY_LATER:
        return retry_as
    if error == ErrorCode.PRODUCER_FENCED:
        return ErrorCode.INVALID_PRODUCER_EPOCH
    if error == ErrorCode.TRANSACTION_ABORTABLE and version < abortable_from:
        return ErrorCode.INVALID_TXN_STATE
    return error


def _topic_results(results: dict[TopicPartition, ErrorCode]) -> list[dict]:
    return by_topic({tp: {"partition_index": tp[1], "partition_error_code": error}
                     for tp, error in results.items()}, "results_by_partition")


async def _add_partitions(broker, ctx: RequestContext, transactional_id: str, producer_id: int, epoch: int,
                          topics: Iterable, verify_only: bool, version: int) -> dict[TopicPartition, ErrorCode]:
    wanted = [(t.name, p) for t in topics for p in t.partitions]
    from_broker = version >= 4  # the batched form; its caller was authorized as a broker
    if not from_broker:
        if not allowed(broker, ctx, WRITE, TRANSACTIONAL_ID, transactional_id):
            return dict.fromkeys(wanted, ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED)
        denied = {tp for tp in wanted if not allowed(broker, ctx, WRITE, TOPIC, tp[0])}
        if denied:  # Kafka adds none of them then
            return {tp: ErrorCode.TOPIC_AUTHORIZATION_FAILED if tp in denied else ErrorCode.OPERATION_NOT_ATTEMPTED
                    for tp in wanted}
    topics_meta = broker.metadata_cache.topics
    unknown = {tp for tp in wanted
               if tp[0] not in topics_meta or tp[1] not in topics_meta[tp[0]].partitions}
    if unknown:  # Kafka adds none of them then
        return {tp: ErrorCode.UNKNOWN_TOPIC_OR_PARTITION if tp in unknown
                else ErrorCode.OPERATION_NOT_ATTEMPTED for tp in wanted}
    coordinator = broker.txn_coordinator
    if verify_only:
        return coordinator.verify_partitions(transactional_id, producer_id, epoch, wanted)
    # A leader adding partitions with v5 does so for a producer of transactions version 2.
    error = await broker.add_partitions_to_txn.add(transactional_id, producer_id, epoch, wanted,
                                            transaction_version=2 if from_broker and version >= 5 else 0)
    return dict.fromkeys(wanted, fenced_code(error, version, PRODUCER_FENCED_FROM))


@api(ADD_PARTITIONS_TO_TXN, 0, 5)
async def handle_add_partitions_to_txn(broker, ctx: RequestContext, request) -> dict:
    version = ctx.header.api_version
    if version <= 3:
        results = await _add_partitions(broker, ctx, request.v3_and_below_transactional_id,
                                  request.v3_and_below_producer_id, request.v3_and_below_producer_epoch,
                                  request.v3_and_below_topics, False, version)
        return {"throttle_time_ms": 0, "results_by_topic_v3_and_below": _topic_results(results)}
    # v4+: the batched shape brokers use to add or verify several transactions at once; as in
    # Kafka, only for callers allowed CLUSTER_ACTION.
    if not allowed(broker, ctx, CLUSTER_ACTION, CLUSTER):
        return {"throttle_time_ms": 0, "error_code": ErrorCode.CLUSTER_AUTHORIZATION_FAILED,
                "results_by_transaction": []}
    return {"throttle_time_ms": 0, "error_code": ErrorCode.NONE, "results_by_transaction": [
        {"transactional_id": t.transactional_id, "topic_results": _topic_results(await _add_partitions(
            broker, ctx, t.transactional_id, t.producer_id, t.producer_epoch, t.topics, t.verify_only, version))}
        for t in request.transactions]}


@api(ADD_OFFSETS_TO_TXN, 0, 4)
async def handle_add_offsets_to_txn(broker, ctx: RequestContext, request) -> dict:
    """The group's `__consumer_offsets` partition joins the transaction, so that offsets sent
    with TxnOffsetCommit get its marker."""
    if not allowed(broker, ctx, WRITE, TRANSACTIONAL_ID, request.transactional_id):
        return {"throttle_time_ms": 0, "error_code": ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED}
    if not allowed(broker, ctx, READ, GROUP, request.group_id):
        return {"throttle_time_ms": 0, "error_code": ErrorCode.GROUP_AUTHORIZATION_FAILED}
    if not request.group_id:
        return {"throttle_time_ms": 0, "error_code": ErrorCode.INVALID_GROUP_ID}
    partition = broker.group_coordinator.store.partition_for(request.group_id)
    try:
        await broker.auto_topics.ensure_internal_topic(GROUP_METADATA_TOPIC)
    except KafkaError as e:
        return {"throttle_time_ms": 0, "error_code": e.code}
    error = await broker.add_partitions_to_txn.add(request.transactional_id, request.producer_id,
                                            request.producer_epoch, [(GROUP_METADATA_TOPIC, partition)])
    return {"throttle_time_ms": 0,
            "error_code": fenced_code(error, ctx.header.api_version, PRODUCER_FENCED_FROM)}


@api(END_TXN, 0, 5)
async def handle_end_txn(broker, ctx: RequestContext, request) -> dict:
    """v5 is transactions version 2: the epoch is bumped and the answer says what the producer
    goes on with."""
    version = ctx.header.api_version
    if not allowed(broker, ctx, WRITE, TRANSACTIONAL_ID, request.transactional_id):
        return {"throttle_time_ms": 0, "error_code": ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
                "producer_id": -1, "producer_epoch": -1}
    result = broker.txn_coordinator.end_transaction(request.transactional_id, request.producer_id,
                                                    request.producer_epoch, request.committed,
                                                    transaction_version=2 if version >= 5 else 0)
    error = result.error
    if error == ErrorCode.NONE:
        error = await broker.coordinators.await_internal_replication(TRANSACTION_STATE_TOPIC, request.transactional_id)
    ok = error == ErrorCode.NONE
    return {"throttle_time_ms": 0, "error_code": fenced_code(error, version, PRODUCER_FENCED_FROM),
            "producer_id": result.producer_id if ok else -1, "producer_epoch": result.producer_epoch if ok else -1}


@api(WRITE_TXN_MARKERS, 1, 2)
async def handle_write_txn_markers(broker, ctx: RequestContext, request) -> dict:
    markers = []
    permitted = allowed(broker, ctx, CLUSTER_ACTION, CLUSTER)  # only brokers write markers
    for m in request.markers:
        wanted = [(t.name, p) for t in m.topics for p in t.partition_indexes]
        if not permitted:
            errors = dict.fromkeys(wanted, ErrorCode.CLUSTER_AUTHORIZATION_FAILED)
        else:
            errors = _stale_v2_markers(broker, m, wanted)
            errors |= broker.txn_markers.write(m.producer_id, m.producer_epoch, m.coordinator_epoch,
                                               m.transaction_result, [tp for tp in wanted if tp not in errors])
        markers.append({"producer_id": m.producer_id, "topics": by_topic(
            {tp: {"partition_index": tp[1], "error_code": errors[tp]} for tp in wanted})})
    return {"markers": markers}


def _stale_v2_markers(broker, marker, wanted: list[TopicPartition]) -> dict[TopicPartition, ErrorCode]:
    """KIP-1228: a transactions-version-2 coordinator bumps the producer epoch as it ends each
    transaction, so its marker must be above the epoch the partition last saw from the
    producer (a marker at that epoch is a late one, and would end the next transaction); a
    marker of an older transaction version may equal it. The partitions refused here."""
    if getattr(marker, "transaction_version", 0) < TRANSACTIONS_V2:
        return {}
    refused = {}
    for tp in wanted:
        partition = broker.replica_manager.get_partition(*tp)
        entry = None if partition is None else partition.producer_state.producers.get(marker.producer_id)
        if entry is not None and marker.producer_epoch <= entry.producer_epoch:
            refused[tp] = ErrorCode.INVALID_PRODUCER_EPOCH
    return refused


@api(DESCRIBE_TRANSACTIONS, 0, 0)
async def handle_describe_transactions(broker, ctx: RequestContext, request) -> dict:
    states = []
    for transactional_id in request.transactional_ids:
        error, meta = broker.txn_coordinator.describe(transactional_id)
        if not allowed(broker, ctx, DESCRIBE, TRANSACTIONAL_ID, transactional_id):
            error, meta = ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED, None
        entry = {"error_code": error, "transactional_id": transactional_id, "transaction_state": "",
                 "transaction_timeout_ms": 0, "transaction_start_time_ms": -1, "producer_id": -1,
                 "producer_epoch": -1, "topics": []}
        if meta is not None:
            entry.update(transaction_state=meta.state.display, transaction_timeout_ms=meta.timeout_ms,
                         transaction_start_time_ms=meta.start_ms, producer_id=meta.producer_id,
                         producer_epoch=meta.producer_epoch,
                         topics=by_topic({tp: tp[1] for tp in sorted(meta.partitions)}, name="topic"))
        states.append(entry)
    return {"throttle_time_ms": 0, "transaction_states": states}


@api(LIST_TRANSACTIONS, 0, 2)
async def handle_list_transactions(broker, ctx: RequestContext, request) -> dict:
    version = ctx.header.api_version
    duration = request.duration_filter if version >= 1 else -1
    pattern = request.transactional_id_pattern if version >= 2 else None
    try:  # v2 (KIP-1152): ids the whole pattern matches; none or empty: every id
        matches = re.compile(pattern).fullmatch if pattern else None
    except (re.error, RecursionError, OverflowError):
        return {"throttle_time_ms": 0, "error_code": ErrorCode.INVALID_REGULAR_EXPRESSION,
                "unknown_state_filters": [], "transaction_states": []}
    if broker.txn_coordinator.loading:  # as Kafka: nothing listed while a partition loads
        return {"throttle_time_ms": 0, "error_code": ErrorCode.COORDINATOR_LOAD_IN_PROGRESS,
                "unknown_state_filters": [], "transaction_states": []}
    found, unknown = broker.txn_coordinator.list(request.state_filters or (),
                                                 request.producer_id_filters or (), duration)
    found = [m for m in found if (matches is None or matches(m.transactional_id))
             and allowed(broker, ctx, DESCRIBE, TRANSACTIONAL_ID, m.transactional_id)]
    return {"throttle_time_ms": 0, "error_code": ErrorCode.NONE, "unknown_state_filters": unknown,
            "transaction_states": [{"transactional_id": m.transactional_id, "producer_id": m.producer_id,
                                    "transaction_state": m.state.display} for m in found]}


@api(DESCRIBE_PRODUCERS, 0, 0)
async def handle_describe_producers(broker, ctx: RequestContext, request) -> dict:
    """The producers a partition leader remembers (kafka-transactions.sh describe-producers)."""
    topics = []
    for t in request.topics:
        partitions = []
        for index in t.partition_indexes:
            partition = broker.replica_manager.get_partition(t.name, index)
            entry = {"partition_index": index, "error_code": ErrorCode.NONE, "error_message": None,
                     "active_producers": []}
            if not allowed(broker, ctx, READ, TOPIC, t.name):
                entry["error_code"] = ErrorCode.TOPIC_AUTHORIZATION_FAILED
            elif partition is None:
                entry["error_code"] = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
            elif not partition.is_leader:
                entry["error_code"] = ErrorCode.NOT_LEADER_OR_FOLLOWER
            else:
                entry["active_producers"] = [
                    {"producer_id": e.producer_id, "producer_epoch": e.producer_epoch,
                     "last_sequence": e.last_seq, "last_timestamp": e.last_timestamp,
                     "coordinator_epoch": e.coordinator_epoch,
                     "current_txn_start_offset": e.current_txn_first_offset}
                    for e in partition.producer_state.producers.values()]
            partitions.append(entry)
        topics.append({"name": t.name, "partitions": partitions})
    return {"throttle_time_ms": 0, "topics": topics}
