"""The metadata stores: the same tree semantics from the local file and from a real ZooKeeper."""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from kazoo.client import KazooClient

from strom.controller.store import (
    BadVersion,
    Check,
    Create,
    Delete,
    LocalMetadataStore,
    NodeExists,
    NoNode,
    SetData,
    StoreUnavailable,
)
from strom.controller.zk_store import ZooKeeperMetadataStore
from strom.testing import wait_for
from strom.zookeeper_server import ZooKeeperServer, zookeeper_available


@pytest.fixture(scope="module")
def zk_server() -> Iterator[ZooKeeperServer]:
    problem = zookeeper_available()
    if problem:
        pytest.fail(f"ZooKeeper cannot run here: {problem}")
    with ZooKeeperServer(fsync=False) as server:
        yield server


class Opener:
    """Opens (and reopens) one store of a kind, so tests can close and come back."""

    def __init__(self, kind: str, tmp_path: Path, zk_server: ZooKeeperServer | None) -> None:
        self.kind = kind
        self.file = tmp_path / "strom-metadata.json"
        self.connect = f"{zk_server.connect}/test-{uuid.uuid4().hex[:8]}" if zk_server else ""
        self.opened: list[Any] = []

    def open(self) -> Any:
        store = (LocalMetadataStore(self.file) if self.kind == "local"
                 else ZooKeeperMetadataStore(self.connect, session_timeout_ms=4000))
        self.opened.append(store)
        return store

    def close_all(self) -> None:
        for store in self.opened:
            store.close()


@pytest.fixture(params=["local", "zookeeper"])
def opener(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Opener]:
    server = request.getfixturevalue("zk_server") if request.param == "zookeeper" else None
    opener = Opener(request.param, tmp_path, server)
    yield opener
    opener.close_all()


@pytest.fixture
def store(opener: Opener) -> Any:
    return opener.open()


def eventually(predicate: Callable[[], bool], what: str, timeout: float = 30.0) -> None:
    wait_for(predicate, timeout, interval=0.01, what=what)


def test_get_set_create_delete_children(store: Any) -> None:
    assert store.get("/brokers/topics/a") is None
    assert store.children("/brokers/topics") == []
    assert store.create("/brokers/topics/b", {"partitions": {"0": [1]}}) == "/brokers/topics/b"
    assert store.set("/brokers/topics/a", {"version": 2}) == 0  # set creates a missing node
    assert store.get("/brokers/topics/a") == ({"version": 2}, 0)
    assert store.get("/brokers") == (None, 0)  # parents are real, empty nodes
    assert store.children("/brokers/topics") == ["a", "b"]
    assert store.children("/brokers") == ["topics"]
    assert store.children("/") == ["brokers"]
    store.create("/brokers/topics/b/partitions/0/state", {"leader": 1})
    store.delete("/brokers/topics/b")  # recursive
    assert store.get("/brokers/topics/b/partitions/0/state") is None
    assert store.children("/brokers/topics") == ["a"]
    store.delete("/no/such/node")  # no error
    store.create("/empty")
    assert store.get("/empty") == (None, 0)


def test_get_many_reads_every_node_in_order(store: Any) -> None:
    with store.batch():
        for i in range(2500):  # more than one pipelined round of reads
            if i % 7:
                store.create(f"/brokers/topics/t/partitions/{i}/state", {"leader": i})
    paths = [f"/brokers/topics/t/partitions/{i}/state" for i in range(2500)]
    got = store.get_many(paths)
    assert got == [None if i % 7 == 0 else ({"leader": i}, 0) for i in range(2500)]
    assert store.get_many([]) == []


def test_get_many_reads_the_same_without_multi_read(zk_server: ZooKeeperServer) -> None:
    """A ZooKeeper before 3.6 has no multiRead: the store falls back to one getData each."""
    store = ZooKeeperMetadataStore(f"{zk_server.connect}/old-{uuid.uuid4().hex[:8]}")
    try:
        store.create("/n/big", "x" * 200_000)
        store.create("/n/empty")
        store.set("/n/twice", 1)
        store.set("/n/twice", 2)
        paths = ["/n/big", "/n/empty", "/n/none", "/n/twice"]
        expected = [("x" * 200_000, 0), (None, 0), None, (2, 1)]
        assert store.get_many(paths) == expected
        store._multi_read = False
        assert store.get_many(paths) == expected
    finally:
        store.close()


