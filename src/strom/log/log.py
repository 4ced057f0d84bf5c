"""One partition's log: an ordered list of segments in `<log.dir>/<topic>-<partition>/`.

This is the broker's produce and fetch hot path, so everything is per batch and per call:
appends validate batch headers, rewrite offsets in place and write the record set with one
syscall; reads hand back a file region (`FetchSlice`) for `os.sendfile`. The log is owned by
the broker's single event loop and takes no locks; only `flush()` is meant to run in a thread
and it touches nothing but descriptors and the recovery point.
"""

from __future__ import annotations

import logging
import os
import shutil
import threading
import time
from bisect import bisect_right
from collections.abc import Callable
from dataclasses import dataclass
from operator import attrgetter
from pathlib import Path

from strom.log.config import INT_MAX, LogConfig
from strom.log.index import fsync_path
from strom.log.leader_epoch import LeaderEpochCache
from strom.log.open_files import Pin
from strom.log.segment import (
    DELETED_SUFFIX,
    INDEX_SUFFIX,
    LOG_SUFFIX,
    SEGMENT_FILE_SUFFIXES,
    TIME_INDEX_SUFFIX,
    TXN_INDEX_SUFFIX,
    LogSegment,
    scan_headers,
    segment_name,
)
from strom.log.txn_index import AbortedTxn
from strom.protocol.errors import (
    CorruptRecordError,
    InvalidRecordError,
    OffsetOutOfRangeError,
    RecordTooLargeError,
    StorageError,
)
from strom.protocol.records import (
    HEADER_SIZE,
    BatchHeader,
    assign_offsets,
    read_header,
    scan_valid_prefix,
    validate_batches,
)

log = logging.getLogger(__name__)

CLEANED_SUFFIX = ".cleaned"
SWAP_SUFFIX = ".swap"
_LEFTOVER_SUFFIXES = (DELETED_SUFFIX, CLEANED_SUFFIX)

# Log.flush_hook(log, up_to): ask for an asynchronous flush of `log` up to offset `up_to`.
FlushHook = Callable[["Log", int], None]
# Log.io_error_hook(log, error): an I/O error hit the log's directory (Kafka's LogDirFailureChannel).
IoErrorHook = Callable[["Log", BaseException], None]
_INDEX_SUFFIXES = (INDEX_SUFFIX, TIME_INDEX_SUFFIX, TXN_INDEX_SUFFIX)


def wall_clock_ms() -> int:
    return time.time_ns() // 1_000_000


def parse_log_dir_name(name: str) -> tuple[str, int]:
    """`<topic>-<partition>` -> (topic, partition); the partition follows the LAST '-'."""
    topic, sep, partition = name.rpartition("-")
    if not sep or not topic or not partition.isdigit():
        raise ValueError(f"{name!r} is not a <topic>-<partition> log directory name")
    return topic, int(partition)


@dataclass(slots=True)
class AppendInfo:
    first_offset: int
    last_offset: int
    max_timestamp: int
    offset_of_max_timestamp: int  # base offset of the batch carrying max_timestamp
    log_append_time: int  # -1 unless message.timestamp.type is LogAppendTime
    log_start_offset: int
    valid_bytes: int


# A region up to this size is read when the fetch is served and travels as bytes; a larger one
# is sent from the file (sendfile) and pins the segment's descriptor until then. Reading small
# regions at once keeps a fetch of thousands of partitions from pinning thousands of files.
SMALL_REGION = 32 * 1024


@dataclass(slots=True)
class FetchSlice:
    """A region of a segment file: its bytes (`data`) when small, else a descriptor that `pin`
    holds open until the region is sent and dropped, even if the segment is deleted or its
    file leaves the cache of open files meanwhile. An empty slice has neither (fd -1)."""

    fd: int
    position: int
    size: int
    segment: LogSegment | None = None
    pin: Pin | None = None
    data: bytes | None = None

    def head(self, n: int) -> bytes:
        """The region's first `n` bytes."""
        return self.data[:n] if self.data is not None else os.pread(self.fd, min(n, self.size), self.position)

    def read_bytes(self) -> bytes:
        """The region's bytes via pread, for callers that cannot sendfile."""
        if self.data is not None:
            return self.data
        if self.size <= 0:
            return b""
        data = os.pread(self.fd, self.size, self.position)
        if len(data) < self.size:  # pread may return less; loop for the rest
            parts = [data]
            got = len(data)
            while got < self.size:
                more = os.pread(self.fd, self.size - got, self.position + got)
                if not more:
                    break
                parts.append(more)
                got += len(more)
            data = b"".join(parts)
        return data


def _segment_base(segment: LogSegment) -> int:
    return segment.base_offset


def _clocked(attr: str) -> property:
    """An offset of a Log kept in `attr`, whose every move moves Log.offsets_clock."""

    def set_offset(log: Log, offset: int) -> None:
        if offset != getattr(log, attr):
            setattr(log, attr, offset)
            Log.offsets_clock += 1

    return property(attrgetter(attr), set_offset)


