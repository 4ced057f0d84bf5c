"""Where cluster metadata lives: a tree of JSON nodes with versions, shaped like ZooKeeper's.

The controller reads and writes paths such as `/brokers/topics/<topic>` and
`/config/topics/<topic>` with conditional updates by version, exactly as it would against
ZooKeeper. Two stores implement `MetadataStore`: `LocalMetadataStore` keeps the tree in one
file for the embedded single broker; `ZooKeeperMetadataStore` (zk_store.py) keeps it in
ZooKeeper for clusters, in the layout Kafka's ZooKeeper mode writes.
"""

from __future__ import annotations

import json
import logging
import os
import random
import threading
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

log = logging.getLogger(__name__)


class NodeError(Exception):
    """A call failed because of its nodes (not because the store is unreachable)."""


class BadVersion(NodeError):
    pass


class NodeExists(NodeError):
    pass


class NoNode(NodeError):
    pass


class NotEmpty(NodeError):
    """A non-recursive delete (Delete in multi) of a node that has children."""


class StoreUnavailable(Exception):
    """The store cannot be reached (ZooKeeper down or the session lost mid-call)."""


@dataclass(frozen=True)
class Stat:
    version: int
    czxid: int
    ephemeral_owner: int  # the owning session's id; 0 for a persistent node


# Operations for multi(): applied all together or not at all.
@dataclass
class Create:
    path: str
    data: Any = None
    ephemeral: bool = False


@dataclass
class SetData:
    path: str
    data: Any
    version: int = -1


@dataclass
class Delete:
    path: str
    version: int = -1


@dataclass
class Check:
    path: str
    version: int


Op = Create | SetData | Delete | Check


class Watch(Protocol):
    def cancel(self) -> None: ...


class MetadataStore(Protocol):
    def get(self, path: str) -> tuple[Any, int] | None: ...
    def get_stat(self, path: str) -> tuple[Any, Stat] | None: ...
    def get_many(self, paths: list[str]) -> list[tuple[Any, int] | None]: ...
    def children(self, path: str) -> list[str]: ...
    def create(self, path: str, data: Any = None, *, ephemeral: bool = False,
               sequential: bool = False) -> str: ...
    def set(self, path: str, data: Any, expected_version: int = -1) -> int: ...
    def delete(self, path: str, expected_version: int = -1) -> None: ...
    def multi(self, ops: list[Op]) -> None: ...
    def multi_many(self, batches: list[list[Op]]) -> list[NodeError | None]: ...
    def batch(self) -> AbstractContextManager[None]: ...
    def watch_children(self, path: str, callback: Callable[[list[str]], None]) -> Watch: ...
    def watch_data(self, path: str, callback: Callable[[Any, int], None]) -> Watch: ...
    def add_session_listener(self, callback: Callable[[str], None]) -> None: ...
    def close(self) -> None: ...


def encode(data: Any) -> bytes:
    """Node bytes exactly as Kafka writes them: compact JSON, UTF-8; no data is empty bytes."""
    if data is None:
        return b""
    return json.dumps(data, separators=(",", ":"), ensure_ascii=False).encode()


def decode(raw: bytes | None) -> Any:
    if not raw:
        return None
    try:
        return json.loads(raw)
    except ValueError:
        return raw.decode("utf-8", "replace")  # not written by Strom or Kafka: hand it over as text


def parent_of(path: str) -> str:
    return path.rsplit("/", 1)[0] or "/"


def ancestors(path: str) -> list[str]:
    """'/a/b/c' -> ['/a', '/a/b'] (outermost first; the root is not a node to create)."""
    parts = path.strip("/").split("/")[:-1]
    return ["/" + "/".join(parts[: i + 1]) for i in range(len(parts))]


def check_path(path: str) -> None:
    if not path.startswith("/") or (path != "/" and path.endswith("/")) or "//" in path:
        raise ValueError(f"invalid node path {path!r}")


