"""Delegation tokens (KIP-48): the tokens a broker knows, and how they change.

The HMAC of a token is HMAC-SHA512 of its id under `delegation.token.secret.key`, so every node
with the same secret derives it; a client authenticates with SCRAM as user <token id>,
password base64(HMAC), and the `tokenauth=true` extension, and is then its token's owner until
the token expires. TokenCache is one broker's view (Kafka's DelegationTokenCache); where the
tokens come from depends on the mode:

- ZooKeeper and the embedded broker (DelegationTokens): the tokens are a TokenStore's
  (metadata/security_store.py: owner, requester, renewers, issue, expiry and max timestamps;
  never the HMAC), each change announced to every broker, which follows the announcements. The
  broker that takes a request writes the change.
- KRaft (QuorumTokens): the tokens are the metadata image's DelegationTokenRecords; the active
  controller writes every change (controller/token_control.py) and removes expired tokens.
"""

from __future__ import annotations

import base64
import logging
import os
import time
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import Any

from strom.metadata.delegation_token import TokenError, TokenInformation, new_token_id, token_hmac
from strom.metadata.security_store import TokenStore
from strom.protocol.errors import ErrorCode
from strom.protocol.scram import (
    MIN_ITERATIONS,
    SCRAM_MECHANISMS,
    ScramCredential,
    salted_password,
    scram_credential,
)

log = logging.getLogger(__name__)


@dataclass
class _Cached:
    info: TokenInformation
    hmac: bytes
    # SCRAM credentials by mechanism, made at the token's first authentication (a PBKDF2 of
    # 4,096 rounds each: not paid for tokens never used on this broker).
    credentials: dict[str, ScramCredential] = field(default_factory=dict)


def secret_of(config: Any) -> bytes | None:
    """delegation.token.secret.key (or its old name, delegation.token.master.key); None: off."""
    secret = config["delegation.token.secret.key"] or config["delegation.token.master.key"]
    return secret.encode() if secret else None


class TokenCache:
    """The tokens one broker knows, by id and by HMAC (Kafka's DelegationTokenCache)."""

    # Whether this broker removes expired tokens itself (ZooKeeper) or the controller does.
    expires_locally = True
    # Whether Create/Renew/ExpireDelegationToken go to the active controller (KRaft).
    forwarded = False

    def __init__(self, config: Any) -> None:
        self.secret = secret_of(config)
        self.max_lifetime_ms = config["delegation.token.max.lifetime.ms"]
        self.renew_ms = config["delegation.token.expiry.time.ms"]
        self.tokens: dict[str, _Cached] = {}
        self._by_hmac: dict[bytes, str] = {}

    @property
    def enabled(self) -> bool:
        return self.secret is not None

    def hmac_of(self, token_id: str) -> bytes:
        return token_hmac(self.secret, token_id)

    def _cache(self, info: TokenInformation) -> None:
        cached = self.tokens.get(info.token_id)
        if cached is not None:  # the same token changed (renewed, expiry moved): same HMAC
            cached.info = info
            return
        token_hmac_ = self.hmac_of(info.token_id)
        self.tokens[info.token_id] = _Cached(info, token_hmac_)
        self._by_hmac[token_hmac_] = info.token_id

    def forget(self, token_id: str) -> None:
        cached = self.tokens.pop(token_id, None)
        if cached is not None:
            self._by_hmac.pop(cached.hmac, None)

    def credential(self, mechanism: str, token_id: str) -> tuple[ScramCredential, str, int] | None:
        """What SCRAM with `tokenauth=true` checks a token against: its credential, its owner,
        its expiry (ms); None for an unknown or expired token."""
        cached = self.tokens.get(token_id)
        if cached is None or cached.info.expired(_now_ms()) or mechanism not in SCRAM_MECHANISMS:
            return None
        credential = cached.credentials.get(mechanism)
        if credential is None:
            password = base64.b64encode(cached.hmac).decode()
            salt = os.urandom(32)
            credential = scram_credential(mechanism, salted_password(mechanism, password, salt, MIN_ITERATIONS),
                                          salt, MIN_ITERATIONS)
            cached.credentials[mechanism] = credential
        return credential, cached.info.owner, cached.info.expiry_ms

    def by_hmac(self, token_hmac_: bytes) -> TokenInformation | None:
        token_id = self._by_hmac.get(bytes(token_hmac_))
        return None if token_id is None else self.tokens[token_id].info


