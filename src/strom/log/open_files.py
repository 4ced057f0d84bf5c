"""The segment and index files a broker keeps open: at most `capacity`, least recently used
closed first, reopened on their next use.

Without it every segment holds a descriptor for its whole life, so the open-file limit caps the
number of partitions (and a topic of 100,000 partitions takes the log dir down at the limit).
An owner (a segment, an index) asks for its descriptor with `use()`, which pins it for the
block: eviction, from any thread, never closes a descriptor in use, and an owner that closes
while pinned (a segment deleted under an in-flight fetch) has its descriptor closed when the
last pin goes. A fetch region that outlives the call holds a `Pin` of its own.
"""

from __future__ import annotations

import errno
import logging
import os
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator
from contextlib import contextmanager

log = logging.getLogger(__name__)

DEFAULT_CAPACITY = 1024


class OpenFiles:
    def __init__(self, capacity: int = DEFAULT_CAPACITY) -> None:
        self.capacity = capacity
        self._fds: OrderedDict[object, int] = OrderedDict()  # owner -> fd, oldest use first
        self._pins: dict[object, int] = {}
        self._closed_while_pinned: dict[object, int] = {}  # owner -> fd to close at unpin
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._fds)

    def _pinned(self, owner: object, opener: Callable[[], int]) -> int:
        """The owner's descriptor, pinned. Opening and closing happen outside the lock: on a
        slow disk an open takes long, and threads closing or flushing thousands of logs at
        once (a shutdown) would otherwise wait on each other's."""
        with self._lock:
            fd = self._fds.get(owner)
            if fd is not None:
                self._fds.move_to_end(owner)
                self._pins[owner] = self._pins.get(owner, 0) + 1
                return fd
        opened = self._open(opener)
        with self._lock:
            fd = self._fds.get(owner)
            if fd is None:
                fd, spare = opened, None
                self._fds[owner] = fd
            else:  # another thread opened it meanwhile: use theirs
                spare = opened
                self._fds.move_to_end(owner)
            self._pins[owner] = self._pins.get(owner, 0) + 1
            victims = self._victims(len(self._fds) - self.capacity, keep=owner)
        for victim in [spare, *victims] if spare is not None else victims:
            os.close(victim)
        return fd

    def _open(self, opener: Callable[[], int]) -> int:
        try:
            return opener()
        except OSError as e:
            if e.errno not in (errno.EMFILE, errno.ENFILE):
                raise
        # Out of descriptors (the limit was lowered, or other files took them): give back
        # half of what is cached and try once more.
        with self._lock:
            victims = self._victims(len(self._fds) // 2)
        for victim in victims:
            os.close(victim)
        return opener()

    def _victims(self, count: int, keep: object = None) -> list[int]:
        """Take out the `count` least recently used descriptors that are neither pinned nor
        `keep` (the one being handed out), for the caller to close once it lets go of the lock.
        Pinned ones may hold the cache above capacity."""
        if count <= 0:
            return []
        victims = []
        for owner in self._fds:  # oldest first; stop at `count`, not at the end of the cache
            if owner not in self._pins and owner is not keep:
                victims.append(owner)
                if len(victims) == count:
                    break
        return [self._fds.pop(owner) for owner in victims]

    @contextmanager
    def use(self, owner: object, opener: Callable[[], int]) -> Iterator[int]:
        """The owner's descriptor, opened if it is not, and kept open for the block."""
        fd = self._pinned(owner, opener)
        try:
            yield fd
        finally:
            self._unpin(owner)


    def pin(self, owner: object, opener: Callable[[], int]) -> Pin:
        """A descriptor that stays open until the returned `Pin` is released or collected."""
        return Pin(self, owner, self._pinned(owner, opener))

    def _unpin(self, owner: object) -> None:
        with self._lock:
            left = self._pins[owner] - 1
            if left:
                self._pins[owner] = left
                return
            del self._pins[owner]
            fd = self._closed_while_pinned.pop(owner, None)
        if fd is not None:
            os.close(fd)

    # As `use` without the context manager (the append path): `acquire(owner, opener)` pairs
    # with `release(owner)`. The pinning functions themselves: a call less each per append.
    acquire = _pinned
    release = _unpin

    def close(self, owner: object) -> None:
        """The owner is done with its file: close it now, or when its last pin goes."""
        if owner not in self._fds:
            # Holds none (never opened, evicted, closed): no lock. A shutdown's 16 threads
            # closing 100,000 logs, five owners each, queued on it for 4 s.
            return
        with self._lock:
            fd = self._fds.pop(owner, None)
            if fd is None:
                return
            if owner in self._pins:
                self._closed_while_pinned[owner] = fd
                return
        os.close(fd)


class Pin:
    """A pinned descriptor (`fd`) for work that outlives one call, such as a fetch response
    region sent after the handler returns. Released explicitly or when collected."""

    __slots__ = ("_files", "_owner", "fd")

    def __init__(self, files: OpenFiles, owner: object, fd: int) -> None:
        self._files: OpenFiles | None = files
        self._owner = owner
        self.fd = fd

    def release(self) -> None:
        files, self._files = self._files, None
        if files is not None:
            files._unpin(self._owner)

    def __del__(self) -> None:
        self.release()


# One per process: descriptors are a process-wide resource. The broker sizes it at start-up.
OPEN_FILES = OpenFiles()
