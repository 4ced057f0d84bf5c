"""CreateAcls, DescribeAcls and DeleteAcls (KIP-140, prefixed patterns from v1: KIP-290).

From v1 only, as Kafka 4.0 (KIP-896 removed v0, which had no pattern type): a v0 request is an
unsupported version, and the connection is closed.

ACLs are written to the metadata store (security/authorizer.py) and so apply on every broker.
Altering them takes ALTER on the cluster, reading them DESCRIBE; with no authorizer
configured Kafka answers SECURITY_DISABLED, as here.
"""

from __future__ import annotations

from collections import defaultdict

from strom.protocol.errors import ErrorCode
from strom.security.authorizer import (
    ALLOW,
    ALTER,
    CLUSTER,
    CLUSTER_NAME,
    DENY,
    DESCRIBE,
    LITERAL,
    OPERATION_NAMES,
    PREFIXED,
    RESOURCE_NAMES,
    Acl,
    AclFilter,
    allowed,
)
from strom.server.apis import RequestContext, api

DESCRIBE_ACLS, CREATE_ACLS, DELETE_ACLS = 29, 30, 31


def _disabled_or_denied(broker, ctx: RequestContext, operation: int) -> tuple[ErrorCode, str] | None:
    if broker.authorizer is None:
        return ErrorCode.SECURITY_DISABLED, "No Authorizer is configured on the broker"
    if not allowed(broker, ctx, operation, CLUSTER):
        return ErrorCode.CLUSTER_AUTHORIZATION_FAILED, "Cluster authorization failed"
    return None


def check_binding(rtype: int, name: str, pattern: int, principal: str, operation: int, permission: int) -> str | None:
    """Why Kafka would refuse to create this ACL, or None."""
    if rtype not in RESOURCE_NAMES:
        return f"Invalid resource type {rtype}"
    if pattern not in (LITERAL, PREFIXED):
        return f"Invalid pattern type {pattern}: ACLs are LITERAL or PREFIXED"
    if operation not in OPERATION_NAMES:
        return f"Invalid operation {operation}"
    if permission not in (ALLOW, DENY):
        return f"Invalid permission type {permission}"
    if not principal.startswith("User:") or len(principal) == len("User:"):
        return f"Invalid principal {principal!r}: expected User:<name>"
    if not name:
        return "Resource name must not be empty"
    if rtype == CLUSTER and name != CLUSTER_NAME:
        return f"The only valid name for the CLUSTER resource is {CLUSTER_NAME}"
    return None


@api(CREATE_ACLS, 1, 3)
async def handle_create_acls(broker, ctx: RequestContext, request) -> dict:
    refused = _disabled_or_denied(broker, ctx, ALTER)
    results = []
    for c in request.creations:
        pattern = c.resource_pattern_type
        if refused is not None:
            results.append({"error_code": refused[0], "error_message": refused[1]})
            continue
        why = check_binding(c.resource_type, c.resource_name, pattern, c.principal, c.operation, c.permission_type)
        if why is not None:
            results.append({"error_code": ErrorCode.INVALID_REQUEST, "error_message": why})
            continue
        await broker.store_io(broker.authorizer.change, (c.resource_type, pattern, c.resource_name),
                              [Acl(c.principal, c.host, c.operation, c.permission_type)])
        results.append({"error_code": ErrorCode.NONE, "error_message": None})
    return {"throttle_time_ms": 0, "results": results}


def acl_filter(f) -> AclFilter:
    return AclFilter(f.resource_type_filter, f.resource_name_filter, f.pattern_type_filter,
                     f.principal_filter, f.host_filter, f.operation, f.permission_type)


def _acl_entry(acl: Acl) -> dict:
    return {"principal": acl.principal, "host": acl.host, "operation": acl.operation,
            "permission_type": acl.permission}


@api(DESCRIBE_ACLS, 1, 3)
async def handle_describe_acls(broker, ctx: RequestContext, request) -> dict:
    refused = _disabled_or_denied(broker, ctx, DESCRIBE)
    if refused is not None:
        return {"throttle_time_ms": 0, "error_code": refused[0], "error_message": refused[1], "resources": []}
    wanted = acl_filter(request)  # the request's fields are a DeleteAcls filter's
    resources = []
    for (rtype, pattern, name), acls in sorted(broker.authorizer.acls.items()):
        if not wanted.matches_resource((rtype, pattern, name)):
            continue
        matching = [_acl_entry(a) for a in sorted(acls, key=lambda a: (a.principal, a.operation)) if wanted.matches_acl(a)]
        if matching:
            resources.append({"resource_type": rtype, "resource_name": name, "pattern_type": pattern,
                              "acls": matching})
    return {"throttle_time_ms": 0, "error_code": ErrorCode.NONE, "error_message": None, "resources": resources}


@api(DELETE_ACLS, 1, 3)
async def handle_delete_acls(broker, ctx: RequestContext, request) -> dict:
    refused = _disabled_or_denied(broker, ctx, ALTER)
    results = []
    for f in request.filters:
        if refused is not None:
            results.append({"error_code": refused[0], "error_message": refused[1], "matching_acls": []})
            continue
        wanted = acl_filter(f)
        removed: dict[tuple, list[Acl]] = defaultdict(list)
        for resource, acls in list(broker.authorizer.acls.items()):
            if wanted.matches_resource(resource):
                removed[resource] += [a for a in acls if wanted.matches_acl(a)]
        matching = []
        for resource, acls in removed.items():
            if acls:
                await broker.store_io(broker.authorizer.change, resource, (), acls)
                rtype, pattern, name = resource
                matching += [{"error_code": ErrorCode.NONE, "error_message": None, "resource_type": rtype,
                              "resource_name": name, "pattern_type": pattern, **_acl_entry(a)} for a in acls]
        results.append({"error_code": ErrorCode.NONE, "error_message": None, "matching_acls": matching})
    return {"throttle_time_ms": 0, "filter_results": results}

