"""Kafka message schemas kafka-python 3.0 does not ship (KIP-848's ConsumerGroup* APIs, the
controller-to-broker APIs LeaderAndIsr, StopReplica, UpdateMetadata, the delegation token
APIs, and KIP-932's share group APIs and share-state RPCs), in Kafka's own JSON schema format so that the same generated codec reads and writes
them."""
