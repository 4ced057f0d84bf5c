"""Group configs (KIP-848/KIP-932's GROUP config resource, type 32): per-group overrides that
IncrementalAlterConfigs, AlterConfigs and DescribeConfigs manage, stored at
/config/groups/<group> in the metadata store and read by the share partition manager.

Strom applies the share group ones: share.auto.offset.reset (where a share group starts
reading a partition it never read: earliest, latest or by_duration:<ISO-8601 duration>, the
first record at or after now minus the duration; a leader initializing a share partition
reads it from the store, not from what it followed), share.record.lock.duration.ms (bounded by
group.share.min/max.record.lock.duration.ms), share.isolation.level, and the session timeouts
and heartbeat intervals (consumer.*, share.*), validated against the broker's min/max bounds
and read by the group coordinator at each heartbeat, KIP-1240's share.delivery.count.limit and
share.partition.max.record.locks (bounded by group.share.min/max.*; dynamic: a share partition
takes the group's current values at each fetch and acknowledgement), the assignment intervals
consumer/share.assignment.interval.ms (validated and described only: Strom's assignors run at
each change of a group's epoch, not on a timer), share.renew.acknowledge.enable (Kafka 4.3:
whether members may RENEW their locks), and Strom's own share.release.delay.ms
(delayed delivery: how long a released record waits before it is delivered again), and KIP-1191's
errors.deadletterqueue.topic.name / errors.deadletterqueue.copy.record.enable (a share group's
dead-letter topic, strom.share.dead_letters; a name starting with "__" is refused, as Kafka
does; the topic's own rules are checked when dead letters are written). The overrides live
in the ConfigRepository (`groups`): read at start-up, and followed on every broker through
/config/changes like topic configs.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from strom.config.repository import sanitize
from strom.protocol.errors import ErrorCode, KafkaError
from strom.share.dead_letters import COPY_RECORD as DLQ_COPY_RECORD
from strom.share.dead_letters import TOPIC_NAME as DLQ_TOPIC_NAME
from strom.share.partition_manager import by_duration_ms

GROUP_RESOURCE = 32
ENTITY_TYPE = "groups"
GROUP_CONFIG_DOCS = {
    "share.auto.offset.reset": "Where a share group starts reading a partition it has no state for: latest "
                               "(the log end) or earliest (the log start).",
    "share.isolation.level": "read_committed: the share group never sees records of aborted transactions "
                             "and reads up to the last stable offset; read_uncommitted: up to the high watermark.",
    "share.record.lock.duration.ms": "How long a record acquired by a share group member stays locked to it "
                                     "before it becomes available to the group again.",
}
GROUP_CONFIG_DOCS.update({
    "consumer.session.timeout.ms": "A consumer group's session timeout (KIP-848), within "
                                   "group.consumer.min/max.session.timeout.ms; replaces "
                                   "group.consumer.session.timeout.ms for this group.",
    "consumer.heartbeat.interval.ms": "A consumer group's heartbeat interval (KIP-848), within "
                                      "group.consumer.min/max.heartbeat.interval.ms; replaces "
                                      "group.consumer.heartbeat.interval.ms for this group.",
    "share.session.timeout.ms": "A share group's session timeout, within group.share.min/max.session.timeout.ms; "
                                "replaces group.share.session.timeout.ms for this group.",
    "share.release.delay.ms": "Strom's own: how long a record a share group member released (RELEASE) "
                              "waits before any member may acquire it again; 0: not at all.",
    "share.heartbeat.interval.ms": "A share group's heartbeat interval, within "
                                   "group.share.min/max.heartbeat.interval.ms; replaces "
                                   "group.share.heartbeat.interval.ms for this group.",
})
GROUP_CONFIG_DOCS.update({
    "errors.deadletterqueue.topic.name": "The name of the topic to be used as the dead-letter queue (DLQ) "
                                         "topic for this share group. If blank (the default), the group does "
                                         "not have a DLQ topic.",
    "errors.deadletterqueue.copy.record.enable": "When writing onto the dead-letter queue topic, whether to "
                                                 "copy the original record (its key, value and headers) onto the DLQ "
                                                 "topic, or just write a record containing the context "
                                                 "information headers.",
})
GROUP_CONFIG_DOCS.update({
    "share.auto.offset.reset": "The strategy to initialize the share-partition start offset: earliest (the log "
                               "start), latest (the log end) or by_duration:<duration> (the first record at or "
                               "after now minus the duration, an ISO-8601 duration PnDTnHnMn.nS, not negative).",
    "share.delivery.count.limit": "The maximum number of delivery attempts for a record delivered to a share "
                                  "group (KIP-1240), within group.share.min/max.delivery.count.limit; replaces "
                                  "group.share.delivery.count.limit for this group.",
    "share.partition.max.record.locks": "Share-group record lock limit per share-partition (KIP-1240), within "
                                        "group.share.min/max.partition.max.record.locks; replaces "
                                        "group.share.partition.max.record.locks for this group.",
    "consumer.assignment.interval.ms": "The interval between assignment updates for a consumer group (KIP-1240). "
                                       "Accepted and validated; Strom assigns at each change of the group's epoch.",
    "share.assignment.interval.ms": "The interval between assignment updates for a share group (KIP-1240). "
                                    "Accepted and validated; Strom assigns at each change of the group's epoch.",
})
GROUP_CONFIG_DOCS["share.renew.acknowledge.enable"] = (
    "Whether the share group's members may RENEW the acquisition lock of records they hold "
    "(KIP-1222); when false a RENEW is refused with INVALID_RECORD_STATE.")
RENEW_ENABLE = "share.renew.acknowledge.enable"
DEFAULTS = {"share.auto.offset.reset": "latest", "share.isolation.level": "read_uncommitted",
            "share.release.delay.ms": "0", DLQ_TOPIC_NAME: "", DLQ_COPY_RECORD: "false", RENEW_ENABLE: "true"}
_BOOLEAN = frozenset({DLQ_COPY_RECORD, RENEW_ENABLE})
MAX_RELEASE_DELAY_MS = 86_400_000  # a day: a released record holds its share partition's window meanwhile
# Group configs bounded by a pair of broker configs (Kafka's GroupConfig validation), each
# defaulting to the broker config of its own name.
_BOUNDED = {
    "share.record.lock.duration.ms": "group.share.{}.record.lock.duration.ms",
    "consumer.session.timeout.ms": "group.consumer.{}.session.timeout.ms",
    "consumer.heartbeat.interval.ms": "group.consumer.{}.heartbeat.interval.ms",
    "share.session.timeout.ms": "group.share.{}.session.timeout.ms",
    "share.heartbeat.interval.ms": "group.share.{}.heartbeat.interval.ms",
    # KIP-1240 (Kafka 4.3)
    "share.delivery.count.limit": "group.share.{}.delivery.count.limit",
    "share.partition.max.record.locks": "group.share.{}.partition.max.record.locks",
    "share.assignment.interval.ms": "group.share.{}.assignment.interval.ms",
    "consumer.assignment.interval.ms": "group.consumer.{}.assignment.interval.ms",
}
_INT = frozenset(_BOUNDED) | {"share.release.delay.ms"}  # the rest are strings but _BOOLEAN
AUTO_OFFSET_RESET = "share.auto.offset.reset"


def _validate(broker: Any, name: str, value: str) -> None:
    def bad(reason: str) -> KafkaError:
        return KafkaError(f"Invalid value {value} for configuration {name}: {reason}", ErrorCode.INVALID_CONFIG)

    if name == AUTO_OFFSET_RESET:
        if value not in ("earliest", "latest") and by_duration_ms(value) is None:
            raise bad(f"Invalid value `{value}` for configuration {name}. The value must be either 'earliest', "
                      "'latest' or of the format 'by_duration:<PnDTnHnMn.nS.>'.")
    elif name == "share.isolation.level":
        if value not in ("read_committed", "read_uncommitted"):
            raise bad("String must be one of: read_committed, read_uncommitted")
    elif name == DLQ_TOPIC_NAME:
        if value.startswith("__"):
            raise KafkaError(f"{name}: DLQ topic name must not start with '__'", ErrorCode.INVALID_CONFIG)
    elif name in _BOOLEAN:
        if value.strip().lower() not in ("true", "false"):
            raise bad("Expected value to be either true or false")
    elif name == "share.release.delay.ms":
        try:
            n = int(value)
        except ValueError:
            raise bad("Not a number of type INT") from None
        if not 0 <= n <= MAX_RELEASE_DELAY_MS:
            raise bad(f"must be within 0 and {MAX_RELEASE_DELAY_MS}")
    elif name in _BOUNDED:
        low, high = (broker.config[_BOUNDED[name].format(b)] for b in ("min", "max"))
        try:
            n = int(value)
        except ValueError:
            raise bad("Not a number of type INT") from None
        if not low <= n <= high:  # Kafka 4.3's message (KIP-1240)
            raise KafkaError(f"{name} must be in the range {low} to {high} inclusive.", ErrorCode.INVALID_CONFIG)
    else:
        raise KafkaError(f"Unknown group config name: {name}", ErrorCode.INVALID_CONFIG)


def defaults(broker: Any) -> dict[str, str]:
    return {**DEFAULTS, **{name: str(broker.config["group." + name]) for name in _BOUNDED}}


def describe(broker: Any, group_id: str, keys: Iterable[str] | None, include_docs: bool) -> list[dict]:
    overrides = broker.group_configs.get(group_id, {})
    values = {**defaults(broker), **overrides}
    wanted = sorted(values) if keys is None else [k for k in keys if k in values]
    # config_source 8: GROUP_CONFIG, 5: DEFAULT_CONFIG; config_type 1: BOOLEAN, 2: STRING, 3: INT (Kafka's
    # types: every .ms group config is an int)
    return [{"name": k, "value": values[k], "read_only": False, "config_source": 8 if k in overrides else 5,
             "is_sensitive": False, "synonyms": [],
             "config_type": 1 if k in _BOOLEAN else 3 if k in _INT else 2,
             "documentation": GROUP_CONFIG_DOCS.get(k) if include_docs else None} for k in wanted]


async def alter(broker: Any, group_id: str, new_configs: Callable[[dict[str, str]], dict[str, str]],
                validate_only: bool) -> None:
    if not group_id:
        raise KafkaError("Group name must not be empty", ErrorCode.INVALID_REQUEST)
    configs = new_configs(dict(broker.group_configs.get(group_id, {})))
    for name, value in configs.items():
        _validate(broker, name, value)
    if validate_only:
        return
    await broker.store_io(broker.admin.change_client_config, f"{ENTITY_TYPE}/{sanitize(group_id)}", configs)
    if configs:
        broker.group_configs[group_id] = dict(configs)
    else:
        broker.group_configs.pop(group_id, None)
