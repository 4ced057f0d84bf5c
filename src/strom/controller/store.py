"""Where cluster metadata lives: a tree of JSON nodes with versions, shaped like ZooKeeper's.

The controller reads and writes paths such as `/brokers/topics/<topic>` and
`/config/topics/<topic>` with conditional updates by version, exactly as it would against
ZooKeeper. `LocalMetadataStore` keeps that tree in one file for the embedded single-node
broker; a ZooKeeper-backed store can implement the same four calls.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Any, Protocol


class BadVersion(Exception):
    pass


class NodeExists(Exception):
    pass


class MetadataStore(Protocol):
    def get(self, path: str) -> tuple[Any, int] | None: ...
    def children(self, path: str) -> list[str]: ...
    def create(self, path: str, data: Any) -> None: ...
    def set(self, path: str, data: Any, expected_version: int = -1) -> int: ...
    def delete(self, path: str) -> None: ...
    def batch(self) -> AbstractContextManager[None]: ...


class LocalMetadataStore:
    """The metadata tree in a JSON file, rewritten atomically on every change."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._nodes: dict[str, dict[str, Any]] = {}
        self._batch_depth = 0
        self._dirty = False
        if path.exists():
            self._nodes = json.loads(path.read_text())

    @contextmanager
    def batch(self) -> Iterator[None]:
        """Changes inside are written as one file (ZooKeeper's multi): a 1,000-partition topic
        is one rewrite and fsync, not 1,000."""
        self._batch_depth += 1
        try:
            yield
        finally:
            self._batch_depth -= 1
            if self._batch_depth == 0 and self._dirty:
                self._persist()

    def get(self, path: str) -> tuple[Any, int] | None:
        node = self._nodes.get(path)
        return None if node is None else (node["data"], node["version"])

    def children(self, path: str) -> list[str]:
        prefix = path.rstrip("/") + "/"
        return sorted({p[len(prefix):].split("/")[0] for p in self._nodes if p.startswith(prefix)})

    def create(self, path: str, data: Any) -> None:
        if path in self._nodes:
            raise NodeExists(path)
        self._nodes[path] = {"data": data, "version": 0}
        self._persist()

    def set(self, path: str, data: Any, expected_version: int = -1) -> int:
        node = self._nodes.get(path)
        current = -1 if node is None else node["version"]
        if expected_version != -1 and expected_version != current:
            raise BadVersion(f"{path}: expected version {expected_version}, found {current}")
        self._nodes[path] = {"data": data, "version": current + 1}
        self._persist()
        return current + 1

    def delete(self, path: str) -> None:
        for key in [p for p in self._nodes if p == path or p.startswith(path.rstrip("/") + "/")]:
            del self._nodes[key]
        self._persist()

    def _persist(self) -> None:
        if self._batch_depth:
            self._dirty = True
            return
        self._dirty = False
        tmp = self.path.with_suffix(".tmp")
        with open(tmp, "w") as f:
            json.dump(self._nodes, f, separators=(",", ":"))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)
        # The rename is durable only once the directory is synced: topic and broker configs
        # must not roll back after a power cut.
        fd = os.open(self.path.parent, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
