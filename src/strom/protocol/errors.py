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
    TOPIC_AUTHORIZATION_FAILED = 29
    CLUSTER_AUTHORIZATION_FAILED = 31
    INVALID_TIMESTAMP = 32
    UNSUPPORTED_SASL_MECHANISM = 33
    ILLEGAL_SASL_STATE = 34
    SECURITY_DISABLED = 54
    SASL_AUTHENTICATION_FAILED = 58
    DELEGATION_TOKEN_AUTH_DISABLED = 61
    DELEGATION_TOKEN_NOT_FOUND = 62
    DELEGATION_TOKEN_OWNER_MISMATCH = 63
    DELEGATION_TOKEN_REQUEST_NOT_ALLOWED = 64
    DELEGATION_TOKEN_AUTHORIZATION_FAILED = 65
    DELEGATION_TOKEN_EXPIRED = 66
    INVALID_PRINCIPAL_TYPE = 67
    THROTTLING_QUOTA_EXCEEDED = 89
    RESOURCE_NOT_FOUND = 91
    DUPLICATE_RESOURCE = 92
    UNACCEPTABLE_CREDENTIAL = 93
    PRINCIPAL_DESERIALIZATION_FAILURE = 97
    UNSUPPORTED_VERSION = 35
    TOPIC_ALREADY_EXISTS = 36
    INVALID_PARTITIONS = 37
    INVALID_REPLICATION_FACTOR = 38
    INVALID_REPLICA_ASSIGNMENT = 39
    INVALID_CONFIG = 40
    NOT_CONTROLLER = 41
    STALE_CONTROLLER_EPOCH = 11
    STALE_BROKER_EPOCH = 77
    INVALID_UPDATE_VERSION = 95
    FEATURE_UPDATE_FAILED = 96
    PREFERRED_LEADER_NOT_AVAILABLE = 80
    ELIGIBLE_LEADERS_NOT_AVAILABLE = 83
    ELECTION_NOT_NEEDED = 84
    NO_REASSIGNMENT_IN_PROGRESS = 85
    NEW_LEADER_ELECTED = 106
    INELIGIBLE_REPLICA = 107
    OFFSET_MOVED_TO_TIERED_STORAGE = 109  # KIP-405: a follower fetched below the leader's local log start
    BROKER_NOT_AVAILABLE = 8
    REPLICA_NOT_AVAILABLE = 9
    INVALID_REQUEST = 42
    UNSUPPORTED_FOR_MESSAGE_FORMAT = 43
    OUT_OF_ORDER_SEQUENCE_NUMBER = 45
    INVALID_PRODUCER_EPOCH = 47
    TRANSACTIONAL_ID_AUTHORIZATION_FAILED = 53
    UNKNOWN_PRODUCER_ID = 59
    POLICY_VIOLATION = 44
    KAFKA_STORAGE_ERROR = 56
    LOG_DIR_NOT_FOUND = 57
    TOPIC_DELETION_DISABLED = 73
    FENCED_LEADER_EPOCH = 74
    UNKNOWN_LEADER_EPOCH = 76
    UNKNOWN_TOPIC_ID = 100
    INVALID_RECORD = 87
    INCONSISTENT_TOPIC_ID = 103
    # Group coordination (classic and KIP-848 consumer groups).
    OFFSET_METADATA_TOO_LARGE = 12
    COORDINATOR_LOAD_IN_PROGRESS = 14
    NOT_COORDINATOR = 16
    ILLEGAL_GENERATION = 22
    INCONSISTENT_GROUP_PROTOCOL = 23
    INVALID_GROUP_ID = 24
    UNKNOWN_MEMBER_ID = 25
    INVALID_SESSION_TIMEOUT = 26
    REBALANCE_IN_PROGRESS = 27
    INVALID_COMMIT_OFFSET_SIZE = 28
    GROUP_AUTHORIZATION_FAILED = 30
    NON_EMPTY_GROUP = 68
    GROUP_ID_NOT_FOUND = 69
    # Fetch sessions (KIP-227).
    FETCH_SESSION_ID_NOT_FOUND = 70
    INVALID_FETCH_SESSION_EPOCH = 71
    MEMBER_ID_REQUIRED = 79
    GROUP_MAX_SIZE_REACHED = 81
    FENCED_INSTANCE_ID = 82
    GROUP_SUBSCRIBED_TO_TOPIC = 86
    UNSTABLE_OFFSET_COMMIT = 88
    FENCED_MEMBER_EPOCH = 110
    UNRELEASED_INSTANCE_ID = 111
    UNSUPPORTED_ASSIGNOR = 112
    STALE_MEMBER_EPOCH = 113
    INVALID_REGULAR_EXPRESSION = 128
    # Share groups (KIP-932).
    INVALID_RECORD_STATE = 121
    SHARE_SESSION_NOT_FOUND = 122
    INVALID_SHARE_SESSION_EPOCH = 123
    FENCED_STATE_EPOCH = 124
    SHARE_SESSION_LIMIT_REACHED = 133
    # Transactions.
    INVALID_TXN_STATE = 48
    INVALID_PRODUCER_ID_MAPPING = 49
    INVALID_TRANSACTION_TIMEOUT = 50
    CONCURRENT_TRANSACTIONS = 51
    TRANSACTION_COORDINATOR_FENCED = 52
    OPERATION_NOT_ATTEMPTED = 55
    PRODUCER_FENCED = 90
    TRANSACTIONAL_ID_NOT_FOUND = 105
    TRANSACTION_ABORTABLE = 120
    # KRaft: brokers registering with the quorum controller.
    DUPLICATE_BROKER_REGISTRATION = 101
    BROKER_ID_NOT_REGISTERED = 102
    INCONSISTENT_CLUSTER_ID = 104
    INVALID_REGISTRATION = 119
    # DescribeCluster sent to the wrong kind of listener (KIP-919).
    MISMATCHED_ENDPOINT_TYPE = 114
    UNSUPPORTED_ENDPOINT_TYPE = 115


class KafkaError(Exception):
    """An error with a Kafka error code; the message goes to the response where the API has one."""

    code: ErrorCode = ErrorCode.UNKNOWN_SERVER_ERROR

    def __init__(self, message: str = "", code: ErrorCode | None = None,
                 record_errors: list[tuple[int, str]] | None = None) -> None:
        super().__init__(message)
        if code is not None:
            self.code = code
        # KIP-467: (index in the record set, reason) of each record that caused the refusal.
        self.record_errors = record_errors or []

    @property
    def record_index(self) -> int | None:
        """The first refused record's index, if the refusal names records."""
        return self.record_errors[0][0] if self.record_errors else None


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
