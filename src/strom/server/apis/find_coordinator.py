"""FindCoordinator: which broker coordinates a group (or a transactional id).

The coordinator of a key is the leader of partition `abs(hashCode(key)) % partitions` of the
internal topic (`__consumer_offsets` for groups, `__transaction_state` for transactions),
computed as Kafka computes it. The internal topic is created on first use. v0-3 carry one key;
v4+ batch several keys of one type. v5 only tells the broker that the client understands
TRANSACTION_ABORTABLE (KIP-890), which FindCoordinator itself never returns. v6 adds key type 2,
share partitions (KIP-932), asked by brokers (CLUSTER_ACTION): the key "groupId:topicId:partition"
is owned by a partition of `__share_group_state`, whose leader is the share coordinator. A key
not of that form is INVALID_REQUEST, as is any while share groups are off (share.version 0).

Advertising the API matters beyond groups: librdkafka enables LZ4 only for brokers that list
FindCoordinator (its marker for Kafka >= 0.8.2) and otherwise sends lz4 batches uncompressed.
"""

from __future__ import annotations

from strom.controller.features import SHARE_VERSION
from strom.coordinator import (
    GROUP_METADATA_TOPIC,
    SHARE_GROUP_STATE_TOPIC,
    TRANSACTION_STATE_TOPIC,
    partition_for,
)
from strom.coordinator.share.state_store import SharePartitionKey
from strom.protocol.errors import ErrorCode, KafkaError
from strom.security.authorizer import CLUSTER, CLUSTER_ACTION, DESCRIBE, TRANSACTIONAL_ID, allowed
from strom.security.authorizer import GROUP as GROUP_RESOURCE
from strom.server.apis import RequestContext, api

FIND_COORDINATOR = 10
GROUP, TRANSACTION, SHARE = 0, 1, 2
_TOPICS = {GROUP: GROUP_METADATA_TOPIC, TRANSACTION: TRANSACTION_STATE_TOPIC, SHARE: SHARE_GROUP_STATE_TOPIC}


def _no_node(code: ErrorCode, message: str) -> dict:
    return {"error_code": code, "error_message": message, "node_id": -1, "host": "", "port": -1}


async def find_coordinator(broker, listener: str, key_type: int, key: str) -> dict:
    """The coordinator entry for one key: node id, host and port, or an error."""
    internal_topic = _TOPICS.get(key_type)
    if internal_topic is None:
        return _no_node(ErrorCode.INVALID_REQUEST, f"Unknown coordinator type {key_type}")
    try:
        topic = await broker.auto_topics.ensure_internal_topic(internal_topic)
    except KafkaError:  # not created yet (the creation logs why it failed)
        return _no_node(ErrorCode.COORDINATOR_NOT_AVAILABLE, "The coordinator is not available.")
    leader = topic.partitions[partition_for(key or "", len(topic.partitions))].leader
    for node in broker.endpoints(listener):
        if node["node_id"] == leader:
            return {"error_code": ErrorCode.NONE, "error_message": None, "node_id": leader,
                    "host": node["host"], "port": node["port"]}
    return _no_node(ErrorCode.COORDINATOR_NOT_AVAILABLE, "The coordinator is not available.")


async def _share_key(broker, ctx: RequestContext, key: str) -> dict:
    """A share partition's key: INVALID_REQUEST before v6 (the type does not exist there). From
    v6, Kafka checks CLUSTER_ACTION first (a refusal fails every key of the request alike, which
    is what answering each key with it gives), then the key's form and share.version."""
    if ctx.header.api_version < 6:
        return _no_node(ErrorCode.INVALID_REQUEST, "Key type 2 (share) needs FindCoordinator v6 or later.")
    if not allowed(broker, ctx, CLUSTER_ACTION, CLUSTER):
        return _no_node(ErrorCode.CLUSTER_AUTHORIZATION_FAILED, "Cluster authorization failed.")
    if broker.finalized_features.level(SHARE_VERSION) < 1:
        return _no_node(ErrorCode.INVALID_REQUEST, "Share groups are not enabled on this broker.")
    parsed = SharePartitionKey.parse(key)
    if parsed is None:
        return _no_node(ErrorCode.INVALID_REQUEST, f"Share coordinator key {key!r} is not groupId:topicId:partition.")
    return await find_coordinator(broker, ctx.listener, SHARE, parsed.coordinator_key)


async def _authorized(broker, ctx: RequestContext, key_type: int, key: str) -> dict:
    """Kafka asks DESCRIBE on the group, or on the transactional id, first."""
    if key_type == GROUP and not allowed(broker, ctx, DESCRIBE, GROUP_RESOURCE, key):
        return _no_node(ErrorCode.GROUP_AUTHORIZATION_FAILED, "Group authorization failed.")
    if key_type == TRANSACTION and not allowed(broker, ctx, DESCRIBE, TRANSACTIONAL_ID, key):
        return _no_node(ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED, "Transactional Id authorization failed.")
    if key_type == SHARE:
        return await _share_key(broker, ctx, key)
    return await find_coordinator(broker, ctx.listener, key_type, key)


@api(FIND_COORDINATOR, 0, 6)
async def handle_find_coordinator(broker, ctx: RequestContext, request) -> dict:
    version = ctx.header.api_version
    key_type = request.key_type if version >= 1 else GROUP
    if version < 4:
        return {"throttle_time_ms": 0, **await _authorized(broker, ctx, key_type, request.key)}
    return {"throttle_time_ms": 0, "coordinators": [
        {"key": key, **await _authorized(broker, ctx, key_type, key)} for key in request.coordinator_keys]}
