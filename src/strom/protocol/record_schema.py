"""Readers and writers of the key and value schemas Kafka keeps in its internal topics
(`__consumer_offsets`, `__transaction_state`, `__share_group_state`, `__remote_log_metadata`):
Kafka's plain big-endian encoding, and its flexible versions (compact lengths, tagged fields).
"""

from __future__ import annotations

import struct
import uuid

from strom.protocol.varint import VarintError, read_uvarint, write_uvarint

_I8, _I16, _I32, _I64 = struct.Struct(">b"), struct.Struct(">h"), struct.Struct(">i"), struct.Struct(">q")


class RecordFormatError(ValueError):
    """A key or value that does not parse as the version it claims."""


class Writer:
    """Non-flexible encoding (what Kafka 3.x writes), or with `flexible` compact lengths."""

    def __init__(self, flexible: bool = False) -> None:
        self.buf = bytearray()
        self.flexible = flexible

    def _length(self, n: int, wide: bool) -> Writer:
        if self.flexible:
            self.buf += write_uvarint(n + 1)
            return self
        return self.int32(n) if wide else self.int16(n)

    def array_length(self, n: int) -> Writer:
        return self._length(n, wide=True)

    def tagged_fields(self, fields: dict[int, bytes] | None = None) -> Writer:
        """The tagged-field section of a flexible struct: tag order, each value pre-encoded."""
        fields = fields or {}
        self.buf += write_uvarint(len(fields))
        for tag in sorted(fields):
            self.buf += write_uvarint(tag) + write_uvarint(len(fields[tag])) + fields[tag]
        return self

    def int8(self, v: int) -> Writer:
        self.buf += _I8.pack(v)
        return self

    def int16(self, v: int) -> Writer:
        self.buf += _I16.pack(v)
        return self

    def int32(self, v: int) -> Writer:
        self.buf += _I32.pack(v)
        return self

    def int64(self, v: int) -> Writer:
        self.buf += _I64.pack(v)
        return self

    def uvarint(self, v: int) -> Writer:
        self.buf += write_uvarint(v)
        return self

    def uuid(self, v: uuid.UUID) -> Writer:
        self.buf += v.bytes
        return self

    def string(self, v: str | None) -> Writer:
        data = None if v is None else v.encode()
        self._length(-1 if data is None else len(data), wide=False)
        self.buf += data or b""
        return self

    def bytes_(self, v: bytes | None) -> Writer:
        self._length(-1 if v is None else len(v), wide=True)
        self.buf += v or b""
        return self


class Reader:
    def __init__(self, buf: bytes, flexible: bool = False) -> None:
        self.buf = memoryview(buf)
        self.pos = 0
        self.flexible = flexible

    def _take(self, n: int) -> memoryview:
        if n < 0 or self.pos + n > len(self.buf):
            raise RecordFormatError("record ends early")
        out = self.buf[self.pos : self.pos + n]
        self.pos += n
        return out

    def int8(self) -> int:
        return _I8.unpack(self._take(1))[0]

    def int16(self) -> int:
        return _I16.unpack(self._take(2))[0]

    def int32(self) -> int:
        return _I32.unpack(self._take(4))[0]

    def int64(self) -> int:
        return _I64.unpack(self._take(8))[0]

    def uuid(self) -> uuid.UUID:
        return uuid.UUID(bytes=bytes(self._take(16)))

    def uvarint(self) -> int:
        try:
            value, self.pos = read_uvarint(self.buf, self.pos)
        except VarintError as e:
            raise RecordFormatError(str(e)) from None
        return value

    def _length(self, wide: bool) -> int:
        if self.flexible:
            return self.uvarint() - 1
        return self.int32() if wide else self.int16()

    def string(self) -> str | None:
        n = self._length(wide=False)
        return None if n < 0 else bytes(self._take(n)).decode("utf-8", "replace")

    def bytes_(self) -> bytes | None:
        n = self._length(wide=True)
        return None if n < 0 else bytes(self._take(n))

    def array_length(self) -> int:
        return self._length(wide=True)

    def tagged_fields(self) -> dict[int, memoryview]:
        """Skip a tagged-field section, returning the raw value of each tag (empty when not
        flexible)."""
        if not self.flexible:
            return {}
        fields = {}
        for _ in range(self.uvarint()):
            tag = self.uvarint()
            fields[tag] = self._take(self.uvarint())  # RecordFormatError past the end
        return fields
