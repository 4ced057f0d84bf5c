"""SASL on SASL_PLAINTEXT and SASL_SSL listeners: the mechanisms (PLAIN, SCRAM-SHA-256,
SCRAM-SHA-512, OAUTHBEARER with unsecured JWS) as byte-in, byte-out exchanges, knowing nothing
of sockets, and the JAAS option lines Kafka configures them with.

Credentials, as in Kafka: PLAIN users from the listener's JAAS options (`user_<name>="<pw>"`),
SCRAM users from the metadata store (/config/users/<name>, written by
AlterUserScramCredentials), OAUTHBEARER tokens checked as Kafka's unsecured validator does.

Password guessing is bounded where a guess is evaluated (`GuessLimit`): per principal and
client address, a few failed guesses per window, after which the next guesses of that pair
wait their turn. No guess is refused unevaluated, so a correct credential is never locked out,
and a guesser slows down only the principal it guesses, from its own address.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import json
import logging
import math
import secrets
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import partial
from typing import Any

from strom.client import ClientSecurity
from strom.jaas import parse_jaas
from strom.protocol.scram import (
    MIN_ITERATIONS,
    SCRAM_MECHANISMS,
    ScramCredential,
)
from strom.security.tls import client_context

log = logging.getLogger(__name__)

SUPPORTED = ("PLAIN", *SCRAM_MECHANISMS, "OAUTHBEARER")
# A SASL session may not outlive an int64 of milliseconds (SaslAuthenticate's field).
_MAX_LIFETIME_MS = 2**63 - 1


class AuthenticationFailed(Exception):
    """The client's credentials are wrong: SASL_AUTHENTICATION_FAILED, then the connection closes."""


class SaslProtocolError(Exception):
    """The client broke the exchange (bytes out of order, unparseable)."""


# --- mechanisms ----------------------------------------------------------------------------------

class Mechanism:
    """One authentication exchange: `evaluate(client bytes) -> server bytes` until `complete`."""

    complete = False
    principal = ""
    lifetime_ms: int | None = None  # when the credential stops being valid (OAUTHBEARER's exp)

    def evaluate(self, token: bytes) -> bytes:
        raise NotImplementedError

    def guess_of(self, token: bytes) -> str | None:
        """The user whose secret `token` would be checked against, if evaluating it is a
        guess (GuessLimit counts those); None when it checks no secret."""
        return None


class PlainServer(Mechanism):
    def __init__(self, users: Mapping[str, str]) -> None:
        self.users = users

    def evaluate(self, token: bytes) -> bytes:
        parts = token.split(b"\0")
        if len(parts) != 3:
            raise SaslProtocolError("PLAIN expects authzid NUL username NUL password")
        authzid, username, password = (p.decode("utf-8", "replace") for p in parts)
        if not username or not password:
            raise AuthenticationFailed("Authentication failed: username or password not specified")
        expected = self.users.get(username)
        if expected is None or not hmac.compare_digest(expected.encode(), password.encode()):
            raise AuthenticationFailed("Authentication failed: Invalid username or password")
        if authzid and authzid != username:
            raise AuthenticationFailed("Authentication failed: Client requested an authorization id "
                                       "that is different from username")
        self.complete, self.principal = True, f"User:{username}"
        return b""

    def guess_of(self, token: bytes) -> str | None:
        parts = token.split(b"\0")
        return parts[1].decode("utf-8", "replace") if len(parts) == 3 else None


