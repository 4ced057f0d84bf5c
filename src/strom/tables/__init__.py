"""Iceberg topics: the committed records of a topic become rows of an Iceberg table.

- settings.py: the broker's iceberg.* keys as catalog properties (no pyiceberg import, so a
  broker without iceberg.enabled never loads it).
- key_value.py: the key_value mode's converter, records -> an Arrow table of the table's schema.
- table.py: the topic's table in the catalog (made on first use, refused when not Strom's) and
  the exactly-once commit (docs/iceberg-topics.md).
- translator.py: one partition leader's reading (read_committed, over the broker's own
  connection) and its periodic commits, run off the loop.

server/iceberg_topics.py schedules translators on the partitions this broker leads.
"""