def call_safely(callback: Callable[..., None], *args: Any) -> None:
    """Watch and session callbacks are the callers' code: one that raises must not stop the
    store or the other callbacks."""
    try:
        callback(*args)
    except Exception:
        log.exception("metadata store callback %r failed", callback)


# Keys in the local file that are not nodes: node paths always start with "/", so a version
# that does not know this key skips it (its children() only matches "/..." prefixes).
_META_KEY = "#strom"


class _LocalWatch:
    def __init__(self, store: LocalMetadataStore, path: str, kind: str,
                 callback: Callable[..., None]) -> None:
        self.store, self.path, self.kind, self.callback = store, path, kind, callback
        self.cancelled = False
        self.fire_lock = threading.Lock()  # one call at a time, in order of the changes

    def cancel(self) -> None:
        self.cancelled = True
        with self.store._lock:
            watches = self.store._watches.get((self.kind, self.path))
            if watches is not None and self in watches:
                watches.remove(self)

    def fire(self) -> None:
        with self.fire_lock:
            if self.cancelled:
                return
            if self.kind == "children":
                call_safely(self.callback, self.store.children(self.path))
            else:
                node = self.store.get(self.path)
                call_safely(self.callback, *(node if node is not None else (None, -1)))


class LocalMetadataStore:
    """The metadata tree in a JSON snapshot file plus a journal of the changes since.

    The snapshot maps each persistent node's path to {"data", "version", "czxid"}, plus one
    bookkeeping entry (the zxid counter and per-parent sequence counters). Each change (a
    create, set, delete, or a whole multi or batch) appends one line to `<file>.journal`
    naming the nodes it changed with their new value (null: deleted) and the counters, and is
    fsynced before it returns, so a change costs one small write whatever the size of the tree
    (with 100,000 partitions the snapshot is megabytes). When the journal outgrows the
    snapshot, the snapshot is rewritten and the journal emptied. Ephemeral nodes live only in
    memory, owned by this process's session. Thread-safe: the controller may call it from a
    worker thread; watches fire on the thread that made the change, after it is applied and
    outside the lock.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self.journal_path = path.with_name(path.name + ".journal")
        self.session_id = random.getrandbits(62) | 1  # nonzero: 0 means "persistent"
        self._nodes: dict[str, dict[str, Any]] = {}
        self._zxid = 0
        self._sequences: dict[str, int] = {}
        self._lock = threading.RLock()
        self._batch_depth = 0
        self._pending: set[str] = set()  # paths changed inside a batch, journaled at its end
        self._journal_fd = -1
        self._journal_bytes = 0
        self._snapshot_bytes = 0
        self._watches: dict[tuple[str, str], list[_LocalWatch]] = {}
        self._session_listeners: list[Callable[[str], None]] = []
        if path.exists():
            try:
                text = path.read_text(encoding="utf-8")
                self._snapshot_bytes = len(text)
                self._load(json.loads(text))
            except (ValueError, AttributeError, TypeError) as e:
                raise ValueError(f"{path} is not a metadata file Strom can read ({e}); restore it "
                                 "from a backup, or move it away to start with no topics") from None
        self._replay_journal()

    def _load(self, saved: dict[str, Any]) -> None:
        meta = saved.pop(_META_KEY, {})
        self._zxid = meta.get("zxid", 0)
        self._sequences = dict(meta.get("sequences", {}))
        for path, node in saved.items():
            # Files from before czxid was kept: number those nodes after the saved counter.
            if "czxid" not in node:
                self._zxid += 1
                node = {**node, "czxid": self._zxid}
            self._nodes[path] = node
        # Older files hold only the nodes written, not their parents: make parents real nodes,
        # as ZooKeeper has them.
        for path in list(self._nodes):
            for parent in ancestors(path):
                if parent not in self._nodes:
                    self._zxid += 1
                    self._nodes[parent] = {"data": None, "version": 0, "czxid": self._zxid}

    # --- reads ---

    def get(self, path: str) -> tuple[Any, int] | None:
        with self._lock:
            node = self._nodes.get(path)
            return None if node is None else (node["data"], node["version"])

    def get_many(self, paths: list[str]) -> list[tuple[Any, int] | None]:
        return [self.get(path) for path in paths]

    def get_stat(self, path: str) -> tuple[Any, Stat] | None:
        with self._lock:
            node = self._nodes.get(path)
            if node is None:
                return None
            owner = self.session_id if node.get("ephemeral") else 0
            return node["data"], Stat(node["version"], node["czxid"], owner)

    def children(self, path: str) -> list[str]:
        prefix = path.rstrip("/") + "/"
        with self._lock:
            return sorted({p[len(prefix):].split("/")[0] for p in self._nodes
                           if p.startswith(prefix)})

    # --- writes ---

    @contextmanager
    def batch(self) -> Iterator[None]:
        """Changes inside are journaled as one line and one fsync (ZooKeeper's multi), not one
        per node. Other threads' changes meanwhile join the batch."""
        with self._lock:
            self._batch_depth += 1
        try:
            yield
        finally:
            with self._lock:
                self._batch_depth -= 1
                if self._batch_depth == 0 and self._pending:
                    self._persist([])

    def create(self, path: str, data: Any = None, *, ephemeral: bool = False,
               sequential: bool = False) -> str:
        check_path(path)
        changed: list[tuple[str, str]] = []
        with self._lock:
            if sequential:
                parent = parent_of(path)
                counter = self._sequences.get(parent, 0)
                self._sequences[parent] = counter + 1
                path = f"{path}{counter:010d}"
            self._create(self._nodes, path, data, ephemeral, changed)
            self._persist(changed)
        self._fire(changed)
        return path

    def set(self, path: str, data: Any, expected_version: int = -1) -> int:
        check_path(path)
        changed: list[tuple[str, str]] = []
        with self._lock:
            node = self._nodes.get(path)
            if node is None:
                if expected_version != -1:
                    raise BadVersion(f"{path}: expected version {expected_version}, found none")
                self._create(self._nodes, path, data, False, changed)
                version = 0
            else:
                version = self._set(self._nodes, path, data, expected_version, changed)
            self._persist(changed)
        self._fire(changed)
        return version

    def delete(self, path: str, expected_version: int = -1) -> None:
        check_path(path)
        changed: list[tuple[str, str]] = []
        with self._lock:
            node = self._nodes.get(path)
            if node is None:
                return
            if expected_version != -1 and node["version"] != expected_version:
                raise BadVersion(f"{path}: expected version {expected_version}, "
                                 f"found {node['version']}")
            prefix = path.rstrip("/") + "/"
            # Deepest first, so each node is childless when it goes, as in ZooKeeper.
            for key in sorted((p for p in self._nodes if p.startswith(prefix)), reverse=True):
                self._delete(self._nodes, key, -1, changed, check_empty=False)
            self._delete(self._nodes, path, -1, changed, check_empty=False)
            self._persist(changed)
        self._fire(changed)

    def multi_many(self, batches: list[list[Op]]) -> list[NodeError | None]:
        """`multi` of each batch in turn; for each, None or what it raised."""
        outcomes: list[NodeError | None] = []
        for ops in batches:
            try:
                self.multi(ops)
                outcomes.append(None)
            except NodeError as e:
                outcomes.append(e)
        return outcomes

    def multi(self, ops: list[Op]) -> None:
        """All or nothing: the ops run against a copy of the tree (node dicts are replaced,
        never changed in place, so a shallow copy suffices), which replaces the tree only if
        every op succeeded; then one write to disk."""
        changed: list[tuple[str, str]] = []
        with self._lock:
            nodes = dict(self._nodes)
            for op in ops:
                check_path(op.path)
                if isinstance(op, Create):
                    for parent in ancestors(op.path):
                        if parent not in nodes:
                            self._create(nodes, parent, None, False, changed)
                    self._create(nodes, op.path, op.data, op.ephemeral, changed, make_parents=False)
                elif isinstance(op, SetData):
                    self._set(nodes, op.path, op.data, op.version, changed)
                elif isinstance(op, Delete):
                    self._delete(nodes, op.path, op.version, changed)
                elif isinstance(op, Check):
                    self._node_at_version(nodes, op.path, op.version)
                else:
                    raise TypeError(f"not a multi op: {op!r}")
            self._nodes = nodes
            self._persist(changed)
        self._fire(changed)

    def _create(self, nodes: dict[str, dict[str, Any]], path: str, data: Any, ephemeral: bool,
                changed: list[tuple[str, str]], make_parents: bool = True) -> None:
        if path in nodes:
            raise NodeExists(path)
        if make_parents:
            for parent in ancestors(path):
                if parent not in nodes:
                    self._create(nodes, parent, None, False, changed, make_parents=False)
        parent = parent_of(path)
        if parent != "/" and parent not in nodes:
            raise NoNode(parent)
        if nodes.get(parent, {}).get("ephemeral"):
            raise NoNode(f"{parent} is ephemeral and cannot have children")
        self._zxid += 1
        node: dict[str, Any] = {"data": data, "version": 0, "czxid": self._zxid}
        if ephemeral:
            node["ephemeral"] = True
        nodes[path] = node
        changed += [("data", path), ("children", parent)]

    def _set(self, nodes: dict[str, dict[str, Any]], path: str, data: Any, expected_version: int,
             changed: list[tuple[str, str]]) -> int:
        node = self._node_at_version(nodes, path, expected_version)
        nodes[path] = {**node, "data": data, "version": node["version"] + 1}
        changed.append(("data", path))
        return node["version"] + 1

    def _delete(self, nodes: dict[str, dict[str, Any]], path: str, expected_version: int,
                changed: list[tuple[str, str]], check_empty: bool = True) -> None:
        self._node_at_version(nodes, path, expected_version)
        prefix = path + "/"
        # A recursive delete goes deepest first and skips this scan of the whole tree.
        if check_empty and any(p.startswith(prefix) for p in nodes):
            raise NotEmpty(path)
        del nodes[path]
        changed += [("data", path), ("children", parent_of(path))]

    @staticmethod
    def _node_at_version(nodes: dict[str, dict[str, Any]], path: str,
                         expected_version: int) -> dict[str, Any]:
        node = nodes.get(path)
        if node is None:
            raise NoNode(path)
        if expected_version != -1 and node["version"] != expected_version:
            raise BadVersion(f"{path}: expected version {expected_version}, "
                             f"found {node['version']}")
        return node

    # --- watches and sessions ---

    def watch_children(self, path: str, callback: Callable[[list[str]], None]) -> _LocalWatch:
        return self._watch("children", path, callback)

    def watch_data(self, path: str, callback: Callable[[Any, int], None]) -> _LocalWatch:
        return self._watch("data", path, callback)

    def _watch(self, kind: str, path: str, callback: Callable[..., None]) -> _LocalWatch:
        watch = _LocalWatch(self, path, kind, callback)
        with self._lock:
            self._watches.setdefault((kind, path), []).append(watch)
        watch.fire()
        return watch

    def _fire(self, changed: list[tuple[str, str]]) -> None:
        with self._lock:
            due = [w for key in dict.fromkeys(changed) for w in self._watches.get(key, ())]
        for watch in due:
            watch.fire()

    def add_session_listener(self, callback: Callable[[str], None]) -> None:
        # This store's session is the process: it never expires, so listeners never fire.
        self._session_listeners.append(callback)

    def close(self) -> None:
        """Fold the journal into the snapshot, so the file alone is the whole tree again."""
        with self._lock:
            if self._journal_bytes:
                self._write_snapshot()
            if self._journal_fd >= 0:
                os.close(self._journal_fd)
                self._journal_fd = -1

    # --- the files ---

    def _replay_journal(self) -> None:
        """Apply the journal's complete lines to the snapshot just loaded. A torn last line
        (a crash mid-write: it was never acknowledged) is cut off."""
        try:
            raw = self.journal_path.read_bytes()
        except FileNotFoundError:
            raw = b""
        good = 0
        for line in raw.split(b"\n")[:-1]:  # the part after the last newline is incomplete
            try:
                entry = json.loads(line)
                changes, meta = entry["n"], entry["m"]
            except (ValueError, KeyError, TypeError):
                break
            for node_path, node in changes.items():
                if node is None:
                    self._nodes.pop(node_path, None)
                else:
                    self._nodes[node_path] = node
            self._zxid = meta["zxid"]
            self._sequences = dict(meta["sequences"])
            good += len(line) + 1
        if good != len(raw):
            log.warning("%s: dropping %d bytes of an incomplete last change", self.journal_path,
                        len(raw) - good)
            with open(self.journal_path, "r+b") as f:
                f.truncate(good)
                os.fsync(f.fileno())
        self._journal_bytes = good

    def _persist(self, changed: list[tuple[str, str]]) -> None:
        # Ephemeral creations are journaled too (with no node): the zxid counter must never go
        # back after a restart, or a re-registered broker could get the czxid (epoch) it had.
        self._pending.update(p for kind, p in changed if kind == "data")
        if self._batch_depth:
            return
        paths, self._pending = self._pending, set()
        changes = {}
        for node_path in paths:
            node = self._nodes.get(node_path)
            if node is None or not node.get("ephemeral"):
                changes[node_path] = node
        line = json.dumps({"n": changes, "m": {"zxid": self._zxid, "sequences": self._sequences}},
                          separators=(",", ":")).encode() + b"\n"
        if self._journal_bytes + len(line) > max(_MIN_JOURNAL_BYTES, self._snapshot_bytes):
            self._write_snapshot()
            return
        if self._journal_fd < 0:
            self._journal_fd = os.open(self.journal_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
            fsync_dir(self.path.parent)  # the journal's name, made now, must survive too
        view = memoryview(line)
        while view:
            view = view[os.write(self._journal_fd, view):]
        os.fsync(self._journal_fd)
        self._journal_bytes += len(line)

    def _write_snapshot(self) -> None:
        """The whole tree to the snapshot file (atomically), then an empty journal."""
        saved: dict[str, Any] = {p: n for p, n in self._nodes.items() if not n.get("ephemeral")}
        saved[_META_KEY] = {"zxid": self._zxid, "sequences": self._sequences}
        tmp = self.path.with_suffix(".tmp")
        with open(tmp, "w") as f:
            # dumps, not dump: dump streams through the pure-Python encoder (100,000 partitions:
            # 1.4 s of a clean stop), dumps runs the C one.
            f.write(json.dumps(saved, separators=(",", ":")))
            f.flush()
            os.fsync(f.fileno())
            self._snapshot_bytes = f.tell()
        os.replace(tmp, self.path)
        # The rename is durable only once the directory is synced: topic and broker configs
        # must not roll back after a power cut. Only then may the journal go.
        fsync_dir(self.path.parent)
        if self._journal_fd >= 0:
            os.close(self._journal_fd)
            self._journal_fd = -1
        if self._journal_bytes or self.journal_path.exists():
            with open(self.journal_path, "wb") as f:
                os.fsync(f.fileno())
        self._journal_bytes = 0


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


# The journal is compacted into the snapshot once it is bigger than the snapshot (and than
# this): the rewrite then costs at most as much as the changes since the last one.
_MIN_JOURNAL_BYTES = 1 << 20
