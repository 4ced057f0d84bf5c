"""Confluent Schema Registry's errors: an HTTP status and a body {"error_code", "message"},
error codes as its clients know them (the status is the code's first three digits)."""

from __future__ import annotations

SUBJECT_NOT_FOUND = 40401
VERSION_NOT_FOUND = 40402
SCHEMA_NOT_FOUND = 40403
SUBJECT_SOFT_DELETED = 40404
SUBJECT_NOT_SOFT_DELETED = 40405
SCHEMA_VERSION_SOFT_DELETED = 40406
SCHEMA_VERSION_NOT_SOFT_DELETED = 40407
SUBJECT_COMPATIBILITY_NOT_CONFIGURED = 40408
SUBJECT_MODE_NOT_CONFIGURED = 40409
INCOMPATIBLE_SCHEMA = 409
INVALID_SCHEMA = 42201
INVALID_VERSION = 42202
INVALID_COMPATIBILITY_LEVEL = 42203
INVALID_MODE = 42204
OPERATION_NOT_PERMITTED = 42205
REFERENCE_EXISTS = 42206
ID_DOES_NOT_MATCH = 42207
INVALID_SUBJECT = 42208
UNPROCESSABLE = 422
BAD_REQUEST = 400
UNAUTHORIZED = 40101
FORBIDDEN = 40301
NOT_FOUND = 404
TOO_LARGE = 413
STORE_ERROR = 50001
OPERATION_TIMEOUT = 50002
FORWARDING_FAILED = 50003
UNKNOWN_LEADER = 50004


class RegistryError(Exception):
    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message

    @property
    def status(self) -> int:
        text = str(self.code)
        return int(text[:3]) if len(text) > 3 else self.code

    def body(self) -> dict:
        return {"error_code": self.code, "message": self.message}


def subject_not_found(subject: str) -> RegistryError:
    return RegistryError(SUBJECT_NOT_FOUND, f"Subject '{subject}' not found.")


def version_not_found(version: object) -> RegistryError:
    return RegistryError(VERSION_NOT_FOUND, f"Version {version} not found.")


def schema_not_found(what: object = "") -> RegistryError:
    return RegistryError(SCHEMA_NOT_FOUND, f"Schema {what} not found".replace("  ", " ").strip() + ".")


def invalid_schema(why: str) -> RegistryError:
    return RegistryError(INVALID_SCHEMA, f"Invalid schema: {why}")


def invalid_version(version: object) -> RegistryError:
    return RegistryError(INVALID_VERSION, f"The specified version '{version}' is not a valid version id. "
                         "Allowed values are between [1, 2^31-1] and the string \"latest\"")


def not_permitted(why: str) -> RegistryError:
    return RegistryError(OPERATION_NOT_PERMITTED, why)