class Log:
    """A partition's segments, offsets and retention. Open with `Log.open`; a new partition's
    with `Log.create`."""

    # Moves whenever any log's recovery point or log start offset moves, or a log is truncated:
    # the periodic checkpoints skip their walk of 100,000 logs when it has not moved since.
    offsets_clock = 0

    def __init__(
        self,
        dir: Path,
        config: LogConfig,
        segments: list[LogSegment],
        *,
        log_start_offset: int,
        log_end_offset: int,
        recovery_point: int,
        now_ms: Callable[[], int],
    ) -> None:
        self.dir = dir if isinstance(dir, Path) else Path(dir)
        self.topic, self.partition = parse_log_dir_name(self.dir.name)
        self._config = config
        # None until first needed (a log trusted after a clean shutdown, see `Log.lazy`).
        self._loaded_segments: list[LogSegment] | None = segments
        self._load_lock = threading.RLock()
        self._epoch_cache: LeaderEpochCache | None = None
        self._epoch_defer: Callable[[LeaderEpochCache], None] | None = None
        # Leader epochs assigned before the epoch file was read (see assign_leader_epoch), and
        # all those assigned before the directory was read: the load's checks would drop them.
        self._pending_epochs: list[tuple[int, int]] = []
        self._unloaded_epochs: list[tuple[int, int]] = []
        self._new = False  # its directory was made just now: it has no epoch file to read
        # Made this run and never given a batch: its directory holds one empty segment file,
        # whose name a power cut may lose at no cost (opening the log makes it again), so a
        # flush does not fsync the directory for it (a clean stop of 80,000 new partitions).
        self._untouched = False
        # Its directory, once read, ended elsewhere than the checkpoint said (changed offline):
        # whoever keeps a high watermark for it must look again.
        self.end_corrected = False
        self._log_start_offset = log_start_offset
        # The log start as checkpointed, before opening raised it to the first segment: a log
        # opened before its topic's configs arrived (a KRaft broker's start) that turns out
        # tiered starts there again, in remote storage (see the config setter).
        self._checkpointed_start = log_start_offset
        self._log_end_offset = log_end_offset
        self._recovery_point = recovery_point
        self._now_ms = now_ms
        # Deleted segments waiting for file.delete.delay.ms: (deadline ms, segment).
        self._pending_deletes: list[tuple[int, LogSegment]] = []
        self._dir_dirty = False  # a segment file was created since the last flush
        self._parent_dirty = False  # the partition directory itself is new
        self._dir_made = True  # False for a log made by Log.create until its first write
        self.closed = False
        self.offline = False  # its log dir failed: every operation answers KAFKA_STORAGE_ERROR
        self.write_refusal: str | None = None  # its disk is (nearly) full: appends refused, reads served
        # (log, bytes appended): the disk space guard, and the flush.ms check's list of logs to look at
        self.append_hook: Callable[[Log, int], None] | None = None
        self.config_hook: Callable[[Log], None] | None = None  # the log manager's indexes by config
        self.last_flush_ms = now_ms()  # for flush.ms (Kafka's lastFlushTime)
        # A tiered log's last offset in remote storage (-1: none), kept by the remote log
        # manager: local segments up to it may go by local retention.
        self.highest_offset_in_remote_storage = -1
        self.flush_hook: FlushHook | None = None
        self.io_error_hook: IoErrorHook | None = None

    log_start_offset = _clocked("_log_start_offset")
    recovery_point = _clocked("_recovery_point")

    @property
    def _segments(self) -> list[LogSegment]:
        segments = self._loaded_segments
        return segments if segments is not None else self._load_segments()

    @_segments.setter
    def _segments(self, segments: list[LogSegment]) -> None:
        self._loaded_segments = segments

    @property
    def tiered(self) -> bool:
        """Its topic has remote storage (KIP-405): the log starts in the remote store, and its
        local segments may begin later (at local_log_start_offset)."""
        return self._config.remote_storage_enable

    @property
    def local_log_start_offset(self) -> int:
        """The first offset this replica holds on its own disk (Kafka's localLogStartOffset):
        the log start offset, unless remote storage holds the offsets before its first segment."""
        return min(max(self.log_start_offset, self._segments[0].base_offset), self._log_end_offset)

    @property
    def checkpoint_start_offset(self) -> int:
        """What log-start-offset-checkpoint keeps: the log start, or lower the start it was opened
        with while that is still in force (a tiered log opened before its configs arrived: a
        crash then must not lose the remote part's start; a plain log raises it again on open)."""
        return min(self.log_start_offset, self._checkpointed_start)

    @property
    def loaded(self) -> bool:
        """False while a lazily opened log has not read its directory yet."""
        return self._loaded_segments is not None

    @property
    def fully_loaded(self) -> bool:
        """Its directory and its leader epoch file are read."""
        return self._loaded_segments is not None and self._epoch_cache is not None

    @property
    def leader_epoch_cache(self) -> LeaderEpochCache:
        cache = self._epoch_cache
        if cache is None:
            with self._load_lock:
                if self._epoch_cache is None:
                    cache = LeaderEpochCache(self.dir, self._epoch_defer, new=self._new,
                                             holds_data=self._holds_data)
                    for epoch, start in self._pending_epochs:
                        cache.assign(epoch, start)
                    self._pending_epochs = []
                    self._epoch_cache = cache
                cache = self._epoch_cache
        return cache

    def assign_leader_epoch(self, epoch: int, start_offset: int) -> None:
        """A new leader epoch starts at `start_offset` (a leader's LeaderAndIsr). An epoch file not
        read yet is not read for it: the assignment waits for the first use of the cache (or
        the background load), so a restarted broker becomes leader of 100,000 partitions
        without reading 100,000 files first."""
        with self._load_lock:
            if self._loaded_segments is None:
                self._unloaded_epochs.append((epoch, start_offset))  # for after the load's checks
            if self._epoch_cache is None:
                self._pending_epochs.append((epoch, start_offset))
                return
        self._epoch_cache.assign(epoch, start_offset)

    def close_epoch_cache(self) -> None:
        """Write nothing more to the epoch file (its directory is going away); an unread
        file is not read for it."""
        with self._load_lock:
            if self._epoch_cache is None:
                self._epoch_cache = LeaderEpochCache(self.dir, self._epoch_defer, new=True,
                                                     holds_data=self._holds_data)
            self._pending_epochs = []
            self._unloaded_epochs = []
        self._epoch_cache.close()

    def _holds_data(self) -> bool:
        return self._log_end_offset > self.log_start_offset

    def defer_epoch_writes(self, defer: Callable[[LeaderEpochCache], None]) -> None:
        """Have the leader epoch checkpoint written by `defer` (see leader_epoch.py)."""
        self._epoch_defer = defer
        if self._epoch_cache is not None:
            self._epoch_cache.defer = defer
            if self._epoch_cache.dirty:  # changed by recovery
                defer(self._epoch_cache)

    # -- opening and recovery

    @classmethod
    def lazy(cls, dir: Path, config: LogConfig, *, log_start_offset: int, log_end_offset: int,
             now_ms: Callable[[], int] = wall_clock_ms) -> Log:
        """A log that a clean shutdown left flushed and checkpointed up to `log_end_offset`:
        its directory is read when first used (or by a background load), so a broker with
        100,000 partitions opens its port without reading 100,000 directories first."""
        return cls(dir, config, None, log_start_offset=log_start_offset,
                   log_end_offset=log_end_offset, recovery_point=log_end_offset, now_ms=now_ms)

    @classmethod
    def create(cls, dir: Path, config: LogConfig, *, now_ms: Callable[[], int] = wall_clock_ms) -> Log:
        """A new, empty log that has no files yet: its directory and first segment file are
        made with its first write (make_files). Creating a topic of 10,000 partitions costs
        no file system work, and a partition never written never costs any: its existence is
        in the cluster's metadata, and a restart makes the log again, as empty as it was."""
        # Its segment too is made when first needed (see _load_segments): a restart makes
        # again the logs of the partitions never written, 100,000 of them before its port opens.
        made = cls(dir, config, None, log_start_offset=0, log_end_offset=0, recovery_point=0,
                   now_ms=now_ms)
        made._new = made._untouched = True
        made._dir_made = False
        return made

    @property
    def dir_made(self) -> bool:
        """Its directory exists (False for a log from Log.create before its first write)."""
        return self._dir_made

    def make_files(self) -> None:
        """Make the directory and active segment file of a log from Log.create, if it has none
        yet (blocking: the broker calls it in a worker thread before a write reaches the log,
        so the loop does not make files; the write makes them itself otherwise). Their names
        are fsynced by the log's next flush. A closed log gets none: it was deleted meanwhile."""
        if self._made_dir():
            with self._segments[-1]._file():
                pass  # an unmade segment's first use creates its file

    def _made_dir(self) -> bool:
        """Make the directory of a log from Log.create if it has none; False if the log is
        closed (deleted meanwhile: no directory may appear after its removal)."""
        with self._load_lock:
            if self.closed:
                return False
            if not self._dir_made:
                self.dir.mkdir(exist_ok=True)
                self._dir_made = True
                self._dir_dirty = self._parent_dirty = True
            return True

    def close_unmade(self) -> bool:
        """Close the log if it has no directory (nothing on disk to delete or move); True if it
        had none."""
        with self._load_lock:
            if self._dir_made:
                return False
            self.close()
            return True

    def load(self) -> None:
        """Read the directory and the leader epoch file of a lazily opened log now (a worker
        thread may call it)."""
        self._ensure_loaded()
        self.read_epoch_file()

    def read_epoch_file(self) -> None:
        """Read the leader epoch file now, if it is not read yet and the log is open (a worker
        thread may call it, so that the loop's first use finds it read)."""
        if not (self.closed or self.offline):
            self.leader_epoch_cache  # noqa: B018  (reads the file)

    def _ensure_loaded(self) -> None:
        """Before using the end offset to change or read the log: reading the directory of a
        lazily opened log may correct it."""
        if self._loaded_segments is None:
            self._load_segments()

    def _load_segments(self) -> list[LogSegment]:
        with self._load_lock:
            if self._loaded_segments is not None:
                return self._loaded_segments
            if not self._dir_made:  # from Log.create: nothing to read
                first = LogSegment(self.dir, 0, self._config, now_ms=self._now_ms(), unmade=True)
                first.created_here = True
                self._loaded_segments = [first]
                self._check_epoch_cache(None)
                return self._loaded_segments
            segments = _open_segments(self.dir, self._config, self._log_end_offset, True,
                                      self.log_start_offset, self._now_ms())
            end = segments[-1].next_offset
            if end != self._log_end_offset:
                log.warning("%s: the log ends at %d, not at %d as checkpointed at shutdown",
                            self.name, end, self._log_end_offset)
                self._log_end_offset = end
                self.recovery_point = min(self.recovery_point, end)
                self.end_corrected = True
            self.log_start_offset = _start_offset(self._config, self.log_start_offset, segments, end)
            self._loaded_segments = segments
            self._check_epoch_cache(None)
            return segments

    @classmethod
    def open(
        cls,
        dir: Path,
        config: LogConfig,
        *,
        recovery_point: int = 0,
        log_start_offset: int = 0,
        clean_shutdown: bool = False,
        now_ms: Callable[[], int] = wall_clock_ms,
    ) -> Log:
        """Load (and where needed recover) the log in `dir`, creating it if missing.

        After a clean shutdown the indexes are trusted once they pass a sanity check, so opening
        costs a few reads per segment. Otherwise every segment holding offsets at or above
        `recovery_point` is re-validated; a torn or corrupt batch is cut off together with all
        later segments.
        """
        dir = Path(dir)
        parse_log_dir_name(dir.name)
        try:
            dir.mkdir()  # one system call for a new log, not a stat first
            new_dir = True
        except FileExistsError:
            new_dir = False
        except FileNotFoundError:
            dir.mkdir(parents=True, exist_ok=True)
            new_dir = True
        now = now_ms()
        segments = _open_segments(dir, config, recovery_point, clean_shutdown, log_start_offset, now,
                                  new=new_dir)
        created = new_dir or segments[0].created_here
        log_end_offset = segments[-1].next_offset
        start = _start_offset(config, log_start_offset, segments, log_end_offset)
        # Kafka's rule: only a clean shutdown lets the recovery point jump to the end; after a
        # recovery the segments are still unflushed.
        point = log_end_offset if clean_shutdown else min(recovery_point, log_end_offset)
        opened = cls(
            dir,
            config,
            segments,
            log_start_offset=start,
            log_end_offset=log_end_offset,
            recovery_point=point,
            now_ms=now_ms,
        )
        opened._checkpointed_start = min(log_start_offset, log_end_offset)
        opened._dir_dirty = created
        opened._parent_dirty = new_dir
        opened._new = opened._untouched = new_dir
        # What recovery changes in the leader epoch file is written later and without an fsync
        # (by the log manager's batched writer, or the first flush): only entries at or past the
        # log's end go, and should the old file come back after a power cut, those describe
        # nothing that exists. Written here, it was a create, rename and two fsyncs per log.
        opened._epoch_defer = _leave_dirty
        opened._check_epoch_cache(None if clean_shutdown else point)
        if not clean_shutdown:
            # A crash may have left the file as written, unsynced, by the batched writer: the
            # flush that moves the recovery point past its epochs' batches must fsync it.
            opened.leader_epoch_cache.assume_unsynced()
        opened._epoch_defer = opened.leader_epoch_cache.defer = None
        return opened

    def _check_epoch_cache(self, recovered_from: int | None) -> None:
        """The leader epoch cache must describe the log as it is after recovery: rebuilt from
        the batches if its file is missing, else trimmed to the log's offsets. After a crash
        (`recovered_from`: the recovery point) the epochs of the batches written since are
        assigned too: a kill between a batch's write and its epoch's checkpoint write would
        otherwise leave that epoch out.

        A leader's epoch assigned before the log was read starts at the log's end, which is
        what the checks drop: it is assigned again after them, as Kafka assigns a new leader's
        epoch once the log is loaded."""
        with self._load_lock:
            early, self._unloaded_epochs = self._unloaded_epochs, []
        cache = self.leader_epoch_cache
        if not cache.loaded and self._log_end_offset > self.log_start_offset:
            cache.rebuild(self._batch_epochs())
        else:
            self._trim_epoch_cache(cache, recovered_from)
        for epoch, _ in early:  # nothing was appended since: the epoch starts at the end
            cache.assign(epoch, self._log_end_offset)

    def _trim_epoch_cache(self, cache: LeaderEpochCache, recovered_from: int | None) -> None:
        cache.truncate_from_end(self._log_end_offset)
        # From the log start as checkpointed, not as raised to the first segment: a tiered log
        # opened before its configs arrived keeps the epochs of its remote part (retention trims
        # a plain log's soon enough).
        cache.truncate_from_start(min(self.log_start_offset, self._checkpointed_start))
        if recovered_from is not None:
            latest, missed = cache.latest_epoch(), []
            for epoch, offset in self._batch_epochs(recovered_from):
                if epoch > latest:
                    latest = epoch
                    missed.append((epoch, offset))
            if missed:
                log.warning("%s: leader epochs %s were missing from %s after recovery", self.name,
                            missed, cache.FILE)
                for epoch, offset in missed:  # rare, and rarely more than one
                    cache.assign(epoch, offset)

    def _batch_epochs(self, start: int | None = None):
        """(partition leader epoch, base offset) of every batch from `start` (default: the log
        start offset), reading headers only."""
        first = self.local_log_start_offset
        offset = first if start is None else max(start, first)
        while offset < self._log_end_offset:
            data = self.read(offset, 1 << 20, min_one_message=True).read_bytes()
            pos = 0
            while len(data) - pos >= HEADER_SIZE:
                header = read_header(data, pos)
                if pos + header.size > len(data):
                    break
                yield header.partition_leader_epoch, header.base_offset
                offset = header.last_offset + 1
                pos += header.size
            if pos == 0:
                return

    # -- properties

    @property
    def config(self) -> LogConfig:
        return self._config

    @config.setter
    def config(self, config: LogConfig) -> None:
        if config.remote_storage_enable and not self._config.remote_storage_enable \
                and self._checkpointed_start < self.log_start_offset:
            self.log_start_offset = self._checkpointed_start
        self._config = config
        for segment in self._loaded_segments or ():  # an unread log's segments get it when read
            segment.config = config
        if self.config_hook is not None:
            self.config_hook(self)

    @property
    def name(self) -> str:
        return self.dir.name

    @property
    def log_end_offset(self) -> int:
        """The offset the next appended record gets."""
        return self._log_end_offset

    @property
    def segments(self) -> tuple[LogSegment, ...]:
        return tuple(self._segments)

    @property
    def active_segment(self) -> LogSegment:
        return self._segments[-1]

    @property
    def size_in_bytes(self) -> int:
        return sum(segment.size for segment in self._segments)

    def __repr__(self) -> str:
        return (
            f"Log({self.dir}, start={self.log_start_offset}, end={self._log_end_offset}, "
            f"segments={len(self._segments)})"
        )

    # -- appending

    def append(self, records: bytearray | memoryview, *, leader_epoch: int = 0,
               batches: list[tuple[int, BatchHeader]] | None = None) -> AppendInfo:
        """Validate, assign offsets in place and write a produce request's record set.

        Raises a KafkaError subclass (CorruptRecordError, RecordTooLargeError,
        InvalidRecordError) before anything is written, or StorageError if the write fails.
        `batches` is what `validate_batches` returned for this very buffer, when the caller
        already had to validate it (idempotent producers), so the CRCs are not checked twice.
        """
        config = self._open_for_append()
        kind = type(records)
        if not (kind is bytearray or (kind is memoryview or isinstance(records, memoryview)) and not records.readonly):
            records = bytearray(records)  # offsets are assigned in place: need a writable buffer
        if batches is None:
            batches = validate_batches(records, config.max_message_bytes)
        first = self._log_end_offset
        if len(batches) == 1:  # a single-record request's one batch: no walk over the list
            last = first + batches[0][1].last_offset_delta
        else:
            last = first + len(batches) - 1 + sum(h.last_offset_delta for _, h in batches)
        now = self._now_ms()
        append_time = now if config.log_append_time else None
        max_ts, offset_of_max = self._write(records, batches, first, last, now, leader_epoch, append_time)
        cache = self._epoch_cache  # the property's lookup only while it is unread (every append)
        if cache is None:
            cache = self.leader_epoch_cache
        if leader_epoch > cache.latest_epoch():
            cache.assign(leader_epoch, first)
        elif self.log_start_offset >= first or self._loaded_segments[0].base_offset >= first:
            cache.data_arrived()  # the log was empty (first was its local start offset)
        return self._appended(config, len(records), first, last, max_ts, offset_of_max, append_time)

    def append_as_follower(self, records: bytearray | memoryview) -> AppendInfo:
        """Write batches exactly as the leader has them: offsets and partition leader epochs
        are kept, never assigned. The first batch may not start below the log end offset."""
        config = self._open_for_append()
        batches = _validate_replicated(records, config.max_message_bytes)
        first = batches[0][1].base_offset
        last = batches[-1][1].base_offset + batches[-1][1].last_offset_delta
        if first < self._log_end_offset:
            raise OffsetOutOfRangeError(f"{self.name}: the leader's batch at offset {first} is below "
                                        f"this replica's log end offset {self._log_end_offset}")
        was_empty = self._log_end_offset == self.local_log_start_offset
        max_ts, offset_of_max = self._write(records, batches, first, last, self._now_ms(), None, None)
        cache = self.leader_epoch_cache
        for _, header in batches:
            if header.partition_leader_epoch > cache.latest_epoch():
                cache.assign(header.partition_leader_epoch, header.base_offset)
        if was_empty:
            cache.data_arrived()
        return self._appended(config, len(records), first, last, max_ts, offset_of_max, None)

    def _open_for_append(self) -> LogConfig:
        """The config to append under, once the log may take writes (its directory made at
        the first)."""
        if self.closed or self.offline or self.write_refusal is not None:
            self._check_writable()  # raises what refuses the write
        if self._loaded_segments is None:
            self._load_segments()
        if not self._dir_made:
            self._make_dir()
        return self._config

    def _write(self, records: bytearray | memoryview, batches: list[tuple[int, BatchHeader]], first: int,
               last: int, now: int, leader_epoch: int | None, append_time: int | None) -> tuple[int, int]:
        """The batches into the active segment, rolled first if due: offsets assigned under
        `leader_epoch` (a leader's append) or kept (None: a follower's). Returns the largest
        timestamp and the offset of its batch."""
        try:
            segment = self._maybe_roll(len(records), last, now)
            if leader_epoch is None:
                _, max_ts, offset_of_max = segment.append(records, batches, first, keep_offsets=True)
            else:
                assign_offsets(records, batches, first, leader_epoch, append_time)
                _, max_ts, offset_of_max = segment.append(records, batches, first, append_time)
        except (OSError, StorageError) as e:
            raise self._io_error(e) from e
        self._log_end_offset = last + 1
        if self.append_hook is not None:
            self.append_hook(self, len(records))
        return max_ts, offset_of_max

    def _appended(self, config: LogConfig, size: int, first: int, last: int, max_ts: int, offset_of_max: int,
                  append_time: int | None) -> AppendInfo:
        self._untouched = False
        if self.flush_hook is not None and last + 1 - self.recovery_point >= config.flush_messages:
            self.flush_hook(self, last + 1)  # flush.messages: Kafka's unflushedMessages check
        return AppendInfo(first, last, max_ts, offset_of_max, -1 if append_time is None else append_time,
                          self.log_start_offset, size)

    def end_offset_for_epoch(self, epoch: int) -> tuple[int, int]:
        """(epoch, end offset) as OffsetForLeaderEpoch answers (Kafka's endOffsetFor)."""
        return self.leader_epoch_cache.end_offset_for(epoch, self._log_end_offset)

    def _maybe_roll(self, size: int, last_offset: int, now: int) -> LogSegment:
        segment = self._loaded_segments[-1]  # loaded by _open_for_append: no property per append
        if segment.size == 0:
            return segment  # an empty segment takes any record set, however big
        config = self._config
        if (
            segment.size + size > config.segment_bytes
            or now - segment.created_ms > config.segment_ms - segment.roll_jitter_ms
            or segment.index_full()
            or last_offset - segment.base_offset > INT_MAX
        ):
            return self.roll(now)
        return segment

    def roll(self, now_ms: int | None = None) -> LogSegment:
        """Start a new active segment at the log end offset and return it."""
        self._check_open()
        now = self._now_ms() if now_ms is None else now_ms
        active = self._segments[-1]
        end = self._log_end_offset
        if active.size == 0 and active.base_offset == end:
            active.created_ms = now
            return active
        active.seal()
        try:
            segment = LogSegment(self.dir, end, self._config, now_ms=now, create=True)
        except FileExistsError:
            # A leftover file at the new base offset: only an empty one may be reused.
            segment = LogSegment(self.dir, end, self._config, now_ms=now)
            if segment.size:
                segment._close_fd()
                raise StorageError(f"segment {segment.log_path} already exists") from None
            segment.recover(self._config.max_message_bytes)
        self._segments.append(segment)
        self._dir_dirty = True
        if self.flush_hook is not None:
            # Kafka flushes everything before the new segment asynchronously after a roll, so the
            # recovery point keeps up with the data and a crash re-scans only the newest segment.
            self.flush_hook(self, end)
        return segment

    # -- reading

    def read(
        self,
        offset: int,
        max_bytes: int,
        *,
        max_offset: int | None = None,
        min_one_message: bool = True,
    ) -> FetchSlice:
        """The file region to send for a fetch at `offset` (see LogSegment.read for the rules).

        Raises OffsetOutOfRangeError outside [log_start_offset, log_end_offset]. Batches with a
        base offset >= `max_offset` (the high watermark) are never included.
        """
        self._check_open()
        self._ensure_loaded()
        end = self._log_end_offset
        start = self.local_log_start_offset
        if offset < start or offset > end:
            raise OffsetOutOfRangeError(f"offset {offset} is outside [{start}, {end}] of {self.name}")
        segments = self._segments
        if offset == end or (max_offset is not None and offset >= max_offset):
            return self._empty_slice()
        i = max(bisect_right(segments, offset, key=_segment_base) - 1, 0)
        while i < len(segments):
            segment = segments[i]
            max_position = None
            if max_offset is not None:
                upper = segments[i + 1].base_offset if i + 1 < len(segments) else end
                if max_offset < upper:
                    max_position = segment.position_of(max_offset)
            try:
                found = segment.read_region(offset, max_bytes, max_position, min_one_message)
                if found is not None and found[2] is None and 0 < found[1] <= SMALL_REGION:
                    found = found[0], found[1], segment.read_batch(found[0], found[1])
            except OSError as e:
                raise self._io_error(e) from e
            if found is not None:
                position, size, data = found
                if size <= 0:
                    return FetchSlice(-1, position, 0, segment)
                if size <= SMALL_REGION:
                    return FetchSlice(-1, position, len(data), segment, data=data)
                pin = segment.pin()
                return FetchSlice(pin.fd, position, size, segment, pin)
            i += 1  # `offset` fell in a gap: the next segment holds the next batch
        return self._empty_slice()

    # -- transactions

    def add_aborted_txn(self, txn: AbortedTxn) -> None:
        """Index an aborted transaction in the segment holding its abort marker."""
        segments = self._segments
        i = max(bisect_right(segments, txn.last_offset, key=_segment_base) - 1, 0)
        try:
            segments[i].txn_index.append(txn)
        except OSError as e:
            raise self._io_error(e) from e

    def collect_aborted_txns(self, fetch_offset: int, upper_bound: int) -> list[AbortedTxn]:
        """Aborted transactions overlapping [fetch_offset, upper_bound): their markers are at or
        after `fetch_offset`, so only that segment and later ones are asked."""
        segments = self._segments
        i = max(bisect_right(segments, fetch_offset, key=_segment_base) - 1, 0)
        out: list[AbortedTxn] = []
        for segment in segments[i:]:
            try:
                found = segment.txn_index.collect(fetch_offset, upper_bound)
            except OSError as e:
                raise self._io_error(e) from e
            out += found
            # collect() stops at an abort after which the stable offset passed the bound: no
            # later marker can belong to a transaction that started below it (Kafka's isComplete).
            if found and found[-1].last_stable_offset >= upper_bound:
                break
        return out

    def _empty_slice(self) -> FetchSlice:
        active = self._segments[-1]
        return FetchSlice(-1, active.size, 0, active)

    def fetch_offset_by_timestamp(self, timestamp: int) -> tuple[int, int] | None:
        """(offset, timestamp) of the first record whose timestamp is >= `timestamp`."""
        self._check_open()
        for segment in list(self._segments):
            if segment.max_timestamp >= timestamp:
                found = segment.find_offset_by_timestamp(timestamp, self.local_log_start_offset)
                if found is not None:
                    return found
        return None

    def offset_of_max_timestamp(self) -> tuple[int, int] | None:
        """(timestamp, offset) of the first record with the largest timestamp in the log."""
        self._check_open()
        best: LogSegment | None = None
        for segment in self._segments:
            if segment.max_timestamp >= 0 and (best is None or segment.max_timestamp > best.max_timestamp):
                best = segment
        return None if best is None else best.max_timestamp_record()

    # -- durability

    def flush(self, up_to: int | None = None) -> None:
        """fsync the segments holding offsets in [recovery_point, up_to) and advance the
        recovery point to `up_to` (default: the log end offset). Blocking: meant for a thread,
        so it works on a snapshot of the segment list and mutates nothing else."""
        end = self._log_end_offset
        target = end if up_to is None else min(up_to, end)
        start = self.recovery_point
        if target > start and self.loaded:  # an unloaded log has nothing unflushed
            segments = list(self._segments)
            for i, segment in enumerate(segments):
                if segment.base_offset >= target:
                    break
                upper = segments[i + 1].base_offset if i + 1 < len(segments) else None
                if upper is not None and upper <= start:
                    continue
                try:
                    segment.flush()
                except OSError:
                    if not (segment.closed or segment.deleted):
                        raise
        # The epochs of the batches the recovery point passes must be durable first: recovery
        # reads epochs back only from batches above it.
        if self._epoch_cache is not None and self._epoch_cache.sync(sync_dir=False):
            self._dir_dirty = True  # its new name: one directory fsync with the segments' names
        if self._dir_dirty and not self._untouched:
            self._dir_dirty = False
            fsync_path(self.dir)
        if self._parent_dirty:
            self._parent_dirty = False
            fsync_path(self.dir.parent)
        if target > self.recovery_point:
            self.recovery_point = target
        self.last_flush_ms = self._now_ms()

    def epoch_file_behind(self) -> bool:
        """Whether prepare_sync_whole() has anything to write."""
        return self._epoch_cache is not None and self.loaded and self._epoch_cache.dirty

    def prepare_sync_whole(self) -> None:
        """Write, without an fsync, what flush() would make durable besides the segments (the
        leader epoch file), before the whole filesystem is synced. Blocking: for a thread."""
        if self._epoch_cache is not None and self.loaded:
            self._epoch_cache.write()

    def synced_whole(self) -> None:
        """The filesystem holding this log was synced whole after prepare_sync_whole(): all
        that flush() would have fsynced is durable, and the recovery point is the log's end."""
        self._dir_dirty = self._parent_dirty = False
        if self.loaded and self._log_end_offset > self.recovery_point:
            self.recovery_point = self._log_end_offset
        self.last_flush_ms = self._now_ms()

    def unflushed_messages(self) -> int:
        return self._log_end_offset - self.recovery_point

    # -- log start offset

    def increment_log_start_offset(self, offset: int) -> bool:
        """Move the log start offset up to `offset` (DeleteRecords); True if it moved. Segments
        wholly below it go at the next retention run, as in Kafka."""
        self._check_open()
        self._ensure_loaded()
        if offset > self._log_end_offset:
            raise OffsetOutOfRangeError(
                f"cannot move the log start offset of {self.name} to {offset}: beyond the log end "
                f"offset {self._log_end_offset}"
            )
        if offset <= self.log_start_offset:
            return False
        self.log_start_offset = self._checkpointed_start = offset
        self.leader_epoch_cache.truncate_from_start(offset)
        # Data below the log start needs no recovery (Kafka's updateLogStartOffset).
        self.recovery_point = max(self.recovery_point, offset)
        log.info("%s: log start offset moved to %d", self.name, offset)
        return True

    # -- compaction

    def replace_segments(self, base_offset: int, old: list[LogSegment]) -> LogSegment:
        """Swap the cleaned segment `<base_offset>.log.cleaned` (and its indexes), already
        written and fsynced, in for the consecutive segments `old` (Kafka's replaceSegments).

        Order matters for crash safety: `.cleaned` -> `.swap` for every file, then the old
        segments -> `.deleted`, then `.swap` -> final names. Start-up (`_clean_dir`) completes
        or discards whatever step a crash interrupted, so the log is always either the old
        segments or the new one, never a mix. On the event loop: only renames happen here.
        """
        self._check_open()
        segments = self._segments
        try:
            i = next(k for k, s in enumerate(segments) if s is old[0])
        except StopIteration:
            raise ValueError(f"{old[0]} is no longer part of {self.name}") from None
        if segments[i : i + len(old)] != old or i + len(old) >= len(segments):
            raise ValueError(f"{self.name}: segments to replace are not consecutive inactive ones")
        stem = self.dir / segment_name(base_offset)
        paths = [stem.with_name(stem.name + suffix) for suffix in SEGMENT_FILE_SUFFIXES]
        try:
            for path in paths:
                _rename_if_exists(path.with_name(path.name + CLEANED_SUFFIX),
                                  path.with_name(path.name + SWAP_SUFFIX))
            now = self._now_ms()
            self._schedule_delete(old, now)
            for path in paths:
                _rename_if_exists(path.with_name(path.name + SWAP_SUFFIX), path)
            new = LogSegment(self.dir, base_offset, self._config, now_ms=now)
        except OSError as e:
            raise self._io_error(e) from e
        segments[i : i + len(old)] = [new]
        self._dir_dirty = True
        return new

    # -- retention

    def delete_retention_segments(
        self, now_ms: int | None = None, *, high_watermark: int | None = None
    ) -> int:
        """Delete whole segments past retention.ms / retention.bytes, or wholly below the log
        start offset; return how many. Segments above `high_watermark` (default: the log end
        offset) are kept, and the log is never left without an active segment.

        A tiered log's local segments go by local.retention.* instead, and only those whose
        every offset is in remote storage (up to highest_offset_in_remote_storage); the log
        start offset stays where it is (retention of the whole log is the remote log manager's)."""
        self._check_open()
        self._ensure_loaded()
        now = self._now_ms() if now_ms is None else now_ms
        config = self._config
        segments = self._segments
        end = self._log_end_offset
        hw = end if high_watermark is None else high_watermark

        tiered = config.remote_storage_enable
        # a tiered log's segment goes by retention only once its last offset is in remote storage
        uploaded_to = self.highest_offset_in_remote_storage + 1 if tiered else end

        def deletable(predicate: Callable[[LogSegment, LogSegment | None], bool], bound: int = end) -> int:
            count = 0
            for i, segment in enumerate(segments):
                nxt = segments[i + 1] if i + 1 < len(segments) else None
                if nxt is None and segment.size == 0:
                    break
                if (nxt.base_offset if nxt is not None else end) > min(hw, bound):
                    break
                if not predicate(segment, nxt):
                    break
                count += 1
            return count

        n = deletable(lambda _s, nxt: nxt is not None and nxt.base_offset <= self.log_start_offset)
        if tiered:
            retention_ms, retention_bytes = config.local_retention_ms_effective, config.local_retention_bytes_effective
        else:
            retention_ms, retention_bytes = config.retention_ms, config.retention_bytes
        if config.delete_enabled:
            if retention_ms >= 0:
                limit = retention_ms
                n = max(n, deletable(lambda s, _n: now - s.largest_timestamp > limit, uploaded_to))
            if retention_bytes >= 0:
                excess = self.size_in_bytes - retention_bytes

                def over_size(s: LogSegment, _n: LogSegment | None) -> bool:
                    nonlocal excess
                    if excess - s.size >= 0:
                        excess -= s.size
                        return True
                    return False

                n = max(n, deletable(over_size, uploaded_to))
        if n == 0:
            return 0
        if n == len(segments):
            self.roll(now)  # Kafka keeps an empty active segment rather than no segment at all
        victims = self._segments[:n]
        del self._segments[:n]
        if not tiered:
            self.log_start_offset = self._checkpointed_start = max(self.log_start_offset, self._segments[0].base_offset)
        self.recovery_point = max(self.recovery_point, self.local_log_start_offset)
        # Deleted before the epoch checkpoint is rewritten: on a full disk that write fails,
        # and the segments, out of the log already, must still go to give the space back.
        self._schedule_delete(victims, now)
        self.leader_epoch_cache.truncate_from_start(self.log_start_offset)
        log.info("%s: deleted %d segment(s) by %sretention; log start offset now %d%s", self.name, n,
                 "local " if tiered else "", self.log_start_offset,
                 f" (local {self.local_log_start_offset})" if tiered else "")
        return n

    def _schedule_delete(self, segments: list[LogSegment], now: int) -> None:
        deadline = now + self._config.file_delete_delay_ms
        for segment in segments:
            segment.delete()
            self._pending_deletes.append((deadline, segment))

    def purge_deleted(self, now_ms: int | None = None) -> int:
        """Close and unlink deleted segments whose file.delete.delay.ms has passed."""
        now = self._now_ms() if now_ms is None else now_ms
        keep: list[tuple[int, LogSegment]] = []
        purged = 0
        for deadline, segment in self._pending_deletes:
            if deadline <= now:
                segment.purge()
                purged += 1
            else:
                keep.append((deadline, segment))
        self._pending_deletes = keep
        return purged

    # -- truncation

    def truncate_to(self, offset: int) -> bool:
        """Remove everything from the batch holding `offset` on (follower truncation); True if
        anything was removed."""
        self._check_open()
        self._ensure_loaded()
        if offset >= self._log_end_offset:
            # Nothing to remove, but an epoch this replica started as leader and wrote nothing
            # in may sit at the log end, unknown to the leader that followed: kept, it would
            # be this follower's last fetched epoch, which the leader answers with a diverging
            # epoch that truncates nothing, at every fetch, for ever (Kafka trims it too).
            self.leader_epoch_cache.truncate_from_end(self._log_end_offset)
            return False
        if offset < self._segments[0].base_offset:
            # A tiered log's offsets below its first segment are in remote storage (uploaded before
            # they were deleted here): its log start and leader epochs there stay.
            self.truncate_fully_and_start_at(offset, self.log_start_offset if self.tiered else None)
            return True
        now = self._now_ms()
        victims = [s for s in self._segments if s.base_offset > offset]
        if victims:
            del self._segments[-len(victims):]
            self._schedule_delete(victims, now)
        self._segments[-1].truncate_to(offset)
        self._log_end_offset = offset
        Log.offsets_clock += 1  # the flushed-end checkpoint must forget the old end
        self.leader_epoch_cache.truncate_from_end(offset)
        self.recovery_point = min(self.recovery_point, offset)
        self.log_start_offset = min(self.log_start_offset, offset)
        self._checkpointed_start = min(self._checkpointed_start, offset)
        return True

    def truncate_fully_and_start_at(self, offset: int, log_start_offset: int | None = None) -> None:
        """Drop every segment and restart the log empty at `offset`. With `log_start_offset`
        (a tiered log) the log goes on before `offset` in remote storage: it keeps that log
        start and its leader epochs below `offset`."""
        self._check_open()
        self._ensure_loaded()
        if not self._dir_made:
            self._make_dir()  # the new start must outlive a restart: its segment file says it
        now = self._now_ms()
        victims = self._segments
        self._segments = []
        self._schedule_delete(victims, now)
        self._segments.append(LogSegment(self.dir, offset, self._config, now_ms=now, create=True))
        self._dir_dirty = True
        self._untouched = False
        self._log_end_offset = offset
        self.recovery_point = offset
        if log_start_offset is None:
            self.log_start_offset = self._checkpointed_start = offset
            self.leader_epoch_cache.clear()
        else:  # the log goes on below `offset`, in remote storage, with its epochs
            self.log_start_offset = self._checkpointed_start = min(log_start_offset, offset)
            self.leader_epoch_cache.truncate_from_end(offset)

    # -- lifecycle

    def close(self) -> None:
        """Close every segment (recording final time index entries) and finish pending
        deletions."""
        if self.closed:
            return
        self.closed = True
        cache = self._epoch_cache
        if not self.loaded:  # never read: nothing open, nothing to write
            if cache is not None:
                cache.write()
                cache.close()
            return
        if self.offline:  # its directory failed: release descriptors, write nothing
            if cache is not None:
                cache.close()
            for segment in self._segments:
                segment._close_fd()
            for _, segment in self._pending_deletes:
                segment._close_fd()
            self._pending_deletes = []
            return
        segments = self._segments
        for segment in segments:
            segment.close(active=segment is segments[-1])
        for _, segment in self._pending_deletes:
            segment.purge()
        self._pending_deletes = []
        # LogManager.shutdown flushed (and so synced) it before: this writes only what changed
        # since, as for a log closed at any other time.
        if cache is not None:
            cache.write()
            cache.close()

    def parent_synced(self) -> None:
        """The log dir was fsynced after this log's directory was made (LogManager.make_files
        calls it only for directories made before its fsync)."""
        with self._load_lock:
            self._parent_dirty = False

    def _make_dir(self) -> None:
        """A write's own making of the directory (its segment file follows with the write)."""
        try:
            self._made_dir()
        except OSError as e:
            raise self._io_error(e) from e

    def delete(self, remove: bool = True) -> None:
        """Close the log and remove its directory (topic deletion); without `remove` the
        directory is left for the caller to remove (off the loop)."""
        if self._epoch_cache is not None:
            self._epoch_cache.close()
        if not self.closed and not self.loaded:
            self.closed = True
        if not self.closed:
            self.closed = True
            # No final index writes: the files are about to go.
            for segment in self._segments:
                segment._close_fd()
            for _, segment in self._pending_deletes:
                segment._close_fd()
            self._pending_deletes = []
        if remove:
            shutil.rmtree(self.dir, ignore_errors=True)

    def _check_open(self) -> None:
        if self.closed:
            raise StorageError(f"log {self.name} is closed")
        if self.offline:
            raise StorageError(f"the log directory of {self.name} is offline")

    def _check_writable(self) -> None:
        self._check_open()
        if self.write_refusal is not None:
            raise StorageError(self.write_refusal)

    def _io_error(self, error: BaseException) -> StorageError:
        """Report an I/O failure (the broker takes the log dir offline) and return the
        KAFKA_STORAGE_ERROR to raise."""
        if self.io_error_hook is not None:
            self.io_error_hook(self, error)
        if isinstance(error, StorageError):
            return error
        return StorageError(f"I/O error on {self.name}: {error}")

    def go_offline(self) -> None:
        """Stop serving after a log dir failure. Descriptors stay open (in-flight fetch regions
        still point at them) until `close()`; nothing more is written to the failed dir."""
        self.offline = True


