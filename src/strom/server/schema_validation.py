"""Schema validation on produce (Confluent Server's confluent.value.schema.validation and
confluent.key.schema.validation topic configs), beyond what Apache Kafka does.

For a topic with either config on, every record's value (or key) must be framed as the schema
registry's serializers frame it (magic byte 0, a 4-byte schema id) with an id registered, and
not deleted, under the record's subject in this broker's copy of the registry. A batch with any
other record is refused whole with INVALID_RECORD, each such record named (KIP-467's
record_errors), before anything of it is written. Null keys and values pass (tombstones).

The walk over the records is the compiled one (strom.protocol.records.batch_schema_ids): the
distinct ids of a batch, usually one, are what is looked up. An id this broker has not read yet
(it was registered a moment ago through another broker) is waited for briefly before the batch
is refused: registering acknowledges only once the registry's writer has read it back, and this
broker's reader long-polls the same topic.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

from strom.log.config import RECORD_NAME_STRATEGY, TOPIC_NAME_STRATEGY, LogConfig
from strom.protocol.errors import ErrorCode, KafkaError
from strom.protocol.records import batch_records_with_schema_id, batch_schema_ids, validate_batches
from strom.replication.replica_manager import ProduceResult

log = logging.getLogger(__name__)

UNKNOWN_ID_WAIT_S = 0.5  # how long an id not yet read here is waited for
MAX_NAMED = 100  # record errors named per partition (the first ones)


def validating(config: LogConfig) -> bool:
    return config.key_schema_validation or config.value_schema_validation


async def refused_by_schemas(broker: Any, entries: Iterable[tuple[tuple[str, int], bytes]]
                             ) -> dict[tuple[str, int], ProduceResult]:
    """The partitions of `entries` whose records fail their topic's schema validation."""
    refused: dict[tuple[str, int], ProduceResult] = {}
    for tp, records in entries:
        partition = broker.replica_manager.get_partition(*tp)
        config = partition.log.config if partition is not None else None
        if config is None or not validating(config):
            continue
        registry = getattr(broker, "schema_registry", None)
        if registry is None:
            refused[tp] = ProduceResult(ErrorCode.INVALID_RECORD, message=(
                f"{tp[0]} validates records against the schema registry, which this broker does not "
                "run (schema.registry.listeners)"))
            continue
        errors = await _record_errors(registry, tp[0], records, config)
        if errors:
            log.info("produce to %s-%d refused: %d record(s) fail schema validation; record %d: %s",
                     tp[0], tp[1], len(errors), *errors[0])
            refused[tp] = ProduceResult(ErrorCode.INVALID_RECORD, message=errors[0][1],
                                        record_errors=errors[:MAX_NAMED])
    return refused


async def _record_errors(registry: Any, topic: str, records: bytes, config: LogConfig) -> list[tuple[int, str]]:
    try:  # malformed batches are the log's to refuse, with its own errors
        batches = validate_batches(records, config.max_message_bytes, check_records=False)
    except KafkaError:
        return []
    view = memoryview(records)
    errors: list[tuple[int, str]] = []
    for value, on, strategy in ((False, config.key_schema_validation, config.key_subject_name_strategy),
                                (True, config.value_schema_validation, config.value_subject_name_strategy)):
        if not on:
            continue
        what = "value" if value else "key"
        first_index = 0
        for pos, header in batches:
            found = batch_schema_ids(view, pos, header, value)
            if found is None:
                return []  # malformed records: the log refuses them
            ids, unframed = found
            errors += [(first_index + i, f"the record's {what} is not framed with a schema id (magic byte 0 and "
                                         "a 4-byte id)") for i in unframed]
            for schema_id in ids:
                problem = await _id_problem(registry, topic, schema_id, what, strategy)
                if problem is not None:
                    errors += [(first_index + i, problem)
                               for i in batch_records_with_schema_id(view, pos, header, value, schema_id)]
            first_index += header.record_count
    errors.sort()
    return errors


async def _id_problem(registry: Any, topic: str, schema_id: int, what: str, strategy: str) -> str | None:
    """Why `schema_id` may not frame this topic's keys or values (None: it may)."""
    # Perhaps registered a moment ago through another broker: this one's reader is about to see it.
    if registry.store.schema_by_id(schema_id) is None and not await _read_soon(
            registry, lambda: registry.store.schema_by_id(schema_id) is not None):
        return f"the {what}'s schema id {schema_id} is not registered"
    subject = await _subject(registry, topic, schema_id, what, strategy)
    if subject is None:
        return f"the {what}'s schema id {schema_id} has no record name for {strategy.rsplit('.', 1)[1]}"
    if registry.store.is_registered(subject, schema_id) or await _read_soon(
            registry, lambda: registry.store.is_registered(subject, schema_id)):
        return None
    return f"the {what}'s schema id {schema_id} is not registered under subject {subject}"


async def _read_soon(registry: Any, until) -> bool:
    return await registry.registry.topic.wait(until, UNKNOWN_ID_WAIT_S)


async def _subject(registry: Any, topic: str, schema_id: int, what: str, strategy: str) -> str | None:
    if strategy == TOPIC_NAME_STRATEGY:
        return f"{topic}-{what}"
    name = await registry.registry.record_name(schema_id)
    if name is None:
        return None
    return name if strategy == RECORD_NAME_STRATEGY else f"{topic}-{name}"
