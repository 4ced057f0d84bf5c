"""Kafka's keystore and truststore files (ssl.keystore.type / ssl.truststore.type PKCS12 or JKS)
read into the PEM that Python's ssl module loads, so that a Kafka deployment's stores work as
they are.

PKCS12 is read with `cryptography`. JKS, Java's own format, has no maintained Python reader;
what Strom needs of it is small and read here: the entries (a private key with its certificate
chain, or a trusted certificate), the store's integrity digest (SHA-1 over the password, the
words "Mighty Aphrodite" and the store) and Sun's key protection of a private key (an XOR
stream of chained SHA-1 digests of the password and a salt, with a SHA-1 check of the key).
"""

from __future__ import annotations

import hashlib
import hmac
from pathlib import Path

STORE_TYPES = ("PEM", "PKCS12", "JKS")
_JKS_MAGIC, _JCEKS_MAGIC = 0xFEEDFEED, 0xCECECECE
_PRIVATE_KEY, _TRUSTED_CERT = 1, 2
_MAX_STORE_BYTES = 16 << 20


class KeystoreError(ValueError):
    """The store cannot be read: wrong password, damaged, or of another kind."""


def read_keystore(path: str, store_type: str, store_password: str | None,
                  key_password: str | None) -> tuple[str, str]:
    """(private key, certificate chain) of the store's key entry, as PEM."""
    data = _read(path)
    if store_type == "PKCS12":
        key, chain = _pkcs12(data, store_password)
    else:
        keys, _ = _jks(data, store_password, key_password or store_password)
        if not keys:
            raise KeystoreError(f"{path} holds no private key entry")
        if len(keys) > 1:
            raise KeystoreError(f"{path} holds {len(keys)} private keys: Strom takes a store with one")
        key, chain = keys[0]
    if key is None:
        raise KeystoreError(f"{path} holds no private key")
    return _key_pem(key), "".join(_cert_pem(c) for c in chain)


def read_truststore(path: str, store_type: str, password: str | None) -> str:
    """Every certificate of the store, as PEM."""
    data = _read(path)
    if store_type == "PKCS12":
        key, certs = _pkcs12(data, password)
    else:
        keys, certs = _jks(data, password, None)
        certs = certs + [c for _, chain in keys for c in chain[:1]]
    if not certs:
        raise KeystoreError(f"{path} holds no certificate")
    return "".join(_cert_pem(c) for c in certs)


def _read(path: str) -> bytes:
    file = Path(path)
    if file.stat().st_size > _MAX_STORE_BYTES:
        raise KeystoreError(f"{path} is larger than a keystore ({_MAX_STORE_BYTES >> 20} MiB)")
    return file.read_bytes()


# --- PKCS12 -------------------------------------------------------------------------------------

