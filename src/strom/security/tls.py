"""TLS for SSL listeners: Kafka's `ssl.*` broker configs turned into an `ssl.SSLContext`, and
the principal a client certificate names.

Keystores and truststores are PEM (`ssl.keystore.type=PEM`), as files
(`ssl.keystore.location`: private key and certificate chain in one file;
`ssl.truststore.location`: CA certificates) or inline (`ssl.keystore.certificate.chain` with
`ssl.keystore.key`, `ssl.truststore.certificates`), or Kafka's PKCS12 and JKS store files with
their passwords (`ssl.keystore.password`, `ssl.key.password`, `ssl.truststore.password`), read
into PEM in memory (strom.security.keystores). `listener.name.<listener>.ssl.*` overrides the
broker-wide value for one listener, as in Kafka.
"""

from __future__ import annotations

import logging
import os
import ssl
import tempfile
from collections.abc import Callable
from typing import Any

from strom.security.keystores import STORE_TYPES, KeystoreError, read_keystore, read_truststore

log = logging.getLogger(__name__)

ANONYMOUS = "User:ANONYMOUS"
_VERSIONS = {"TLSv1.2": ssl.TLSVersion.TLSv1_2, "TLSv1.3": ssl.TLSVersion.TLSv1_3}
# Names Kafka (Java) knows for protocols too old to offer: dropped from ssl.enabled.protocols.
_OLD_VERSIONS = frozenset({"TLSv1", "TLSv1.1", "SSLv3", "SSLv2", "SSLv2Hello"})
_warned: set[tuple[str, tuple[str, ...]]] = set()
_CLIENT_AUTH = {"none": ssl.CERT_NONE, "requested": ssl.CERT_OPTIONAL, "required": ssl.CERT_REQUIRED}
# RFC 2253 short names of the attributes Python reports by their long names.
_RDN_NAMES = {"commonName": "CN", "organizationName": "O", "organizationalUnitName": "OU",
              "countryName": "C", "stateOrProvinceName": "ST", "localityName": "L",
              "streetAddress": "STREET", "domainComponent": "DC", "userId": "UID"}


class TlsConfigError(ValueError):
    pass


def server_context(get: Callable[[str], Any], listener: str) -> ssl.SSLContext:
    """The context of SSL listener `listener`; `get(key)` answers `ssl.*` keys with the
    listener's override or the broker's value."""
    for kind, inline in (("keystore", "ssl.keystore.certificate.chain"), ("truststore", "ssl.truststore.certificates")):
        store_type = (get(f"ssl.{kind}.type") or "").upper()
        if get(inline) and store_type != "PEM":
            raise TlsConfigError(f"listener {listener}: {inline} is PEM: set ssl.{kind}.type=PEM")
        if get(f"ssl.{kind}.location") and store_type not in STORE_TYPES:
            raise TlsConfigError(f"listener {listener}: ssl.{kind}.type={store_type} is not supported; "
                                 f"Strom reads {', '.join(STORE_TYPES)} {kind}s")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    _load_keystore(context, get, listener)
    _limit_versions(context, get("ssl.enabled.protocols"), listener)
    suites = [s.strip() for s in (get("ssl.cipher.suites") or "").split(",") if s.strip()]
    if suites:
        try:
            context.set_ciphers(":".join(suites))
        except ssl.SSLError:
            raise TlsConfigError(f"listener {listener}: none of ssl.cipher.suites={','.join(suites)} "
                                 "is a cipher suite OpenSSL knows (use OpenSSL's names)") from None
    auth = get("ssl.client.auth") or "none"
    context.verify_mode = _CLIENT_AUTH[auth]
    trusted = _load_truststore(context, get, listener)
    if auth != "none" and not trusted:
        raise TlsConfigError(f"listener {listener}: ssl.client.auth={auth} needs a truststore "
                             "(ssl.truststore.location or ssl.truststore.certificates)")
    return context


def client_context(get: Callable[[str], Any], listener: str) -> ssl.SSLContext:
    """What a broker connects to listener `listener` of other brokers with: their certificates
    checked against the truststore (and their host name, unless
    ssl.endpoint.identification.algorithm is empty), its own certificate shown if it has one."""
    if not (get("ssl.truststore.location") or get("ssl.truststore.certificates")):
        raise TlsConfigError(f"listener {listener} carries traffic between brokers over TLS: it needs a "
                             "truststore (ssl.truststore.location or ssl.truststore.certificates) to check them")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = bool(get("ssl.endpoint.identification.algorithm"))
    _load_truststore(context, get, listener)
    _limit_versions(context, get("ssl.enabled.protocols"), listener)
    if get("ssl.keystore.location") or get("ssl.keystore.certificate.chain"):
        _load_keystore(context, get, listener)
    return context


