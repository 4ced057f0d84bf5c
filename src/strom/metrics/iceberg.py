"""Iceberg topics' metrics (strom.tables), read from the broker's translators at scrape time:
per partition this broker translates, how far the table is behind the partition's last stable
offset, in offsets and in seconds (the age of the oldest record not yet in the table); per
topic, the records this broker's translators sent to the dead-letter table. Nothing is served
by a broker without iceberg.enabled."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily


def iceberg_families(topics: Any) -> Iterator[Any]:
    """`topics`: the broker's server.iceberg_topics.IcebergTopics, or None."""
    if topics is None:
        return
    labels = ["topic", "partition"]
    offsets = GaugeMetricFamily("strom_iceberg_translation_lag_offsets",
                                "Offsets of a partition not yet in its Iceberg table (last stable offset minus "
                                "the table's entry)", labels=labels)
    seconds = GaugeMetricFamily("strom_iceberg_translation_lag_seconds",
                                "Age of the oldest record of a partition not yet in its Iceberg table", labels=labels)
    for topic, partition, lag_offsets, lag_seconds in topics.lags():
        offsets.add_metric([topic, str(partition)], lag_offsets)
        seconds.add_metric([topic, str(partition)], lag_seconds)
    yield offsets
    yield seconds
    dead = CounterMetricFamily("strom_iceberg_dead_letter_records",
                               "Records this broker's translators wrote to a topic's <topic>~dlq table", labels=["topic"])
    for topic, count in sorted(topics.dead_letters().items()):
        dead.add_metric([topic], count)
    yield dead
