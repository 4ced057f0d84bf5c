"""The metadata tree in ZooKeeper, laid out as Kafka's ZooKeeper mode lays it out.

`connect` is Kafka's `zookeeper.connect`: hosts, optionally followed by a chroot path
("127.0.0.1:2181,127.0.0.1:2182/strom"). As Kafka does, the chroot node is created if
missing; every path the callers use is then inside it.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

from kazoo.client import KazooClient
from kazoo.exceptions import (
    BadVersionError,
    ConnectionClosedError,
    ConnectionLoss,
    KazooException,
    NoAuthError,
    NodeExistsError,
    NoNodeError,
    NotEmptyError,
    OperationTimeoutError,
    RolledBackError,
    RuntimeInconsistency,
    SessionExpiredError,
    UnimplementedError,
)
from kazoo.handlers.threading import KazooTimeoutError
from kazoo.protocol.states import EventType, KazooState
from kazoo.retry import KazooRetry
from kazoo.security import make_acl, make_digest_acl

from strom.controller import znodes
from strom.controller.store import (
    BadVersion,
    Check,
    Create,
    Delete,
    NodeError,
    NodeExists,
    NoNode,
    NotEmpty,
    Op,
    SetData,
    Stat,
    StoreUnavailable,
    ancestors,
    call_safely,
    check_path,
    decode,
    encode,
)
from strom.controller.zk_multiread import MultiRead, NodeData

log = logging.getLogger(__name__)

_UNAVAILABLE = (ConnectionLoss, SessionExpiredError, ConnectionClosedError, OperationTimeoutError)


def split_connect(connect: str) -> tuple[str, str]:
    """'h1:2181,h2:2181/strom/a' -> ('h1:2181,h2:2181', '/strom/a'); no chroot -> ''."""
    hosts, slash, chroot = connect.partition("/")
    chroot = ("/" + chroot).rstrip("/") if slash else ""
    return hosts, chroot


@contextmanager
def _mapped(path: str) -> Iterator[None]:
    """kazoo's exceptions as the store's."""
    try:
        yield
    except BadVersionError as e:
        raise BadVersion(f"{path}: version mismatch") from e
    except NodeExistsError as e:
        raise NodeExists(path) from e
    except NoNodeError as e:
        raise NoNode(path) from e
    except NotEmptyError as e:
        raise NotEmpty(path) from e
    except _UNAVAILABLE as e:
        raise StoreUnavailable(f"ZooKeeper unavailable ({type(e).__name__}) at {path}") from e


GET_MANY_IN_FLIGHT = 1000  # reads sent before waiting for their answers
# Paths per multiRead: a request far below the server's jute.maxbuffer (1 MiB), and for the
# ~100-byte partition state nodes read most, an answer of ~170 KB.
MULTI_READ_PATHS = 1000
MULTI_READS_IN_FLIGHT = 4
MULTIS_IN_FLIGHT = 8  # transactions of multi_many sent before waiting for the first answer
T = TypeVar("T")
MULTI_PARENT_RACES = 3  # times a multi is sent again after another client made a parent it made


class _ParentMadeMeanwhile(Exception):
    pass

# What only the broker's own ZooKeeper user may read under zookeeper.set.acl (Kafka's
# sensitive root paths: SCRAM credentials, dynamic broker configs with their passwords, tokens).
SENSITIVE_PATHS = (znodes.CONFIG_USERS, znodes.CONFIG_BROKERS, znodes.TOKENS)

class _ZkWatch:
    """A persistent watch over one-shot ZooKeeper watches: each fire re-reads the node and
    re-arms. Unlike kazoo's ChildrenWatch it survives the node being absent (reports [] and
    waits for it to appear), sorts children, and re-reads after a new session."""

    def __init__(self, store: ZooKeeperMetadataStore, path: str, kind: str,
                 callback: Callable[..., None]) -> None:
        self.store, self.path, self.kind, self.callback = store, path, kind, callback
        self.cancelled = False
        self._last: Any = object()  # never equal to a real state, so the first read reports
        self._lock = threading.Lock()
        store._client.add_listener(self._on_state)
        self._refresh()

    def cancel(self) -> None:
        self.cancelled = True
        self.store._client.remove_listener(self._on_state)

    def _on_state(self, state: str) -> None:
        # Runs on kazoo's connection thread, which must not wait on ZooKeeper: re-read elsewhere.
        # After a new session the server has forgotten our watches; after a mere reconnect it
        # has not, and the re-read finds nothing changed.
        if state == KazooState.CONNECTED and not self.cancelled:
            self.store._client.handler.spawn(self._refresh)

    def _on_event(self, event: Any) -> None:
        # kazoo sends NONE events when the connection drops: re-reading then would wait for the
        # connection on kazoo's callback thread; the CONNECTED state re-reads instead.
        if not self.cancelled and event.type != EventType.NONE:
            self._refresh(fired=True)

    def _refresh(self, fired: bool = False) -> None:
        """Re-read and re-arm; report the state if it changed, or after a fire (`fired`) even
        if it reads the same: a child deleted and created again before the re-read (a broker
        whose old session expired and that registered again at once) leaves the same list of
        children, and the controller must still look (at the new registration's epoch)."""
        client, full = self.store._client, self.store._full(self.path)
        with self._lock:
            if self.cancelled:
                return
            try:
                while True:
                    try:
                        if self.kind == "children":
                            state: Any = sorted(client.get_children(full, watch=self._on_event))
                            token: Any = state
                        else:
                            raw, stat = client.get(full, watch=self._on_event)
                            state = (decode(raw), stat.version)
                            token = (stat.czxid, stat.mzxid)
                        break
                    except NoNodeError:
                        # Arm an existence watch; if the node appeared meanwhile, read it.
                        if client.exists(full, watch=self._on_event) is None:
                            # A missing node has no children: the same state as none.
                            state = [] if self.kind == "children" else (None, -1)
                            token = [] if self.kind == "children" else None
                            break
            except (KazooException, KazooTimeoutError) as e:
                # Disconnected: the next CONNECTED state re-reads.
                log.debug("watch on %s not re-armed yet: %r", self.path, e)
                return
            if token == self._last and not (fired and self.kind == "children"):
                return
            self._last = token
            if self.kind == "children":
                call_safely(self.callback, state)
            else:
                call_safely(self.callback, *state)


class ZooKeeperMetadataStore:
    def __init__(self, connect: str, session_timeout_ms: int = 18000,
                 connection_timeout_ms: int = 18000, digest: str | None = None, set_acl: bool = False) -> None:
        """`digest` ("user:password"): authenticate to ZooKeeper with it; `set_acl`
        (zookeeper.set.acl): nodes created are writable by that user only and readable by all,
        except the sensitive ones (credentials, dynamic broker configs, delegation tokens),
        which only it may read, as Kafka's secure ZooKeeper mode has it."""
        self.connect = connect
        hosts, self.chroot = split_connect(connect)
        # Keep reconnecting forever, quickly: after an expired session kazoo starts a new one
        # and callers re-register (the default backoff grows to an hour between attempts).
        retry = KazooRetry(max_tries=None, delay=0.1, backoff=2, max_delay=1.0)
        self._owner_acl = self._public_acl = None
        if set_acl:
            if not digest or ":" not in digest:
                raise StoreUnavailable("zookeeper.set.acl=true needs zookeeper.digest.auth=<user>:<password>")
            user, _, password = digest.partition(":")
            self._owner_acl = [make_digest_acl(user, password, all=True)]
            self._public_acl = [*self._owner_acl, make_acl("world", "anyone", read=True)]
        self._client = KazooClient(hosts=hosts, timeout=session_timeout_ms / 1000, connection_retry=retry,
                                   auth_data=[("digest", digest)] if digest else None,
                                   default_acl=self._public_acl)
        self._connection_timeout = connection_timeout_ms / 1000
        # multiRead goes through kazoo's request queue (KazooClient._call, what its own *_async
        # methods use); until the server says it has none, or if a kazoo has no such queue.
        self._multi_read = callable(getattr(self._client, "_call", None))
        self._connected = threading.Event()
        self._closed = False
        self._session_listeners: list[Callable[[str], None]] = []
        self._events: queue.SimpleQueue[str | None] = queue.SimpleQueue()
        self._lost = False
        self._client.add_listener(self._on_state)
        try:
            self._client.start(timeout=connection_timeout_ms / 1000)
        except KazooTimeoutError:
            raise StoreUnavailable(
                f"cannot connect to ZooKeeper at {connect} within {connection_timeout_ms} ms"
            ) from None
        self._dispatcher = threading.Thread(target=self._dispatch, name="zk-session-events",
                                            daemon=True)
        self._dispatcher.start()
        if self.chroot:
            with self._op(self.chroot):
                self._client.ensure_path(self.chroot)

    def _acl(self, path: str) -> list | None:
        if self._owner_acl is not None and path.startswith(SENSITIVE_PATHS):
            return self._owner_acl
        return self._public_acl

    @contextmanager
    def _op(self, path: str) -> Iterator[None]:
        """One call to ZooKeeper: while disconnected, wait for the connection as long as a
        connection attempt may take, then fail (kazoo alone would wait until it is back, which
        could hold up a broker's shut-down for ever). A connection lost during the call fails
        it: its outcome is then unknown, as with ZooKeeper's ConnectionLoss."""
        if self._closed:
            raise StoreUnavailable(f"metadata store for {self.connect} is closed")
        if not self._connected.wait(self._connection_timeout):
            raise StoreUnavailable(f"no connection to ZooKeeper at {self.connect} within "
                                   f"{self._connection_timeout * 1000:.0f} ms ({path})")
        with _mapped(path):
            yield

    @property
    def session_id(self) -> int:
        return self._client.client_id[0] if self._client.client_id else 0

    def _full(self, path: str) -> str:
        check_path(path)
        if not self.chroot:
            return path
        return self.chroot if path == "/" else self.chroot + path

    def _relative(self, full: str) -> str:
        return full[len(self.chroot):] or "/"

    # --- reads ---

    def get(self, path: str) -> tuple[Any, int] | None:
        found = self.get_stat(path)
        return None if found is None else (found[0], found[1].version)

    def get_stat(self, path: str) -> tuple[Any, Stat] | None:
        with self._op(path):
            try:
                raw, stat = self._client.get(self._full(path))
            except NoNodeError:
                return None
        return decode(raw), Stat(stat.version, stat.czxid, stat.ephemeralOwner)

    def get_many(self, paths: list[str]) -> list[tuple[Any, int] | None]:
        """`get` of many nodes (a failover reads 100,000 partition states): multiRead requests
        of MULTI_READ_PATHS each, or pipelined getData from a ZooKeeper older than 3.6."""
        nodes = self._read_many(paths)
        if nodes is not None:
            return [None if node is None else (decode(node.data), node.version) for node in nodes]

        def read(result: Any) -> tuple[Any, int] | None:
            try:
                raw, stat = result.get()
            except NoNodeError:
                return None
            return decode(raw), stat.version

        return self._pipelined(paths, self._client.get_async, read)

    def _exist_many(self, paths: list[str]) -> list[bool]:
        """Whether each node exists: read in multiRead requests where this client may read
        them all, else asked one by one (pipelined; exists needs no read permission)."""
        try:
            nodes = self._read_many(paths)
        except NoAuthError:
            nodes = None
        if nodes is not None:
            return [node is not None for node in nodes]
        return self._pipelined(paths, self._client.exists_async, lambda result: result.get() is not None)

    def _read_many(self, paths: list[str]) -> list[NodeData | None] | None:
        """The nodes at `paths` (None where none is) through multiRead; None if this ZooKeeper
        has no multiRead (before 3.6), which is then not asked for it again."""
        if not self._multi_read:
            return None
        out: list[NodeData | None] = []
        try:
            for start in range(0, len(paths), MULTI_READ_PATHS * MULTI_READS_IN_FLIGHT):
                chunk = paths[start:start + MULTI_READ_PATHS * MULTI_READS_IN_FLIGHT]
                with self._op(chunk[0]):
                    pending = []
                    for first in range(0, len(chunk), MULTI_READ_PATHS):
                        result = self._client.handler.async_result()
                        request = MultiRead([self._full(p) for p in chunk[first:first + MULTI_READ_PATHS]])
                        self._client._call(request, result)  # kazoo sends any request object
                        pending.append(result)
                    for result in pending:
                        out.extend(result.get())
        except UnimplementedError:
            log.info("ZooKeeper at %s has no multiRead (before 3.6): reading nodes one by one", self.connect)
            self._multi_read = False
            return None
        return out

    def _pipelined(self, paths: list[str], send: Callable[[str], Any], read: Callable[[Any], T]) -> list[T]:
        """read(send(path)) for each path, in order, with up to GET_MANY_IN_FLIGHT requests on
        the wire at once instead of one round trip each."""
        out: list[T] = []
        for start in range(0, len(paths), GET_MANY_IN_FLIGHT):
            chunk = paths[start:start + GET_MANY_IN_FLIGHT]
            with self._op(chunk[0]):
                pending = [send(self._full(path)) for path in chunk]
                out.extend(read(result) for result in pending)
        return out

    def children(self, path: str) -> list[str]:
        with self._op(path):
            try:
                return sorted(self._client.get_children(self._full(path)))
            except NoNodeError:
                return []

    # --- writes ---

    @contextmanager
    def batch(self) -> Iterator[None]:
        # Every ZooKeeper write is durable on its own; there is no file to rewrite once.
        yield

    def create(self, path: str, data: Any = None, *, ephemeral: bool = False,
               sequential: bool = False) -> str:
        with self._op(path):
            created = self._client.create(self._full(path), encode(data), ephemeral=ephemeral,
                                          sequence=sequential, makepath=True, acl=self._acl(path))
        return self._relative(created)

    def set(self, path: str, data: Any, expected_version: int = -1) -> int:
        full, raw = self._full(path), encode(data)
        with self._op(path):
            while True:
                try:
                    return self._client.set(full, raw, version=expected_version).version
                except NoNodeError:
                    if expected_version != -1:
                        raise BadVersion(f"{path}: expected version {expected_version}, "
                                         "found none") from None
                try:
                    self._client.create(full, raw, makepath=True, acl=self._acl(path))
                    return 0
                except NodeExistsError:
                    continue  # created by someone else meanwhile: set it as asked

    def delete(self, path: str, expected_version: int = -1) -> None:
        full = self._full(path)
        with self._op(path):
            if expected_version == -1:
                self._client.delete(full, recursive=True)
                return
            stat = self._client.exists(full)
            if stat is None:
                return
            if stat.version != expected_version:
                raise BadVersion(f"{path}: expected version {expected_version}, "
                                 f"found {stat.version}")
            for child in self._client.get_children(full):
                self._client.delete(f"{full}/{child}", recursive=True)
            try:
                self._client.delete(full, version=expected_version)
            except NoNodeError:
                pass

    def multi(self, ops: list[Op]) -> None:
        # ZooKeeper's multi does not make parents: the missing ones are made in the same
        # transaction, before the nodes under them. Another client making one meanwhile fails
        # the transaction; then it is sent again with the parents missing by then.
        for attempt in range(MULTI_PARENT_RACES + 1):
            try:
                self._commit(ops, self._missing_parents(ops))
                return
            except _ParentMadeMeanwhile:
                if attempt == MULTI_PARENT_RACES:
                    raise NodeExists("a parent of a multi's node, made by another client each time") from None

    def _missing_parents(self, ops: list[Op]) -> dict[int, list[str]]:
        """For each Create of `ops` (by index), the ancestors that neither exist nor are made
        earlier in `ops`, outermost first: asked in one pipelined round of exists, not a
        round trip each (a new topic's 100,000 partition state nodes each need a parent)."""
        made: set[str] = set()
        wanted: dict[str, None] = {}
        for op in ops:
            if isinstance(op, Create):
                for path in ancestors(op.path):
                    if path not in made:
                        wanted[path] = None
                made.add(op.path)
        paths = list(wanted)
        found = self._exist_many(paths)
        absent = {path for path, here in zip(paths, found, strict=True) if not here}
        out: dict[int, list[str]] = {}
        for i, op in enumerate(ops):
            if isinstance(op, Create):
                parents = [path for path in ancestors(op.path) if path in absent]
                absent.difference_update(parents)
                if parents:
                    out[i] = parents
        return out

    def multi_many(self, batches: list[list[Op]]) -> list[NodeError | None]:
        """`multi` of each batch, with up to MULTIS_IN_FLIGHT transactions on the wire at once:
        ZooKeeper applies a session's requests in order, so the outcome is that of one after
        another, without a round trip each (a controller writes 100,000 partition states in 200
        transactions). For each batch, None (applied) or what `multi` would have raised."""
        parents = self._missing_parents([op for ops in batches for op in ops])
        outcomes: list[NodeError | None] = []
        pending: deque[tuple[list[tuple[str, bool]], Any]] = deque()
        raced: list[int] = []

        def settle() -> None:
            sent, result = pending.popleft()
            try:
                with self._op("multi"):
                    self._check_results(sent, result.get())
                outcomes.append(None)
            except _ParentMadeMeanwhile:
                raced.append(len(outcomes))
                outcomes.append(None)
            except NodeError as e:
                outcomes.append(e)

        first = 0
        for ops in batches:
            own = {i - first: parents[i] for i in range(first, first + len(ops)) if i in parents}
            first += len(ops)
            with self._op("multi"):
                pending.append(self._send_transaction(ops, own))
            if len(pending) >= MULTIS_IN_FLIGHT:
                settle()
        while pending:
            settle()
        if raced:
            # Another client made a parent these batches were to make: a failed transaction
            # changed nothing, so it and the ones after it that failed are sent again alone.
            for index in range(raced[0], len(batches)):
                if index in raced or outcomes[index] is not None:
                    try:
                        self.multi(batches[index])
                        outcomes[index] = None
                    except NodeError as e:
                        outcomes[index] = e
        return outcomes

    def _commit(self, ops: list[Op], parents: dict[int, list[str]]) -> None:
        with self._op("multi"):
            sent, result = self._send_transaction(ops, parents)
            self._check_results(sent, result.get())

    def _send_transaction(self, ops: list[Op], parents: dict[int, list[str]]) -> tuple[list[tuple[str, bool]], Any]:
        txn = self._client.transaction()
        sent: list[tuple[str, bool]] = []  # (path, made as a parent) of each op in the transaction
        for i, op in enumerate(ops):
            for path in parents.get(i, ()):
                txn.create(self._full(path), b"")  # as ensure_path makes it: no data, default ACL
                sent.append((path, True))
            full = self._full(op.path)
            if isinstance(op, Create):
                txn.create(full, encode(op.data), ephemeral=op.ephemeral, acl=self._acl(op.path))
            elif isinstance(op, SetData):
                txn.set_data(full, encode(op.data), version=op.version)
            elif isinstance(op, Delete):
                txn.delete(full, version=op.version)
            elif isinstance(op, Check):
                txn.check(full, op.version)
            else:
                raise TypeError(f"not a multi op: {op!r}")
            sent.append((op.path, False))
        return sent, txn.commit_async()

    @staticmethod
    def _check_results(sent: list[tuple[str, bool]], results: list) -> None:
        for (path, parent), result in zip(sent, results, strict=False):
            if isinstance(result, Exception) and not isinstance(
                    result, RolledBackError | RuntimeInconsistency):
                if parent and isinstance(result, NodeExistsError):
                    raise _ParentMadeMeanwhile()
                with _mapped(path):
                    raise result

    # --- watches and sessions ---

    def watch_children(self, path: str, callback: Callable[[list[str]], None]) -> _ZkWatch:
        return _ZkWatch(self, path, "children", callback)

    def watch_data(self, path: str, callback: Callable[[Any, int], None]) -> _ZkWatch:
        return _ZkWatch(self, path, "data", callback)

    def add_session_listener(self, callback: Callable[[str], None]) -> None:
        self._session_listeners.append(callback)

    def _on_state(self, state: str) -> None:
        # kazoo's connection thread: never call ZooKeeper here (it would deadlock). LOST
        # means the session expired (our ephemerals are gone); the next CONNECTED is a new
        # session, which kazoo establishes by itself.
        if state == KazooState.CONNECTED:
            self._connected.set()
        else:
            self._connected.clear()
        if state == KazooState.LOST:
            self._lost = True
            self._events.put("expired")
        elif state == KazooState.CONNECTED and self._lost:
            self._lost = False
            self._events.put("reconnected")

    def _dispatch(self) -> None:
        while (event := self._events.get()) is not None:
            for callback in list(self._session_listeners):
                call_safely(callback, event)

    def close(self) -> None:
        self._closed = True
        self._client.remove_listener(self._on_state)
        try:
            self._client.stop()
            self._client.close()
        finally:
            self._events.put(None)
