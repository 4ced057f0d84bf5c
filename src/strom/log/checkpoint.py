"""Kafka's offset checkpoint files (recovery-point-offset-checkpoint, log-start-offset-checkpoint).

Text format: a version line (`0`), an entry count line, then `topic partition offset` per line.
Written atomically (temp file, fsync, rename, fsync of the directory) because a torn checkpoint
would make the next start-up either skip needed recovery or fail.

Every file has one writer at a time (`write_atomically` holds a lock per path), and requests
that want a checkpoint written now share writes (`CoalescedWrite`): a thousand DeleteRecords
at once cost two checkpoint writes, not a thousand fsyncs in a row.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
from collections.abc import Callable, Mapping
from pathlib import Path

VERSION = 0
# One writer per file at a time: two writers sharing the temp file would each rename the
# other's away (ENOENT). Locks are few (one per checkpoint file) and live as long as the process.
_locks: dict[Path, threading.Lock] = {}
_locks_guard = threading.Lock()


def _lock_for(path: Path) -> threading.Lock:
    with _locks_guard:
        lock = _locks.get(path)
        if lock is None:
            lock = _locks[path] = threading.Lock()
        return lock


def read_checkpoint(path: Path) -> dict[tuple[str, int], int]:
    """{(topic, partition): offset}; {} when the file does not exist; ValueError if malformed."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return {}
    except UnicodeDecodeError:
        raise ValueError(f"malformed checkpoint file {path}: not text") from None
    lines = text.splitlines()
    try:
        if len(lines) < 2:
            raise ValueError("missing version or entry count line")
        version = int(lines[0].strip())
        if version != VERSION:
            raise ValueError(f"unsupported version {version}")
        count = int(lines[1].strip())
        rows = [line for line in lines[2:] if line.strip()]
        if count != len(rows):
            raise ValueError(f"expected {count} entries, found {len(rows)}")
        entries: dict[tuple[str, int], int] = {}
        for row in rows:
            fields = row.split()
            if len(fields) != 3:
                raise ValueError(f"expected 'topic partition offset', got {row!r}")
            topic, partition, offset = fields[0], int(fields[1]), int(fields[2])
            entries[(topic, partition)] = offset
    except ValueError as e:
        raise ValueError(f"malformed checkpoint file {path}: {e}") from None
    return entries


def write_checkpoint(path: Path, entries: Mapping[tuple[str, int], int]) -> None:
    """Replace `path` atomically with `entries`."""
    path = Path(path)
    lines = [str(VERSION), str(len(entries))]
    lines += [f"{topic} {partition} {offset}" for (topic, partition), offset in sorted(entries.items())]
    write_atomically(path, "\n".join(lines) + "\n")


def read_flushed_ends(path: Path) -> dict[tuple[str, int], tuple[int, int, int]]:
    """{(topic, partition): (end offset, active segment base, its size)} of Strom's
    flushed-end-checkpoint (same framing as Kafka's checkpoints, three numbers per line); {}
    when missing or unreadable (every log then recovers as it would without it)."""
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
        if len(lines) < 2 or int(lines[0]) != VERSION or int(lines[1]) != len(lines) - 2:
            return {}
        out = {}
        for row in lines[2:]:
            topic, partition, end, base, size = row.split()
            out[(topic, int(partition))] = (int(end), int(base), int(size))
        return out
    except (OSError, ValueError, UnicodeDecodeError):
        return {}


def write_flushed_ends(path: Path, entries: Mapping[tuple[str, int], tuple[int, int, int]]) -> None:
    lines = [str(VERSION), str(len(entries))]
    lines += [f"{t} {p} {end} {base} {size}" for (t, p), (end, base, size) in sorted(entries.items())]
    write_atomically(path, "\n".join(lines) + "\n")


def write_atomically(path: Path, text: str, sync: bool = True, own_lock: bool = False,
                     sync_dir: bool = True) -> None:
    """Replace `path` with `text`: temp file, fsync, rename, fsync of the directory. Without
    `sync`, the same but no fsync: readers never see a torn file, a power cut may leave the
    old one (for files whose loss recovery repairs, see leader_epoch.py). `own_lock`: the
    caller already makes sure it is the file's only writer. Without `sync_dir` the caller
    fsyncs the directory itself (once for several files)."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    with contextlib.nullcontext() if own_lock else _lock_for(path):
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
            if sync:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, path)
        if sync and sync_dir:
            fd = os.open(path.parent, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)



class CoalescedWrite:
    """`write` (blocking) run in a worker thread, one run at a time. A caller that arrives
    while a run is under way waits for the next run, which starts once that one ends and
    serves every caller that arrived meanwhile: what it writes is computed after their
    changes, so each caller returns once a write that includes its change is done."""

    def __init__(self, write: Callable[[], None]) -> None:
        self._write = write
        self._task: asyncio.Task | None = None
        self._queued: list[asyncio.Future] = []

    async def __call__(self) -> None:
        waiter = asyncio.get_running_loop().create_future()
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run([waiter]))
        else:
            self._queued.append(waiter)
        await asyncio.shield(waiter)

    async def _run(self, waiters: list[asyncio.Future]) -> None:
        try:
            while waiters:
                try:
                    await asyncio.to_thread(self._write)
                    error = None
                except Exception as e:  # handed to every caller of this run
                    error = e
                for w in waiters:
                    if not w.done():
                        w.set_result(None) if error is None else w.set_exception(error)
                waiters, self._queued = self._queued, []
        finally:
            self._task = None
