"""A topic's Iceberg table: found or made in the catalog, refused when it is not this topic's, and
the exactly-once commit. Everything here blocks (catalog calls, Parquet writes): translators
call it in their executor, never on the loop.

Where translation stands lives in the table itself: each commit's snapshot summary carries
`strom.offsets`, a JSON map partition -> next offset, the whole topic's (each commit copies the
previous snapshot's map and moves its own partition's entry). A commit goes through only if the
entry it starts from is still the table's: pyiceberg's append asserts the main branch's snapshot
is the one it was built on (AssertRefSnapshotId), and the SQL catalog swaps the metadata location
only where it is still the one read, so nothing moves the entry between the check and the commit.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
from pyiceberg.catalog import Catalog
from pyiceberg.exceptions import CommitFailedException, NoSuchTableError, TableAlreadyExistsError
from pyiceberg.io.pyarrow import schema_to_pyarrow
from pyiceberg.partitioning import UNPARTITIONED_PARTITION_SPEC, PartitionField, PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.table import Table
from pyiceberg.table.snapshots import ancestors_of
from pyiceberg.transforms import (
    DayTransform,
    HourTransform,
    IdentityTransform,
    MonthTransform,
    YearTransform,
)

from strom.log.config import parse_partition_spec, parse_table_properties
from strom.protocol.records import Record
from strom.tables.errors import TableGone, TableRefused
from strom.tables.settings import IcebergSettings
from strom.tables.values import dead_row

log = logging.getLogger(__name__)

OFFSETS = "strom.offsets"  # snapshot summary: {"<partition>": next offset, ...}
TOPIC_ID = "strom.topic.id"  # table property: the topic the table was made for
MODE = "strom.mode"  # table property: how its rows were made (iceberg.mode)
NUM_RETRIES = "commit.retry.num-retries"
COMMIT_ATTEMPTS = 20
REST_TIMEOUT_S = 30.0  # a REST catalog call without an answer by then has failed  # commits of a topic's partitions racing each other: refresh and try again
_TRANSFORMS = {"identity": IdentityTransform, "year": YearTransform, "month": MonthTransform,
               "day": DayTransform, "hour": HourTransform}


def open_catalog(settings: IcebergSettings) -> Catalog:
    props = dict(settings.catalog_properties)
    kind = props.pop("type")
    if kind == "sql":
        from pyiceberg.catalog.sql import SqlCatalog

        uri = props.get("uri", "")
        if uri.startswith("sqlite:///"):
            Path(uri[len("sqlite:///"):]).parent.mkdir(parents=True, exist_ok=True)
        return SqlCatalog(settings.catalog_name, **props)
    from pyiceberg.catalog.rest import RestCatalog

    class TimedRestCatalog(RestCatalog):
        """pyiceberg's REST client waits for an answer without a bound: a catalog that never
        answers would hold the executor's threads (and the broker's exit) for good."""

        def _create_session(self) -> Any:
            session = super()._create_session()
            request = session.request

            def timed(method: str, url: str, **kwargs: Any) -> Any:
                kwargs.setdefault("timeout", REST_TIMEOUT_S)
                return request(method, url, **kwargs)

            session.request = timed
            return session

    return TimedRestCatalog(settings.catalog_name, **props)


def partition_spec(schema: Schema, text: str, prefix: str = "") -> PartitionSpec:
    """iceberg.partition.spec over `schema`'s columns (ValueError for a column it has not);
    `prefix`: where the spec's columns are (the schema modes' `strom.` struct)."""
    fields = []
    for i, (transform, column) in enumerate(parse_partition_spec(text)):
        source = schema.find_field(prefix + column)  # ValueError when absent
        name = column if transform == "identity" else f"{column}_{transform}"
        fields.append(PartitionField(source_id=source.field_id, field_id=1000 + i,
                                     transform=_TRANSFORMS[transform](), name=name))
    return PartitionSpec(*fields) if fields else UNPARTITIONED_PARTITION_SPEC


def table_offsets(table: Table) -> dict[str, int]:
    """The partitions' next offsets the table holds: the map of the newest snapshot of the main
    branch that has one (a snapshot made by another writer, a compaction say, carries none)."""
    for snapshot in ancestors_of(table.current_snapshot(), table.metadata):
        text = snapshot.summary.get(OFFSETS) if snapshot.summary is not None else None
        if text is not None:
            try:
                offsets = json.loads(text)
                return {str(p): int(o) for p, o in offsets.items()}
            except (ValueError, TypeError, AttributeError):
                raise TableRefused(f"its snapshot {snapshot.snapshot_id} has an unreadable {OFFSETS}") from None
    return {}


class TopicTable:
    """The table `<namespace>.<topic>` of one topic, as one translator sees it."""

    def __init__(self, catalog: Catalog, namespace: str, topic: str, topic_id: str, converter: Any,
                 spec: str, properties: str) -> None:
        self.catalog = catalog
        self.identifier = (namespace, topic)
        self.name = f"{namespace}.{topic}"
        self.topic_id = topic_id
        self.converter = converter
        self.spec = spec
        self.properties = properties
        self.table: Table | None = None

    def load(self) -> dict[str, int]:
        """Find or make the table; its offsets. Raises TableRefused for a table not to touch."""
        try:
            table = self.catalog.load_table(self.identifier)
        except NoSuchTableError:
            table = self._create()
        self._check(table)
        self.table = table
        return table_offsets(table)

    def _create(self) -> Table:
        try:
            self.catalog.create_namespace_if_not_exists(self.identifier[0])
        except Exception:
            if not self.catalog.namespace_exists(self.identifier[0]):
                raise
            # another translator made it between the look and the insert
        schema = self.converter.schema
        properties = {**parse_table_properties(self.properties), TOPIC_ID: self.topic_id,
                      MODE: self.converter.mode}
        try:
            table = self.catalog.create_table(self.identifier, schema=schema,
                                              partition_spec=partition_spec(schema, self.spec,
                                                                            getattr(self.converter, "spec_prefix", "")),
                                              properties=properties)
        except TableAlreadyExistsError:  # another partition's leader made it first
            return self.catalog.load_table(self.identifier)
        log.info("created the Iceberg table %s (partition spec %s)", self.name, self.spec)
        return table

    def _check(self, table: Table) -> None:
        props = table.properties
        if TOPIC_ID not in props:
            raise TableRefused("it was not made by Strom")
        if props[TOPIC_ID] != self.topic_id:
            raise TableRefused(f"it was made for another topic of that name (id {props[TOPIC_ID]})")
        if props.get(MODE) != self.converter.mode:
            raise TableRefused(f"it holds iceberg.mode {props.get(MODE)}, not {self.converter.mode}")
        theirs = schema_to_pyarrow(table.schema(), include_field_ids=False)
        ours = schema_to_pyarrow(self.converter.schema, include_field_ids=False)
        if getattr(self.converter, "evolves", False):  # the value's columns evolve; the metadata's do not
            name = ours.names[0]
            if name not in theirs.names or not theirs.field(name).equals(ours.field(name)):
                raise TableRefused(f"its column {name} is not the one of its iceberg.mode")
        elif not theirs.equals(ours, check_metadata=False):
            raise TableRefused("its schema is not the one of its iceberg.mode")

    def _fresh(self) -> Table:
        """The table's newest metadata, checked, with pyiceberg's commit retries off."""
        try:
            table = self.catalog.load_table(self.identifier)
        except NoSuchTableError:
            raise TableGone(self.name) from None
        self._check(table)
        self.table = table
        # pyiceberg retries a lost commit on top of the winner's snapshot with this commit's
        # summary, which would carry an offsets map from before the winner's: its retries are
        # off here (in memory only), so that each try checks the entry again.
        table.metadata = table.metadata.model_copy(
            update={"properties": {**table.metadata.properties, NUM_RETRIES: "0"}})
        return table

    def refused_columns(self, partition: int, columns: dict[int, pa.Schema]) -> tuple[int | None, dict[int, str]]:
        """The partition's entry, and which of the writer schemas' columns the table cannot take
        (a type change), each with the reason: tried in order on the table as it is now,
        nothing committed."""
        table = self._fresh()
        refused: dict[int, str] = {}
        trial = table.transaction()
        for key, schema in columns.items():
            try:
                with trial.update_schema() as update:
                    update.union_by_name(schema)
            except Exception as e:  # noqa: BLE001 - pyiceberg's ValidationError, or a type it cannot map
                refused[key] = f"the table cannot take the schema's columns: {e}"
        return table_offsets(table).get(str(partition)), refused

    def commit_dead_letters(self, partition: int, end: int, rows: list[dict]) -> int:
        """Dead-letter rows of the partition's records up to `end`: only those at or after the
        partition's entry in this table are appended (a batch committed here already, by a
        leader that then lost the main table's commit or crashed before it, is not appended
        twice), moving the entry to `end`. The rows appended."""
        key = str(partition)
        for attempt in range(COMMIT_ATTEMPTS):
            table = self._fresh()
            offsets = table_offsets(table)
            entry = offsets.get(key, -1)
            kept = [r for r in rows if r["strom"]["offset"] >= entry]
            if not kept or entry >= end:
                return 0
            offsets[key] = end
            arrow = schema_to_pyarrow(table.schema())
            try:
                table.append(pa.Table.from_pylist(kept, schema=arrow),
                             snapshot_properties={OFFSETS: json.dumps(offsets, sort_keys=True)})
                return len(kept)
            except CommitFailedException:
                time.sleep(0.01 * (attempt + 1))
        raise CommitFailedException(f"{self.name}: {COMMIT_ATTEMPTS} commits in a row lost to others")

    def commit(self, partition: int, start: int | None, end: int, rows: pa.Table | Callable[[pa.Schema], pa.Table],
               evolve: Sequence[pa.Schema] = ()) -> int | None:
        """Append `rows`, the partition's records from `start` (None: from where its log starts)
        up to `end`, moving its entry from `start` to `end` in the same commit. None once
        committed; the table's entry (or -1 for none) when it is not `start`: another leader
        moved it, and the rows are not appended. `evolve`: columns the table takes first
        (union_by_name, in the same commit); `rows` is then made for the evolved table's schema."""
        key = str(partition)
        for attempt in range(COMMIT_ATTEMPTS):
            # The entry is checked against the newest snapshot; a table dropped meanwhile raises
            # TableGone, one made again by another hand TableRefused.
            table = self._fresh()
            offsets = table_offsets(table)
            if offsets.get(key) != start:
                return offsets.get(key, -1)
            offsets[key] = end
            summary = {OFFSETS: json.dumps(offsets, sort_keys=True)}
            try:
                if callable(rows):
                    transaction = table.transaction()
                    for schema in evolve:
                        with transaction.update_schema() as update:
                            update.union_by_name(schema)
                    transaction.append(rows(schema_to_pyarrow(transaction.table_metadata.schema())),
                                       snapshot_properties=summary)
                    transaction.commit_transaction()
                else:
                    table.append(rows, snapshot_properties=summary)
                return None
            except CommitFailedException:
                time.sleep(0.01 * (attempt + 1))  # another partition committed: read it, try again
        raise CommitFailedException(f"{self.name}: {COMMIT_ATTEMPTS} commits in a row lost to others")