class ScramServer(Mechanism):
    """RFC 5802's server side: client-first, server-first, client-final, server-final. With
    the `tokenauth=true` extension the user is a delegation token's id and the principal its
    owner, for as long as the token lives."""

    def __init__(self, mechanism: str, credentials: Callable[[str], ScramCredential | None],
                 token: Callable[[str], tuple[ScramCredential, str, int] | None] = lambda _id: None) -> None:
        self.mechanism = mechanism
        self.digest = SCRAM_MECHANISMS[mechanism][0]
        self.credentials = credentials
        self.token = token
        self.token_owner: str | None = None
        self.state = "first"

    def evaluate(self, token: bytes) -> bytes:
        text = token.decode("utf-8", "replace")
        if self.state == "first":
            return self._first(text)
        if self.state == "final":
            return self._final(text)
        raise SaslProtocolError("SCRAM exchange already finished")

    def _first(self, text: str) -> bytes:
        header, sep, bare = _split_gs2(text)
        if not sep:
            raise SaslProtocolError("SCRAM client-first message without a GS2 header")
        attrs = _attributes(bare)
        if "n" not in attrs or "r" not in attrs:
            raise SaslProtocolError("SCRAM client-first message needs n= and r=")
        self.username = attrs["n"].replace("=2C", ",").replace("=3D", "=")
        authzid = next((p[2:] for p in header.split(",") if p.startswith("a=")), "")
        if authzid and authzid != self.username:
            raise AuthenticationFailed("Authentication failed: authorization id differs from the user name")
        if attrs.get("tokenauth") == "true":
            found = self.token(self.username)
            credential, self.token_owner, expiry_ms = found if found is not None else (None, None, 0)
            if found is not None:
                self.lifetime_ms = max(1, int(expiry_ms - time.time() * 1000))
        else:
            credential = self.credentials(self.username)
        # An unknown user gets the same exchange as a known one, a salt of its own that stays
        # the same from one attempt to the next as a real one does, so neither the salt nor
        # the failure at the end tells which users exist.
        self.credential = credential or ScramCredential(_fake_salt(self.mechanism, self.username), b"", b"",
                                                        MIN_ITERATIONS)
        self.known = credential is not None
        self.gs2_header = header + ","
        self.client_first_bare = bare
        self.nonce = attrs["r"] + secrets.token_urlsafe(18)
        self.server_first = (f"r={self.nonce},s={base64.b64encode(self.credential.salt).decode()},"
                             f"i={self.credential.iterations}")
        self.state = "final"
        return self.server_first.encode()

    def _final(self, text: str) -> bytes:
        self.state = "done"
        without_proof, _, proof_part = text.rpartition(",p=")
        attrs = _attributes(without_proof)
        # Kafka checks that the client's nonce ends with the server's, not that they are equal:
        # librdkafka sends its own nonce again in front of the one the server returned.
        if not attrs.get("r", "").endswith(self.nonce):
            raise AuthenticationFailed("Authentication failed: invalid nonce in the client's final message")
        try:
            binding = base64.b64decode(attrs.get("c", ""), validate=True)
        except ValueError:
            raise SaslProtocolError("SCRAM channel binding (c=) is not base64") from None
        if binding != self.gs2_header.encode():
            raise AuthenticationFailed("Authentication failed: invalid channel binding")
        auth_message = f"{self.client_first_bare},{self.server_first},{without_proof}".encode()
        try:
            proof = base64.b64decode(proof_part, validate=True)
        except ValueError:
            raise SaslProtocolError("SCRAM client proof is not base64") from None
        signature = hmac.digest(self.credential.stored_key, auth_message, self.digest)
        client_key = bytes(a ^ b for a, b in zip(proof, signature, strict=False))
        if (not self.known or len(proof) != len(signature)
                or not hmac.compare_digest(hashlib.new(self.digest, client_key).digest(), self.credential.stored_key)):
            raise AuthenticationFailed(f"Authentication failed during authentication due to invalid "
                                       f"credentials with SASL mechanism {self.mechanism}")
        self.complete, self.principal = True, self.token_owner or f"User:{self.username}"
        server_signature = hmac.digest(self.credential.server_key, auth_message, self.digest)
        return b"v=" + base64.b64encode(server_signature)

    def guess_of(self, token: bytes) -> str | None:
        return self.username if self.state == "final" else None  # client-final carries the proof


# What unknown users' SCRAM salts derive from: the same user gets the same salt for as long as
# the broker runs (delegation.token.secret.key, the cluster's shared secret, makes it the same
# on every broker and across restarts: see set_salt_secret).
_salt_secret = secrets.token_bytes(32)