def test_a_multi_under_a_parent_it_may_not_read(zk_server: ZooKeeperServer) -> None:
    """A multi's missing parents are found by reading many nodes at once; a parent this client
    may create under but not read (another tool's ACL) is still found to exist."""
    from kazoo.security import make_acl

    chroot = f"/unreadable-{uuid.uuid4().hex[:8]}"
    raw = KazooClient(hosts=zk_server.connect)
    raw.start()
    store = ZooKeeperMetadataStore(f"{zk_server.connect}{chroot}")
    try:
        raw.create(f"{chroot}/locked", b"secret", acl=[make_acl("world", "anyone", create=True)])
        store.multi([Create("/locked/child", {"made": True})])
        assert raw.get(f"{chroot}/locked/child")[0] == b'{"made":true}'
    finally:
        store.close()
        raw.stop()
        raw.close()


def test_values_round_trip(store: Any) -> None:
    for i, value in enumerate([1, "text", [1, 2], {"a": {"b": None}}, True, 2.5, "ünïcode"]):
        store.set(f"/v/{i}", value)
        assert store.get(f"/v/{i}") == (value, 0)


def test_versions_and_bad_version(store: Any) -> None:
    assert store.set("/n", 1) == 0
    assert store.set("/n", 2, expected_version=0) == 1
    with pytest.raises(BadVersion):
        store.set("/n", 3, expected_version=0)
    assert store.get("/n") == (2, 1)
    with pytest.raises(BadVersion):
        store.set("/missing", 1, expected_version=0)
    with pytest.raises(BadVersion):
        store.delete("/n", expected_version=0)
    store.create("/n/child")
    store.delete("/n", expected_version=1)
    assert store.get("/n") is None and store.get("/n/child") is None


def test_create_existing_raises(store: Any) -> None:
    store.create("/controller", {"brokerid": 1})
    with pytest.raises(NodeExists):
        store.create("/controller", {"brokerid": 2})
    assert store.get("/controller") == ({"brokerid": 1}, 0)


def test_multi_applies_all_or_nothing(store: Any) -> None:
    store.set("/controller_epoch", 1)
    store.multi([Check("/controller_epoch", 0), Create("/brokers/topics/t/partitions/0/state", {"leader": 1}),
                 SetData("/controller_epoch", 2, version=0), Create("/admin/delete_topics")])
    assert store.get("/controller_epoch") == (2, 1)
    assert store.get("/brokers/topics/t/partitions/0/state") == ({"leader": 1}, 0)

    failing = [
        ([SetData("/controller_epoch", 3), Create("/x/y", 1), Check("/controller_epoch", 0)], BadVersion),
        ([SetData("/controller_epoch", 3), Create("/x/y", 1), Create("/admin/delete_topics")], NodeExists),
        ([SetData("/controller_epoch", 3), Create("/x/y", 1), SetData("/nothing/here", 1)], NoNode),
        ([SetData("/controller_epoch", 3), Create("/x/y", 1), Delete("/nothing/here")], NoNode),
        ([SetData("/controller_epoch", 3), Delete("/admin/delete_topics", version=7)], BadVersion),
    ]
    for ops, error in failing:
        with pytest.raises(error):
            store.multi(ops)
        assert store.get("/controller_epoch") == (2, 1), ops
        assert store.get("/x/y") is None, ops
        assert store.get("/x") is None, ops  # nor the parent it would have made
        assert store.get("/admin/delete_topics") == (None, 0), ops

    store.multi([Delete("/brokers/topics/t/partitions/0/state"), Delete("/brokers/topics/t/partitions/0")])
    assert store.children("/brokers/topics/t/partitions") == []


