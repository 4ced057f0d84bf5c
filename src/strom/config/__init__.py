"""Configuration: the broker's config keys with Kafka's names, types and defaults (broker.py),
the dynamic layers over them, the configs stored in the metadata (repository.py),
DescribeConfigs' sources, synonyms and documentation, and log4j-style logger levels."""