def _load_keystore(context: ssl.SSLContext, get: Callable[[str], Any], listener: str) -> None:
    location, chain, key = get("ssl.keystore.location"), get("ssl.keystore.certificate.chain"), get("ssl.keystore.key")
    password = get("ssl.key.password") or get("ssl.keystore.password")
    store_type = (get("ssl.keystore.type") or "PEM").upper()
    try:
        if location and store_type != "PEM":
            key_pem, chain_pem = read_keystore(location, store_type, get("ssl.keystore.password"),
                                               get("ssl.key.password"))
            _load_inline_chain(context, chain_pem, key_pem, None)
        elif location:
            context.load_cert_chain(location, password=password)
        elif chain and key:
            _load_inline_chain(context, chain, key, password)
        else:
            raise TlsConfigError(f"listener {listener} is SSL but has no certificate: set "
                                 "ssl.keystore.location, or ssl.keystore.certificate.chain and ssl.keystore.key")
    except (OSError, ssl.SSLError, KeystoreError) as e:
        raise TlsConfigError(f"listener {listener}: cannot load its certificate and key: {_explained(e)}") from None


def _load_inline_chain(context: ssl.SSLContext, chain: str, key: str, password: str | None) -> None:
    # load_cert_chain reads files only: a private temporary file holds them for the call.
    fd, path = tempfile.mkstemp(prefix="strom-keystore-", suffix=".pem")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(_pem(key) + _pem(chain))
        context.load_cert_chain(path, password=password)
    finally:
        os.unlink(path)


def _load_truststore(context: ssl.SSLContext, get: Callable[[str], Any], listener: str) -> bool:
    location, inline = get("ssl.truststore.location"), get("ssl.truststore.certificates")
    store_type = (get("ssl.truststore.type") or "PEM").upper()
    try:
        if location and store_type != "PEM":
            context.load_verify_locations(cadata=read_truststore(location, store_type, get("ssl.truststore.password")))
        elif location:
            context.load_verify_locations(cafile=location)
        elif inline:
            context.load_verify_locations(cadata=_pem(inline))
        else:
            return False
    except (OSError, ssl.SSLError, KeystoreError) as e:
        raise TlsConfigError(f"listener {listener}: cannot load its truststore: {_explained(e)}") from None
    return True


def _explained(e: Exception) -> str:
    """OpenSSL's reason, with what to do where it is cryptic."""
    text = str(e)
    if "CA_MD_TOO_WEAK" in text or "EE_KEY_TOO_SMALL" in text or "CA_KEY_TOO_SMALL" in text:
        text += (" (a certificate is signed with SHA-1 or MD5, or its key is too small, which OpenSSL refuses at "
                 "its security level: re-issue it signed with SHA-256 and a 2048-bit or larger key, e.g. keytool "
                 "-sigalg SHA256withRSA -keysize 2048, or openssl x509 -sha256)")
    return text


def _pem(text: str) -> str:
    """Inline PEM as properties files carry it: maybe on one line, with escaped newlines."""
    text = text.replace("\\n", "\n").strip()
    for marker in ("-----BEGIN ", "-----END "):
        text = text.replace(f" {marker}", f"\n{marker}")
    return text + "\n"


def _limit_versions(context: ssl.SSLContext, enabled: str | None, listener: str) -> None:
    names = [v.strip() for v in (enabled or "TLSv1.2,TLSv1.3").split(",") if v.strip()]
    unknown = [n for n in names if n not in _VERSIONS and n not in _OLD_VERSIONS]
    if unknown or not names:
        raise TlsConfigError(f"listener {listener}: ssl.enabled.protocols may hold TLSv1.2 and TLSv1.3, "
                             f"not {','.join(unknown) or 'nothing'}")
    old = [n for n in names if n in _OLD_VERSIONS]
    offered = [n for n in names if n in _VERSIONS]
    if not offered:
        raise TlsConfigError(f"listener {listener}: ssl.enabled.protocols={','.join(names)} names only "
                             "protocols Strom does not offer (they are broken); enable TLSv1.2 or TLSv1.3")
    if old and (listener, tuple(old)) not in _warned:
        # Many real configs list the old protocols next to TLSv1.2 (Kafka's default before 2.x):
        # the broker starts with the safe ones, saying so once.
        _warned.add((listener, tuple(old)))
        log.warning("listener %s: ssl.enabled.protocols names %s, which Strom does not offer (insecure); "
                    "offering %s only", listener, ", ".join(old), ", ".join(offered))
    versions = sorted(_VERSIONS[n] for n in offered)
    context.minimum_version, context.maximum_version = versions[0], versions[-1]


def principal(peercert: dict | None) -> str:
    """Kafka's default principal for a TLS client: `User:` and the certificate's subject as an
    RFC 2253 distinguished name (most specific part first), or ANONYMOUS without one."""
    if not peercert or not peercert.get("subject"):
        return ANONYMOUS
    parts = []
    for rdn in reversed(peercert["subject"]):
        parts.append("+".join(f"{_RDN_NAMES.get(k, k)}={_escape(v)}" for k, v in rdn))
    return "User:" + ",".join(parts)


def _escape(value: str) -> str:
    out = "".join(f"\\{c}" if c in ',+"\\<>;=' else c for c in value)
    if out.startswith(("#", " ")):
        out = "\\" + out
    return out[:-1] + "\\ " if out.endswith(" ") else out