def _leave_dirty(_cache: LeaderEpochCache) -> None:
    """An epoch cache change left for later (see Log.open)."""


def _start_offset(config: LogConfig, checkpointed: int, segments: list[LogSegment], end: int) -> int:
    """A log's start offset as opened: where its first segment begins, or later where
    DeleteRecords moved it; a tiered log's may lie before its first segment, in remote storage."""
    if config.remote_storage_enable:
        return min(checkpointed, end)
    return min(max(checkpointed, segments[0].base_offset), end)


def _open_segments(dir: Path, config: LogConfig, recovery_point: int, clean_shutdown: bool,
                   log_start_offset: int, now: int, new: bool = False) -> list[LogSegment]:
    """The segments of `dir`, recovered as needed; one new empty segment if there are none."""
    bases = [] if new else _clean_dir(dir)
    segments: list[LogSegment] = []
    try:
        for base in bases:
            segments.append(LogSegment(dir, base, config, now_ms=now))
        segments = _recover_segments(dir, segments, config, recovery_point, clean_shutdown)
        if not segments:
            segments.append(LogSegment(dir, log_start_offset, config, now_ms=now, create=True))
            segments[0].created_here = True
    except BaseException:
        for segment in segments:
            segment._close_fd()
        raise
    return segments


def _validate_replicated(buf, max_batch_bytes: int) -> list[tuple[int, BatchHeader]]:
    """Check a leader's batches for a follower's append; return (position, header) of each.

    Not `validate_batches`: a compacted batch keeps its last offset delta with fewer records, or
    none, so the produce rule record count == last offset delta + 1 does not hold for it.
    Checked instead, as Kafka's follower does: framing, magic, CRC, size and increasing offsets.
    """
    if not len(buf):
        raise InvalidRecordError("empty record set")
    batches, valid = scan_valid_prefix(buf)
    if valid != len(buf):
        raise CorruptRecordError(f"replicated record set is torn or corrupt at byte {valid} of {len(buf)}")
    next_offset = -1
    for pos, header in batches:
        if header.size > max_batch_bytes:
            raise RecordTooLargeError(
                f"record batch of {header.size} bytes exceeds the limit of {max_batch_bytes}")
        if header.last_offset_delta < 0 or header.base_offset < next_offset:
            raise InvalidRecordError(f"replicated batch at byte {pos} has out-of-order offsets "
                                     f"{header.base_offset}..{header.last_offset}")
        next_offset = header.last_offset + 1
    return batches