def set_salt_secret(secret: str | None) -> None:
    global _salt_secret
    if secret:
        _salt_secret = hashlib.sha256(b"strom-scram-salt:" + secret.encode()).digest()


def _fake_salt(mechanism: str, user: str) -> bytes:
    return hmac.digest(_salt_secret, f"{mechanism}:{user}".encode(), "sha256")[:16]


class OAuthBearerServer(Mechanism):
    """RFC 7628 with Kafka's unsecured JWS validator (alg "none"; `sub` names the principal;
    `exp` bounds the session). A bad token is answered with an error challenge, which the
    client acknowledges with 0x01 before the failure (RFC 7628, 3.2.2)."""

    def __init__(self, options: Mapping[str, str]) -> None:
        self.claim = options.get("unsecuredValidatorPrincipalClaimName", "sub")
        self.scope_claim = options.get("unsecuredValidatorScopeClaimName", "scope")
        self.required_scope = [s for s in options.get("unsecuredValidatorRequiredScope", "").split(",") if s]
        self.skew_ms = int(options.get("unsecuredValidatorAllowableClockSkewMs", "0"))
        self.error: str | None = None

    def evaluate(self, token: bytes) -> bytes:
        if self.error is not None:
            raise AuthenticationFailed(f"Authentication failed: {self.error}")
        text = token.decode("utf-8", "replace")
        header, sep, rest = _split_gs2(text)
        if not sep:
            raise SaslProtocolError("OAUTHBEARER message without a GS2 header")
        fields = dict(part.split("=", 1) for part in rest.strip("\x01").split("\x01") if "=" in part)
        auth = fields.get("auth", "")
        if not auth.lower().startswith("bearer "):
            raise SaslProtocolError("OAUTHBEARER message without auth=Bearer <token>")
        try:
            self._validate(auth[7:].strip())
        except ValueError as e:
            self.error = str(e)
            return json.dumps({"status": "invalid_token"}).encode()
        self.complete = True
        return b""

    def _validate(self, jws: str) -> None:
        parts = jws.split(".")
        if len(parts) != 3 or parts[2]:
            raise ValueError("the token is not an unsecured JWS (header.payload. with no signature)")
        try:
            header, claims = (json.loads(base64.urlsafe_b64decode(p + "=" * (-len(p) % 4))) for p in parts[:2])
        except (ValueError, TypeError):
            raise ValueError("the token's header or claims are not base64url JSON") from None
        if not isinstance(header, dict) or header.get("alg") != "none" or not isinstance(claims, dict):
            raise ValueError("the token must be unsecured (alg none)")
        now_ms = time.time() * 1000
        exp = claims.get("exp")
        if isinstance(exp, bool) or not isinstance(exp, int | float) or not math.isfinite(exp):
            raise ValueError("the token has no exp claim, or one that is not a number of seconds")
        if exp * 1000 + self.skew_ms <= now_ms:
            raise ValueError("the token has expired")
        subject = claims.get(self.claim)
        if not isinstance(subject, str) or not subject:
            raise ValueError(f"the token has no {self.claim} claim")
        scopes = claims.get(self.scope_claim, [])
        scopes = scopes.split() if isinstance(scopes, str) else scopes
        missing = [s for s in self.required_scope if s not in scopes]
        if missing:
            raise ValueError(f"the token lacks the required scope {missing}")
        self.principal = f"User:{subject}"
        self.lifetime_ms = max(1, min(_MAX_LIFETIME_MS, int(exp * 1000 - now_ms)))


def _split_gs2(text: str) -> tuple[str, str, str]:
    """GS2 header ("n,," or "n,a=user,"), separator, rest."""
    parts = text.split(",", 2)
    if len(parts) < 3 or parts[0] not in ("n", "y") or (parts[1] and not parts[1].startswith("a=")):
        return "", "", text
    return f"{parts[0]},{parts[1]}", ",", parts[2]


def _attributes(text: str) -> dict[str, str]:
    return dict(part.split("=", 1) for part in text.split(",") if "=" in part)


# --- how many guesses ---------------------------------------------------------------------------