def test_multi_many_applies_each_batch_as_its_own_multi(store: Any) -> None:
    """Batches sent together (to ZooKeeper, pipelined): each all or nothing, in order, a failed
    one leaving the others as they would be one after another."""
    store.set("/controller_epoch", 1)
    batches = [[Check("/controller_epoch", 0), Create(f"/brokers/topics/t/partitions/{i}/state", {"leader": i})]
               for i in range(20)]
    batches[7].append(SetData("/nothing/here", 1))  # fails: NoNode
    batches[12] = [Check("/controller_epoch", 5), *batches[12][1:]]  # fails: BadVersion
    # Needs the parents batch 0 makes (/brokers/topics/t/partitions), and batch 3's node.
    batches.append([Create("/brokers/topics/t/partitions/3/state/extra", 1)])
    outcomes = store.multi_many(batches)
    assert [type(o).__name__ if o else None for o in outcomes] == [
        *[None] * 7, "NoNode", *[None] * 4, "BadVersion", *[None] * 8]
    made = sorted(int(i) for i in store.children("/brokers/topics/t/partitions"))
    assert made == [i for i in range(20) if i not in (7, 12)]
    assert store.get("/brokers/topics/t/partitions/3/state/extra") == (1, 0)
    assert store.multi_many([]) == []


def test_multi_many_takes_a_parent_made_meanwhile_as_made(zk_server: ZooKeeperServer) -> None:
    store = ZooKeeperMetadataStore(f"{zk_server.connect}/race-many")
    other = ZooKeeperMetadataStore(f"{zk_server.connect}/race-many")
    found = store._missing_parents

    def missing_then_made(ops: list) -> dict:
        parents = found(ops)
        if not other.get("/t/p"):
            other.create("/t/p", {"by": "other"})
        return parents

    store._missing_parents = missing_then_made
    try:
        outcomes = store.multi_many([[Create(f"/t/p/{i}/state", {"leader": i})] for i in range(3)])
        assert outcomes == [None, None, None]
        assert store.get("/t/p") == ({"by": "other"}, 0)
        assert [store.get(f"/t/p/{i}/state")[0] for i in range(3)] == [{"leader": i} for i in range(3)]
    finally:
        store.close()
        other.close()


def test_sequential_nodes(store: Any) -> None:
    first = store.create("/config/changes/config_change_", {"entity_path": "topics/a"}, sequential=True)
    second = store.create("/config/changes/config_change_", {"entity_path": "topics/b"}, sequential=True)
    assert first == "/config/changes/config_change_0000000000"
    assert second == "/config/changes/config_change_0000000001"
    assert store.children("/config/changes") == ["config_change_0000000000", "config_change_0000000001"]
    assert store.get(second) == ({"entity_path": "topics/b"}, 0)


def test_ephemeral_nodes_end_with_their_session(opener: Opener) -> None:
    store = opener.open()
    store.create("/brokers/ids/1", {"host": "127.0.0.1", "port": 9092}, ephemeral=True)
    store.create("/brokers/seqid")
    data, stat = store.get_stat("/brokers/ids/1")
    assert data == {"host": "127.0.0.1", "port": 9092}
    assert stat.ephemeral_owner != 0
    assert store.get_stat("/brokers/seqid")[1].ephemeral_owner == 0
    store.close()
    again = opener.open()
    assert again.get("/brokers/ids/1") is None
    assert again.get("/brokers/seqid") == (None, 0)
    assert again.children("/brokers/ids") == []


def test_czxid_increases_across_reopen(opener: Opener) -> None:
    store = opener.open()
    store.create("/a")
    store.create("/b", ephemeral=True)
    a, b = store.get_stat("/a")[1].czxid, store.get_stat("/b")[1].czxid
    assert b > a > 0
    store.close()
    again = opener.open()
    assert again.get_stat("/a")[1].czxid == a
    again.create("/b", ephemeral=True)  # a re-registered broker gets a later czxid (its epoch)
    assert again.get_stat("/b")[1].czxid > b