def _clean_dir(dir: Path) -> list[int]:
    """Remove leftovers of interrupted deletes/compactions and orphan index files, finish
    interrupted segment swaps; return the base offsets of the segments present, sorted."""
    bases: set[int] = set()
    indexes: list[tuple[int, str]] = []
    with os.scandir(dir) as entries:
        names = [e.name for e in entries if e.is_file()]
    swaps = [name for name in names if name.endswith(SWAP_SUFFIX)]
    if swaps:
        _complete_swaps(dir, names, swaps)
        with os.scandir(dir) as entries:
            names = [e.name for e in entries if e.is_file()]
    for name in names:
        if name.endswith(_LEFTOVER_SUFFIXES):
            os.unlink(dir / name)
            continue
        stem, dot, suffix = name.partition(".")
        if not dot or not stem.isdigit():
            continue
        if "." + suffix == LOG_SUFFIX:
            bases.add(int(stem))
        elif "." + suffix in _INDEX_SUFFIXES:
            indexes.append((int(stem), name))
    for base, name in indexes:
        if base not in bases:
            log.info("%s: deleting index file %s without a log file", dir.name, name)
            os.unlink(dir / name)
    return sorted(bases)


def _complete_swaps(dir: Path, names: list[str], swaps: list[str]) -> None:
    """Finish a compaction swap that a crash interrupted (Kafka's LogLoader does the same).

    A `.log.swap` exists only once the cleaned segment was completely written and fsynced, so
    it wins: every old segment whose base offset falls in the range the swap covers is
    deleted, then the swap files take their final names. The index swap files may be missing
    or stale; removing them makes the segment's indexes be rebuilt by recovery.
    """
    log_swaps = sorted(int(n.split(".")[0]) for n in swaps if n.endswith(LOG_SUFFIX + SWAP_SUFFIX))
    for name in swaps:
        if not name.endswith(LOG_SUFFIX + SWAP_SUFFIX):
            os.unlink(dir / name)  # an index swap: rebuilt below by recovery
    if not log_swaps:
        return
    ranges: list[tuple[int, int]] = []
    for base in log_swaps:
        path = dir / f"{segment_name(base)}{LOG_SUFFIX}{SWAP_SUFFIX}"
        fd = os.open(path, os.O_RDONLY)
        try:
            next_offset = base
            for _, h in scan_headers(fd, 0, os.fstat(fd).st_size):
                next_offset = h[0] + h[6] + 1  # base offset + last offset delta + 1
        finally:
            os.close(fd)
        # An empty cleaned segment still replaces the old segment with its base offset.
        ranges.append((base, max(next_offset, base + 1)))
    for name in names:
        stem, dot, suffix = name.partition(".")
        if not dot or not stem.isdigit() or "." + suffix not in SEGMENT_FILE_SUFFIXES:
            continue
        if any(lo <= int(stem) < hi for lo, hi in ranges):
            log.info("%s: deleting %s replaced by an interrupted compaction swap", dir.name, name)
            os.unlink(dir / name)
    for base in log_swaps:
        path = dir / f"{segment_name(base)}{LOG_SUFFIX}"
        os.rename(path.with_name(path.name + SWAP_SUFFIX), path)
        log.info("%s: completed the interrupted swap of %s", dir.name, path.name)
    fsync_path(dir)


