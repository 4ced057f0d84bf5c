"""Delegation tokens (KIP-48) as data: a token's information, as the ZooKeeper node and the
metadata log's DelegationTokenRecord hold it, and its HMAC. Below both the brokers' token
caches (security/delegation_tokens.py) and the quorum controller's rules
(controller/token_control.py), which share it."""

from __future__ import annotations

import base64
import hmac as hmac_lib
import uuid
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, unquote

from strom.protocol.errors import ErrorCode, KafkaError


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

    @classmethod
    def from_record(cls, rec: Any) -> TokenInformation:
        """A DelegationTokenRecord of the metadata log (principals as "User:alice")."""
        return cls(rec.token_id, rec.owner, rec.requester, tuple(rec.renewers), rec.issue_timestamp,
                   rec.max_timestamp, rec.expiration_timestamp)

    def to_record(self) -> Any:
        # Imported here: the record codecs are generated at import (~30 ms), which a broker that
        # never writes a token to the metadata log (every broker but a KRaft one) need not pay.
        from strom.metadata import records as r

        return r.DelegationTokenRecord(owner=self.owner, requester=self.requester, renewers=list(self.renewers),
                                       issue_timestamp=self.issue_ms, max_timestamp=self.max_ms,
                                       expiration_timestamp=self.expiry_ms, token_id=self.token_id)

    def owner_or_renewer(self, principal: str) -> bool:
        return principal == self.owner or principal in self.renewers

    def expired(self, now_ms: int) -> bool:
        return self.max_ms < now_ms or self.expiry_ms < now_ms


class TokenError(KafkaError):
    def __init__(self, code: ErrorCode) -> None:
        super().__init__(code.name, code)


def token_hmac(secret: bytes, token_id: str) -> bytes:
    return hmac_lib.digest(secret, token_id.encode(), "sha512")


def new_token_id() -> str:
    """Kafka's Uuid.randomUuid().toString(): 16 random bytes, URL-safe base64 without padding."""
    return base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
