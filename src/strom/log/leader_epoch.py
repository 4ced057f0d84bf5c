"""The leader epoch cache of a partition (Kafka's LeaderEpochFileCache, KIP-101).

Which leader epoch wrote which offsets: (epoch, start offset) pairs, both increasing, kept in
the partition's `leader-epoch-checkpoint` in Kafka's text format (version `0`, a count, then
`epoch start_offset` per line). A follower asks its leader where its latest epoch ends and
truncates there, so no replica keeps records a new leader never had.

Writing the file is not on the path that changes the cache. A broker gives the cache a `defer`
hook: a change marks it dirty and the hook has the file written later, in a batch with other
partitions' caches, off the event loop and without an fsync per file (becoming leader of
10,000 partitions would otherwise be 20,000 fsyncs on the loop). What makes that safe is
`sync()`, which `Log.flush` calls before it moves the recovery point: the epochs of flushed
batches are always durable, and an epoch the file lost in a power cut is one no flushed batch
carries, which recovery reads back from the batches above the recovery point. Without a hook
(tools, tests) every change is written and fsynced at once, as before.

A log that holds no batch and has no file yet (a new partition) writes none: until a batch
carries an epoch the file would describe nothing, and a missing file is rebuilt from the
batches. The first batch has it written. Creating 100,000 partitions thus makes no epoch files.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from strom.log.checkpoint import write_atomically
from strom.log.index import fsync_path

log = logging.getLogger(__name__)

UNDEFINED = (-1, -1)


@dataclass(frozen=True, slots=True)
class EpochEntry:
    epoch: int
    start_offset: int


class LeaderEpochCache:
    FILE = "leader-epoch-checkpoint"

    def __init__(self, directory: Path, defer: Callable[[LeaderEpochCache], None] | None = None,
                 new: bool = False, holds_data: Callable[[], bool] | None = None) -> None:
        self.path = Path(directory) / self.FILE
        self.entries: list[EpochEntry] = []
        self.loaded = False  # False: the file was missing or unreadable (the log rebuilds it)
        self.on_disk = False  # the file exists (read or written)
        self._file_entries: list[EpochEntry] | None = None  # what the file says, if known
        self._file_durable = False  # ... and it is fsynced (or was there at start-up)
        self.defer = defer
        self.holds_data = holds_data  # the log has a batch: no file is written before it does
        self._version = 0  # changes made in memory
        self._written = 0  # the version the file holds
        self._synced = 0  # the version the file holds durably
        self._closed = False
        self._lock = threading.Lock()  # one writer of the file at a time (loop, batch, flush)
        if new:  # a log made just now: no file to read
            self.loaded = True
            return
        try:
            self.entries = _read(self.path)
            self.loaded = self.on_disk = self._file_durable = True
            self._file_entries = self.entries
        except FileNotFoundError:
            pass
        except (OSError, ValueError) as e:
            self.on_disk = True  # to be replaced, even while the log is empty
            log.warning("%s is unreadable (%s); it will be rebuilt from the log", self.path, e)

    def _persist(self) -> None:
        self._version += 1
        if not self._waits_for_data():
            self._hand_over()

    def _log_is_empty(self) -> bool:
        return self.holds_data is not None and not self.holds_data()

    def _waits_for_data(self) -> bool:
        return not self.on_disk and self._log_is_empty()

    def data_arrived(self) -> None:
        """The log's first batch is in: an epoch assigned before it is written now."""
        if self.dirty and not self.on_disk:
            self._hand_over()

    def _hand_over(self) -> None:
        if self.defer is not None:
            self.defer(self)
        else:
            self.write(sync=True)

    @property
    def dirty(self) -> bool:
        return self._written < self._version

    def write(self, sync: bool = False, sync_dir: bool = True) -> bool:
        """Write the file if it is behind the entries (and fsync it, with `sync`; its
        directory too unless the caller does that). Callable from any thread. True when the
        file was written (a new name in the directory)."""
        with self._lock:
            if self._closed or self._waits_for_data():
                return False
            version, entries = self._version, list(self.entries)
            if version <= (self._synced if sync else self._written):
                return False
            if entries == self._file_entries and (self._file_durable or not sync):
                # The file says this already (a change undone: loading drops a leader's epoch
                # at the log's end, then assigns it again): not rewritten for nothing.
                self._written = max(self._written, version)
                if sync:
                    self._synced = version
                return False
            if sync and version <= self._written:
                # Written already, not yet durable: fsync what is there rather than write it
                # again (a new topic's 20,000 files, flushed at shutdown); its name is new to
                # the directory all the same.
                if self.on_disk:
                    fsync_path(self.path)
                if sync_dir:
                    fsync_path(self.path.parent)
                self._synced = version
                return True
            if not entries and self._log_is_empty():
                # Nothing to say about a log without batches (a file from before it emptied, or
                # from an older Strom that wrote one per new log): no file, and its next epochs
                # wait for its first batch.
                self.path.unlink(missing_ok=True)
                self.on_disk = False
                self._file_entries = None
                if sync and sync_dir:
                    fsync_path(self.path.parent)
            else:
                write_atomically(self.path, format_checkpoint(entries), sync=sync, own_lock=True,
                                 sync_dir=sync_dir)
                self.on_disk = True
                self._file_entries, self._file_durable = entries, sync
            self._written = max(self._written, version)
            if sync:
                self._synced = version
        return True

    def assume_unsynced(self) -> None:
        """The file may not be durable (read after a crash): the next sync fsyncs it."""
        with self._lock:
            self._file_durable = False
            self._synced = min(self._synced, self._version - 1)

    def sync(self, sync_dir: bool = True) -> bool:
        """Make the file durable with everything the cache holds now (before a flush moves
        the recovery point past batches of the newest epochs). True if it was written: without
        `sync_dir` the caller must then fsync the directory."""
        return self.write(sync=True, sync_dir=sync_dir)

    def close(self) -> None:
        """Write nothing more: the directory is going away (or is another log's now)."""
        with self._lock:
            self._closed = True
            self.holds_data = None  # the log's method: no cycle outlives the log

    def latest_epoch(self) -> int:
        return self.entries[-1].epoch if self.entries else -1

    def assign(self, epoch: int, start_offset: int, persist: bool = True) -> None:
        """`epoch` starts at `start_offset`; an epoch already known or older changes nothing.
        Entries at or past `start_offset` (a truncation not yet seen) give way."""
        if epoch < 0 or (self.entries and epoch <= self.entries[-1].epoch):
            return
        kept = len(self.entries)
        while kept and self.entries[kept - 1].start_offset >= start_offset:
            kept -= 1
        # One assignment of a new list: a writer thread copying the entries sees the old list
        # or the new one, never a state in between.
        self.entries = [*self.entries[:kept], EpochEntry(epoch, start_offset)]
        if persist:
            self._persist()

    def end_offset_for(self, epoch: int, log_end_offset: int) -> tuple[int, int]:
        """(largest known epoch <= `epoch`, the offset where it ends): the log end for the
        latest epoch, else the start of the next epoch. An epoch older than every known one
        ends where the first known one starts, as Kafka answers; UNDEFINED above the latest."""
        if not self.entries or epoch < 0:
            return UNDEFINED
        if epoch == self.entries[-1].epoch:
            return epoch, log_end_offset
        if epoch > self.entries[-1].epoch:
            return UNDEFINED
        if epoch < self.entries[0].epoch:
            return epoch, self.entries[0].start_offset
        for i, entry in enumerate(self.entries):
            if entry.epoch > epoch:
                return self.entries[i - 1].epoch, entry.start_offset
        return UNDEFINED  # unreachable: the latest epoch is > epoch here

    def epoch_for(self, offset: int) -> int:
        found = -1
        for entry in self.entries:
            if entry.start_offset > offset:
                break
            found = entry.epoch
        return found

    def truncate_from_end(self, end_offset: int) -> None:
        kept = [e for e in self.entries if e.start_offset < end_offset]
        if len(kept) != len(self.entries):
            self.entries = kept
            self._persist()

    def truncate_from_start(self, start_offset: int) -> None:
        """Entries wholly below the new log start go; the one covering it moves up to it."""
        below = [e for e in self.entries if e.start_offset <= start_offset]
        if not below or (len(below) == 1 and below[0].start_offset == start_offset):
            return
        covering = EpochEntry(below[-1].epoch, start_offset)
        self.entries = [covering, *self.entries[len(below):]]
        self._persist()

    def clear(self) -> None:
        self.entries = []
        self._persist()

    def rebuild(self, headers) -> None:
        """From (partition leader epoch, base offset) of every batch, in offset order."""
        self.entries = []
        for epoch, base_offset in headers:
            self.assign(epoch, base_offset, persist=False)
        self._persist()
        self.loaded = True


def format_checkpoint(entries: Iterable[EpochEntry]) -> str:
    """The leader-epoch-checkpoint text (version 0) of `entries`: the file, and what a remote
    segment carries of its epochs."""
    entries = list(entries)
    lines = ["0", str(len(entries)), *(f"{e.epoch} {e.start_offset}" for e in entries)]
    return "\n".join(lines) + "\n"


def _read(path: Path) -> list[EpochEntry]:
    return parse_checkpoint(path.read_text(encoding="utf-8"))


def parse_checkpoint(text: str) -> list[EpochEntry]:
    lines = [line for line in text.splitlines() if line.strip()]
    if len(lines) < 2 or lines[0].strip() != "0":
        raise ValueError("not a version 0 leader epoch checkpoint")
    count = int(lines[1])
    if count != len(lines) - 2:
        raise ValueError(f"expected {count} entries, found {len(lines) - 2}")
    entries = []
    for line in lines[2:]:
        epoch, start = (int(x) for x in line.split())
        if entries and (epoch <= entries[-1].epoch or start < entries[-1].start_offset):
            raise ValueError(f"entries out of order at {line!r}")
        entries.append(EpochEntry(epoch, start))
    return entries
