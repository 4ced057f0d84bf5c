"""The schema registry's security, off by default: HTTP basic authentication against the
broker's own SASL users, and the broker's authorizer deciding with Kafka's ACLs.

Who: a PLAIN user of a SASL listener's JAAS config (`user_<name>="<password>"`), or a SCRAM
user (SCRAM-SHA-256 or -512 credentials in the metadata store, checked by deriving the stored
key from the password). The principal is `User:<name>`; a wrong or missing credential gets 401
with a WWW-Authenticate challenge.

What, when the broker has an authorizer (authorizer.class.name), by ACLs Kafka already has:
- a subject's schemas read (versions, lookup, compatibility tests, ids): READ on the TOPIC the
  subject names by TopicNameStrategy (`orders-value` and `orders-key` -> topic `orders`; another
  subject name -> the topic of that name);
- a subject written (register, delete, its config and mode): WRITE on that TOPIC;
- the global config and mode: DESCRIBE_CONFIGS (read) and ALTER_CONFIGS (write) on the CLUSTER;
  a subject's config and mode read: READ on its topic.
A schema by id is readable by who may read any subject that has it. Denied: 403, error 40301.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import time
from typing import Any

from aiohttp import web

from strom.protocol.scram import SCRAM_MECHANISMS, salted_password
from strom.registry import errors as err
from strom.registry.errors import RegistryError
from strom.security.authorizer import (
    ALTER_CONFIGS,
    CLUSTER,
    CLUSTER_NAME,
    DESCRIBE_CONFIGS,
    READ,
    TOPIC,
    WRITE,
)

_CACHE_S = 60.0  # a checked password is not derived again for this long (PBKDF2 is slow on purpose)


def topic_of(subject: str) -> str:
    """The topic a subject names by TopicNameStrategy."""
    for suffix in ("-value", "-key"):
        if subject.endswith(suffix) and len(subject) > len(suffix):
            return subject[: -len(suffix)]
    return subject


class RegistrySecurity:
    def __init__(self, broker: Any) -> None:
        self.broker = broker
        self._checked: dict[tuple[str, bytes], float] = {}

    # --- who ---------------------------------------------------------------------------------
    async def authenticate(self, request: web.Request) -> str:
        header = request.headers.get("Authorization", "")
        scheme, _, encoded = header.partition(" ")
        try:
            user, sep, password = base64.b64decode(encoded.strip(), validate=True).decode().partition(":")
        except (ValueError, UnicodeDecodeError):
            sep = ""
        if scheme.lower() != "basic" or not sep or not await self._valid(user, password):
            raise web.HTTPUnauthorized(
                headers={"WWW-Authenticate": 'Basic realm="schema-registry"'},
                body=b'{"error_code":40101,"message":"Unauthorized"}',
                content_type="application/vnd.schemaregistry.v1+json")
        return f"User:{user}"

    async def _valid(self, user: str, password: str) -> bool:
        key = (user, hashlib.sha256(password.encode()).digest())
        now = time.monotonic()
        if self._checked.get(key, 0.0) > now:
            return True
        listeners = list(getattr(self.broker.socket_server, "sasl", {}).values())
        for listener in listeners:
            expected = listener.options.get("PLAIN", {}).get(f"user_{user}")
            if expected is not None and hmac.compare_digest(expected.encode(), password.encode()):
                self._remember(key, now)
                return True
        for listener in listeners[:1]:  # SCRAM credentials are the cluster's, whichever listener asks
            for mechanism in SCRAM_MECHANISMS:
                credential = listener.scram_credential(mechanism, user)
                if credential is None:
                    continue
                digest = SCRAM_MECHANISMS[mechanism][0]
                salted = await asyncio.get_running_loop().run_in_executor(
                    None, salted_password, mechanism, password, credential.salt, credential.iterations)
                client_key = hmac.digest(salted, b"Client Key", digest)
                if hmac.compare_digest(hashlib.new(digest, client_key).digest(), credential.stored_key):
                    self._remember(key, now)
                    return True
        return False

    def _remember(self, key: tuple[str, bytes], now: float) -> None:
        if len(self._checked) > 10_000:
            self._checked = {k: t for k, t in self._checked.items() if t > now}
        self._checked[key] = now + _CACHE_S

    # --- what --------------------------------------------------------------------------------
    def allowed(self, principal: str | None, operation: str, subject: str | None, host: str = "*") -> bool:
        authorizer = self.broker.authorizer
        if authorizer is None or principal is None:
            return True
        if subject is None:
            op = DESCRIBE_CONFIGS if operation == "read_config" else ALTER_CONFIGS
            return authorizer.authorize(principal, host, op, CLUSTER, CLUSTER_NAME)
        op = READ if operation in ("read", "read_config") else WRITE
        return authorizer.authorize(principal, host, op, TOPIC, topic_of(subject))

    def authorize(self, principal: str | None, operation: str, subject: str | None, host: str = "*") -> None:
        if not self.allowed(principal, operation, subject, host):
            what = f"subject '{subject}'" if subject is not None else "the global config and mode"
            raise RegistryError(err.FORBIDDEN, f"{principal} is not allowed to {operation.replace('_', ' ')} {what}")