class DelegationTokens(TokenCache):
    """A ZooKeeper broker's tokens and the writes that change them (Kafka's
    DelegationTokenManagerZk)."""

    def __init__(self, store: TokenStore, config: Any) -> None:
        super().__init__(config)
        self.store = store
        self._changes = store.token_changes(self._changed)

    def load(self) -> None:
        """Every token (blocking; at start-up)."""
        if not self.enabled:
            return
        self._changes.skip_existing()
        for token_id in self.store.token_ids():
            self._reload(token_id)

    def _reload(self, token_id: str) -> None:
        info = self.store.read_token(token_id)
        if info is None:
            self.forget(token_id)
        else:
            self._cache(info)

    async def start(self) -> None:
        if self.enabled:
            await self._changes.start()

    def stop(self) -> None:
        self._changes.stop()

    async def _changed(self, token_id: str) -> None:
        await self.store.io(self._reload, token_id)

    # -- writes (blocking: run them through the store thread)

    def _write(self, info: TokenInformation | None, token_id: str) -> None:
        self.store.write_token(token_id, info)
        if info is None:
            self.forget(token_id)
        else:
            self._cache(info)
        self.store.announce_token_change(token_id)

    def create(self, owner: str, requester: str, renewers: list[str], max_lifetime_ms: int) -> tuple[TokenInformation, bytes]:
        if not self.enabled:
            raise TokenError(ErrorCode.DELEGATION_TOKEN_AUTH_DISABLED)
        now = _now_ms()
        lifetime = self.max_lifetime_ms if max_lifetime_ms <= 0 else min(max_lifetime_ms, self.max_lifetime_ms)
        token_id = new_token_id()
        info = TokenInformation(token_id, owner, requester, tuple(renewers), now, now + lifetime,
                                min(now + lifetime, now + self.renew_ms))
        self._write(info, token_id)
        log.info("created delegation token %s for %s", token_id, owner)
        return info, self.hmac_of(token_id)

    def _owned(self, principal: str, token_hmac_: bytes) -> TokenInformation:
        if not self.enabled:
            raise TokenError(ErrorCode.DELEGATION_TOKEN_AUTH_DISABLED)
        info = self.by_hmac(token_hmac_)
        if info is None:
            raise TokenError(ErrorCode.DELEGATION_TOKEN_NOT_FOUND)
        if not info.owner_or_renewer(principal):
            raise TokenError(ErrorCode.DELEGATION_TOKEN_OWNER_MISMATCH)
        return info

    def renew(self, principal: str, token_hmac_: bytes, period_ms: int) -> int:
        info = self._owned(principal, token_hmac_)
        now = _now_ms()
        if info.expired(now):
            raise TokenError(ErrorCode.DELEGATION_TOKEN_EXPIRED)
        renewed = replace(info, expiry_ms=min(info.max_ms, now + (self.renew_ms if period_ms < 0 else period_ms)))
        self._write(renewed, info.token_id)
        return renewed.expiry_ms

    def expire(self, principal: str, token_hmac_: bytes, period_ms: int) -> int:
        info = self._owned(principal, token_hmac_)
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


class QuorumTokens(TokenCache):
    """A KRaft broker's tokens: the metadata image's, published on each change to them. The
    active controller writes every change and removes expired tokens."""

    expires_locally = False
    forwarded = True

    def load(self) -> None:
        """Nothing to read at start-up: the first metadata image brings the tokens."""

    async def start(self) -> None:
        """Nothing to follow but the metadata log, which the publisher does."""

    def stop(self) -> None:
        pass

    def publish(self, records: Iterable[Any]) -> None:
        """The image's DelegationTokenRecords become this broker's tokens (without a secret the
        broker knows no tokens, as a Kafka broker without one)."""
        if not self.enabled:
            return
        current = {rec.token_id: rec for rec in records}
        for token_id in [t for t in self.tokens if t not in current]:
            self.forget(token_id)
        for token_id, rec in current.items():
            cached = self.tokens.get(token_id)
            info = TokenInformation.from_record(rec)
            if cached is None or cached.info != info:
                self._cache(info)


def _now_ms() -> int:
    return int(time.time() * 1000)