class _Pair:
    __slots__ = ("failures", "evaluating", "waiting", "changed")

    def __init__(self) -> None:
        self.failures: deque[float] = deque()  # when each failed guess in the window was answered
        self.evaluating = 0
        self.waiting = 0
        self.changed = asyncio.Event()


class GuessLimit:
    """Failed guesses per (user, client address): at most `max_failures` within `window_s`
    (sasl.server.failed.authentication.limit / .window.ms). Past that, the pair's next guess
    waits until its oldest failure leaves the window; guesses being evaluated count as well,
    so connections opened beforehand and used together get no more turns. A guess is never
    refused unevaluated: a correct credential waits at worst, and only behind guesses of the
    same user from the same address. Pairs are kept by digest (a user name is whatever a client
    sent), only while they have failures in the window, and at most MAX_PAIRS of them."""

    MAX_PAIRS = 50_000

    def __init__(self, max_failures: int, window_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.max_failures = max_failures
        self.window_s = window_s
        self.clock = clock
        self._pairs: dict[bytes, _Pair] = {}

    async def turn(self, user: str, address: str) -> bytes | None:
        """Wait until a guess of `user`'s secret from `address` may be evaluated; the key to
        hand to `done` (None: the limit is off)."""
        if self.max_failures <= 0:
            return None
        key = hashlib.sha256(f"{address}\0{user}".encode()).digest()
        pair = self._pairs.get(key)
        if pair is None:
            if len(self._pairs) >= self.MAX_PAIRS:
                self._sweep()
            pair = self._pairs[key] = _Pair()
        pair.waiting += 1
        try:
            while True:
                self._expire(pair)
                if len(pair.failures) + pair.evaluating < self.max_failures:
                    pair.evaluating += 1
                    return key
                pair.changed.clear()
                timeout = pair.failures[0] + self.window_s - self.clock() if pair.failures else None
                try:
                    await asyncio.wait_for(pair.changed.wait(), timeout)
                except TimeoutError:
                    pass
        finally:
            pair.waiting -= 1

    def done(self, key: bytes | None, failed: bool) -> None:
        """The guess `turn` let through was evaluated: `failed` or not."""
        pair = self._pairs.get(key) if key is not None else None
        if pair is None:
            return
        pair.evaluating -= 1
        if failed:
            pair.failures.append(self.clock())
        pair.changed.set()
        if not (pair.failures or pair.evaluating or pair.waiting):
            del self._pairs[key]

    def _expire(self, pair: _Pair) -> None:
        horizon = self.clock() - self.window_s
        while pair.failures and pair.failures[0] <= horizon:
            pair.failures.popleft()

    def _sweep(self) -> None:
        """Forget pairs with nothing in the window; if that is not enough, every idle pair."""
        for key, pair in list(self._pairs.items()):
            self._expire(pair)
            if not (pair.failures or pair.evaluating or pair.waiting):
                del self._pairs[key]
        if len(self._pairs) >= self.MAX_PAIRS:
            for key, pair in list(self._pairs.items()):
                if not (pair.evaluating or pair.waiting):
                    del self._pairs[key]


# --- one connection's authentication -------------------------------------------------------------

SASL_HANDSHAKE, SASL_AUTHENTICATE = 17, 36
_NONE, _ILLEGAL_SASL_STATE, _UNSUPPORTED_SASL_MECHANISM, _SASL_AUTHENTICATION_FAILED = 0, 34, 33, 58


@dataclass(frozen=True, slots=True)
class ListenerSasl:
    """What a SASL listener offers: its mechanisms and their JAAS options, where SCRAM
    credentials come from, and connections.max.reauth.ms."""

    mechanisms: tuple[str, ...]
    options: Mapping[str, Mapping[str, str]]
    scram_credential: Callable[[str, str], ScramCredential | None]  # (mechanism, user)
    max_reauth_ms: int = 0
    # (mechanism, token id) -> the token's credential, owner and expiry (delegation tokens)
    token_credential: Callable[[str, str], tuple[ScramCredential, str, int] | None] = lambda _m, _t: None

    def start(self, mechanism: str) -> Mechanism:
        if mechanism == "PLAIN":
            opts = self.options.get("PLAIN", {})
            return PlainServer({k[5:]: v for k, v in opts.items() if k.startswith("user_")})
        if mechanism in SCRAM_MECHANISMS:
            return ScramServer(mechanism, lambda user: self.scram_credential(mechanism, user),
                               lambda token_id: self.token_credential(mechanism, token_id))
        return OAuthBearerServer(self.options.get("OAUTHBEARER", {}))


class SaslAuthenticator:
    """Kafka's SaslServerAuthenticator for one connection: SaslHandshake picks a mechanism,
    SaslAuthenticate carries its exchange (KIP-152), or after a v0 handshake the tokens come
    as bare size-prefixed frames. A session may be renewed with a new handshake (KIP-368)."""

    def __init__(self, listener: ListenerSasl) -> None:
        self.listener = listener
        self.mechanism: Mechanism | None = None
        self.mechanism_name = ""
        self.raw_tokens = False  # SaslHandshake v0: the next frames are bare tokens
        self.principal: str | None = None  # once authenticated
        self.token_authenticated = False  # with a delegation token: it may not ask for tokens
        self.failed: str | None = None

    def handshake(self, mechanism: str, version: int) -> dict:
        enabled = list(self.listener.mechanisms)
        if self.mechanism is not None and not self.mechanism.complete:
            return {"error_code": _ILLEGAL_SASL_STATE, "mechanisms": enabled}
        if mechanism not in enabled:
            return {"error_code": _UNSUPPORTED_SASL_MECHANISM, "mechanisms": enabled}
        if self.principal is not None and version == 0:
            return {"error_code": _ILLEGAL_SASL_STATE, "mechanisms": enabled}  # KIP-368 needs v1
        self.mechanism, self.mechanism_name = self.listener.start(mechanism), mechanism
        self.raw_tokens = version == 0
        return {"error_code": _NONE, "mechanisms": enabled}

    def step(self, token: bytes) -> bytes:
        """One token of the exchange; raises AuthenticationFailed or SaslProtocolError."""
        if self.mechanism is None or self.mechanism.complete:
            raise SaslProtocolError("SaslAuthenticate without a SaslHandshake before it")
        try:
            reply = self.mechanism.evaluate(token)
        except (AuthenticationFailed, SaslProtocolError):
            raise
        except Exception as e:  # whatever a malformed token trips: a failure like any other
            raise SaslProtocolError(f"malformed {self.mechanism_name} message ({type(e).__name__})") from None
        if self.mechanism.complete:
            if self.principal is not None and self.mechanism.principal != self.principal:
                raise AuthenticationFailed(f"Cannot change principals during re-authentication from "
                                           f"{self.principal}: {self.mechanism.principal}")
            self.principal = self.mechanism.principal
            self.token_authenticated = getattr(self.mechanism, "token_owner", None) is not None
            self.raw_tokens = False
        return reply

    def guess_of(self, token: bytes) -> str | None:
        """The user `token` guesses the secret of (see Mechanism.guess_of)."""
        if self.mechanism is None or self.mechanism.complete:
            return None
        try:
            return self.mechanism.guess_of(token)
        except Exception:  # malformed: evaluating it fails without checking a secret
            return None

    def authenticate(self, auth_bytes: bytes) -> dict:
        """The SaslAuthenticate response for `auth_bytes` (the caller closes after a failure)."""
        try:
            reply = self.step(bytes(auth_bytes))
        except (AuthenticationFailed, SaslProtocolError) as e:
            self.failed = str(e)
            return {"error_code": _SASL_AUTHENTICATION_FAILED, "error_message": str(e), "auth_bytes": b"",
                    "session_lifetime_ms": 0}
        return {"error_code": _NONE, "error_message": None, "auth_bytes": reply,
                "session_lifetime_ms": self.session_lifetime_ms() if self.mechanism.complete else 0}

    def session_lifetime_ms(self) -> int:
        """KIP-368: until the credential expires or connections.max.reauth.ms, whichever is first
        (0: the session does not expire)."""
        limits = [ms for ms in (self.listener.max_reauth_ms, self.mechanism.lifetime_ms) if ms]
        return max(1, min(limits)) if limits else 0


def listener_sasl(setting: Callable[[str], object], listener: str,
                  scram_credential: Callable[[str, str], ScramCredential | None],
                  token_credential: Callable[[str, str], tuple[ScramCredential, str, int] | None]) -> ListenerSasl:
    """A SASL listener's setup from its configs (`setting(key)`: the listener's override or the
    broker's value); ValueError names what is missing or unsupported."""
    enabled = str(setting("sasl.enabled.mechanisms") or "")
    mechanisms = tuple(m.strip().upper() for m in enabled.split(",") if m.strip())
    unsupported = [m for m in mechanisms if m not in SUPPORTED]
    if unsupported or not mechanisms:
        raise ValueError(f"listener {listener}: sasl.enabled.mechanisms={enabled} names mechanisms Strom does "
                         f"not support ({', '.join(unsupported) or 'none given'}); it supports {', '.join(SUPPORTED)}")
    options: dict[str, dict[str, str]] = {}
    for mechanism in mechanisms:
        key = f"{mechanism.lower()}.sasl.jaas.config"
        jaas = setting(key)
        if not jaas:
            # Kafka refuses to start a listener without its mechanism's JAAS entry. SCRAM's
            # entry configures nothing here (credentials are in the metadata store), so only
            # the others are demanded: PLAIN's names the users, and without OAUTHBEARER's any
            # made-up token would be taken.
            if mechanism == "PLAIN":
                raise ValueError(f"listener {listener}: PLAIN needs listener.name.{listener.lower()}.{key} "
                                 'naming its users (user_<name>="<password>")')
            if mechanism == "OAUTHBEARER":
                raise ValueError(f"listener {listener}: OAUTHBEARER needs listener.name.{listener.lower()}.{key} "
                                 "(org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule required;)")
            continue
        try:
            options[mechanism] = parse_jaas(str(jaas))
        except ValueError as e:
            raise ValueError(f"listener {listener}: {key}: {e}") from None
    if "OAUTHBEARER" in mechanisms:
        log.warning("listener %s: OAUTHBEARER takes unsecured tokens (Kafka's unsecured validator): a client "
                    "authenticates as whatever principal its token names; use it for development only",
                    listener)
    return ListenerSasl(mechanisms, options, scram_credential, int(setting("connections.max.reauth.ms") or 0),
                        token_credential)


def broker_security(config: Any) -> ClientSecurity | None:
    """How this broker reaches other brokers' inter-broker listener, authenticating as Kafka's
    brokers do: TLS with the listener's stores, SASL with sasl.mechanism.inter.broker.protocol
    and the `username` / `password` of that mechanism's JAAS line on the listener."""
    listener = config.inter_broker_listener
    protocol = config.protocol_of(listener)
    if protocol == "PLAINTEXT" or not (config["zookeeper.connect"] or config["process.roles"]):
        return None  # an embedded broker's controller talks to it in-process
    get = partial(config.listener_setting, listener)
    context = client_context(get, listener) if protocol in ("SSL", "SASL_SSL") else None
    if not protocol.startswith("SASL_"):
        return ClientSecurity(ssl=context)
    mechanism = str(config["sasl.mechanism.inter.broker.protocol"]).upper()
    if mechanism not in ("PLAIN", *SCRAM_MECHANISMS):
        raise ValueError(f"sasl.mechanism.inter.broker.protocol={mechanism}: brokers authenticate to each other "
                         "with PLAIN or SCRAM-SHA-256/512")
    jaas = get(f"{mechanism.lower()}.sasl.jaas.config")
    options = parse_jaas(str(jaas)) if jaas else {}
    if not options.get("username") or "password" not in options:
        raise ValueError(f"listener {listener} carries traffic between brokers with {mechanism}: its "
                         f"listener.name.{listener.lower()}.{mechanism.lower()}.sasl.jaas.config needs the broker's "
                         "own username and password")
    return ClientSecurity(context, mechanism, options["username"], options["password"])
