"""How a client reaches a secured listener (ClientSecurity): TLS, and the SASL exchange
(PLAIN, SCRAM, SCRAM with a delegation token) as a sans-I/O generator of requests, so the
blocking and the asyncio connection share it."""

from __future__ import annotations

import random
import ssl
import time
from collections.abc import Generator, Mapping
from dataclasses import dataclass
from typing import Any

from strom.jaas import parse_jaas
from strom.protocol.scram import SCRAM_MECHANISMS, ScramClient

SASL_HANDSHAKE, SASL_AUTHENTICATE = 17, 36


class AuthenticationError(ConnectionError):
    pass


@dataclass(frozen=True)
class ClientSecurity:
    """How a client reaches a secured listener: a TLS context, and a SASL mechanism (PLAIN,
    SCRAM-SHA-256/512, the latter also with a delegation token) with its credentials."""

    ssl: ssl.SSLContext | None = None
    sasl_mechanism: str | None = None
    username: str = ""
    password: str = ""
    token: bool = False

    @classmethod
    def from_properties(cls, props: Mapping[str, str]) -> ClientSecurity | None:
        """From Kafka client properties (Java's names, or librdkafka's where they differ):
        security.protocol, ssl.truststore.location / ssl.ca.location (PEM),
        ssl.keystore.location / ssl.certificate.location + ssl.key.location, ssl.key.password,
        ssl.endpoint.identification.algorithm, sasl.mechanism(s), sasl.jaas.config /
        sasl.username + sasl.password. None for PLAINTEXT; ValueError for what cannot work."""
        protocol = props.get("security.protocol", "PLAINTEXT").strip().upper()
        if protocol == "PLAINTEXT":
            return None
        if protocol not in ("SSL", "SASL_PLAINTEXT", "SASL_SSL"):
            raise ValueError(f"security.protocol={protocol} is not PLAINTEXT, SSL, SASL_PLAINTEXT or SASL_SSL")
        context = None
        if protocol in ("SSL", "SASL_SSL"):
            context = ssl.create_default_context(
                cafile=props.get("ssl.truststore.location") or props.get("ssl.ca.location") or None)
            context.check_hostname = props.get("ssl.endpoint.identification.algorithm", "https").strip() != ""
            chain = props.get("ssl.keystore.location") or props.get("ssl.certificate.location")
            if chain:
                context.load_cert_chain(chain, props.get("ssl.key.location") or None,
                                        password=props.get("ssl.key.password") or None)
        if not protocol.startswith("SASL_"):
            return cls(ssl=context)
        mechanism = (props.get("sasl.mechanism") or props.get("sasl.mechanisms") or "GSSAPI").strip().upper()
        options = parse_jaas(props["sasl.jaas.config"]) if props.get("sasl.jaas.config") else {}
        return cls(context, mechanism, options.get("username", props.get("sasl.username", "")),
                   options.get("password", props.get("sasl.password", "")),
                   options.get("tokenauth", "").lower() == "true")

    def exchange(self) -> Generator[tuple[int, int, dict], Any, int]:
        """The SASL requests to send, each answered by the response sent back in (sans-I/O, so
        the blocking and the asyncio connection share it). Returns the session's lifetime in ms
        the broker set (KIP-368; 0: unlimited). Run again on an authenticated connection, it
        re-authenticates it."""
        if self.sasl_mechanism is None:
            return 0
        handshake = yield SASL_HANDSHAKE, 1, {"mechanism": self.sasl_mechanism}
        if handshake.error_code:
            raise AuthenticationError(f"SASL mechanism {self.sasl_mechanism} refused (error {handshake.error_code}); "
                                      f"the broker offers {', '.join(handshake.mechanisms)}")
        if self.sasl_mechanism == "PLAIN":
            tokens = [f"\0{self.username}\0{self.password}".encode()]
            scram = None
        elif self.sasl_mechanism in SCRAM_MECHANISMS:
            scram = ScramClient(self.sasl_mechanism, self.username, self.password, self.token)
            tokens = [scram.first()]
        else:
            raise AuthenticationError(f"SASL mechanism {self.sasl_mechanism} is not one this client speaks")
        answer = yield SASL_AUTHENTICATE, 2, {"auth_bytes": tokens[0]}
        if not answer.error_code and scram is not None:
            answer = yield SASL_AUTHENTICATE, 2, {"auth_bytes": scram.final(answer.auth_bytes)}
            if not answer.error_code and not scram.verify(answer.auth_bytes):
                raise AuthenticationError("the broker's SCRAM signature is wrong: it does not know the password")
        if answer.error_code:
            raise AuthenticationError(answer.error_message or f"SASL authentication failed (error {answer.error_code})")
        return answer.session_lifetime_ms


def reauthentication_time(session_lifetime_ms: int) -> float | None:
    """When (time.monotonic()) to re-authenticate a session of this lifetime that has just
    begun (KIP-368): at a random point between 85% and 95% of it, as Kafka's clients do, which
    leaves room for the round trip and spreads many connections' renewals apart. None: the
    session does not end."""
    if session_lifetime_ms <= 0:
        return None
    return time.monotonic() + session_lifetime_ms * random.uniform(0.85, 0.95) / 1000
