"""Remote storage in a local directory: for one machine, or a filesystem several brokers
share (NFS and the like). Each object is written to a temporary name, fsynced and renamed, so
a crash leaves it whole or absent."""

from __future__ import annotations

import os
import shutil
import uuid
from pathlib import Path

from strom.log.remote import RemoteResourceNotFound, RemoteStorageError
from strom.remote.objects import ObjectStorage


class DirectoryStorage(ObjectStorage):
    def __init__(self, root: Path, key_prefix: str = "") -> None:
        super().__init__(key_prefix)
        self.root = Path(root)

    def _path(self, key: str) -> Path:
        path = (self.root / key).resolve()
        if self.root.resolve() not in path.parents:
            raise RemoteStorageError(f"object key {key!r} leaves the store's directory")
        return path

    def put(self, key: str, content: Path | bytes) -> None:
        path = self._path(key)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
            with open(tmp, "wb") as f:
                if isinstance(content, Path):
                    with open(content, "rb") as source:
                        shutil.copyfileobj(source, f, 1 << 20)
                else:
                    f.write(content)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
            fd = os.open(path.parent, os.O_RDONLY)  # the new name survives a power cut too
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        except OSError as e:
            raise RemoteStorageError(f"cannot write {key}: {e}") from e

    def get(self, key: str, start: int = 0, end: int | None = None) -> bytes:
        try:
            with open(self._path(key), "rb") as f:
                f.seek(start)
                return f.read() if end is None else f.read(max(0, end - start))
        except FileNotFoundError:
            raise RemoteResourceNotFound(f"no object {key}") from None
        except OSError as e:
            raise RemoteStorageError(f"cannot read {key}: {e}") from e

    def delete(self, key: str) -> None:
        try:
            self._path(key).unlink(missing_ok=True)
        except OSError as e:
            raise RemoteStorageError(f"cannot delete {key}: {e}") from e
