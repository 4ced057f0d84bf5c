"""Reading a topic's Iceberg table back with pyiceberg, as a user's job would, and what a topic's
committed records should give."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.exceptions import NoSuchTableError


def catalog(catalog_db: Path, warehouse: Path) -> SqlCatalog:
    catalog_db.parent.mkdir(parents=True, exist_ok=True)  # the broker makes it on its first use
    return SqlCatalog("strom", uri=f"sqlite:///{catalog_db}", warehouse=warehouse.as_uri())


def broker_catalog(data_dir: Path) -> SqlCatalog:
    """The catalog a broker uses by default: under its first log dir."""
    base = data_dir / "logs" / "iceberg"
    return catalog(base / "catalog.db", base / "warehouse")


def rows(cat: SqlCatalog, topic: str) -> list[dict[str, Any]]:
    """Every row of `strom.<topic>` (none while it does not exist)."""
    try:
        table = cat.load_table(("strom", topic))
    except NoSuchTableError:
        return []
    return table.scan().to_arrow().to_pylist()


def offsets_map(cat: SqlCatalog, topic: str) -> dict[str, int]:
    snapshot = cat.load_table(("strom", topic)).current_snapshot()
    return json.loads(snapshot.summary.get("strom.offsets")) if snapshot is not None else {}


def duplicates(table_rows: list[dict[str, Any]]) -> list[tuple[int, int]]:
    counts = Counter((r["partition"], r["offset"]) for r in table_rows)
    return sorted(k for k, n in counts.items() if n > 1)


def expected_row(message: Any) -> dict[str, Any]:
    """A consumed confluent-kafka message as its key_value row (timestamp in milliseconds)."""
    return {"partition": message.partition(), "offset": message.offset(), "timestamp": message.timestamp()[1],
            "timestamp_type": message.timestamp()[0] - 1,  # librdkafka: 1 CreateTime, 2 LogAppendTime
            "key": message.key(), "value": message.value(),
            "headers": [{"key": k, "value": v} for k, v in message.headers() or []]}


def as_compared(row: dict[str, Any]) -> dict[str, Any]:
    return {**row, "timestamp": int(row["timestamp"].timestamp() * 1000)}


# A broker that translates, committing every 200 ms, with small internal topics.
TRANSLATING = {
    "iceberg.enabled": "true",
    "iceberg.commit.interval.ms": "200",
    "offsets.topic.num.partitions": "2",
    "transaction.state.log.num.partitions": "2",
}
