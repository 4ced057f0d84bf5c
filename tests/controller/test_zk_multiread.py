"""ZooKeeper's multiRead request and answer, as bytes (no server: see test_store for that)."""

from __future__ import annotations

import struct

import pytest
from kazoo.exceptions import NoAuthError

from strom.controller.zk_multiread import MultiRead, NodeData

HEADER = struct.Struct("!iBi")
STAT = struct.Struct("!qqqqiiiqiiq")


def stat(version: int, czxid: int, owner: int = 0) -> bytes:
    return STAT.pack(czxid, czxid + 1, 0, 0, version, 0, 0, owner, 0, 0, czxid)


def test_request_is_a_get_data_per_path_then_the_end() -> None:
    request = MultiRead(["/a", "/bc"])
    assert request.type == 22
    assert request.serialize() == (
        HEADER.pack(4, 0, -1) + struct.pack("!i", 2) + b"/a" + b"\x00"
        + HEADER.pack(4, 0, -1) + struct.pack("!i", 3) + b"/bc" + b"\x00"
        + HEADER.pack(-1, 1, -1))


def test_answer_keeps_the_order_with_none_for_missing_nodes() -> None:
    answer = (HEADER.pack(4, 0, 0) + struct.pack("!i", 4) + b'{"a"' + stat(3, 70)
              + HEADER.pack(-1, 0, -101) + struct.pack("!i", -101)  # NoNode
              + HEADER.pack(4, 0, 0) + struct.pack("!i", -1) + stat(0, 80, owner=9)  # no data
              + HEADER.pack(-1, 1, -1))
    prefix = b"\xff" * 5  # the reply header kazoo has read already
    nodes = MultiRead(["/x", "/y", "/z"]).deserialize(prefix + answer, len(prefix))
    assert nodes == [NodeData(b'{"a"', 3, 70, 0), None, NodeData(b"", 0, 80, 9)]


def test_other_failures_raise_kazoos_exception() -> None:
    answer = HEADER.pack(-1, 0, -102) + struct.pack("!i", -102) + HEADER.pack(-1, 1, -1)
    with pytest.raises(NoAuthError):
        MultiRead(["/secret"]).deserialize(answer, 0)


def test_an_answer_of_the_wrong_length_is_refused() -> None:
    with pytest.raises(ValueError, match="answered 0 of 1"):
        MultiRead(["/x"]).deserialize(HEADER.pack(-1, 1, -1), 0)
