"""Strom: a Kafka-compatible distributed commit log."""
