"""DescribeUserScramCredentials and AlterUserScramCredentials (KIP-554).

Credentials live where Kafka's ZooKeeper mode keeps them: one config entry per mechanism in
/config/users/<user> ("SCRAM-SHA-256" -> "salt=..,stored_key=..,server_key=..,iterations=.."),
announced through /config/changes so every broker's SASL listeners see them. The client sends
the salted password, never the password; the broker keeps only what RFC 5802 needs.
"""

from __future__ import annotations

from collections import Counter
from urllib.parse import unquote

from strom.config.repository import sanitize
from strom.protocol.errors import ErrorCode
from strom.protocol.scram import (
    MAX_ITERATIONS,
    MECHANISM_BY_ID,
    MIN_ITERATIONS,
    SCRAM_MECHANISMS,
    ScramCredential,
    scram_credential,
)
from strom.security.authorizer import ALTER, CLUSTER, DESCRIBE, allowed
from strom.server.apis import RequestContext, api

DESCRIBE_USER_SCRAM_CREDENTIALS, ALTER_USER_SCRAM_CREDENTIALS = 50, 51


def _result(user: str, error: ErrorCode = ErrorCode.NONE, message: str | None = None, **extra) -> dict:
    return {"user": user, "error_code": error, "error_message": message, **extra}


@api(DESCRIBE_USER_SCRAM_CREDENTIALS, 0, 0)
async def handle_describe_user_scram_credentials(broker, ctx: RequestContext, request) -> dict:
    if not allowed(broker, ctx, DESCRIBE, CLUSTER):
        return {"throttle_time_ms": 0, "error_code": ErrorCode.CLUSTER_AUTHORIZATION_FAILED,
                "error_message": "Cluster authorization failed.", "results": []}
    repository = broker.config_repository
    named = [u.name for u in request.users] if request.users else None
    results = []
    if named is None:
        named_once = sorted(unquote(path[6:]) for path, configs in repository.clients.items()
                            if path.startswith("users/") and "/" not in path[6:]
                            and any(m in configs for m in SCRAM_MECHANISMS))
        counts: Counter[str] = Counter()
    else:
        named_once, counts = list(dict.fromkeys(named)), Counter(named)
    for user in named_once:
        infos = [{"mechanism": SCRAM_MECHANISMS[m][1], "iterations": ScramCredential.decode(text).iterations}
                 for m, text in sorted(repository.user(user).items()) if m in SCRAM_MECHANISMS]
        if counts[user] > 1:
            results.append(_result(user, ErrorCode.DUPLICATE_RESOURCE,
                                   "Cannot describe SCRAM credentials for the same user twice in a single request",
                                   credential_infos=[]))
        elif not infos:
            results.append(_result(user, ErrorCode.RESOURCE_NOT_FOUND,
                                   "Attempt to describe a user credential that does not exist", credential_infos=[]))
        else:
            results.append(_result(user, credential_infos=infos))
    return {"throttle_time_ms": 0, "error_code": ErrorCode.NONE, "error_message": None, "results": results}


@api(ALTER_USER_SCRAM_CREDENTIALS, 0, 0)
async def handle_alter_user_scram_credentials(broker, ctx: RequestContext, request) -> dict:
    """Each user's changes are checked as a whole and written at once, or not at all."""
    permitted = allowed(broker, ctx, ALTER, CLUSTER)
    changes: dict[str, list] = {}
    for d in request.deletions:
        changes.setdefault(d.name, []).append(("delete", d.mechanism, d))
    for u in request.upsertions:
        changes.setdefault(u.name, []).append(("upsert", u.mechanism, u))
    results = []
    for user, ops in changes.items():
        current = dict(broker.config_repository.user(user))
        error, message = check(user, ops, current) if permitted else (
            ErrorCode.CLUSTER_AUTHORIZATION_FAILED, "Cluster authorization failed.")
        if error == ErrorCode.NONE:
            for op, mechanism_id, item in ops:
                mechanism = MECHANISM_BY_ID[mechanism_id]
                if op == "delete":
                    del current[mechanism]
                else:
                    current[mechanism] = scram_credential(mechanism, bytes(item.salted_password), bytes(item.salt),
                                                          item.iterations).encode()
            path = f"users/{sanitize(user)}"
            await broker.store_io(broker.admin.change_client_config, path, current)
            broker.config_repository.clients[path] = current
        results.append(_result(user, error, message))
    return {"throttle_time_ms": 0, "results": results}


def check(user: str, ops: list, current: dict[str, str]) -> tuple[ErrorCode, str | None]:
    """Kafka's validation, first failure wins: the user's name, each mechanism, each count of
    iterations, no credential changed twice, deletions of credentials that exist."""
    if not user:
        return ErrorCode.UNACCEPTABLE_CREDENTIAL, "Username must not be empty"
    seen: set[int] = set()
    for op, mechanism_id, item in ops:
        if mechanism_id not in MECHANISM_BY_ID:
            return ErrorCode.UNSUPPORTED_SASL_MECHANISM, f"Unknown SCRAM mechanism {mechanism_id}"
        if mechanism_id in seen:
            return ErrorCode.DUPLICATE_RESOURCE, "A user credential cannot be altered twice in the same request"
        seen.add(mechanism_id)
        if op == "upsert":
            if item.iterations < MIN_ITERATIONS:
                return ErrorCode.UNACCEPTABLE_CREDENTIAL, f"Too few iterations: {item.iterations} < {MIN_ITERATIONS}"
            if item.iterations > MAX_ITERATIONS:
                return ErrorCode.UNACCEPTABLE_CREDENTIAL, f"Too many iterations: {item.iterations} > {MAX_ITERATIONS}"
            if not item.salt or not item.salted_password:
                return ErrorCode.UNACCEPTABLE_CREDENTIAL, "Salt and salted password must not be empty"
        elif MECHANISM_BY_ID[mechanism_id] not in current:
            return ErrorCode.RESOURCE_NOT_FOUND, "Attempt to delete a user credential that does not exist"
    return ErrorCode.NONE, None
