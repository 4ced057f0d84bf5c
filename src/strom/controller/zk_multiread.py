"""ZooKeeper's multiRead (opcode 22, ZooKeeper 3.6 and later): many getData in one request.

A new controller reads the state node of every partition. One getData each costs the client
~150 us of Python (an async result, a wake-up of kazoo's connection thread, a reply header),
15 s for 100,000 partitions; one multiRead of 1,000 paths is one request and one reply.

kazoo has no multiRead, but it sends any request object with `type`, `serialize()` and
`deserialize(buffer, offset)` through its connection (`KazooClient._call`): this module is
that object. Layout (ZooKeeper's MultiOperationRecord / MultiResponse): each operation is a
header (type int, done bool, err int) and its body; a header with done set ends the list. A
getData answer is the data (int length, -1 for none, then bytes) and a Stat; a failed one is
a header of type -1 and the error code.
"""

from __future__ import annotations

import struct
from typing import Any, NamedTuple

from kazoo.exceptions import EXCEPTIONS, NoNodeError

MULTI_READ = 22
GET_DATA = 4
ERROR = -1

_HEADER = struct.Struct("!iBi")
_INT = struct.Struct("!i")
# czxid, mzxid, ctime, mtime, version, cversion, aversion, ephemeralOwner, dataLength,
# numChildren, pzxid
_STAT = struct.Struct("!qqqqiiiqiiq")
_END = _HEADER.pack(-1, 1, -1)


class NodeData(NamedTuple):
    data: bytes
    version: int
    czxid: int
    ephemeral_owner: int


class MultiRead(NamedTuple):
    """getData of every path, without watches; the answer is a list in the same order, None
    where the node does not exist. Any other failure raises kazoo's exception for it."""

    paths: list[str]
    type: int = MULTI_READ

    def serialize(self) -> bytes:
        out = bytearray()
        for path in self.paths:
            encoded = path.encode()
            out += _HEADER.pack(GET_DATA, 0, -1)
            out += _INT.pack(len(encoded)) + encoded + b"\x00"
        return bytes(out + _END)

    def deserialize(self, buffer: Any, offset: int) -> list[NodeData | None]:
        results: list[NodeData | None] = []
        while True:
            kind, done, err = _HEADER.unpack_from(buffer, offset)
            offset += _HEADER.size
            if done:
                break
            if kind == ERROR:
                code = _INT.unpack_from(buffer, offset)[0]
                offset += _INT.size
                if code != NoNodeError.code:
                    raise EXCEPTIONS[code]()
                results.append(None)
                continue
            length = _INT.unpack_from(buffer, offset)[0]
            offset += _INT.size
            data = bytes(buffer[offset:offset + length]) if length > 0 else b""
            offset += max(length, 0)
            stat = _STAT.unpack_from(buffer, offset)
            offset += _STAT.size
            results.append(NodeData(data, stat[4], stat[0], stat[7]))
        if len(results) != len(self.paths):
            raise ValueError(f"multiRead answered {len(results)} of {len(self.paths)} reads")
        return results
