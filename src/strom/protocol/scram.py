"""SCRAM (RFC 5802, RFC 7677) as Kafka uses it, without I/O: the credential a server keeps
of a password, and the client side of the exchange (brokers authenticating to each other, tools).
The server side is in security/sasl.py."""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
from dataclasses import dataclass

SCRAM_MECHANISMS = {"SCRAM-SHA-256": ("sha256", 1), "SCRAM-SHA-512": ("sha512", 2)}  # hash, wire id
MECHANISM_BY_ID = {wire: name for name, (_, wire) in SCRAM_MECHANISMS.items()}
MIN_ITERATIONS, MAX_ITERATIONS = 4096, 16384  # Kafka's bounds for SCRAM credentials


@dataclass(frozen=True, slots=True)
class ScramCredential:
    salt: bytes
    stored_key: bytes
    server_key: bytes
    iterations: int

    def encode(self) -> str:
        """Kafka's form in /config/users/<user>: salt=..,stored_key=..,server_key=..,iterations=.."""
        b64 = base64.b64encode
        return (f"salt={b64(self.salt).decode()},stored_key={b64(self.stored_key).decode()},"
                f"server_key={b64(self.server_key).decode()},iterations={self.iterations}")

    @classmethod
    def decode(cls, text: str) -> ScramCredential:
        fields = dict(part.split("=", 1) for part in text.split(","))
        return cls(base64.b64decode(fields["salt"]), base64.b64decode(fields["stored_key"]),
                   base64.b64decode(fields["server_key"]), int(fields["iterations"]))


def scram_credential(mechanism: str, salted_password: bytes, salt: bytes, iterations: int) -> ScramCredential:
    """What the server keeps of a password (RFC 5802): StoredKey = H(HMAC(salted, "Client Key")),
    ServerKey = HMAC(salted, "Server Key")."""
    digest = SCRAM_MECHANISMS[mechanism][0]
    client_key = hmac.digest(salted_password, b"Client Key", digest)
    return ScramCredential(salt, hashlib.new(digest, client_key).digest(),
                           hmac.digest(salted_password, b"Server Key", digest), iterations)


def salted_password(mechanism: str, password: str, salt: bytes, iterations: int) -> bytes:
    return hashlib.pbkdf2_hmac(SCRAM_MECHANISMS[mechanism][0], password.encode(), salt, iterations)



class ScramClient:
    """The client's two messages: `first()`, then `final(server-first)`; `verify(server-final)`
    checks the server knew the password too."""

    def __init__(self, mechanism: str, username: str, password: str, token: bool = False) -> None:
        self.digest = SCRAM_MECHANISMS[mechanism][0]
        self.mechanism, self.password = mechanism, password
        name = username.replace("=", "=3D").replace(",", "=2C")
        self.first_bare = f"n={name},r={base64.b64encode(os.urandom(24)).decode()}" + (",tokenauth=true" if token else "")
        self.server_signature = b""

    def first(self) -> bytes:
        return f"n,,{self.first_bare}".encode()

    def final(self, server_first: bytes) -> bytes:
        text = server_first.decode()
        attrs = dict(part.split("=", 1) for part in text.split(","))
        salted = salted_password(self.mechanism, self.password, base64.b64decode(attrs["s"]), int(attrs["i"]))
        without_proof = f"c=biws,r={attrs['r']}"
        auth_message = f"{self.first_bare},{text},{without_proof}".encode()
        client_key = hmac.digest(salted, b"Client Key", self.digest)
        signature = hmac.digest(hashlib.new(self.digest, client_key).digest(), auth_message, self.digest)
        self.server_signature = hmac.digest(hmac.digest(salted, b"Server Key", self.digest), auth_message, self.digest)
        proof = bytes(a ^ b for a, b in zip(client_key, signature, strict=True))
        return f"{without_proof},p={base64.b64encode(proof).decode()}".encode()

    def verify(self, server_final: bytes) -> bool:
        return hmac.compare_digest(server_final, b"v=" + base64.b64encode(self.server_signature))
