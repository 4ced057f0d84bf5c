"""Kafka message schemas kafka-python 3.0 does not ship (KIP-848's ConsumerGroup* APIs, the
controller-to-broker APIs LeaderAndIsr, StopReplica, UpdateMetadata, and the delegation token
APIs), in Kafka's own JSON schema format so that the same generated codec reads and writes
them."""