def commit_with_dead_letters(main: TopicTable, dead_letters: TopicTable, partition: int, start: int | None,
                             end: int, records: Iterable[tuple[Record, int]]) -> tuple[int | None, int]:
    """A schema mode's batch: the dead letters first, into `<topic>~dlq` (from that table's own
    entry on, so a crash or a lost race between the two commits never appends them twice), then
    the rows, evolving the table's columns in the same commit. (TopicTable.commit's answer, the
    dead letters appended)."""
    decoded = main.converter.decode(partition, records)
    columns = {key: group.columns for key, group in decoded.groups.items()}
    entry, refused = main.refused_columns(partition, columns)
    if entry != start:  # another leader moved it: nothing of this batch is committed
        return (-1 if entry is None else entry), 0
    dead = decoded.dead + [dead_row(row["strom"], raw, refused[key])
                           for key in refused for row, raw in decoded.groups[key].rows]
    appended = 0
    if dead:
        if dead_letters.table is None:
            dead_letters.load()
        appended = dead_letters.commit_dead_letters(partition, end, dead)
    rows = [row for key, group in decoded.groups.items() if key not in refused for row, _ in group.rows]
    evolve = [schema for key, schema in columns.items() if key not in refused]
    return main.commit(partition, start, end, lambda arrow: pa.Table.from_pylist(rows, schema=arrow), evolve), appended