def test_watches_fire_on_changes_until_cancelled(store: Any) -> None:
    seen_children: list[list[str]] = []
    seen_data: list[tuple[Any, int]] = []
    children_watch = store.watch_children("/brokers/ids", seen_children.append)
    data_watch = store.watch_data("/controller", lambda data, version: seen_data.append((data, version)))
    assert seen_children == [[]] and seen_data == [(None, -1)]  # fired at once with the state now

    store.create("/brokers/ids/2", {"port": 2}, ephemeral=True)
    eventually(lambda: seen_children[-1] == ["2"], "children after create")
    store.create("/brokers/ids/1", {"port": 1})
    eventually(lambda: seen_children[-1] == ["1", "2"], "sorted children")
    store.set("/brokers/ids/1", {"port": 11})  # a child's data is not a children change
    store.delete("/brokers/ids/2")
    eventually(lambda: seen_children[-1] == ["1"], "children after delete")
    # A fire may report the state it reads again (see the next test), never a wrong one.
    assert [c for i, c in enumerate(seen_children) if i == 0 or c != seen_children[i - 1]] == [
        [], ["2"], ["1", "2"], ["1"]]

    store.create("/controller", {"brokerid": 1})
    eventually(lambda: seen_data[-1] == ({"brokerid": 1}, 0), "data after create")
    store.set("/controller", {"brokerid": 2})
    eventually(lambda: seen_data[-1] == ({"brokerid": 2}, 1), "data after set")
    store.delete("/controller")
    eventually(lambda: seen_data[-1] == (None, -1), "data after delete")
    assert seen_data == [(None, -1), ({"brokerid": 1}, 0), ({"brokerid": 2}, 1), (None, -1)]

    children_watch.cancel()
    data_watch.cancel()
    store.create("/brokers/ids/3")
    store.create("/controller", {"brokerid": 3})
    # A fresh watch sees the changes, so the old ones have had their chance to fire.
    late: list[list[str]] = []
    store.watch_children("/brokers/ids", late.append)
    eventually(lambda: late[-1:] == [["1", "3"]], "a new watch")
    assert seen_children[-1] == ["1"] and seen_data[-1] == (None, -1)


def test_a_child_deleted_and_created_again_is_reported(store: Any) -> None:
    """A broker whose old session expired and that registered again before the controller
    re-read the children: the list is the same, and the watch must still report it."""
    seen: list[list[str]] = []
    store.watch_children("/brokers/ids", seen.append)
    store.create("/brokers/ids/3", {"port": 3}, ephemeral=True)
    eventually(lambda: seen[-1:] == [["3"]], "children after create")
    reported = len(seen)
    store.multi([Delete("/brokers/ids/3"), Create("/brokers/ids/3", {"port": 33}, ephemeral=True)])
    eventually(lambda: len(seen) > reported, "a report after the delete and create")
    assert seen[-1] == ["3"]


def test_failing_callback_does_not_break_watches(store: Any) -> None:
    calls: list[list[str]] = []

    def explode(children: list[str]) -> None:
        calls.append(children)
        raise RuntimeError("callback bug")

    store.watch_children("/w", explode)
    store.create("/w/a")
    eventually(lambda: calls[-1] == ["a"], "first change")
    store.create("/w/b")
    eventually(lambda: calls[-1] == ["a", "b"], "second change after a failing callback")


def test_local_store_is_thread_safe(tmp_path: Path) -> None:
    store = LocalMetadataStore(tmp_path / "meta.json")
    store.set("/counter", 0)

    def bump() -> None:
        for _ in range(50):
            while True:
                value, version = store.get("/counter")
                try:
                    store.set("/counter", value + 1, expected_version=version)
                    break
                except BadVersion:
                    continue

    threads = [threading.Thread(target=bump) for _ in range(4)]
    with store.batch():  # and cheap: one file write at the end
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert store.get("/counter") == (200, 200)
    assert LocalMetadataStore(tmp_path / "meta.json").get("/counter") == (200, 200)


def test_local_store_loads_the_old_file_format(tmp_path: Path) -> None:
    path = tmp_path / "strom-metadata.json"
    old = {"/brokers/topics/a": {"data": {"version": 2, "partitions": {"0": [1]}}, "version": 3},
           "/config/topics/a": {"data": {"version": 1, "config": {}}, "version": 0},
           "/latest_producer_id_block": {"data": {"block_end": 999}, "version": 5}}
    path.write_text(json.dumps(old, separators=(",", ":")))
    store = LocalMetadataStore(path)
    assert store.get("/brokers/topics/a") == ({"version": 2, "partitions": {"0": [1]}}, 3)
    assert store.children("/brokers/topics") == ["a"]
    assert store.children("/") == ["brokers", "config", "latest_producer_id_block"]
    assert store.set("/latest_producer_id_block", {"block_end": 1999}, expected_version=5) == 6
    created = store.create("/brokers/topics/b", {"version": 2})
    assert store.get_stat(created)[1].czxid > store.get_stat("/brokers/topics/a")[1].czxid
    # Closed, the new file still reads as the old format does: path -> {"data", "version"}.
    store.close()
    saved = json.loads(path.read_text())
    for node, value in old.items():
        if node != "/latest_producer_id_block":
            assert (saved[node]["data"], saved[node]["version"]) == (value["data"], value["version"])
    assert saved["/latest_producer_id_block"]["version"] == 6
    reopened = LocalMetadataStore(path)
    assert reopened.children("/brokers/topics") == ["a", "b"]
    assert reopened.get_stat("/brokers/topics/b")[1].czxid == store.get_stat(created)[1].czxid


