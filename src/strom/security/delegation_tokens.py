"""Delegation tokens (KIP-48), as Kafka's ZooKeeper mode keeps them.

A token is a node /delegation_token/tokens/<token id> (owner, requester, renewers, issue,
expiry and max timestamps; never the HMAC), each change announced by a sequential
/delegation_token/token_changes/token_change_<n> node holding the token id, which every broker
follows. The HMAC is HMAC-SHA512 of the token id under `delegation.token.secret.key`, so every
broker with the same secret derives it; a client authenticates with SCRAM as user <token id>,
password base64(HMAC), and the `tokenauth=true` extension, and is then its token's owner until
the token expires.
"""

from __future__ import annotations

import base64
import hmac as hmac_lib
import logging
import os
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from typing import Any
from urllib.parse import quote, unquote

from strom.config.repository import ChangeListener
from strom.controller import znodes
from strom.controller.store import MetadataStore
from strom.protocol.errors import ErrorCode
from strom.protocol.scram import (
    MIN_ITERATIONS,
    SCRAM_MECHANISMS,
    ScramCredential,
    salted_password,
    scram_credential,
)

log = logging.getLogger(__name__)

TOKEN_CHANGE_PREFIX = "token_change_"


@dataclass(frozen=True)
class TokenInformation:
    token_id: str
    owner: str  # "User:alice"
    requester: str
    renewers: tuple[str, ...]
    issue_ms: int
    max_ms: int
    expiry_ms: int

    def encode(self) -> dict[str, Any]:
        """Kafka's version 3 token node (principals sanitized as its Sanitizer does)."""
        return {"version": 3, "owner": quote(self.owner, safe=""), "tokenRequester": quote(self.requester, safe=""),
                "renewers": [quote(r, safe="") for r in self.renewers], "issueTimestamp": self.issue_ms,
                "maxTimestamp": self.max_ms, "expiryTimestamp": self.expiry_ms, "tokenId": self.token_id}

    @classmethod
    def decode(cls, data: dict[str, Any]) -> TokenInformation:
        owner = unquote(data["owner"])
        return cls(data["tokenId"], owner, unquote(data.get("tokenRequester", quote(owner, safe=""))),
                   tuple(unquote(r) for r in data.get("renewers", [])), int(data["issueTimestamp"]),
                   int(data["maxTimestamp"]), int(data["expiryTimestamp"]))

    def owner_or_renewer(self, principal: str) -> bool:
        return principal == self.owner or principal in self.renewers

    def expired(self, now_ms: int) -> bool:
        return self.max_ms < now_ms or self.expiry_ms < now_ms


@dataclass
class _Cached:
    info: TokenInformation
    hmac: bytes
    credentials: dict[str, ScramCredential] = field(default_factory=dict)


class TokenError(Exception):
    def __init__(self, code: ErrorCode) -> None:
        super().__init__(code.name)
        self.code = code


