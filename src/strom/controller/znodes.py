"""Kafka's ZooKeeper layout: the paths and the JSON each node holds.

The same tree lives in ZooKeeper for a cluster and in the local file for the embedded broker,
so these encoders are the only place that knows what a node looks like. Field names and
versions are Kafka's, so `zookeeper-shell` habits and tools carry over.
"""

from __future__ import annotations

import uuid
from typing import Any

# The shapes (and Kafka's sentinel values) live with the rest of the cluster's model; the znode
# JSON they encode to is Kafka's.
from strom.metadata.model import (  # noqa: F401  (re-exported: znodes.BrokerInfo, ...)
    LEADER_DURING_DELETE,
    NO_LEADER,
    SECURITY_PROTOCOLS,
    BrokerInfo,
    EndPoint,
    PartitionState,
    TopicMetadata,
    is_internal,
    now_ms,
)

CLUSTER_ID = "/cluster/id"
CONTROLLER = "/controller"
CONTROLLER_EPOCH = "/controller_epoch"
BROKER_IDS = "/brokers/ids"
TOPICS = "/brokers/topics"
DELETE_TOPICS = "/admin/delete_topics"
CONFIG_TOPICS = "/config/topics"
CONFIG_BROKERS = "/config/brokers"
CONFIG_CHANGES = "/config/changes"
CONFIG_CHANGE_PREFIX = "config_change_"
PRODUCER_ID_BLOCK = "/latest_producer_id_block"
CONFIG_USERS = "/config/users"  # SCRAM credentials and user quotas, as Kafka keeps them
CONFIG_CLIENTS = "/config/clients"  # client-id quotas
CONFIG_IPS = "/config/ips"  # connection-creation-rate quotas
# ACLs as Kafka's AclAuthorizer keeps them: literal patterns under /kafka-acl/<ResourceType>/<name>,
# prefixed ones under /kafka-acl-extended/prefixed/<ResourceType>/<name>, each change announced
# by a sequential node under the matching changes path.
ACL_LITERAL = "/kafka-acl"
ACL_PREFIXED = "/kafka-acl-extended/prefixed"
ACL_CHANGES = "/kafka-acl-changes"
ACL_EXTENDED_CHANGES = "/kafka-acl-extended-changes"
TOKENS = "/delegation_token/tokens"  # delegation tokens, and the notifications of their changes
TOKEN_CHANGES = "/delegation_token/token_changes"
FEATURE = "/feature"  # finalized feature levels (KIP-584), written by the controller

# Paths every cluster has, created by the first broker (Kafka's persistent paths).
PERSISTENT_PATHS = ("/brokers/ids", "/brokers/topics", "/admin/delete_topics", "/config/topics",
                    "/config/brokers", "/config/changes", CONFIG_USERS, CONFIG_CLIENTS, CONFIG_IPS,
                    ACL_LITERAL, ACL_PREFIXED, ACL_CHANGES, ACL_EXTENDED_CHANGES, TOKENS, TOKEN_CHANGES)


def topic_path(topic: str) -> str:
    return f"{TOPICS}/{topic}"


def partition_state_path(topic: str, partition: int) -> str:
    return f"{TOPICS}/{topic}/partitions/{partition}/state"


def config_path(entity_type: str, name: str) -> str:
    return f"/config/{entity_type}/{name}"


def encode_assignment(topic_id: uuid.UUID, assignment: dict[int, list[int]],
                      adding: dict[int, list[int]] | None = None,
                      removing: dict[int, list[int]] | None = None) -> dict[str, Any]:
    """/brokers/topics/<t>: replicas per partition, and (KIP-455) those being added and
    removed by an ongoing reassignment."""
    return {"version": 3, "topic_id": str(topic_id),
            "partitions": {str(p): list(r) for p, r in sorted(assignment.items())},
            "adding_replicas": {str(p): list(r) for p, r in sorted((adding or {}).items()) if r},
            "removing_replicas": {str(p): list(r) for p, r in sorted((removing or {}).items()) if r}}


def decode_assignment(data: dict[str, Any]) -> tuple[uuid.UUID, dict[int, list[int]]]:
    raw_id = data.get("topic_id")
    topic_id = _parse_uuid(raw_id) if raw_id else uuid.uuid4()
    return topic_id, {int(p): list(r) for p, r in data["partitions"].items()}


def decode_reassignment(data: dict[str, Any]) -> tuple[dict[int, list[int]], dict[int, list[int]]]:
    """(adding, removing) replicas per partition of an ongoing reassignment."""
    return ({int(p): list(r) for p, r in (data.get("adding_replicas") or {}).items()},
            {int(p): list(r) for p, r in (data.get("removing_replicas") or {}).items()})


def _parse_uuid(text: str) -> uuid.UUID:
    """Kafka writes topic ids as url-safe base64; earlier Strom wrote the dashed form."""
    if len(text) == 22:
        import base64

        return uuid.UUID(bytes=base64.urlsafe_b64decode(text + "=="))
    return uuid.UUID(text)


def config_change(entity_path: str) -> dict[str, Any]:
    """The body of a /config/changes/config_change_<n> notification (Kafka's version 2)."""
    return {"version": 2, "entity_path": entity_path}


# --- features ----------------------------------------------------------------------------------

def encode_features(levels: dict[str, int]) -> dict[str, Any]:
    """FeatureZNode version 2 (max levels only), status enabled."""
    return {"version": 2, "status": 1,
            "features": {name: {"max_version_level": level} for name, level in sorted(levels.items())}}


def decode_features(data: Any) -> dict[str, int]:
    """Levels from a version 1 or 2 node; a disabled or unreadable node finalizes nothing."""
    if not isinstance(data, dict) or data.get("status") != 1 or not isinstance(data.get("features"), dict):
        return {}
    out = {}
    for name, entry in data["features"].items():
        if isinstance(entry, dict) and isinstance(entry.get("max_version_level"), int):
            out[name] = entry["max_version_level"]
    return out
