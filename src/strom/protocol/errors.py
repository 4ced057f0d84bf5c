"""Kafka's error codes, and exceptions that carry one.

Lower layers raise `KafkaError` subclasses; request handlers turn them into the error code of
the response. The numbers are Kafka's (see the protocol guide's error table).
"""

from __future__ import annotations

from enum import IntEnum


class ErrorCode(IntEnum):
    UNKNOWN_SERVER_ERROR = -1
    NONE = 0
    OFFSET_OUT_OF_RANGE = 1
    CORRUPT_MESSAGE = 2
    UNKNOWN_TOPIC_OR_PARTITION = 3
    INVALID_FETCH_SIZE = 4
    LEADER_NOT_AVAILABLE = 5
    NOT_LEADER_OR_FOLLOWER = 6
    REQUEST_TIMED_OUT = 7
    COORDINATOR_NOT_AVAILABLE = 15
    MESSAGE_TOO_LARGE = 10
    INVALID_TOPIC_EXCEPTION = 17
    RECORD_LIST_TOO_LARGE = 18
    NOT_ENOUGH_REPLICAS = 19
    NOT_ENOUGH_REPLICAS_AFTER_APPEND = 20
    INVALID_REQUIRED_ACKS = 21
    INVALID_TIMESTAMP = 32
    UNSUPPORTED_VERSION = 35
    TOPIC_ALREADY_EXISTS = 36
    INVALID_PARTITIONS = 37
    INVALID_REPLICATION_FACTOR = 38
    INVALID_REPLICA_ASSIGNMENT = 39
    INVALID_CONFIG = 40
    NOT_CONTROLLER = 41
    INVALID_REQUEST = 42
    UNSUPPORTED_FOR_MESSAGE_FORMAT = 43
    OUT_OF_ORDER_SEQUENCE_NUMBER = 45
    INVALID_PRODUCER_EPOCH = 47
    TRANSACTIONAL_ID_AUTHORIZATION_FAILED = 53
    UNKNOWN_PRODUCER_ID = 59
    POLICY_VIOLATION = 44
    KAFKA_STORAGE_ERROR = 56
    TOPIC_DELETION_DISABLED = 73
    UNKNOWN_TOPIC_ID = 100
    INVALID_RECORD = 87
    INCONSISTENT_TOPIC_ID = 103


class KafkaError(Exception):
    """An error with a Kafka error code; the message goes to the response where the API has one."""

    code: ErrorCode = ErrorCode.UNKNOWN_SERVER_ERROR

    def __init__(self, message: str = "", code: ErrorCode | None = None) -> None:
        super().__init__(message)
        if code is not None:
            self.code = code


class CorruptRecordError(KafkaError):
    code = ErrorCode.CORRUPT_MESSAGE


class RecordTooLargeError(KafkaError):
    code = ErrorCode.MESSAGE_TOO_LARGE


class InvalidRecordError(KafkaError):
    code = ErrorCode.INVALID_RECORD


class InvalidTimestampError(KafkaError):
    code = ErrorCode.INVALID_TIMESTAMP


class UnsupportedForMessageFormatError(KafkaError):
    code = ErrorCode.UNSUPPORTED_FOR_MESSAGE_FORMAT


class OffsetOutOfRangeError(KafkaError):
    code = ErrorCode.OFFSET_OUT_OF_RANGE


class StorageError(KafkaError):
    code = ErrorCode.KAFKA_STORAGE_ERROR