class DelegationTokens:
    """The token cache of one broker and the writes that change tokens (Kafka's
    DelegationTokenManagerZk)."""

    def __init__(self, store: MetadataStore, io: Callable[..., Awaitable[Any]], config: Any) -> None:
        self.store, self.io = store, io
        secret = config["delegation.token.secret.key"] or config["delegation.token.master.key"]
        self.secret = secret.encode() if secret else None
        self.max_lifetime_ms = config["delegation.token.max.lifetime.ms"]
        self.renew_ms = config["delegation.token.expiry.time.ms"]
        self.tokens: dict[str, _Cached] = {}
        self._by_hmac: dict[bytes, str] = {}
        self._changes = ChangeListener(store, io, znodes.TOKEN_CHANGES, TOKEN_CHANGE_PREFIX, self._changed)

    @property
    def enabled(self) -> bool:
        return self.secret is not None

    # -- cache

    def hmac_of(self, token_id: str) -> bytes:
        return hmac_lib.digest(self.secret, token_id.encode(), "sha512")

    def _cache(self, info: TokenInformation) -> None:
        token_hmac = self.hmac_of(info.token_id)
        password = base64.b64encode(token_hmac).decode()
        credentials = {}
        for mechanism in SCRAM_MECHANISMS:
            salt = os.urandom(32)
            credentials[mechanism] = scram_credential(
                mechanism, salted_password(mechanism, password, salt, MIN_ITERATIONS), salt, MIN_ITERATIONS)
        self.forget(info.token_id)
        self.tokens[info.token_id] = _Cached(info, token_hmac, credentials)
        self._by_hmac[token_hmac] = info.token_id

    def forget(self, token_id: str) -> None:
        cached = self.tokens.pop(token_id, None)
        if cached is not None:
            self._by_hmac.pop(cached.hmac, None)

    def credential(self, mechanism: str, token_id: str) -> tuple[ScramCredential, str, int] | None:
        """What SCRAM with `tokenauth=true` checks a token against: its credential, its owner,
        its expiry (ms); None for an unknown or expired token."""
        cached = self.tokens.get(token_id)
        if cached is None or cached.info.expired(_now_ms()):
            return None
        return cached.credentials[mechanism], cached.info.owner, cached.info.expiry_ms

    def load(self) -> None:
        """Every token (blocking; at start-up)."""
        if not self.enabled:
            return
        self._changes.skip_existing()
        for token_id in self.store.children(znodes.TOKENS):
            self._reload(token_id)

    def _reload(self, token_id: str) -> None:
        node = self.store.get(f"{znodes.TOKENS}/{token_id}")
        if node is None or not isinstance(node[0], dict):
            self.forget(token_id)
        else:
            self._cache(TokenInformation.decode(node[0]))

    async def start(self) -> None:
        if self.enabled:
            await self._changes.start()

    def stop(self) -> None:
        self._changes.stop()

    async def _changed(self, token_id: Any) -> None:
        await self.io(self._reload, str(token_id))

    # -- writes (blocking: run them through the store thread)

    def _write(self, info: TokenInformation | None, token_id: str) -> None:
        path = f"{znodes.TOKENS}/{token_id}"
        if info is None:
            if self.store.get(path) is not None:
                self.store.delete(path)
            self.forget(token_id)
        else:
            if self.store.get(path) is None:
                self.store.create(path, info.encode())
            else:
                self.store.set(path, info.encode())
            self._cache(info)
        self.store.create(f"{znodes.TOKEN_CHANGES}/{TOKEN_CHANGE_PREFIX}", token_id, sequential=True)

    def create(self, owner: str, requester: str, renewers: list[str], max_lifetime_ms: int) -> tuple[TokenInformation, bytes]:
        if not self.enabled:
            raise TokenError(ErrorCode.DELEGATION_TOKEN_AUTH_DISABLED)
        now = _now_ms()
        lifetime = self.max_lifetime_ms if max_lifetime_ms <= 0 else min(max_lifetime_ms, self.max_lifetime_ms)
        token_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        info = TokenInformation(token_id, owner, requester, tuple(renewers), now, now + lifetime,
                                min(now + lifetime, now + self.renew_ms))
        self._write(info, token_id)
        log.info("created delegation token %s for %s", token_id, owner)
        return info, self.hmac_of(token_id)

    def _owned(self, principal: str, token_hmac: bytes) -> TokenInformation:
        if not self.enabled:
            raise TokenError(ErrorCode.DELEGATION_TOKEN_AUTH_DISABLED)
        token_id = self._by_hmac.get(bytes(token_hmac))
        if token_id is None:
            raise TokenError(ErrorCode.DELEGATION_TOKEN_NOT_FOUND)
        info = self.tokens[token_id].info
        if not info.owner_or_renewer(principal):
            raise TokenError(ErrorCode.DELEGATION_TOKEN_OWNER_MISMATCH)
        return info

    def renew(self, principal: str, token_hmac: bytes, period_ms: int) -> int:
        info = self._owned(principal, token_hmac)
        now = _now_ms()
        if info.expired(now):
            raise TokenError(ErrorCode.DELEGATION_TOKEN_EXPIRED)
        renewed = replace(info, expiry_ms=min(info.max_ms, now + (self.renew_ms if period_ms < 0 else period_ms)))
        self._write(renewed, info.token_id)
        return renewed.expiry_ms

    def expire(self, principal: str, token_hmac: bytes, period_ms: int) -> int:
        info = self._owned(principal, token_hmac)
        now = _now_ms()
        if period_ms < 0:
            self._write(None, info.token_id)
            log.info("expired delegation token %s of %s", info.token_id, info.owner)
            return now
        if info.expired(now):
            raise TokenError(ErrorCode.DELEGATION_TOKEN_EXPIRED)
        changed = replace(info, expiry_ms=min(info.max_ms, now + period_ms))
        self._write(changed, info.token_id)
        return changed.expiry_ms

    def remove_expired(self) -> None:
        """delegation.token.expiry.check.interval.ms: tokens past their expiry or max time go."""
        now = _now_ms()
        for token_id, cached in list(self.tokens.items()):
            if cached.info.expired(now):
                log.info("delegation token %s of %s expired", token_id, cached.info.owner)
                self._write(None, token_id)


def _now_ms() -> int:
    return int(time.time() * 1000)