# --- ZooKeeper only ---


def test_nodes_hold_the_json_kafka_writes(zk_server: ZooKeeperServer) -> None:
    store = ZooKeeperMetadataStore(f"{zk_server.connect}/bytes")
    raw = KazooClient(hosts=zk_server.connect)
    raw.start()
    try:
        store.set("/controller_epoch", 1)
        store.create("/controller", {"version": 1, "brokerid": 1, "timestamp": "1700000000000"})
        store.create("/brokers/seqid")
        assert raw.get("/bytes/controller_epoch")[0] == b"1"
        assert raw.get("/bytes/controller")[0] == b'{"version":1,"brokerid":1,"timestamp":"1700000000000"}'
        assert raw.get("/bytes/brokers/seqid")[0] == b""
    finally:
        raw.stop()
        raw.close()
        store.close()


def test_chroots_are_isolated(zk_server: ZooKeeperServer) -> None:
    one = ZooKeeperMetadataStore(f"{zk_server.connect}/iso/one")
    two = ZooKeeperMetadataStore(f"{zk_server.connect}/iso/two")
    try:
        one.create("/brokers/ids/1", {"port": 1}, ephemeral=True)
        two.create("/brokers/ids/2", {"port": 2}, ephemeral=True)
        assert one.children("/brokers/ids") == ["1"]
        assert two.children("/brokers/ids") == ["2"]
        assert one.children("/") == ["brokers"]
        assert one.create("/s/n-", sequential=True) == "/s/n-0000000000"  # paths come back relative
    finally:
        one.close()
        two.close()


def test_a_parent_made_by_another_client_during_a_multi_is_taken_as_made(zk_server: ZooKeeperServer) -> None:
    """The multi finds /t/p missing and makes it in its transaction; another client makes it
    first, failing the transaction: it is sent again without it, not failed."""
    store = ZooKeeperMetadataStore(f"{zk_server.connect}/race")
    other = ZooKeeperMetadataStore(f"{zk_server.connect}/race")
    found = store._missing_parents
    raced: list[dict] = []

    def missing_then_made(ops: list) -> dict:
        parents = found(ops)
        if not raced:
            raced.append(parents)
            other.create("/t/p", {"by": "other"})
        return parents

    store._missing_parents = missing_then_made
    try:
        store.multi([Create("/t/p/0/state", {"leader": 1}), Create("/t/p/1/state", {"leader": 2})])
        assert raced == [{0: ["/t", "/t/p", "/t/p/0"], 1: ["/t/p/1"]}]
        assert store.get("/t/p") == ({"by": "other"}, 0)
        assert [store.get(f"/t/p/{i}/state")[0] for i in (0, 1)] == [{"leader": 1}, {"leader": 2}]
    finally:
        store.close()
        other.close()


def test_unreachable_zookeeper_is_a_clear_error() -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    # The message names the bound that ended the wait (a hang would trip the test's timeout).
    with pytest.raises(StoreUnavailable, match=f"127.0.0.1:{port}/strom within 500 ms"):
        ZooKeeperMetadataStore(f"127.0.0.1:{port}/strom", connection_timeout_ms=500)


