"""Iceberg topics' place in the broker: with iceberg.enabled, a translator (strom.tables) on each
partition this broker leads whose topic has an iceberg.mode, started when it becomes leader or
the mode is set, stopped when it no longer leads or the mode goes back to disabled (the table
stays). A look at the hosted partitions each second; nothing else of the broker waits on it."""

from __future__ import annotations

import asyncio
import importlib.util
import logging
import time
from typing import Any

from strom.config.broker import ConfigError
from strom.tables.settings import SchemaSource, iceberg_settings
from strom.tables.translator import PartitionTranslator, Translation

log = logging.getLogger(__name__)

TICK_MS = 1000  # how often the led partitions are looked at
YIELD_EVERY = 1000  # partitions looked at between two yields to the loop
REGISTRY_TIMEOUT_S = 30.0  # a translator's wait for the registry (it waits for _schemas to be read)


class IcebergTopics:
    def __init__(self, broker: Any) -> None:
        self.broker = broker
        self.translation = Translation(iceberg_settings(broker.config), _schema_source(broker))
        # (topic, partition) -> its translator, and what it was started with
        self.translators: dict[tuple[str, int], tuple[PartitionTranslator, tuple]] = {}
        self.closed = False
        self.dead_letter_totals: dict[str, int] = {}  # of translators stopped since the broker started

    async def tick(self) -> None:
        if self.closed:  # the scheduler's last turns, between close() and the broker's shutdown
            return
        wanted: dict[tuple[str, int], tuple] = {}
        for i, p in enumerate(list(self.broker.replica_manager.partitions.values())):
            if i % YIELD_EVERY == YIELD_EVERY - 1:
                await asyncio.sleep(0)
            config = p.log.config
            if p.is_leader and config.iceberg_mode != "disabled" and not (p.log.offline or p.log.closed):
                wanted[(p.topic, p.index)] = (str(p.topic_id), config.iceberg_mode, config.iceberg_partition_spec,
                                              config.iceberg_table_properties)
        for key, (translator, how) in list(self.translators.items()):
            if wanted.get(key) != how:
                del self.translators[key]
                await translator.close()
                self.dead_letter_totals[key[0]] = self.dead_letter_totals.get(key[0], 0) + translator.dead_letter_count
                log.info("%s: Iceberg translation stopped (%s)", translator.label,
                         "iceberg.mode changed" if key in wanted else "not led here or no iceberg.mode")
        for key, how in wanted.items():
            if key not in self.translators and not self.closed:
                translator = PartitionTranslator(self.broker, self.translation, key[0], key[1], *how)
                translator.start()
                self.translators[key] = (translator, how)

    async def close(self) -> None:
        self.closed = True  # a tick under way starts no translator from here on
        await asyncio.gather(*(t.close() for t, _ in self.translators.values()), return_exceptions=True)
        self.translators.clear()
        self.translation.close()

    def lags(self) -> list[tuple[str, int, int, float]]:
        """(topic, partition, offsets, seconds) of each partition translated here (metrics)."""
        now_ms = int(time.time() * 1000)
        out = []
        for (topic, partition), (translator, _) in self.translators.items():
            lag = translator.lag(now_ms)
            if lag is not None:
                out.append((topic, partition, *lag))
        return out

    def dead_letters(self) -> dict[str, int]:
        """Per topic, the dead letters this broker's translators appended since it started."""
        out = dict(self.dead_letter_totals)
        for (topic, _), (translator, _) in self.translators.items():
            out[topic] = out.get(topic, 0) + translator.dead_letter_count
        return out


def _schema_source(broker: Any) -> SchemaSource | None:
    """The broker's schema registry (schema.registry.listeners; started after this) as the
    blocking calls translators make from their executor: the registry reads its store on the
    loop."""
    if not broker.config["schema.registry.listeners"]:
        return None
    loop = asyncio.get_running_loop()

    def on_loop(call: Any) -> Any:
        async def asked() -> Any:
            running = broker.schema_registry
            if running is None:
                raise RuntimeError("the schema registry has not started yet")
            return await call(running.registry)
        return asyncio.run_coroutine_threadsafe(asked(), loop).result(REGISTRY_TIMEOUT_S)

    return SchemaSource(schemas=lambda ids: on_loop(lambda r: r.parsed_schemas(ids)),
                        latest=lambda subject: on_loop(lambda r: r.latest_schema(subject)))


def start_iceberg_topics(broker: Any) -> IcebergTopics | None:
    if not broker.config["iceberg.enabled"]:
        return None
    if importlib.util.find_spec("pyiceberg") is None:  # looked up, not imported
        raise ConfigError("iceberg.enabled is true but pyiceberg is not installed: pip install 'strom[iceberg]'")
    topics = IcebergTopics(broker)
    broker.scheduler.schedule("iceberg-topics", TICK_MS, topics.tick)
    return topics