def _pkcs12(data: bytes, password: str | None) -> tuple[bytes | None, list[bytes]]:
    """(PKCS8 DER key or None, DER certificates: the key's own first)."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.serialization import pkcs12

    try:
        store = pkcs12.load_pkcs12(data, password.encode() if password else None)
    except ValueError as e:
        raise KeystoreError(f"not a PKCS12 store, or a wrong password ({e})") from None
    der = serialization.Encoding.DER
    certs = ([store.cert.certificate.public_bytes(der)] if store.cert else []) + [
        c.certificate.public_bytes(der) for c in store.additional_certs]
    key = None if store.key is None else store.key.private_bytes(
        der, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    return key, certs


# --- JKS ----------------------------------------------------------------------------------------

class _Reader:
    def __init__(self, data: bytes) -> None:
        self.data, self.pos = data, 0

    def take(self, n: int) -> bytes:
        if n < 0 or self.pos + n > len(self.data):
            raise KeystoreError("the JKS store is truncated")
        out = self.data[self.pos:self.pos + n]
        self.pos += n
        return out

    def int(self, size: int = 4) -> int:
        return int.from_bytes(self.take(size), "big")

    def utf(self) -> str:
        return self.take(self.int(2)).decode("utf-8", "replace")


def _jks(data: bytes, password: str | None, key_password: str | None
         ) -> tuple[list[tuple[bytes, list[bytes]]], list[bytes]]:
    """([(PKCS8 DER key, DER chain)], [DER trusted certificates]) of a JKS store."""
    r = _Reader(data)
    magic = r.int()
    if magic == _JCEKS_MAGIC:
        raise KeystoreError("a JCEKS store: convert it to PKCS12 (keytool -importkeystore -deststoretype PKCS12)")
    if magic != _JKS_MAGIC:
        raise KeystoreError("not a JKS store (set ssl.keystore.type / ssl.truststore.type to what the file is)")
    version, count = r.int(), r.int()
    if version not in (1, 2):
        raise KeystoreError(f"JKS version {version} is not one Java writes")
    keys: list[tuple[bytes, list[bytes]]] = []
    certs: list[bytes] = []
    for _ in range(count):
        tag = r.int()
        r.utf()  # alias
        r.take(8)  # creation time
        if tag == _PRIVATE_KEY:
            protected = r.take(r.int())
            chain = [_jks_cert(r, version) for _ in range(r.int())]
            if key_password is not None:
                keys.append((_recover_key(protected, key_password), chain))
            else:
                keys.append((b"", chain))
        elif tag == _TRUSTED_CERT:
            certs.append(_jks_cert(r, version))
        else:
            raise KeystoreError(f"a JKS entry of kind {tag}, which Java's JKS does not write")
    if password is not None:
        expected = hashlib.sha1(_utf16(password) + b"Mighty Aphrodite" + data[:r.pos]).digest()
        if not hmac.compare_digest(expected, r.take(20)):
            raise KeystoreError("the store's password is wrong, or the store was altered")
    return keys, certs


def _jks_cert(r: _Reader, version: int) -> bytes:
    if version == 2 and r.utf() != "X.509":
        raise KeystoreError("a certificate that is not X.509")
    return r.take(r.int())


def _recover_key(protected: bytes, password: str) -> bytes:
    """The PKCS8 key inside an EncryptedPrivateKeyInfo of Sun's JKS key protector."""
    blob = _der_octets_of_encrypted_key_info(protected)
    if len(blob) < 41:
        raise KeystoreError("a protected key too short to hold one")
    salt, encrypted, check = blob[:20], blob[20:-20], blob[-20:]
    secret = _utf16(password)
    stream, digest = bytearray(), salt
    while len(stream) < len(encrypted):
        digest = hashlib.sha1(secret + digest).digest()
        stream += digest
    key = bytes(a ^ b for a, b in zip(encrypted, stream, strict=False))
    if not hmac.compare_digest(hashlib.sha1(secret + key).digest(), check):
        raise KeystoreError("the key's password is wrong (ssl.key.password, or ssl.keystore.password)")
    return key


def _der_octets_of_encrypted_key_info(der: bytes) -> bytes:
    """EncryptedPrivateKeyInfo ::= SEQUENCE { AlgorithmIdentifier, OCTET STRING }: the octets."""
    r = _Reader(der)

    def header(expected: int) -> int:
        if r.int(1) != expected:
            raise KeystoreError("a protected key that is not an EncryptedPrivateKeyInfo")
        length = r.int(1)
        if length & 0x80:
            length = r.int(length & 0x7F)
        return length

    header(0x30)
    r.take(header(0x30))  # the algorithm: Sun's key protector, whatever its parameters
    return r.take(header(0x04))


def _utf16(password: str) -> bytes:
    return password.encode("utf-16-be")


# --- PEM ----------------------------------------------------------------------------------------

def _key_pem(pkcs8: bytes) -> str:
    from cryptography.hazmat.primitives import serialization

    try:
        key = serialization.load_der_private_key(pkcs8, password=None)
    except ValueError as e:
        raise KeystoreError(f"the private key does not decode ({e})") from None
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption()).decode()


def _cert_pem(der: bytes) -> str:
    import base64

    body = base64.encodebytes(der).decode().replace("\n", "")
    lines = "\n".join(body[i:i + 64] for i in range(0, len(body), 64))
    return f"-----BEGIN CERTIFICATE-----\n{lines}\n-----END CERTIFICATE-----\n"
