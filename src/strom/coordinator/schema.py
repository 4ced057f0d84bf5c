"""Readers and writers of the key and value schemas that coordinators keep in their internal
topics (`__consumer_offsets`, `__transaction_state`): Kafka's plain big-endian encoding, and
for reading its flexible versions (compact lengths, tagged fields) as well.
"""

from __future__ import annotations

import struct

from strom.protocol.varint import VarintError, read_uvarint, skip_tagged_fields

_I8, _I16, _I32, _I64 = struct.Struct(">b"), struct.Struct(">h"), struct.Struct(">i"), struct.Struct(">q")


class RecordFormatError(ValueError):
    """A key or value that does not parse as the version it claims."""


class Writer:
    """Non-flexible encoding: what Kafka 3.x writes."""

    def __init__(self) -> None:
        self.buf = bytearray()

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

    def string(self, v: str | None) -> Writer:
        if v is None:
            return self.int16(-1)
        data = v.encode()
        self.int16(len(data))
        self.buf += data
        return self

    def bytes_(self, v: bytes | None) -> Writer:
        if v is None:
            return self.int32(-1)
        self.int32(len(v))
        self.buf += v
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

    def tagged_fields(self) -> None:
        if self.flexible:
            try:
                self.pos = skip_tagged_fields(self.buf, self.pos)
            except VarintError as e:
                raise RecordFormatError(str(e)) from None