def _rename_if_exists(src: Path, dst: Path) -> None:
    try:
        os.rename(src, dst)
    except FileNotFoundError:
        pass


def _recover_segments(
    dir: Path,
    segments: list[LogSegment],
    config: LogConfig,
    recovery_point: int,
    clean_shutdown: bool,
) -> list[LogSegment]:
    for i, segment in enumerate(segments):
        last = i == len(segments) - 1
        # A segment holds offsets [base, next base): it has unflushed data if that range
        # reaches the recovery point (Kafka's rule, which includes the segment containing it).
        unflushed = not clean_shutdown and (last or segments[i + 1].base_offset > recovery_point)
        if unflushed:
            truncated = segment.recover(config.max_message_bytes)
        elif not segment.sanity_check(None if last else segments[i + 1].base_offset, last=last) or (
            # the active segment's end is found by a short scan, which also bounds its entries
            last and not (segment.load_tail() and segment.sanity_check(segment.next_offset, last=True))
        ):
            log.warning("%s: rebuilding the indexes of %s", dir.name, segment.log_path.name)
            truncated = segment.recover(config.max_message_bytes)
        else:
            continue
        if not last:
            # Rebuilding opened the index files for writing; an inactive segment must not keep
            # those descriptors (10,000 recovered segments would hold 20,000 of them).
            segment.offset_index.close()
            segment.time_index.close()
        if truncated:
            # Name what is lost: everything from the first bad batch to the end of this
            # segment, or of the log when the later segments go with it.
            lost_to = ("the log end" if last or unflushed
                       else f"{segments[i + 1].base_offset - 1}")
            log.warning(
                "%s: %s has a torn or corrupt batch at byte %d: truncated %d bytes there, so "
                "offsets %d to %s are unreadable and dropped",
                dir.name, segment.log_path.name, segment.size, truncated, segment.next_offset, lost_to,
            )
            if unflushed and not last:
                for later in segments[i + 1 :]:
                    log.warning("%s: deleting %s after a corrupt batch", dir.name, later.log_path.name)
                    later.purge()
                return segments[: i + 1]
    return segments

