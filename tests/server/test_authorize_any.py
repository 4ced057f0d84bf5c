"""Authorizer.authorize_any (Kafka's authorizeByResourceType) against an in-memory ACL cache:
how an idempotent producer without IDEMPOTENT_WRITE on the cluster gets in."""

from __future__ import annotations

from strom.security.authorizer import (
    ALLOW,
    DENY,
    LITERAL,
    PREFIXED,
    TOPIC,
    WILDCARD,
    WRITE,
    Acl,
    Authorizer,
)


def authorizer(allow_if_no_acl: bool, acls: dict) -> Authorizer:
    a = Authorizer.__new__(Authorizer)  # the decisions only: no store behind it
    a.super_users, a.allow_if_no_acl, a._last_denial_log = {"User:admin"}, allow_if_no_acl, {}
    a.acls = {key: frozenset(v) for key, v in acls.items()}
    return a


def acl(permission: int, principal: str = "User:alice") -> Acl:
    return Acl(principal, WILDCARD, WRITE, permission)


def test_no_acls_at_all_follows_allow_everyone_if_no_acl_found():
    assert authorizer(True, {}).authorize_any("User:alice", "127.0.0.1", WRITE, TOPIC)
    assert not authorizer(False, {}).authorize_any("User:alice", "127.0.0.1", WRITE, TOPIC)
    assert authorizer(False, {}).authorize_any("User:admin", "127.0.0.1", WRITE, TOPIC)


def test_allows_and_denies():
    literal = {(TOPIC, LITERAL, "orders"): {acl(ALLOW)}}
    assert authorizer(False, literal).authorize_any("User:alice", "h", WRITE, TOPIC)
    assert not authorizer(False, literal).authorize_any("User:bob", "h", WRITE, TOPIC)
    denied = {**literal, (TOPIC, PREFIXED, "ord"): {acl(DENY)}}
    assert not authorizer(False, denied).authorize_any("User:alice", "h", WRITE, TOPIC)
    # With ACLs on some topics, allow.everyone still lets in a user none of them names.
    assert authorizer(True, literal).authorize_any("User:bob", "h", WRITE, TOPIC)
    everything_denied = {(TOPIC, LITERAL, WILDCARD): {acl(DENY)}}
    assert not authorizer(True, everything_denied).authorize_any("User:alice", "h", WRITE, TOPIC)
