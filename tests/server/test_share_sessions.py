"""ShareSessionCache: KIP-932 share session epochs and the bound on sessions."""

from __future__ import annotations

import pytest

from strom.protocol.errors import ErrorCode, KafkaError
from strom.share.partition_manager import ShareSessionCache


def error_of(call) -> ErrorCode:
    with pytest.raises(KafkaError) as e:
        call()
    return e.value.code


def test_epochs_open_advance_and_close():
    cache = ShareSessionCache(10)
    assert error_of(lambda: cache.begin("g", "m", 1)) == ErrorCode.SHARE_SESSION_NOT_FOUND
    session = cache.begin("g", "m", 0)
    cache.end(session, 0)
    assert error_of(lambda: cache.begin("g", "m", 2)) == ErrorCode.INVALID_SHARE_SESSION_EPOCH
    for epoch in (1, 2, 3):
        cache.end(cache.begin("g", "m", epoch), epoch)
    cache.end(cache.begin("g", "m", -1), -1)  # the final epoch closes it
    assert error_of(lambda: cache.begin("g", "m", 4)) == ErrorCode.SHARE_SESSION_NOT_FOUND


def test_the_limit_makes_room_only_from_members_that_left():
    members = {"a", "b"}
    cache = ShareSessionCache(2, alive=lambda group, member: member in members)
    for m in ("a", "b"):
        cache.end(cache.begin("g", m, 0), 0)
    assert error_of(lambda: cache.begin("g", "c", 0)) == ErrorCode.SHARE_SESSION_LIMIT_REACHED
    members.discard("a")  # a left the group without closing its session
    cache.begin("g", "c", 0)
    assert set(cache.sessions) == {("g", "b"), ("g", "c")}


def test_a_closed_connection_ends_the_sessions_it_opened_and_still_holds():
    cache = ShareSessionCache(10)
    a = cache.begin("g", "m1", 0, "10.0.0.1:5000")
    cache.begin("g", "m2", 0, "10.0.0.1:5000")
    cache.end(cache.begin("g", "m2", -1), -1)  # closed properly: nothing left to end
    cache.begin("g", "m3", 0, "10.0.0.1:5000")
    again = cache.begin("g", "m3", 0, "10.0.0.2:6000")  # reopened on another connection
    assert cache.connection_closed("10.0.0.1:5000") == [a]
    assert set(cache.sessions) == {("g", "m3")} and cache.sessions[("g", "m3")] is again
    assert cache.connection_closed("10.0.0.1:5000") == []
    assert cache.connection_closed("10.0.0.2:6000") == [again] and not cache.sessions
    assert cache.by_connection == {}  # no more bookkeeping than sessions