def test_session_expiry_then_new_session(zk_server: ZooKeeperServer) -> None:
    store = ZooKeeperMetadataStore(f"{zk_server.connect}/expiry", session_timeout_ms=2000)
    events: list[str] = []
    store.add_session_listener(events.append)
    seen: list[list[str]] = []
    store.watch_children("/brokers/ids", seen.append)
    try:
        store.create("/brokers/ids/1", {"port": 1}, ephemeral=True)
        eventually(lambda: seen[-1] == ["1"], "registration seen")
        old_session = store.session_id
        # Expire the session the way ZooKeeper's own tests do: another client attaches to it
        # and closes it.
        session_id, password = store._client.client_id
        thief = KazooClient(hosts=zk_server.connect, client_id=(session_id, password))
        thief.start()
        thief.stop()
        thief.close()
        eventually(lambda: events == ["expired", "reconnected"], "expired then reconnected")
        assert store.session_id != old_session
        assert store.get("/brokers/ids/1") is None  # the ephemeral went with the session
        eventually(lambda: seen[-1] == [], "watch sees the ephemeral gone")
        # The store works in the new session and the watch was re-armed in it.
        store.create("/brokers/ids/1", {"port": 1}, ephemeral=True)
        eventually(lambda: seen[-1] == ["1"], "re-registration seen")
        assert store.get_stat("/brokers/ids/1")[1].ephemeral_owner == store.session_id
    finally:
        store.close()


def test_calls_fail_while_zookeeper_is_down_and_work_when_it_is_back(zk_server: ZooKeeperServer) -> None:
    with ZooKeeperServer(fsync=False) as own:
        store = ZooKeeperMetadataStore(f"{own.connect}/down", session_timeout_ms=10000,
                                       connection_timeout_ms=500)
        try:
            # A persistent node: the session may not outlive the outage. A client that connects
            # in the instant the restarted ZooKeeper listens but does not yet serve gets no
            # answer (ZooKeeper fails to close that connection) until its connect timeout, a
            # session timeout, and ZooKeeper then expires the session it restored.
            store.create("/config/topics/t", {"version": 1})
            own.kill()
            # Either the client has noticed the loss (the call waits for a connection) or the
            # call went out on the dead socket: both are the store being unavailable.
            with pytest.raises(StoreUnavailable, match="within 500 ms|ConnectionLoss"):
                store.get("/config/topics/t")
            own.start()  # the same port and data
            eventually(lambda: store._connected.is_set(), "reconnected")
            assert store.get("/config/topics/t") == ({"version": 1}, 0)
        finally:
            store.close()


def test_local_store_journals_each_change_and_drops_a_torn_last_one(tmp_path: Path) -> None:
    path = tmp_path / "strom-metadata.json"
    store = LocalMetadataStore(path)
    store.create("/brokers/topics/a", {"partitions": {"0": [1]}})
    with store.batch():
        for i in range(100):
            store.create(f"/brokers/topics/a/partitions/{i}/state", {"leader": 1})
    store.set("/brokers/topics/a", {"partitions": {"0": [1], "1": [1]}})
    journal = path.with_name(path.name + ".journal")
    lines = journal.read_bytes().split(b"\n")
    assert len(lines) == 4 and lines[-1] == b""  # one line per change, a batch is one line
    assert not path.exists()  # nothing rewritten yet: the journal is the record
    # A crash in the middle of writing a fourth change: that change was never acknowledged.
    with open(journal, "ab") as f:
        f.write(b'{"n":{"/brokers/topics/b":{"data":1,')
    reopened = LocalMetadataStore(path)
    assert reopened.get("/brokers/topics/a") == ({"partitions": {"0": [1], "1": [1]}}, 1)
    assert len(reopened.children("/brokers/topics/a/partitions")) == 100
    assert reopened.get("/brokers/topics/b") is None
    assert journal.read_bytes().endswith(b"\n")  # the torn tail is cut off
    # New changes after the repair are read back too.
    reopened.set("/brokers/topics/a", {"partitions": {}})
    assert LocalMetadataStore(path).get("/brokers/topics/a") == ({"partitions": {}}, 2)


def test_local_store_compacts_the_journal_into_the_snapshot(tmp_path: Path) -> None:
    path = tmp_path / "strom-metadata.json"
    store = LocalMetadataStore(path)
    big = "x" * 4096
    for i in range(400):  # ~1.6 MB of changes: past the journal's minimum size
        store.set("/config/topics/t", {"i": i, "pad": big})
    journal = path.with_name(path.name + ".journal")
    assert path.exists() and journal.stat().st_size < 1 << 20
    assert LocalMetadataStore(path).get("/config/topics/t")[0]["i"] == 399
