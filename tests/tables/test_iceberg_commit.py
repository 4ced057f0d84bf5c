"""The exactly-once commit of strom.tables against a real SQLite catalog and file:// warehouse:
a commit goes through only from its partition's entry in the table, a stale one is refused
without appending, partitions committing at once all land, a table Strom did not make (or
made for another topic) is refused, and dead letters committed before a crash are not appended
again."""

from __future__ import annotations

import json
import threading
import uuid

import pytest
from pyiceberg.schema import Schema
from pyiceberg.types import LongType, NestedField

from strom.protocol.records import Record
from strom.schemas.parsed import parse
from strom.tables.errors import TableRefused
from strom.tables.key_value import KeyValueConverter
from strom.tables.settings import SchemaSource
from strom.tables.table import TopicTable, commit_with_dead_letters
from strom.tables.values import DeadLetterConverter, SchemaConverter

from .iceberg_table import catalog as open_catalog
from .iceberg_table import offsets_map, rows


@pytest.fixture
def catalog(tmp_path):
    return open_catalog(tmp_path / "catalog.db", tmp_path / "warehouse")


def table(catalog, topic: str = "t", topic_id: str = "id-1", spec: str = "(hour(timestamp))") -> TopicTable:
    return TopicTable(catalog, "strom", topic, topic_id, KeyValueConverter(), spec, "write.format.default=parquet")


def batch(partition: int, start: int, end: int):
    records = [(Record(o, 1_700_000_000_000 + o, b"k", b"v%d" % o, ()), 0) for o in range(start, end)]
    return KeyValueConverter().convert(partition, records)


def test_a_commit_moves_its_entry_and_a_stale_one_is_refused(catalog):
    t = table(catalog)
    assert t.load() == {}
    assert t.commit(0, None, 10, batch(0, 0, 10)) is None
    assert t.commit(1, None, 4, batch(1, 0, 4)) is None
    assert offsets_map(catalog, "t") == {"0": 10, "1": 4}
    # a leader that still thinks the table is where it left it (at nothing, or at 5) is refused
    stale = table(catalog)
    assert stale.commit(0, None, 10, batch(0, 0, 10)) == 10
    assert stale.commit(0, 5, 12, batch(0, 5, 12)) == 10
    assert stale.commit(2, 3, 6, batch(2, 3, 6)) == -1  # no entry where one was expected
    assert len(rows(catalog, "t")) == 14
    assert t.commit(0, 10, 12, batch(0, 10, 12)) is None
    assert offsets_map(catalog, "t") == {"0": 12, "1": 4}
    assert sorted(r["offset"] for r in rows(catalog, "t") if r["partition"] == 0) == list(range(12))
    assert catalog.load_table(("strom", "t")).properties["write.format.default"] == "parquet"


def test_partitions_committing_at_once_all_land(catalog):
    table(catalog).load()
    errors: list[BaseException] = []

    def commit(partition: int) -> None:
        try:
            t = table(catalog)
            t.load()
            for start in range(0, 30, 10):
                assert t.commit(partition, start or None, start + 10, batch(partition, start, start + 10)) is None
        except BaseException as e:  # noqa: BLE001 - handed to the test's thread
            errors.append(e)

    threads = [threading.Thread(target=commit, args=(p,)) for p in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not errors, errors
    assert offsets_map(catalog, "t") == {str(p): 30 for p in range(4)}
    assert len(rows(catalog, "t")) == 4 * 30


def test_tables_strom_did_not_make_are_refused(catalog):
    catalog.create_namespace_if_not_exists("strom")
    catalog.create_table(("strom", "theirs"), schema=Schema(NestedField(1, "id", LongType(), required=False)))
    with pytest.raises(TableRefused, match="not made by Strom"):
        table(catalog, "theirs").load()
    table(catalog, "old", topic_id=str(uuid.uuid4())).load()
    with pytest.raises(TableRefused, match="another topic of that name"):
        table(catalog, "old", topic_id=str(uuid.uuid4())).load()


def test_partition_specs(catalog):
    assert table(catalog, "none", spec="()").load() == {}
    assert catalog.load_table(("strom", "none")).spec().is_unpartitioned()
    table(catalog, "two", spec="(day(timestamp), partition)").load()
    fields = catalog.load_table(("strom", "two")).spec().fields
    assert [(f.name, str(f.transform)) for f in fields] == [("timestamp_day", "day"), ("partition", "identity")]


def test_dead_letters_committed_before_a_crash_are_not_appended_again(catalog):
    """The dead letters' commit goes through, the main table's does not (a crash between the
    two): the batch translated again appends its rows once and no dead letter twice."""
    schema = parse("AVRO", json.dumps({"type": "record", "name": "R", "fields": [{"name": "n", "type": "long"}]}))
    source = SchemaSource(schemas=lambda ids: {i: schema if i == 1 else f"schema id {i} is not registered"
                                               for i in ids},
                          latest=lambda subject: None)
    main = TopicTable(catalog, "strom", "v", "id-1", SchemaConverter("value_schema_id_prefix", "v", source),
                      "(hour(timestamp))", "")
    dead = TopicTable(catalog, "strom", "v~dlq", "id-1", DeadLetterConverter(), "(hour(timestamp))", "")
    main.load()
    good = b"\x00\x00\x00\x00\x01" + schema.encode({"n": 5})
    records = [(Record(o, 1_700_000_000_000, None, good if o % 2 else b"junk-%d" % o, ()), 0) for o in range(6)]
    decoded = main.converter.decode(0, records)
    dead.load()
    assert dead.commit_dead_letters(0, 6, decoded.dead) == 3  # ... and the broker dies here
    assert commit_with_dead_letters(main, dead, 0, None, 6, records) == (None, 0)
    assert sorted(r["strom"]["offset"] for r in rows(catalog, "v~dlq")) == [0, 2, 4]
    assert sorted((r["strom"]["offset"], r["n"]) for r in rows(catalog, "v")) == [(1, 5), (3, 5), (5, 5)]
    assert offsets_map(catalog, "v") == {"0": 6} and offsets_map(catalog, "v~dlq") == {"0": 6}
