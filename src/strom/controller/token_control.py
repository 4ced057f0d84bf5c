"""What the quorum controller writes for delegation tokens (Kafka's
DelegationTokenControlManager): a DelegationTokenRecord for a new, renewed or re-timed token, a
RemoveDelegationTokenRecord for one expired at once or past its time (the periodic sweep every
delegation.token.expiry.check.interval.ms).

The rules are the KRaft controller's, which differ a little from a ZooKeeper broker's
(security/delegation_tokens.py): a renewal period is capped by delegation.token.expiry.time.ms
(<= 0 takes it), and an expired token is refused before its owner is checked.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from strom.controller.replication_control import Change
from strom.metadata import records as r
from strom.metadata.delegation_token import TokenError, TokenInformation, new_token_id, token_hmac
from strom.metadata.image import MetadataImage
from strom.protocol.errors import ErrorCode

log = logging.getLogger(__name__)

# Kafka's MetadataVersion.IBP_3_6_IV2: the first level whose log carries delegation tokens.
TOKENS_METADATA_VERSION = 14
_INT64_MAX = 2**63 - 1


def _plus(now_ms: int, period_ms: int) -> int:
    return _INT64_MAX if now_ms > _INT64_MAX - period_ms else now_ms + period_ms


class TokenControl:
    def __init__(self, secret: bytes | None, max_lifetime_ms: int, renew_ms: int) -> None:
        self.secret = secret
        self.max_lifetime_ms = max_lifetime_ms  # delegation.token.max.lifetime.ms
        self.renew_ms = renew_ms  # delegation.token.expiry.time.ms
        self._hmacs: dict[str, bytes] = {}  # token id -> HMAC, computed once per token

    @property
    def enabled(self) -> bool:
        return self.secret is not None

    def hmac_of(self, token_id: str) -> bytes:
        found = self._hmacs.get(token_id)
        if found is None:
            found = self._hmacs[token_id] = token_hmac(self.secret, token_id)
        return found

    def _check(self, image: MetadataImage) -> None:
        if not self.enabled:
            raise TokenError(ErrorCode.DELEGATION_TOKEN_AUTH_DISABLED)
        if image.features.get("metadata.version", 0) < TOKENS_METADATA_VERSION:
            raise TokenError(ErrorCode.UNSUPPORTED_VERSION)

    def find(self, image: MetadataImage, hmac: bytes) -> TokenInformation | None:
        hmac = bytes(hmac)
        for token_id in [t for t in self._hmacs if t not in image.delegation_tokens]:
            del self._hmacs[token_id]  # gone from the image: forget its HMAC too
        for token_id, rec in image.delegation_tokens.items():
            if self.hmac_of(token_id) == hmac:
                return TokenInformation.from_record(rec)
        return None

    def create(self, image: MetadataImage, owner: str, requester: str, renewers: Sequence[str],
               max_lifetime_ms: int, now_ms: int) -> Change:
        """A new token; the answer is (its TokenInformation, its HMAC)."""
        self._check(image)
        if any(not p.startswith("User:") for p in renewers):
            raise TokenError(ErrorCode.INVALID_PRINCIPAL_TYPE)
        lifetime = self.max_lifetime_ms if max_lifetime_ms <= 0 else min(self.max_lifetime_ms, max_lifetime_ms)
        max_ms = _plus(now_ms, lifetime)
        info = TokenInformation(new_token_id(), owner, requester, tuple(renewers), now_ms, max_ms,
                                min(max_ms, _plus(now_ms, self.renew_ms)))
        return Change([info.to_record()], (info, self.hmac_of(info.token_id)))

    def _owned(self, image: MetadataImage, hmac: bytes) -> TokenInformation:
        self._check(image)
        info = self.find(image, hmac)
        if info is None:
            raise TokenError(ErrorCode.DELEGATION_TOKEN_NOT_FOUND)
        return info

    def renew(self, image: MetadataImage, principal: str, hmac: bytes, period_ms: int, now_ms: int) -> Change:
        """The token's new expiry time is the answer."""
        info = self._owned(image, hmac)
        if info.expired(now_ms):
            raise TokenError(ErrorCode.DELEGATION_TOKEN_EXPIRED)
        if not info.owner_or_renewer(principal):
            raise TokenError(ErrorCode.DELEGATION_TOKEN_OWNER_MISMATCH)
        period = self.renew_ms if period_ms <= 0 else min(self.renew_ms, period_ms)
        expiry = min(info.max_ms, _plus(now_ms, period))
        return Change([replace(info, expiry_ms=expiry).to_record()], expiry)

    def expire(self, image: MetadataImage, principal: str, hmac: bytes, period_ms: int, now_ms: int) -> Change:
        """A negative period removes the token now; else its expiry moves to now + period (never
        past its max time). The new expiry time is the answer."""
        info = self._owned(image, hmac)
        if not info.owner_or_renewer(principal):
            raise TokenError(ErrorCode.DELEGATION_TOKEN_OWNER_MISMATCH)
        if period_ms < 0:
            log.info("delegation token %s of %s expired on request", info.token_id, info.owner)
            return Change([r.RemoveDelegationTokenRecord(token_id=info.token_id)], now_ms)
        if info.expired(now_ms):
            raise TokenError(ErrorCode.DELEGATION_TOKEN_EXPIRED)
        expiry = min(info.max_ms, _plus(now_ms, period_ms))
        return Change([replace(info, expiry_ms=expiry).to_record()], expiry)

    def sweep(self, image: MetadataImage, now_ms: int) -> Change:
        """Tokens past their expiry or max time are removed."""
        records: list[Any] = []
        for rec in image.delegation_tokens.values():
            info = TokenInformation.from_record(rec)
            if info.expired(now_ms):
                log.info("delegation token %s of %s expired", info.token_id, info.owner)
                records.append(r.RemoveDelegationTokenRecord(token_id=info.token_id))
        return Change(records)
