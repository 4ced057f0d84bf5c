"""ACL authorization with Kafka's semantics (KIP-11, KIP-290 prefixed patterns).

The ACLs come from an AclStore (metadata/security_store.py: ZooKeeper or the embedded store,
where every broker follows the announced changes) or, on a KRaft node, from the metadata image
(`replace_acls`). A decision: super users may do anything; a matching DENY wins; then a
matching ALLOW, where READ, WRITE, DELETE and ALTER imply DESCRIBE and ALTER_CONFIGS implies
DESCRIBE_CONFIGS; a resource no ACL matches is open only with allow.everyone.if.no.acl.found.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from strom.metadata.security_store import AclResource, AclStore

log = logging.getLogger("strom.authorizer")  # Kafka's kafka.authorizer.logger

# Wire ids (Kafka's AclResourceType, PatternType, AclOperation, AclPermissionType) and the
# names stored ACLs use.
RESOURCE_NAMES = {2: "Topic", 3: "Group", 4: "Cluster", 5: "TransactionalId", 6: "DelegationToken", 7: "User"}
RESOURCE_IDS = {name: rid for rid, name in RESOURCE_NAMES.items()}
TOPIC, GROUP, CLUSTER, TRANSACTIONAL_ID, DELEGATION_TOKEN, USER = 2, 3, 4, 5, 6, 7
ANY_RESOURCE, ANY_PATTERN, MATCH, LITERAL, PREFIXED = 1, 1, 2, 3, 4
OPERATION_NAMES = {2: "All", 3: "Read", 4: "Write", 5: "Create", 6: "Delete", 7: "Alter", 8: "Describe",
                   9: "ClusterAction", 10: "DescribeConfigs", 11: "AlterConfigs", 12: "IdempotentWrite",
                   13: "CreateTokens", 14: "DescribeTokens"}
OPERATION_IDS = {name: op for op, name in OPERATION_NAMES.items()}
(ALL, READ, WRITE, CREATE, DELETE, ALTER, DESCRIBE, CLUSTER_ACTION, DESCRIBE_CONFIGS, ALTER_CONFIGS,
 IDEMPOTENT_WRITE, CREATE_TOKENS, DESCRIBE_TOKENS) = range(2, 15)
ANY_OPERATION = ANY_PERMISSION = 1
DENY, ALLOW = 2, 3
PERMISSION_NAMES = {DENY: "Deny", ALLOW: "Allow"}
CLUSTER_NAME = "kafka-cluster"
WILDCARD = "*"
# Kafka's authorizer class names: any of them turns ACLs on.
AUTHORIZERS = frozenset({"kafka.security.authorizer.AclAuthorizer", "kafka.security.auth.SimpleAclAuthorizer",
                         "org.apache.kafka.metadata.authorizer.StandardAuthorizer"})
_IMPLIES = {DESCRIBE: {DESCRIBE, READ, WRITE, DELETE, ALTER, ALL},
            DESCRIBE_CONFIGS: {DESCRIBE_CONFIGS, ALTER_CONFIGS, ALL}}
_DENIAL_LOG_EVERY_S = 5.0


@dataclass(frozen=True, slots=True)
class Acl:
    principal: str
    host: str
    operation: int
    permission: int

    def encode(self) -> dict[str, str]:
        return {"principal": self.principal, "permissionType": PERMISSION_NAMES[self.permission],
                "operation": OPERATION_NAMES[self.operation], "host": self.host}

    @classmethod
    def decode(cls, data: dict[str, str]) -> Acl:
        permission = {name: pid for pid, name in PERMISSION_NAMES.items()}[data["permissionType"]]
        return cls(data["principal"], data["host"], OPERATION_IDS[data["operation"]], permission)


Resource = tuple[int, int, str]  # (resource type, pattern type LITERAL/PREFIXED, name)


class AclFilter:
    """DescribeAcls / DeleteAcls filters: ANY matches everything, MATCH a literal name, the
    literal wildcard and every prefix of it."""

    def __init__(self, resource_type: int, name: str | None, pattern: int, principal: str | None,
                 host: str | None, operation: int, permission: int) -> None:
        self.resource_type, self.name, self.pattern = resource_type, name, pattern
        self.principal, self.host, self.operation, self.permission = principal, host, operation, permission

    def matches_resource(self, resource: Resource) -> bool:
        rtype, pattern, name = resource
        if self.resource_type != ANY_RESOURCE and self.resource_type != rtype:
            return False
        if self.pattern == MATCH:
            return self.name is None or (pattern == LITERAL and name in (self.name, WILDCARD)) or (
                pattern == PREFIXED and self.name.startswith(name))
        if self.pattern not in (ANY_PATTERN, pattern):
            return False
        return self.name is None or self.name == name

    def matches_acl(self, acl: Acl) -> bool:
        return ((self.principal is None or self.principal == acl.principal)
                and (self.host is None or self.host == acl.host)
                and self.operation in (ANY_OPERATION, acl.operation)
                and self.permission in (ANY_PERMISSION, acl.permission))


class Authorizer:
    """The decision, over ACLs kept in an AclStore (ZooKeeper mode and the embedded broker) or
    handed over from a KRaft metadata image (`replace_acls`; no store)."""

    def __init__(self, store: AclStore | None, super_users: str, allow_if_no_acl: bool) -> None:
        self.store = store
        self.super_users = {u.strip() for u in super_users.split(";") if u.strip()}
        self.allow_if_no_acl = allow_if_no_acl
        self.acls: dict[Resource, frozenset[Acl]] = {}
        self._changes = None if store is None else store.acl_changes(self._changed)
        self._last_denial_log: dict[tuple, float] = {}

    def replace_acls(self, records: Iterable[Any]) -> None:
        """Every ACL of the cluster, as AccessControlEntryRecords (a KRaft metadata image's)."""
        acls: dict[Resource, set[Acl]] = {}
        for rec in records:
            acls.setdefault((rec.resource_type, rec.pattern_type, rec.resource_name), set()).add(
                Acl(rec.principal, rec.host, rec.operation, rec.permission_type))
        self.acls = {k: frozenset(v) for k, v in acls.items()}

    # -- the decision

    def authorize(self, principal: str, host: str, operation: int, resource_type: int, name: str,
                  log_denied: bool = True) -> bool:
        if principal in self.super_users:
            return True
        matching = [acl for acl in self._matching(resource_type, name)
                    if acl.principal in (principal, "User:*") and acl.host in (host, WILDCARD)]
        if not matching and not self._has_acls(resource_type, name):
            allowed = self.allow_if_no_acl
        elif any(a.permission == DENY and a.operation in (operation, ALL) for a in matching):
            allowed = False
        else:
            implied = _IMPLIES.get(operation, {operation, ALL})
            allowed = any(a.permission == ALLOW and a.operation in implied for a in matching)
        if not allowed and log_denied:
            self._log_denial(principal, host, operation, resource_type, name)
        return allowed

    def authorize_any(self, principal: str, host: str, operation: int, resource_type: int) -> bool:
        """Kafka's authorizeByResourceType: allowed on some resource of the type (an idempotent
        producer may write if it may write to any topic), by an ALLOW no DENY overrides: a DENY
        of every name ("*"), of the same literal name, or of a prefix of the allowed name."""
        if principal in self.super_users:
            return True
        allows: dict[int, set[str]] = {LITERAL: set(), PREFIXED: set()}
        denies: dict[int, set[str]] = {LITERAL: set(), PREFIXED: set()}
        for (rtype, pattern, name), acls in self.acls.items():
            if rtype != resource_type:
                continue
            for a in acls:
                if a.principal in (principal, "User:*") and a.host in (host, WILDCARD) and a.operation in (operation, ALL):
                    (denies if a.permission == DENY else allows)[pattern].add(name)
        if WILDCARD in denies[LITERAL]:
            return False
        # Kafka asks about a made-up name: wildcard ALLOWs, and allow.everyone.if.no.acl.found
        # when no ACL covers it, answer here.
        if self.authorize(principal, host, operation, resource_type, "hardcode", log_denied=False):
            return True

        def denied_by_prefix(name: str) -> bool:
            return any(name.startswith(prefix) for prefix in denies[PREFIXED])

        return (any(name not in denies[LITERAL] and not denied_by_prefix(name) for name in allows[LITERAL])
                or any(not denied_by_prefix(prefix) for prefix in allows[PREFIXED]))

    def _matching(self, resource_type: int, name: str) -> Iterator[Acl]:
        for key in ((resource_type, LITERAL, name), (resource_type, LITERAL, WILDCARD)):
            yield from self.acls.get(key, ())
        for (rtype, pattern, prefix), acls in self.acls.items():
            if rtype == resource_type and pattern == PREFIXED and name.startswith(prefix):
                yield from acls

    def _has_acls(self, resource_type: int, name: str) -> bool:
        return next(self._matching(resource_type, name), None) is not None

    def _log_denial(self, principal: str, host: str, operation: int, resource_type: int, name: str) -> None:
        key = (principal, operation, resource_type, name)
        now = time.monotonic()
        if now - self._last_denial_log.get(key, -_DENIAL_LOG_EVERY_S) >= _DENIAL_LOG_EVERY_S:
            if len(self._last_denial_log) > 10_000:
                self._last_denial_log.clear()
            self._last_denial_log[key] = now
            log.info("Principal = %s is Denied Operation = %s from host = %s on resource = %s:LITERAL:%s",
                     principal, OPERATION_NAMES.get(operation, operation), host,
                     RESOURCE_NAMES.get(resource_type, resource_type), name)

    # -- the store

    @staticmethod
    def _stored(resource: Resource) -> AclResource:
        rtype, pattern, name = resource
        return AclResource(RESOURCE_NAMES[rtype], pattern != LITERAL, name)

    @staticmethod
    def _resource(stored: AclResource) -> Resource | None:
        """None for a resource type this broker does not know."""
        if stored.resource_type not in RESOURCE_IDS:
            return None
        return RESOURCE_IDS[stored.resource_type], PREFIXED if stored.prefixed else LITERAL, stored.name

    def load(self) -> None:
        """Every ACL of the cluster (blocking; at start-up)."""
        if self.store is None:
            return
        self._changes.skip_existing()
        for stored in self.store.acl_resources():
            if (resource := self._resource(stored)) is not None:
                self._reload(resource)

    def _read(self, resource: Resource) -> tuple[set[Acl], int | None]:
        stored = self.store.read_acls(self._stored(resource))
        return (set(), None) if stored is None else ({Acl.decode(a) for a in stored[0]}, stored[1])

    def _reload(self, resource: Resource) -> None:
        acls = frozenset(self._read(resource)[0])
        if acls:
            self.acls[resource] = acls
        else:
            self.acls.pop(resource, None)

    async def start(self) -> None:
        if self._changes is not None:
            await self._changes.start()

    def stop(self) -> None:
        if self._changes is not None:
            self._changes.stop()

    async def _changed(self, stored: AclResource) -> None:
        if (resource := self._resource(stored)) is not None:
            await self.store.io(self._reload, resource)

    def change(self, resource: Resource, add: Iterable[Acl] = (), remove: Iterable[Acl] = ()) -> None:
        """Add or remove ACLs of one resource (blocking): a conditional write, retried on a
        concurrent change, then the change announced."""
        while True:
            current, version = self._read(resource)
            wanted = (current | set(add)) - set(remove)
            if wanted == current:
                return
            if self.store.write_acls(self._stored(resource), [a.encode() for a in sorted(wanted, key=_order)],
                                     version):
                break
            # someone else changed it meanwhile: read again
        self.store.announce_acl_change(self._stored(resource))
        self._reload(resource)


def _order(acl: Acl) -> tuple:
    return acl.principal, acl.host, acl.operation, acl.permission


def host_of(client: str) -> str:
    """The client's address without its port (RequestContext.client is "ip:port")."""
    return client.rsplit(":", 1)[0] if ":" in client else client


# The principal of requests a broker hands itself (its controller's, in process): never a
# client's, which are always "User:...".
INTERNAL = "Broker:local"


def authorizer_from_config(config: Any, store: AclStore | None = None) -> Authorizer | None:
    """The authorizer authorizer.class.name asks for (None when it is empty)."""
    name = config["authorizer.class.name"].strip()
    if not name:
        return None
    if name not in AUTHORIZERS:
        raise ValueError(f"authorizer.class.name={name} is not an authorizer Strom has; use one of "
                         f"{', '.join(sorted(AUTHORIZERS))} (all mean ACLs), or leave it empty")
    return Authorizer(store, config["super.users"], config["allow.everyone.if.no.acl.found"])


def allowed(broker: Any, ctx: Any, operation: int, resource_type: int, name: str = CLUSTER_NAME,
            log_denied: bool = True) -> bool:
    """May this request's principal do `operation` on the resource? Always, with no authorizer."""
    authorizer = broker.authorizer
    if authorizer is None or ctx.principal == INTERNAL:
        return True
    return authorizer.authorize(ctx.principal, host_of(ctx.client), operation, resource_type, name, log_denied)


# The operations each resource type has (Kafka's AclEntry.supportedOperations), for the
# authorized-operations fields of Metadata, DescribeCluster, DescribeGroups,
# ConsumerGroupDescribe and DescribeTopicPartitions (KIP-430): bit n set when operation n is
# allowed. The codec takes the set of bits; None is "not asked for" (INT32_MIN on the wire).
SUPPORTED_OPERATIONS = {
    TOPIC: (READ, WRITE, CREATE, DESCRIBE, DELETE, ALTER, DESCRIBE_CONFIGS, ALTER_CONFIGS),
    GROUP: (READ, DESCRIBE, DELETE),
    CLUSTER: (CREATE, CLUSTER_ACTION, DESCRIBE_CONFIGS, ALTER_CONFIGS, IDEMPOTENT_WRITE, ALTER, DESCRIBE),
}
NOT_REQUESTED = None


def authorized_operations(broker: Any, ctx: Any, resource_type: int, name: str = CLUSTER_NAME) -> set[int]:
    """What this request's principal may do to a resource (every supported operation with no
    authorizer). Checking is not trying: nothing is logged as denied."""
    authorizer = broker.authorizer
    ops = SUPPORTED_OPERATIONS[resource_type]
    if authorizer is None or ctx.principal == INTERNAL:
        return set(ops)
    host = host_of(ctx.client)
    return {op for op in ops if authorizer.authorize(ctx.principal, host, op, resource_type, name, log_denied=False)}


def as_int32(operations: set[int] | None) -> int:
    """The same as a plain INT32 field (schemas that type it so, e.g. ConsumerGroupDescribe)."""
    if operations is None:
        return -(2**31)
    return sum(1 << op for op in operations)


def allowed_any(broker: Any, ctx: Any, operation: int, resource_type: int) -> bool:
    authorizer = broker.authorizer
    if authorizer is None or ctx.principal == INTERNAL:
        return True
    return authorizer.authorize_any(ctx.principal, host_of(ctx.client), operation, resource_type)

