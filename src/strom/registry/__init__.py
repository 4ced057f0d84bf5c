"""The schema registry service: Confluent Schema Registry's REST API on its own HTTP listener
(`schema.registry.listeners`), its state in the compacted `_schemas` topic in Confluent's record
formats, one writer per cluster (the leader of `_schemas` partition 0). docs/schema-registry.md."""
